"""Scenario: the GLM-5.2 vLLM-core patches on real vLLM 0.23.0 classes, on CPU (run in a fresh interpreter).

    python glm52_vllm_core.py engine          # boot via vLLM's own plugin loader, drive wake_up / the DP busy loop,
                                              # spawn engine-core children; gate from the environment
    python glm52_vllm_core.py ours-first      # verl 0.9.1: our patch, then verl's in-tree patch
    python glm52_vllm_core.py verl-first      # verl 0.9.1: verl's in-tree patch, then ours

Prints one JSON document on the last line. What is real and what is a double:
- real: vLLM 0.23.0's EngineCore.wake_up / resume_scheduler, DPEngineCoreProc.run_busy_loop and
  execute_dummy_batch, vLLM's Executor.sleep / wake_up / execute_dummy_batch bookkeeping, vLLM's plugin
  loader, multiprocessing spawn with vLLM's own engine-core target, verl 0.9.1's in-tree patch function.
- doubles (this file): ``RecordingExecutor`` (a real vllm Executor subclass whose collective_rpc records
  the call instead of reaching GPU/NPU workers), ``RecordingScheduler`` (records pause-state changes), and
  engine objects made with ``__new__`` plus the few attributes the driven methods read, because
  EngineCore.__init__ builds a model executor that needs an accelerator. The busy loop runs exactly one
  iteration: ``_handle_shutdown`` answers True once, the DP all-reduce is answered locally.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import sys
from types import SimpleNamespace

GATE = "VERL_VLLM_ASCEND_GLM52_PATCH"
MARKER = "_verl_vllm_ascend_glm52_patched"
IDS = ("glm52-vllm-wake-up-resume-when-awake", "glm52-vllm-dp-no-dummy-forward-asleep",
       "glm52-vllm-engine-core-entry")


def our_statuses() -> dict[str, str]:
    from verl_ascend_ext import patch_statuses

    found = patch_statuses()
    return {i: found[i].status.value if i in found else "none" for i in IDS}


def patch_layers(obj) -> int:
    """How many patch layers (ours or verl's: marked functions with __wrapped__) sit on obj."""
    from verl_ascend_ext.patching.replacement import MARKER as OURS

    obj = getattr(obj, "__func__", obj)
    n = 0
    while True:
        ours = getattr(obj, OURS, None) is not None
        verls = getattr(obj, MARKER, False) and hasattr(obj, "__wrapped__")
        if ours or verls:
            n, obj = n + 1, obj.__wrapped__
        else:
            return n


def core_state() -> dict:
    from vllm.v1.engine import core

    entry = vars(core.EngineCoreProc)["run_engine_core"].__func__
    return {
        "statuses": our_statuses(),
        "wake_up_layers": patch_layers(vars(core.EngineCore)["wake_up"]),
        "dummy_layers": patch_layers(core.DPEngineCoreProc.__dict__.get("execute_dummy_batch")),
        "dummy_own_attribute": "execute_dummy_batch" in vars(core.DPEngineCoreProc),
        "entry": f"{entry.__module__}.{entry.__qualname__}",
    }


# ---- test doubles -------------------------------------------------------------------------------

def recording_executor():
    from vllm.v1.executor.abstract import Executor

    class RecordingExecutor(Executor):
        """A real vLLM Executor whose workers are a call log (no accelerator)."""

        def _init_executor(self) -> None:
            pass

        def collective_rpc(self, method, timeout=None, args=(), kwargs=None, non_block=False, **_):
            self.calls.append(method)
            return [None]

        def check_health(self) -> None:
            pass

        def shutdown(self) -> None:
            pass

    executor = RecordingExecutor.__new__(RecordingExecutor)
    executor.is_sleeping, executor.sleeping_tags, executor.calls = False, set(), []
    return executor


class RecordingScheduler:
    def __init__(self) -> None:
        self.unpaused = 0

    def set_pause_state(self, state) -> None:
        if state.name == "UNPAUSED":
            self.unpaused += 1

    def has_unfinished_requests(self) -> bool:
        return False


def drive_wake_up() -> dict:
    from vllm.v1.engine.core import EngineCore

    engine = EngineCore.__new__(EngineCore)
    engine.model_executor, engine.scheduler = recording_executor(), RecordingScheduler()
    engine.model_executor.sleep(level=1)
    engine.wake_up(["weights"])
    after_weights = (engine.scheduler.unpaused, engine.model_executor.is_sleeping)
    engine.wake_up(["kv_cache"])
    after_kv = (engine.scheduler.unpaused, engine.model_executor.is_sleeping)
    engine.model_executor.sleep(level=1)
    engine.wake_up(None)
    after_full = engine.scheduler.unpaused
    return {"weights_only": list(after_weights), "then_kv_cache": list(after_kv), "full_wake_total": after_full,
            "rpc": engine.model_executor.calls}


def busy_loop_iteration(asleep: bool) -> int:
    """Run one iteration of the real DPEngineCoreProc.run_busy_loop; return the dummy forwards sent to workers."""
    from vllm.v1.engine.core import DPEngineCoreProc

    engine = DPEngineCoreProc.__new__(DPEngineCoreProc)
    engine.model_executor, engine.scheduler = recording_executor(), RecordingScheduler()
    if asleep:
        engine.model_executor.sleep(level=1)
    answers = iter([True, False])
    engine._handle_shutdown = lambda: next(answers)
    engine._process_input_queue = lambda: None
    engine._maybe_publish_request_counts = lambda: None
    engine._process_engine_step = lambda: False  # this rank had no ready request ...
    engine.engines_running = True  # ... while a wave is running: the case that needs a dummy forward
    engine._has_global_unfinished_reqs = lambda local: True  # the DP all-reduce, answered locally
    engine.eep_scaling_state = None
    engine.vllm_config = SimpleNamespace(observability_config=SimpleNamespace(enable_logging_iteration_details=False))
    with contextlib.suppress(SystemExit):  # the loop ends by raising SystemExit once _handle_shutdown is False
        engine.run_busy_loop()
    return engine.model_executor.calls.count("execute_dummy_batch")


# ---- spawned children ---------------------------------------------------------------------------

class Probe:
    """Passed as ``vllm_config`` to vLLM's run_engine_core in a spawned child: reports, then stops the child."""

    def __init__(self, queue, label: str = "entry") -> None:
        self.queue, self.label = queue, label

    @property
    def parallel_config(self):
        from verl_ascend_ext.runtime.boot import loaded_by

        self.queue.put({"child": self.label, **core_state(), "loaded_by": list(loaded_by()),
                        "gate": os.environ.get(GATE)})
        raise SystemExit(0)


def plugin_child(queue) -> None:
    """A child that loads vLLM's general plugins the way EngineCore.__init__ (and Ray engine actors) do."""
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    from verl_ascend_ext.runtime.boot import loaded_by

    queue.put({"child": "plugin", **core_state(), "loaded_by": list(loaded_by()), "gate": os.environ.get(GATE)})


def spawn_children() -> dict:
    from vllm.v1.engine.core import EngineCoreProc

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=EngineCoreProc.run_engine_core, name="EngineCore",
                         kwargs={"vllm_config": Probe(queue), "dp_rank": 0, "local_dp_rank": 0}),
             ctx.Process(target=plugin_child, args=(queue,))]
    for p in procs:
        p.start()
    if os.environ.get(GATE) == "1":  # our entry point as target, in a child whose environment has the gate off
        os.environ[GATE] = "0"
        procs.append(ctx.Process(target=EngineCoreProc.run_engine_core, name="EngineCore",
                                 kwargs={"vllm_config": Probe(queue, "entry-gate-off"), "dp_rank": 0,
                                         "local_dp_rank": 0}))
        procs[-1].start()
        os.environ[GATE] = "1"
    reports = [queue.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(60)
    out = {r["child"]: r for r in reports}
    out["exitcodes"] = [p.exitcode for p in procs]
    return out


# ---- modes --------------------------------------------------------------------------------------

def engine_mode() -> dict:
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # vLLM's own loader finds and calls our vllm.general_plugins entry point
    import vllm.v1.engine.core  # noqa: F401  (EngineCore.__init__ would have imported it already)

    result = {"parent": core_state(), "wake": drive_wake_up(), "dummy_asleep": busy_loop_iteration(True),
              "dummy_awake": busy_loop_iteration(False), "spawn": spawn_children()}
    result["unpatch"] = unpatch_all()
    return result


def unpatch_all() -> dict:
    """Restore everything; the inherited target must be deleted from DPEngineCoreProc, not shadowed."""
    from vllm.v1.engine import core

    from verl_ascend_ext.patching import unpatch

    restored = {i: unpatch(i) for i in IDS}
    return {"restored": restored,
            "dummy_own_attribute": "execute_dummy_batch" in vars(core.DPEngineCoreProc),
            "dummy_is_inherited": core.DPEngineCoreProc.execute_dummy_batch is core.EngineCore.execute_dummy_batch,
            "wake_up_layers": patch_layers(vars(core.EngineCore)["wake_up"]),
            "entry": vars(core.EngineCoreProc)["run_engine_core"].__func__.__module__}


def verl_patch() -> None:
    from verl.utils.vllm import npu_vllm_patch  # importing runs verl's NPU-gated patches: a no-op on CPU

    npu_vllm_patch.patch_vllm_glm52_partial_wake_up()  # the GLM-5.2 vLLM-core part of verl 0.9.1, called directly


def ours() -> None:
    from vllm.v1.engine import core  # noqa: F401

    import verl_ascend_ext

    verl_ascend_ext.activate()


def order_mode(first: str) -> dict:
    # verl's plugin discovery would boot ours at `import verl`, and our post-import hook then runs inside
    # verl's own `from vllm.v1.engine import core`, i.e. ours first. Switch discovery off so that the
    # order is exactly the one asked for (verl first happens e.g. when VERL_USE_EXTERNAL_PLUGINS excludes us).
    os.environ["VERL_USE_EXTERNAL_PLUGINS"] = "none"
    steps = [ours, verl_patch] if first == "ours" else [verl_patch, ours]
    import vllm.v1.engine.core as core

    originals = {"wake_up": vars(core.EngineCore)["wake_up"],
                 "dummy": vars(core.EngineCore)["execute_dummy_batch"]}
    for step in steps:
        step()
    for step in steps:  # and again: still once
        step()
    from verl.utils.vllm import npu_vllm_patch

    state = core_state()
    state.update({
        "originals_untouched": not any(hasattr(f, MARKER) for f in originals.values()),
        "verl_saved_entry": getattr(npu_vllm_patch._glm52_original_run_engine_core, "__module__", None),
        "wake": drive_wake_up(), "dummy_asleep": busy_loop_iteration(True), "dummy_awake": busy_loop_iteration(False),
    })
    return state


if __name__ == "__main__":
    mode = sys.argv[1]
    result = engine_mode() if mode == "engine" else order_mode(mode.split("-")[0])
    print(json.dumps(result))
