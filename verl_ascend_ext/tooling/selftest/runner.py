"""Running the selftest: every record a check covers, in every mode, with the released code and with the fix.

Per record: the check's cases are built with the released code, the record is applied by the engine, the cases are
built again (the fix), and the record is unpatched at the end. Eagerly, every case and variant runs alone. For each
compile backend, all traced records' cases, released and fixed, run in ONE compiled function (one full graph, as
the recipe compiles the whole decoder; one compile per backend keeps the CPU run under two minutes) and that same
function is captured as a device graph and replayed with new inputs; when a batch fails to compile or capture, it
is split by record and then by variant, so the failure is pinned on what causes it.

A line per (record, mode): ``holds`` (the fix matches the intended maths on every case), ``FAILS`` (max error and
where), ``not run`` (why: no device graphs on CPU, the record is not in the vLLM-Ascend at hand, ...) or ``could not
run`` (the harness failed, e.g. an import or an API this stack lacks: a fault of the check, not of the fix; also when
the released code fails the same way as the fix). Exit 1 when a fix fails, else 2 when something could not run or
nothing was checked, else 0.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_ascend_ext.patching.errors import PatchRefusedError
from verl_ascend_ext.patching.record import PatchRecord, Status

HOLDS, FAILS, NOT_RUN, COULD_NOT_RUN = "holds", "FAILS", "not run", "could not run"
RELEASED, FIXED = "released", "fixed"
RAISED = "raised "
VARIANTS = (RELEASED, FIXED)


class SelectionError(ValueError):
    """``--only`` named a record id no installed feature declares."""


@dataclass
class Line:
    record: str
    mode: str
    status: str
    detail: str
    where: str = ""
    max_error: float | None = None
    cases: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"record": self.record, "mode": self.mode, "status": self.status, "detail": self.detail,
                "where": self.where, "max_error": self.max_error, "cases": self.cases}


@dataclass
class Unit:
    record: PatchRecord
    check: Any
    cases: list[Any]
    applied: bool = False


def selected_records(only: Sequence[str] | None) -> list[PatchRecord]:
    from verl_ascend_ext.runtime.registry import registry

    records = list(registry().records)
    if not only:
        return records
    known = {r.id for r in records}
    unknown = [i for i in only if i not in known]
    if unknown:
        raise SelectionError(f"--only: no installed feature declares {', '.join(unknown)}; known ids: "
                             f"{', '.join(sorted(known))}")
    return [r for r in records if r.id in set(only)]


def _short(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:300] if text else ''}".rstrip(": ")


def _origin(err: BaseException) -> str:
    """The innermost frame of the traceback, to say where a harness failure happened."""
    frames = traceback.extract_tb(err.__traceback__)
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def run(device_name: str = "auto", only: Sequence[str] | None = None, source: str | None = None) -> dict[str, Any]:
    """The selftest report (a JSON-able dict with ``exit_code``)."""
    from verl_ascend_ext.tooling.selftest import devices, stacks

    started = time.time()
    report: dict[str, Any] = {"schema": 1, "host": socket.gethostname(), "pid": os.getpid(), "started": started,
                              "requested_device": device_name, "device": None, "double": None, "stack": None,
                              "lines": [], "not_numeric": [], "errors": [], "exit_code": 2}
    try:
        records = selected_records(only)
    except SelectionError as err:
        report["errors"].append(str(err))
        return _finish(report, started)
    try:
        device = devices.pick(device_name)
    except devices.DeviceUnavailable as err:
        report["errors"].append(f"could not run: {err}")
        return _finish(report, started)
    report["device"], report["double"] = device.description, device.double
    from verl_ascend_ext.tooling.selftest.checks import check_for

    covered = [(r, check_for(r)) for r in records]
    report["not_numeric"] = [r.id for r, c in covered if c is None and not r.traced]
    lines: list[Line] = [Line(r.id, "all", NOT_RUN, "no selftest check covers this traced record yet")
                         for r, c in covered if c is None and r.traced]
    covered = [(r, c) for r, c in covered if c is not None]
    if not covered and not lines:
        report["errors"].append("nothing to check: no selected patch has a numeric check (their fixes change no "
                                f"numbers: {', '.join(report['not_numeric'])})")
        return _finish(report, started)
    stack: Any = None
    scratch = Path(tempfile.mkdtemp(prefix="verl-ascend-selftest-src-"))
    try:
        if device.double:
            try:
                tree = stacks.find_source(source, scratch)
            except stacks.HarnessError as err:
                report["errors"].append(f"could not run: {err}")
                return _finish(report, started, lines)
            if tree is None:
                lines += [Line(r.id, "all", NOT_RUN, stacks.describe_missing_source()) for r, _ in covered]
                report["stack"] = "none"
                return _finish(report, started, lines)
            stack = stacks.ReleasedStack(device, tree)
        else:
            if source:
                report["errors"].append("could not run: --vllm-ascend-source is for the test double (CPU, CUDA); on "
                                        "an NPU the installed vLLM-Ascend is checked")
                return _finish(report, started, lines)
            stack = stacks.InstalledStack(device)
            try:
                device.backends = {"AscendCompiler": stack.ascend_backend()}
            except Exception as err:  # the compile modes then report it; eager still runs
                report["errors"].append(f"the recipe's compiler could not be built on this stack: {_short(err)}"
                                        f"{_origin(err)}")
        report["stack"] = stack.description
        report["timings"] = {"start (imports, device, code)": round(time.time() - started, 2)}
        lines += _run_units(stack, device, covered, report)
    finally:
        if stack is not None:
            stack.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return _finish(report, started, lines)


def _run_units(stack: Any, device: Any, covered: list[tuple[PatchRecord, Any]], report: dict[str, Any]) -> list[Line]:
    from verl_ascend_ext.patching import engine

    modes = device.modes()
    lines: list[Line] = []
    units: list[Unit] = []
    results: dict[tuple[str, str, str, str], Any] = {}  # (record, case, variant, mode) -> outputs | exception
    timings = report.setdefault("timings", {})  # seconds per phase, to see where the time goes
    clock = time.monotonic()

    def lap(phase: str) -> None:
        nonlocal clock
        now = time.monotonic()
        timings[phase] = round(now - clock, 2)
        clock = now

    try:
        for record, check in covered:
            unit = _prepare(stack, record, check, modes, lines)
            if unit is not None:
                units.append(unit)
        import torch

        lap("build and apply")
        with stack.indexer_kernel_probe():
            for unit in units:
                # traced code runs under inference mode, as vLLM's model runner calls the forward; weight loading
                # (eager-only records) under no_grad, as vLLM's loader does
                grad_mode = torch.inference_mode if _traced(unit) else torch.no_grad
                for case in unit.cases:
                    for variant in VARIANTS:
                        with grad_mode():
                            results[(unit.record.id, case.name, variant, "eager")] = _eager(case, variant, device)
            lap("eager")
            traced = [u for u in units if _traced(u)]
            for backend_name, backend in device.backends.items():
                with torch.inference_mode():
                    compiled, graphed = _run_backend(traced, device, backend)
                for key, value in compiled.items():
                    results[(*key, f"compiled[{backend_name}]")] = value
                for key, value in graphed.items():
                    results[(*key, f"graph[{backend_name}]")] = value
                lap(f"compiled and graph[{backend_name}]")
        for unit in units:
            lines += _judge_unit(unit, modes, device, results, report)
    finally:
        for unit in units:
            if unit.applied:
                engine.unpatch(unit.record.id)
    return lines


def _traced(unit: Unit) -> bool:
    return bool(unit.check.traced and unit.record.traced)


def _prepare(stack: Any, record: PatchRecord, check: Any, modes: list[Any], lines: list[Line]) -> Unit | None:
    """Cases built with the released code, the record applied, cases built with the fix; or lines saying why not."""
    def all_modes(status: str, detail: str) -> None:
        lines.append(Line(record.id, "all", status, detail))

    from verl_ascend_ext.tooling.selftest.stacks import HarnessError, NotRunError

    try:
        cases = check.cases(stack, record)
        check.build(stack, record, RELEASED, cases)
    except NotRunError as err:
        all_modes(NOT_RUN, str(err))
        return None
    except (HarnessError, Exception) as err:
        all_modes(COULD_NOT_RUN, f"building the released code failed: {_short(err)}{_origin(err)}")
        return None
    try:
        status = stack.apply(record)
    except PatchRefusedError as err:
        all_modes(NOT_RUN, f"the engine refuses this record on the vLLM-Ascend at hand: {_short(err)}")
        return None
    unit = Unit(record, check, cases)
    if status.status is not Status.APPLIED:
        all_modes(NOT_RUN, f"the record is {status.status.value} here ({status.detail}): no fix of ours to check")
        return None
    unit.applied = True
    try:
        check.build(stack, record, FIXED, cases)
    except Exception as err:
        from verl_ascend_ext.patching import engine

        engine.unpatch(record.id)
        all_modes(COULD_NOT_RUN, f"building the fixed code failed: {_short(err)}{_origin(err)}")
        return None
    return unit


def _eager(case: Any, variant: str, device: Any) -> Any:
    try:
        out = case.calls[variant](*case.inputs)
        device.synchronize()
        return out
    except Exception as err:
        return err


def _run_backend(units: list[Unit], device: Any, backend: Any) -> tuple[dict[Any, Any], dict[Any, Any]]:
    """Compiled and captured-graph results of every (record, case, variant) of ``units``, split on failure."""
    groups = [(u, v) for u in units for v in VARIANTS]
    compiled: dict[Any, Any] = {}
    graphed: dict[Any, Any] = {}
    if groups:
        _run_group(groups, device, backend, compiled, graphed)
    return compiled, graphed


def _keys(group: list[tuple[Unit, str]]) -> list[tuple[tuple[str, str, str], Any]]:
    return [((u.record.id, c.name, v), c) for u, v in group for c in u.cases]


def _batch(entries: list[tuple[Any, Any]], variant_of: Callable[[Any], str]) -> Callable[..., tuple[Any, ...]]:
    spans = [(case.calls[variant_of(key)], len(case.inputs)) for key, case in entries]

    def batch(*flat: Any) -> tuple[Any, ...]:
        outs = []
        start = 0
        for call, n in spans:
            outs.append(call(*flat[start:start + n]))
            start += n
        return tuple(outs)

    return batch


def _run_group(group: list[tuple[Unit, str]], device: Any, backend: Any, compiled: dict[Any, Any],
               graphed: dict[Any, Any]) -> None:
    from verl_ascend_ext.tooling.selftest.devices import capture_and_replay, compile_fn

    entries = _keys(group)
    fn = _batch(entries, lambda key: key[2])
    inputs = [t for _, case in entries for t in case.inputs]
    replay = [t for _, case in entries for t in case.replay_inputs]
    try:
        cf = compile_fn(fn, backend)
        outs = cf(*inputs)
        device.synchronize()
    except Exception as err:
        if _split(group, device, backend, compiled, graphed):
            return
        for key, _ in entries:
            compiled[key] = graphed[key] = err
        return
    for (key, _), out in zip(entries, outs, strict=True):
        compiled[key] = out
    if device.graph_api is None:
        return
    try:
        outs = capture_and_replay(device, cf, inputs, replay)
    except Exception as err:
        if len(group) > 1:
            sub_compiled: dict[Any, Any] = {}
            for part in _parts(group):
                _run_group(part, device, backend, sub_compiled, graphed)
            return
        for key, _ in entries:
            graphed[key] = err
        return
    for (key, _), out in zip(entries, outs, strict=True):
        graphed[key] = out


def _parts(group: list[tuple[Unit, str]]) -> list[list[tuple[Unit, str]]]:
    """A failing group split by record, then (one record) by variant; [] when it is one (record, variant)."""
    records = list(dict.fromkeys(u.record.id for u, _ in group))
    if len(records) > 1:
        return [[(u, v) for u, v in group if u.record.id == rid] for rid in records]
    if len(group) > 1:
        return [[item] for item in group]
    return []


def _split(group: list[tuple[Unit, str]], device: Any, backend: Any, compiled: dict[Any, Any],
           graphed: dict[Any, Any]) -> bool:
    parts = _parts(group)
    for part in parts:
        _run_group(part, device, backend, compiled, graphed)
    return bool(parts)


def _judge_unit(unit: Unit, modes: list[Any], device: Any, results: dict[Any, Any], report: dict[str, Any]
                ) -> list[Line]:
    from verl_ascend_ext.tooling.selftest.devices import COMPILED, EAGER, GRAPH

    lines = []
    rid = unit.record.id
    for mode in modes:
        if mode.kind != EAGER and not _traced(unit):
            continue
        if mode.kind == GRAPH and device.graph_api is None:
            continue
        lines.append(_judge(unit, mode.name, mode.kind == GRAPH, results))
    if not _traced(unit):
        lines.append(Line(rid, "compiled, graph", NOT_RUN, "runs once after weight loading, outside the model "
                          "forward: eager only (record traced=False)"))
    elif device.graph_api is None:
        lines.append(Line(rid, "graph", NOT_RUN, f"no device graphs on {device.kind.upper()}"))
    if not device.backends and _traced(unit):
        why = next((e for e in report["errors"] if "compiler" in e), "no compile backend")
        lines.append(Line(rid, f"{COMPILED}, {GRAPH}", COULD_NOT_RUN, why))
    return lines


def _judge(unit: Unit, mode: str, replayed: bool, results: dict[Any, Any]) -> Line:
    from verl_ascend_ext.tooling.selftest.compare import failed_run, judge

    rid = unit.record.id
    cases_out = []
    fails, harness, notes = [], [], []
    worst_fixed = 0.0
    for case in unit.cases:
        host = [t.detach().cpu() for t in (case.replay_inputs if replayed else case.inputs)]
        reference = case.reference(host)
        bug = case.bug(host) if case.bug is not None else None
        got: dict[str, Any] = {}
        for variant in VARIANTS:
            out = results.get((rid, case.name, variant, mode))
            if isinstance(out, BaseException):
                expected = variant == RELEASED and isinstance(out, case.expected_errors)
                got[variant] = failed_run(("the bug: " if expected else RAISED) + _short(out))
            elif out is None:
                got[variant] = failed_run(RAISED + "nothing: this mode did not run")
            else:
                got[variant] = judge(out, reference, bug, case.dtype)
        fixed, released = got[FIXED], got[RELEASED]
        fixed_raised, released_raised = fixed.problem.startswith(RAISED), released.problem.startswith(RAISED)
        entry = {"case": case.name, "fixed": fixed.as_dict(), "released": released.as_dict(),
                 "runs": dict(case.runs), "bug_expected": case.bites}
        cases_out.append(entry)
        if fixed_raised and released_raised:
            harness.append(f"{case.name}: the released code {released.problem} too; the fix {fixed.problem}")
            continue
        if not fixed.matches:
            fails.append((case, fixed))
            continue
        worst_fixed = max(worst_fixed, fixed.max_error)
        if case.bites and released.matches:
            notes.append(f"{case.name}: the released code matches here too (the bug does not show on this stack)")
        elif not case.bites and not released.matches:
            notes.append(f"{case.name}: the released code differs here although the fix should change nothing")
    if harness:
        return Line(rid, mode, COULD_NOT_RUN, "; ".join(harness), cases=cases_out)
    if fails:
        case, j = max(fails, key=lambda f: f[1].max_error)
        if j.problem:
            detail = f"{case.name}: {j.problem}"
        elif not j.within:
            detail = (f"{case.name}: max error {j.max_error:.4g} at {j.where}, outside the {_dtype(case.dtype)} "
                      "tolerance")
        else:
            detail = (f"{case.name}: max error {j.max_error:.4g} at {j.where} is inside the {_dtype(case.dtype)} "
                      f"tolerance, but the output follows the released maths (mean error {j.mean_error:.3g} to the "
                      f"intended maths vs {j.mean_error_to_bug:.3g} to the released maths)")
        detail += f"; runs {case.runs.get(FIXED, '?')}"
        more = f" (and {len(fails) - 1} more case(s))" if len(fails) > 1 else ""
        return Line(rid, mode, FAILS, detail + more, where=f"{case.name}: {j.where}", max_error=j.max_error,
                    cases=cases_out)
    moved = [c for c in cases_out if c["bug_expected"] and not c["released"]["matches"]]
    detail = (f"{len(unit.cases)} case(s) match the intended maths (max error {worst_fixed:.3g}, "
              f"{_dtype(unit.cases[0].dtype)} tolerance)")
    if moved:
        detail += "; the released code does not (" + "; ".join(_released_summary(c) for c in moved) + ")"
    if notes:
        detail += "; " + "; ".join(notes)
    return Line(rid, mode, HOLDS, detail, max_error=worst_fixed, cases=cases_out)


def _released_summary(entry: dict[str, Any]) -> str:
    r = entry["released"]
    if r["problem"]:
        return f"{entry['case']}: {r['problem']}"
    if not r["within_tolerance"]:
        return f"{entry['case']}: max error {r['max_error']:.3g}"
    return (f"{entry['case']}: closer to the released maths, mean error {r['mean_error']:.3g} vs "
            f"{r['mean_error_to_bug']:.3g}")


def _dtype(dtype: Any) -> str:
    from verl_ascend_ext.tooling.selftest.compare import rtol

    return f"{str(dtype).removeprefix('torch.')} (rtol {rtol(dtype):g})"


def _finish(report: dict[str, Any], started: float, lines: list[Line] | None = None) -> dict[str, Any]:
    lines = lines or []
    report["lines"] = [line.as_dict() for line in lines]
    statuses = [line.status for line in lines]
    counts = {s: statuses.count(s) for s in (HOLDS, FAILS, NOT_RUN, COULD_NOT_RUN)}
    report["counts"] = counts
    if counts[FAILS]:
        code = 1
    elif counts[COULD_NOT_RUN] or report["errors"] or not counts[HOLDS]:
        code = 2
    else:
        code = 0
    report["exit_code"] = code
    report["seconds"] = round(time.time() - started, 1)
    return report
