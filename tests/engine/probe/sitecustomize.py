"""Test probe of the real-engine tier, loaded by every Python process of an engine run (PYTHONPATH).

Only active when ENGINE_PROBE_DIR is set. It records, into ENGINE_PROBE_DIR/<pid>.json, what this process
itself saw; it changes nothing the GLM-5.2 patches touch:
- in an EngineCore process, each time the client asks ``is_scheduler_paused``: the patch layers on the
  three targets and the plugin's statuses here (``core_state``), read after the engine finished starting;
- in any process whose executor runs a dummy forward (``Executor.execute_dummy_batch`` or the
  ``MultiprocExecutor`` override, the call that reaches the workers): how many ran while the executor
  slept and while it was awake.
"""

from __future__ import annotations

import os

if os.environ.get("ENGINE_PROBE_DIR"):
    import json
    import threading

    import wrapt

    _lock = threading.Lock()
    _record: dict = {"pid": os.getpid(), "dummy_forwards": {"asleep": 0, "awake": 0}}

    def _write() -> None:
        path = os.path.join(os.environ["ENGINE_PROBE_DIR"], f"{os.getpid()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(_record, f)
        os.replace(path + ".tmp", path)

    def _paused_probe(wrapped, instance, args, kwargs):
        from engine_probe import core_state

        with _lock:
            _record["engine_core"] = core_state()
            _record["process"] = type(instance).__name__
            _record["executor"] = type(instance.model_executor).__name__
            _write()
        return wrapped(*args, **kwargs)

    def _dummy_probe(wrapped, instance, args, kwargs):
        with _lock:
            _record["dummy_forwards"]["asleep" if instance.is_sleeping else "awake"] += 1
            _write()
        return wrapped(*args, **kwargs)

    @wrapt.when_imported("vllm.v1.engine.core")
    def _on_core(module):
        wrapt.wrap_function_wrapper(module, "EngineCore.is_scheduler_paused", _paused_probe)

    @wrapt.when_imported("vllm.v1.executor.abstract")
    def _on_executor(module):
        wrapt.wrap_function_wrapper(module, "Executor.execute_dummy_batch", _dummy_probe)

    @wrapt.when_imported("vllm.v1.executor.multiproc_executor")
    def _on_mp_executor(module):  # overrides Executor's
        wrapt.wrap_function_wrapper(module, "MultiprocExecutor.execute_dummy_batch", _dummy_probe)
