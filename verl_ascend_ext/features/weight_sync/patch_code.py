"""Replacement code of the weight-sync patches (imported only when a patch is applied).

The barrier and the light clean-up act only on verl's hybrid-mode sync, where ``update_weights`` pushes weights into
a colocated rollout and resumes its KV cache. Elsewhere they call verl's code as it is and report where they stood
down (``status.stood_down``): a rollout in its own pool (fully-async, disaggregated; weights go through a checkpoint
engine), a single rank, no process group, a sync that resumed no KV cache.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
from contextvars import ContextVar
from types import ModuleType
from typing import Any

from verl_ascend_ext.features.weight_sync.declaration import KV_BARRIER, LIGHT_EMPTY_CACHE
from verl_ascend_ext.patching.status import acted, stood_down

NO_ROLLOUT = "no colocated rollout: it runs in its own pool (fully-async, disaggregated), synced by a checkpoint engine"
ONE_RANK = "a single rank: no other rank to wait for"
NO_GROUP = "no torch.distributed process group"
NO_KV_RESUME = "update_weights resumed no KV cache in this call"


class _Sync:
    """One ``update_weights`` call: whether the barrier before its KV-cache resume ran."""

    __slots__ = ("barrier_met",)

    def __init__(self) -> None:
        self.barrier_met = False


# The ``update_weights`` call in progress (set by its replacement below, in its task's context: concurrent
# coroutines and other threads do not see it). Both targets run eagerly, never traced.
_in_update_weights: ContextVar[_Sync | None] = ContextVar("verl_ascend_ext_in_update_weights", default=None)
_shim_lock = threading.Lock()  # module stand-ins (``asyncio``, ``gc``) are installed once per module


def _no_barrier_needed(self: Any) -> str | None:
    """Why this worker's sync needs no barrier (a stand-down path), or None."""
    import torch.distributed as dist

    if getattr(self, "rollout", None) is None:
        return NO_ROLLOUT
    if not dist.is_available() or not dist.is_initialized():
        return NO_GROUP
    if dist.get_world_size() == 1:
        return ONE_RANK
    return None


async def barrier_before_kv_resume(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """``update_weights`` whose KV-cache resume first waits, off the event loop, until every rank arrives.

    verl's method is one coroutine, so the barrier goes in through the object it calls: for the
    duration of the call, ``self.rollout.resume`` is shadowed (on that rollout object only) by a
    coroutine that runs the bounded barrier (``barrier.bounded_barrier``: at most
    ``VERL_ASCEND_EXT_WEIGHT_SYNC_BARRIER_TIMEOUT`` seconds, then an error naming the missing ranks) in a thread
    before ``resume(tags=['kv_cache'])``.
    It also marks the call (``_in_update_weights``) for ``light_empty_cache_in_update_weights``.
    """
    sync = _Sync()
    token = _in_update_weights.set(sync)
    try:
        result = await _with_kv_barrier(original, self, sync, *args, **kwargs)
    finally:
        _in_update_weights.reset(token)
    _report_stand_down(self, sync)
    return result


def _report_stand_down(self: Any, sync: _Sync) -> None:
    """After a call that returned: where the barrier was not needed, or not reached, say so."""
    if not sync.barrier_met:
        stood_down(KV_BARRIER.id, _no_barrier_needed(self) or NO_KV_RESUME)


async def _with_kv_barrier(original: Any, self: Any, sync: _Sync, *args: Any, **kwargs: Any) -> Any:
    from verl_ascend_ext.features.weight_sync.barrier import bounded_barrier

    if _no_barrier_needed(self) is not None:
        return await original(self, *args, **kwargs)
    rollout = self.rollout
    resume = rollout.resume
    shadowed = "resume" in vars(rollout)

    async def resume_after_barrier(*r_args: Any, **r_kwargs: Any) -> Any:
        tags = r_kwargs.get("tags", r_args[0] if r_args else None)
        if tags is not None and "kv_cache" in tags:
            sync.barrier_met = True
            acted(KV_BARRIER.id)
            await asyncio.to_thread(bounded_barrier)
        return await resume(*r_args, **r_kwargs)

    rollout.resume = resume_after_barrier
    try:
        return await original(self, *args, **kwargs)
    finally:
        if shadowed:
            rollout.resume = resume
        else:
            del rollout.resume


async def bounded_upstream_barrier(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """``update_weights`` of a verl whose own barrier before the KV-cache resume is unbounded (0.9.1).

    verl calls ``await asyncio.to_thread(torch.distributed.barrier)`` there; ``asyncio`` of its module is
    replaced (once) by a stand-in that, inside this call only (``_in_update_weights``, set in this task's context,
    which ``to_thread`` carries into the thread), runs the bounded barrier instead; everything else goes to
    ``asyncio`` unchanged.
    """
    _asyncio_shim_for(sys.modules[getattr(original, "__module__", None) or type(self).__module__])
    sync = _Sync()
    token = _in_update_weights.set(sync)
    try:
        result = await original(self, *args, **kwargs)
    finally:
        _in_update_weights.reset(token)
    _report_stand_down(self, sync)
    return result


class _AsyncioWithBoundedBarrier(ModuleType):
    """Stands in for ``asyncio`` in verl's worker module: ``to_thread(torch.distributed.barrier)`` with no arguments,
    inside a patched ``update_weights``, runs ``barrier.bounded_barrier``."""

    def __init__(self) -> None:
        super().__init__("asyncio")

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def to_thread(self, func: Any, /, *args: Any, **kwargs: Any) -> Any:
        sync = _in_update_weights.get()
        if not args and not kwargs and sync is not None and func is _distributed_barrier():
            from verl_ascend_ext.features.weight_sync.barrier import bounded_barrier

            sync.barrier_met = True
            acted(KV_BARRIER.id)
            func = bounded_barrier
        return await asyncio.to_thread(func, *args, **kwargs)


def _distributed_barrier() -> Any:
    import torch.distributed as dist

    return dist.barrier


def _asyncio_shim_for(module: ModuleType) -> None:
    with _shim_lock:
        if not isinstance(module.__dict__.get("asyncio"), _AsyncioWithBoundedBarrier):
            module.asyncio = _AsyncioWithBoundedBarrier()


def light_empty_cache() -> None:
    """What verl 0.9.1 does on the sync path: synchronise, then return cached device blocks; no GC."""
    from verl.utils.device import get_torch_device

    device = get_torch_device()
    if not device.is_available():
        return
    device.synchronize()
    device.empty_cache()


def light_empty_cache_in_update_weights(original: Any, *args: Any, **kwargs: Any) -> Any:
    """``aggressive_empty_cache`` that is light inside ``ActorRolloutRefWorker.update_weights``.

    The weight-sync-kv-barrier replacement of ``update_weights`` marks the call (the record ``needs`` it).
    """
    if _in_update_weights.get() is not None:
        acted(LIGHT_EMPTY_CACHE.id)
        return light_empty_cache()
    return original(*args, **kwargs)


class _NoFullGC(ModuleType):
    """Stands in for ``gc`` in the bucketed-transfer module: ``collect()`` is skipped inside a patched clean-up."""

    def __init__(self) -> None:
        super().__init__("gc")
        self.skip = threading.local()

    def __getattr__(self, name: str) -> Any:
        return getattr(gc, name)

    def collect(self, generation: int = 2) -> int:
        if getattr(self.skip, "depth", 0):
            return 0
        return gc.collect(generation)


def _shim_for(module: ModuleType) -> _NoFullGC:
    with _shim_lock:
        current = module.__dict__.get("gc")
        if isinstance(current, _NoFullGC):
            return current
        shim = _NoFullGC()
        module.gc = shim
        return shim


def cleanup_without_full_gc(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """Bucketed sender/receiver ``_cleanup`` with its ``gc.collect()`` skipped (this thread, this call only)."""
    # the module whose global ``gc`` the cleanup code reads: where the method is defined, not the instance's class
    shim = _shim_for(sys.modules[getattr(original, "__module__", None) or type(self).__module__])
    shim.skip.depth = getattr(shim.skip, "depth", 0) + 1
    try:
        return original(self, *args, **kwargs)
    finally:
        shim.skip.depth -= 1
