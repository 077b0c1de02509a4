"""Replacement code of the GLM-5.2 vLLM-core patches (imported only when a patch applies, or by a spawned child).

``resume_only_when_awake`` and ``skip_dummy_batch_while_asleep`` are patch code the engine installs behind
plain-function replacements (they run eagerly, in the engine-core busy loop); ``run_engine_core``
is a module-level function installed as ``staticmethod`` on ``EngineCoreProc``: multiprocessing spawn
pickles a target by module and qualname, so the child imports this module and runs this function.
"""

from __future__ import annotations

from typing import Any

from verl_ascend_ext.features.glm52.vllm.declaration import DUMMY_BATCH, ENGINE_CORE_ENTRY, WAKE_UP
from verl_ascend_ext.patching.replacement import reported
from verl_ascend_ext.patching.status import acted
from verl_ascend_ext.runtime.records import recorder

ENTRY_PATCH_ID = ENGINE_CORE_ENTRY.id


def resume_only_when_awake(original: Any, self: Any, tags: list[str] | None = None) -> None:
    """``EngineCore.wake_up`` as vLLM 0.24.0 has it: resume scheduling only when the executor is fully awake.

    Re-implements the whole method (the original's last statement resumes unconditionally); the record's
    fingerprint admits only the exact vLLM 0.23.0 body, so everything else is the same code.
    """
    if tags is not None and "scheduling" in tags:
        tags = [t for t in tags if t != "scheduling"]
    if tags is None or tags:
        self.model_executor.wake_up(tags)
    if not self.model_executor.is_sleeping:
        self.resume_scheduler()
    else:  # where vLLM 0.23 resumed scheduling on an engine whose KV cache still sleeps
        acted(WAKE_UP.id)
        recorder.flush()  # once a weight sync: written now, as a fully-async job may end (and Ray kill it) right after


def skip_dummy_batch_while_asleep(original: Any, self: Any) -> Any:
    """``DPEngineCoreProc.execute_dummy_batch``: no dummy forward while the executor sleeps.

    The busy loop around it (wave bookkeeping, the DP all-reduce of unfinished requests) runs unchanged,
    as in vLLM 0.24.0 where only the dummy forward is skipped.
    """
    if self.model_executor.is_sleeping:
        acted(DUMMY_BATCH.id)
        return None
    return original(self)


@reported(ENTRY_PATCH_ID)
def run_engine_core(*args: Any, **kwargs: Any) -> Any:
    """The engine-core process entry point: boot the plugin here, then run vLLM's ``run_engine_core``.

    In a spawned child nothing of the parent's patching survives; booting reads the gate from this
    process's environment, and importing ``vllm.v1.engine.core`` then applies the core patches (post-import
    hooks) before any engine object exists.
    """
    from verl_ascend_ext.patching.engine import original
    from verl_ascend_ext.runtime.boot import activate

    activate("vllm-engine-core")
    from vllm.v1.engine import core

    raw = original(ENTRY_PATCH_ID)
    if raw is None:  # not applied in this process (e.g. gate off here): the class holds vLLM's (or verl's) entry
        raw = vars(core.EngineCoreProc)["run_engine_core"]
    entry = raw.__func__ if isinstance(raw, staticmethod) else raw
    if entry is run_engine_core:
        raise RuntimeError(
            "verl-ascend-ext: EngineCoreProc.run_engine_core is this package's entry point but the original is "
            f"unknown in this process (patch '{ENTRY_PATCH_ID}' not applied here); reinstall verl-ascend-ext"
        )
    return entry(*args, **kwargs)
