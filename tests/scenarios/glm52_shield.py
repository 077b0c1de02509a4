"""Scenario: verl 0.9.1's in-tree GLM-5.2 vLLM-core copy on the real core.py of later vLLM releases (fresh interpreter).

    python glm52_shield.py with-ours  CORE_PY...   # our plugin booted (gate from the environment), then verl's copy
    python glm52_shield.py verl-alone CORE_PY...   # verl's copy only

For each CORE_PY (a released, or mutated, ``vllm/v1/engine/core.py``) a forked child imports
``vllm.v1.engine.core`` from that file and calls verl 0.9.1's real ``patch_vllm_glm52_partial_wake_up``,
as ``apply_npu_vllm_patches`` does on an NPU. Prints one JSON document ``{CORE_PY: result}`` on the last line.

What is real: verl 0.9.1's function (its string checks read the released file through ``inspect``), our
boot and post-import hook, vLLM 0.23.0's ``vllm`` / ``vllm.v1.engine`` packages, and the ``EngineCore``,
``EngineCoreProc`` and ``DPEngineCoreProc`` classes of the released file: compiled from that file at their
own lines, so both patchers read and change the real released functions.
What is not: the rest of the released module. A later core.py does not import against vLLM 0.23.0 (it
imports modules 0.23.0 lacks), so the module holds only those three classes, and every other name they
reference is bound to ``Inert``, which is callable, subscriptable and an identity decorator. Neither
patcher calls any of those names.
"""

from __future__ import annotations

import ast
import builtins
import importlib.abc
import importlib.util
import json
import logging
import multiprocessing
import os
import sys
import types
from pathlib import Path

MODULE = "vllm.v1.engine.core"
CLASSES = ("EngineCore", "EngineCoreProc", "DPEngineCoreProc")
MARKER = "_verl_vllm_ascend_glm52_patched"
WITH_OURS = False
IDS = ("glm52-vllm-wake-up-resume-when-awake", "glm52-vllm-dp-no-dummy-forward-asleep",
       "glm52-vllm-engine-core-entry")


class Inert:
    """Stands for a name the released module imports and the three classes reference; never called by a patcher."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Inert:
        return Inert(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and isinstance(args[0], (types.FunctionType, type)):
            return args[0]  # used as a decorator: the function stays the released one
        return Inert(f"{self._name}(...)")

    def __getitem__(self, _item) -> Inert:
        return self

    def __or__(self, _other) -> Inert:
        return self

    __ror__ = __or__


class ReleasedCore(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``vllm.v1.engine.core`` in ``path``: the three engine classes of that file, at their own lines."""

    path: str | None = None

    def find_spec(self, fullname, path=None, target=None):
        if fullname != MODULE or self.path is None:
            return None
        return importlib.util.spec_from_file_location(fullname, self.path, loader=self)

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        tree = ast.parse(Path(self.path).read_text(encoding="utf-8"), filename=self.path)
        classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in CLASSES]
        referenced = {n.id for c in classes for n in ast.walk(c) if isinstance(n, ast.Name)}
        for name in sorted(referenced - set(CLASSES) - set(dir(builtins))):
            module.__dict__[name] = Inert(name)
        exec(compile(ast.Module(body=classes, type_ignores=[]), self.path, "exec"), module.__dict__)


FINDER = ReleasedCore()


class Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def our_statuses() -> dict[str, str]:
    from verl_ascend_ext import patch_statuses

    found = patch_statuses()
    return {i: found[i].status.value if i in found else "none" for i in IDS}


def released(func, path: str) -> bool:
    """``func`` is a plain function defined in ``path`` (not a wrapper: a wrapt proxy forwards ``__code__``)."""
    return type(func) is types.FunctionType and func.__code__.co_filename == path


def child(path: str) -> dict:
    """In a forked child: import the released core.py and run verl's copy; what each patcher did."""
    import vllm.v1.engine as package
    from verl.utils.vllm import npu_vllm_patch

    # verl's utils imported vLLM 0.23.0's core in the parent; forget it so that the next import reads ``path``.
    del sys.modules[MODULE]
    del package.core
    FINDER.path = path
    if WITH_OURS:
        import verl_ascend_ext

        verl_ascend_ext.activate()  # registers our post-import hook on vllm.v1.engine.core (gate from the env)

    verl_log = Messages()
    logging.getLogger(npu_vllm_patch.__name__).addHandler(verl_log)
    logging.getLogger(npu_vllm_patch.__name__).setLevel(logging.INFO)
    error = None
    try:
        npu_vllm_patch.patch_vllm_glm52_partial_wake_up()
    except Exception as err:  # the scenario reports which patcher raised what
        error = f"{type(err).__name__}: {err}"
    core = sys.modules.get(MODULE)
    if core is None:
        return {"error": error, "statuses": our_statuses(), "imported": False}
    wake_up = vars(core.EngineCore)["wake_up"]
    dummy = core.DPEngineCoreProc.execute_dummy_batch
    entry = vars(core.EngineCoreProc)["run_engine_core"].__func__
    return {
        "error": error,
        "imported": True,
        "statuses": our_statuses(),
        "verl_log": [line for line in verl_log.lines if "GLM-5.2" in line],
        "wake_up_released": released(wake_up, path),
        "dummy_released": "execute_dummy_batch" not in vars(core.DPEngineCoreProc) and released(dummy, path),
        "entry": f"{entry.__module__}.{entry.__qualname__}",
        "markers": {"wake_up": getattr(wake_up, MARKER, False), "dummy": getattr(dummy, MARKER, False)},
    }


def main(paths: list[str]) -> dict:
    # verl's plugin discovery would boot ours at `import verl` below, in the parent, before the released core is
    # imported; here ours is booted in each child instead (with-ours), right before the released core is imported.
    os.environ["VERL_USE_EXTERNAL_PLUGINS"] = "none"
    sys.meta_path.insert(0, FINDER)  # before our boot: wrapt's hook finder then sits in front and sees the import
    from verl.utils.vllm import npu_vllm_patch  # noqa: F401  (verl, torch, vLLM 0.23.0: imported once, then forked)

    assert "verl_ascend_ext.runtime.boot" not in sys.modules
    with multiprocessing.get_context("fork").Pool(min(2, len(paths)), maxtasksperchild=1) as pool:
        return dict(zip(paths, pool.map(child, paths, chunksize=1), strict=True))


if __name__ == "__main__":
    assert sys.argv[1] in ("with-ours", "verl-alone"), sys.argv[1]
    WITH_OURS = sys.argv[1] == "with-ours"
    print(json.dumps(main([os.path.abspath(p) for p in sys.argv[2:]])))
