"""The processes of the contract suite: ``python -m verl_ascend_ext.testing.child JOBS.json`` prints one JSON list.

One interpreter serves many jobs, of one or several releases (ddtrace-style shared starts): it imports the
``warm`` modules once (the third-party packages the targets import: torch, ray, ...), then forks one child per
job, so each job starts from a fresh plugin and fresh target modules at the cost of a fork. After a job that
imported a release for real, the interpreter also imports the third-party modules that job loaded (never a
module of the release or of this package), so the next jobs fork with them already loaded. A job is one of:

- ``scenario``: set the job's environment, make the release importable (``real``: its tree first on
  ``sys.path``; ``standin``: its definitions, ``standin.install``), boot the plugin as production does
  (``verl``: ``import verl``, i.e. verl's own plugin discovery; ``vllm``: the ``vllm.general_plugins`` entry
  point), import every target module of the job's records, and report each record's in-process status and
  its target's state (layers of our replacement, our markers set on upstream code, where the live definition
  is). A refusal that stops the process (a target imported during ``import verl``: SystemExit) or raises on
  import is reported, not fatal. With ``again``, boot once more through every loader and apply each record
  again, and report the state once more.
- ``doctor``: the release tree first on ``sys.path`` (and, for ``standin``, its stand-in finder first on
  ``sys.meta_path``, so that a tree holding only some files of a package is the one found, not an installed
  copy), doctor's report (``tooling.doctor.build_report``) for the job's environment; the rows of the job's
  records.
- ``mutant``: ``doctor``, then ``scenario``, in one process (doctor imports no target).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from typing import Any

OUT_FD_ENV = "VERL_ASCEND_EXT_TESTING_RESULT"


def _state(record: Any) -> dict[str, Any]:
    """The target's state in this process: imported, layers of our replacement, markers, the live definition."""
    from verl_ascend_ext.patching.record import Action
    from verl_ascend_ext.patching.replacement import MARKER
    from verl_ascend_ext.patching.source import definition_of_object

    module = sys.modules.get(record.module)
    if module is None:
        return {"imported": False}
    if record.action == Action.IMPORT:
        return {"imported": True, "layers": int(record.wrapper in sys.modules), "markers": [], "where": ""}
    owner: Any = module
    *parents, name = record.qualname.split(".")
    try:
        for part in parents:
            owner = getattr(owner, part)
        if isinstance(owner, type):
            raw = next(vars(k)[name] for k in owner.__mro__ if name in vars(k))
        else:
            raw = getattr(owner, name)
    except (AttributeError, StopIteration):
        return {"imported": True, "defined": False, "layers": 0, "markers": [], "where": ""}
    func = getattr(raw, "__func__", raw)
    layers, inner = 0, func
    while getattr(inner, MARKER, None) is not None:
        layers += 1
        wrapped = getattr(inner, "__wrapped__", None)
        if wrapped is None:  # a staticmethod replacement: the original is kept by the engine
            from verl_ascend_ext.patching import engine

            kept = engine.original(record.id)
            wrapped = getattr(kept, "__func__", kept)
        if wrapped is None:
            break
        inner = wrapped
    markers = [m for m in record.exposes_markers if m in getattr(inner, "__dict__", {})]
    found = definition_of_object(inner)
    return {"imported": True, "defined": True, "layers": layers, "markers": markers,
            "where": found.where if found else ""}


def _statuses(records: list[Any]) -> dict[str, Any]:
    from verl_ascend_ext.patching.status import statuses

    known = statuses()
    out = {}
    for record in records:
        status = known.get(record.id)
        out[record.id] = {"status": status.status.value if status else None,
                          "detail": status.detail if status else "", **_state(record)}
    return out


def _boot(how: str) -> str | None:
    """Boot the plugin as production does; the stopping message if it stopped the process or refused."""
    from verl_ascend_ext.patching.errors import PatchRefusedError

    try:
        if how == "verl":
            importlib.import_module("verl")
        elif how == "vllm":
            from verl_ascend_ext.runtime.boot import vllm_plugin

            vllm_plugin()
        else:
            from verl_ascend_ext.runtime.boot import activate

            activate("api")
    except SystemExit as stop:  # verl's loader: the plugin stops the process on a refusal at discovery
        return f"SystemExit: {stop}"
    except PatchRefusedError as err:
        return f"PatchRefusedError: {err}"
    return None


def scenario(job: dict[str, Any]) -> dict[str, Any]:
    from verl_ascend_ext.patching.errors import PatchRefusedError
    from verl_ascend_ext.runtime.registry import registry

    sys.path.insert(0, job["root"])  # real: its modules; both: its .dist-info (the version the engine reports)
    importlib.invalidate_caches()
    for call in job.get("prepare", ()):  # e.g. a test double of an NPU-only module the patch code imports
        module, _, function = call.partition(":")
        getattr(importlib.import_module(module), function)()
    if job["mode"] == "standin":
        _stand_in(job["root"])
    records = [registry().record(i) for i in job["records"]]
    out: dict[str, Any] = {"boot": _boot(job["boot"]), "imports": {}}
    for module in dict.fromkeys(r.module for r in records):
        try:
            importlib.import_module(module)
            out["imports"][module] = None
        except (PatchRefusedError, SystemExit) as err:
            out["imports"][module] = f"{type(err).__name__}: {err}"
        except Exception as err:  # reported: the test shows it, naming the module
            out["imports"][module] = f"{type(err).__name__}: {err}"
    out["records"] = _statuses(records)
    if job.get("again"):
        from verl_ascend_ext.patching import engine
        from verl_ascend_ext.patching.record import OFF, Status
        from verl_ascend_ext.runtime import boot

        boot.activate("api")
        boot.activate("verl")
        boot.vllm_plugin()
        for record in records:
            known = out["records"][record.id]["status"]
            if known not in {s.value for s in OFF} and known != Status.REFUSED.value and \
                    record.module in sys.modules:
                engine.apply(record)
        out["again"] = _statuses(records)
    return out


def _stand_in(root: str) -> None:
    """The release at ``root`` served as its released definitions (``standin``), once per process."""
    from pathlib import Path

    from verl_ascend_ext.testing.standin import StandIn, install

    if not any(isinstance(f, StandIn) and f.root == Path(root) for f in sys.meta_path):
        install(root)


def doctor(job: dict[str, Any]) -> dict[str, Any]:
    sys.path.insert(0, job["root"])
    importlib.invalidate_caches()
    if job.get("mode") == "standin":
        _stand_in(job["root"])
    from verl_ascend_ext.tooling.doctor import build_report

    report, code = build_report(job["env"])
    rows = {p["id"]: p for p in report["patches"] if p["id"] in job["records"]}
    return {"code": code, "records": rows}


def mutant(job: dict[str, Any]) -> dict[str, Any]:
    """Doctor's report first (it imports no target), then the in-process scenario, in one process."""
    return {"doctor": doctor(job), "live": scenario(job)}


def _run(job: dict[str, Any]) -> dict[str, Any]:
    os.environ.update(job.get("env", {}))
    for name in job.get("unset", ()):
        os.environ.pop(name, None)
    return {"scenario": scenario, "doctor": doctor, "mutant": mutant}[job["kind"]](job)


def _loaded_since(before: set[str], job: dict[str, Any]) -> list[str]:
    """Modules this job process loaded, in import order, but those of the release and of this package."""
    from pathlib import Path

    root = Path(job["root"])
    own = {p.name for p in root.iterdir()} | {"verl_ascend_ext", "__main__"}
    out = []
    for name, module in list(sys.modules.items()):
        if name in before or name.split(".")[0] in own:
            continue
        file = getattr(module, "__file__", None) or ""
        if file and Path(file).is_relative_to(root):
            continue
        out.append(name)
    return out


def _fork(job: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the job's own process
        os.close(read)
        before = set(sys.modules)
        try:
            result = _run(job)
            if job.get("mode") == "real":
                result["loaded"] = _loaded_since(before, job)
        except BaseException:
            result = {"crash": traceback.format_exc()}
        with os.fdopen(write, "w") as out:
            json.dump(result, out)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as got:
        data = got.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        return {"crash": f"job process ended without a result (wait status {status})"}
    return {**json.loads(data), "seconds": round(time.monotonic() - started, 3)}


def _warm(names: list[str], warmed: dict[str, bool]) -> None:
    for name in names:
        if name in sys.modules or name in warmed:
            continue
        try:
            importlib.import_module(name)
            warmed[name] = True
        except Exception:  # a warm-up only saves time; the job imports what it needs itself (and reports it)
            warmed[name] = False


def main(argv: list[str]) -> int:
    with open(argv[0], encoding="utf-8") as f:
        spec = json.load(f)
    sys.path.extend(spec.get("path", ()))
    warmed: dict[str, bool] = {}
    started = time.monotonic()
    _warm(spec.get("warm", []), warmed)
    warm_seconds = time.monotonic() - started
    results = []
    for job in spec["jobs"]:
        result = _fork(job)
        learned = result.pop("loaded", [])
        started = time.monotonic()
        _warm(learned, warmed)
        warm_seconds += time.monotonic() - started
        results.append({"id": job["id"], **result})
    print(json.dumps({"warmed": sum(warmed.values()), "not_warmed": sorted(n for n, ok in warmed.items() if not ok),
                      "warm_seconds": round(warm_seconds, 3), "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
