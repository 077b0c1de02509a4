"""What one process of a real engine run holds: the patch layers on the GLM-5.2 vLLM-core targets, by owner.

Imported by tests/engine/drive.py (front-end) and by the probe (sitecustomize.py) in EngineCore processes.
"""

from __future__ import annotations

import inspect
import os

MARKER = "_verl_vllm_ascend_glm52_patched"  # verl 0.9.1's in-tree copy stands down on a function carrying it


def owner(obj) -> str:
    """Whose code ``obj`` is: vllm, verl, ours (verl_ascend_ext) or the file it comes from."""
    filename = obj.__code__.co_filename  # our layers are plain functions made in verl_ascend_ext/patching/
    for name, part in (("ours", "/verl_ascend_ext/"), ("verl", "/verl/"), ("vllm", "/vllm/")):
        if part in filename:
            return name
    return filename


def chain(obj) -> list[str]:
    """Owners from the outermost layer down to the innermost function (follows ``__wrapped__``)."""
    out = []
    obj = getattr(obj, "__func__", obj)
    while obj is not None:
        out.append(owner(obj))
        obj = getattr(obj, "__wrapped__", None)
        obj = getattr(obj, "__func__", obj)
    return out


def core_state() -> dict:
    """Patch layers on the three targets in this process, our statuses here and who booted the plugin here."""
    from vllm.v1.engine import core

    from verl_ascend_ext import patch_statuses
    from verl_ascend_ext.runtime.boot import loaded_by

    wake_up = inspect.getattr_static(core.EngineCore, "wake_up")
    dummy = inspect.getattr_static(core.DPEngineCoreProc, "execute_dummy_batch")
    return {
        "pid": os.getpid(),
        "wake_up": chain(wake_up),
        "dummy": chain(dummy),
        "entry": chain(inspect.getattr_static(core.EngineCoreProc, "run_engine_core")),
        "marked": {"wake_up": getattr(wake_up, MARKER, False) is True, "dummy": getattr(dummy, MARKER, False) is True},
        "statuses": {k: v.status.value for k, v in patch_statuses().items() if k.startswith("glm52-vllm")},
        "loaded_by": list(loaded_by()),
    }


def process_state(worker=None) -> dict:
    """A worker's own view (sent with collective_rpc): its pid, its parent (the EngineCore), who booted the plugin."""
    import sys

    from verl_ascend_ext import patch_statuses
    from verl_ascend_ext.runtime.boot import loaded_by

    return {"pid": os.getpid(), "ppid": os.getppid(), "loaded_by": list(loaded_by()),
            "core_imported": "vllm.v1.engine.core" in sys.modules,
            "statuses": {k: v.status.value for k, v in patch_statuses().items() if k.startswith("glm52-vllm")}}
