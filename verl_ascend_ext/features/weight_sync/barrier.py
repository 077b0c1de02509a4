"""The bounded cross-rank barrier before the KV-cache resume: wait at most N seconds, then name who is missing.

``torch.distributed.barrier`` has no bound of its own short of the process group's timeout (30 min by
default; verl passes none) and, when it fails, it names no rank. ``monitored_barrier`` names the missing
ranks on rank 0 only: the other ranks wait for rank 0's answer and report "check rank 0 logs".
So every rank checks for itself, on the default process group's key-value store (the rendezvous store
every backend has, gloo-only or ``cpu:gloo,npu:hccl`` alike): it writes ``<generation>/<rank>``, then waits
for every rank's key for at most the timeout; on expiry it lists the keys that are missing. All of it
runs in the calling thread and returns or raises within the timeout; nothing is left running.

All ranks call it the same number of times (``update_weights`` is dispatched ONE_TO_ALL), so a call counter
is the generation. A rank deletes its key of the previous generation once every rank has reached the
current one, so the store holds at most two keys per rank.
"""

from __future__ import annotations

import os
import socket
import threading
from datetime import timedelta
from typing import Any

from verl_ascend_ext.features.weight_sync.declaration import BARRIER_TIMEOUT, KV_BARRIER

PREFIX = "verl_ascend_ext/kv_barrier"


class WeightSyncBarrierTimeout(RuntimeError):
    """Some ranks did not reach the barrier before the KV-cache resume within the timeout."""


_lock = threading.Lock()
_generation = 0
_announced = False


def _key(generation: int, rank: int) -> str:
    return f"{PREFIX}/{generation}/{rank}"


def _who_key(rank: int) -> str:
    return f"{PREFIX}/who/{rank}"


def _store() -> Any:
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()  # the store init_process_group made (no public accessor)


def bounded_barrier(timeout: float | None = None) -> None:
    """Wait until every rank of the default process group arrives, at most ``timeout`` seconds (default: the
    value of ``VERL_ASCEND_EXT_WEIGHT_SYNC_BARRIER_TIMEOUT``); raise WeightSyncBarrierTimeout naming the ranks
    that did not arrive."""
    import torch.distributed as dist

    global _generation, _announced
    seconds = BARRIER_TIMEOUT.read() if timeout is None else timeout
    rank, world = dist.get_rank(), dist.get_world_size()
    with _lock:
        _generation += 1
        generation = _generation
    store = _store()
    me = f"host {socket.gethostname()}, pid {os.getpid()}"
    try:
        if not _announced:
            store.set(_who_key(rank), me)
            _announced = True
        store.set(_key(generation, rank), me)
        keys = [_key(generation, r) for r in range(world)]
        try:
            store.wait(keys, timedelta(seconds=seconds))
        except RuntimeError as err:  # DistStoreError on expiry (a RuntimeError subclass)
            missing = [r for r in range(world) if not store.check([_key(generation, r)])]
            if missing:  # else everyone arrived just as the wait expired
                raise WeightSyncBarrierTimeout(_message(store, missing, rank, world, seconds)) from err
        if generation > 1:  # every rank got past the previous generation: its key is no longer read
            store.delete_key(_key(generation - 1, rank))
    except WeightSyncBarrierTimeout:
        raise
    except RuntimeError as err:  # the store itself is gone or broken
        raise WeightSyncBarrierTimeout(
            f"verl-ascend-ext {KV_BARRIER.id}: rank {rank} of {world} could not reach the process group's store to "
            f"meet the other ranks before the KV-cache resume ({type(err).__name__}: {err}). With env:// "
            "initialisation the store lives in rank 0's process (MASTER_ADDR:MASTER_PORT): rank 0 has probably "
            "died; read its log. The KV cache was not resumed on this rank.") from err


def _message(store: Any, missing: list[int], rank: int, world: int, seconds: float) -> str:
    named = []
    for r in missing:
        known = store.check([_who_key(r)])
        named.append(f"{r} ({store.get(_who_key(r)).decode()})" if known else f"{r} (never reached this barrier)")
    ranks = "rank " + named[0] if len(named) == 1 else "ranks " + ", ".join(named)
    return (f"verl-ascend-ext {KV_BARRIER.id}: {ranks} of {world} did not reach the barrier before the KV-cache "
            f"resume within {seconds:g} s (seen from rank {rank}). It died or is stuck in update_weights (weight "
            f"transfer, offload or cache clean-up): read {'its' if len(named) == 1 else 'their'} log (the Ray worker "
            f"log of that actor rank). If it is only slow, raise {BARRIER_TIMEOUT.env} (now {seconds:g} s). The KV "
            "cache was not resumed on this rank.")
