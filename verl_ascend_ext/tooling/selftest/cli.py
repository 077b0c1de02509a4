"""``verl-ascend selftest [--json] [--device auto|npu|cuda|cpu] [--only ID,...] [--vllm-ascend-source PATH]``.

Runs the checks in this process, prints one line per record and mode (text) or one JSON object, stores the result
for ``status`` and ``doctor`` and exits 0 (all hold), 1 (a fix fails) or 2 (could not run, or nothing checked).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

from verl_ascend_ext.tooling.selftest import DEVICES
from verl_ascend_ext.tooling.selftest import DOUBLE_LABEL as LABEL

ENDINGS = {0: "ALL HOLD (exit 0)", 1: "A FIX FAILS (exit 1)", 2: "COULD NOT RUN (exit 2)"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="where to run (default auto: an NPU, else a CUDA GPU, else the CPU; off an NPU the "
                             "checks run on the NPU test double)")
    parser.add_argument("--only", metavar="ID,...", help="only these patch ids (from `verl-ascend doctor`)")
    parser.add_argument("--vllm-ascend-source", metavar="PATH",
                        help="off an NPU: the released vLLM-Ascend to read (a wheel, sdist or source directory); "
                             "default: the installed vllm-ascend distribution's files")
    parser.add_argument("--no-store", action="store_true", help="do not store the result for status/doctor")


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "selftest", help="check on this node that each numeric fix holds eagerly, compiled and in device graphs",
        description="For every patch whose fix changes numbers, build the patched vLLM-Ascend code as vLLM builds "
                    "it, run it eagerly, compiled as the GLM-5.2 recipe compiles it and captured as a device graph, "
                    "with the fix and with the released code, and compare with a float64 CPU reference. Exit 0 all "
                    "hold, 1 a fix fails, 2 could not run.")
    add_arguments(parser)


def format_report(report: dict[str, Any]) -> str:
    double = bool(report.get("double"))
    label = f"  [{LABEL}]" if double else ""
    out = [f"verl-ascend selftest on {report.get('device') or report['requested_device']}",
           f"  code: {report.get('stack') or 'none'}", ""]
    width = max((len(line["record"]) for line in report["lines"]), default=0)
    mode_width = max((len(line["mode"]) for line in report["lines"]), default=0)
    for line in report["lines"]:
        out.append(f"{line['record']:<{width}}  {line['mode']:<{mode_width}}  {line['status']}: {line['detail']}"
                   f"{label}")
    if report["not_numeric"]:
        out += ["", "Not checked here (their fix changes no numbers; see docs/selftest.md): "
                + ", ".join(report["not_numeric"])]
    for err in report["errors"]:
        out += ["", f"error: {err}"]
    counts = report.get("counts") or {}
    out += ["", ", ".join(f"{counts.get(k, 0)} {k}" for k in ("holds", "FAILS", "not run", "could not run"))
            + f" in {report.get('seconds', 0)} s"
            + (" (" + ", ".join(f"{k} {v} s" for k, v in report["timings"].items()) + ")" if report.get("timings")
               else "")]
    if report.get("stored"):
        out.append(f"stored: {report['stored']}")
    elif report.get("not_stored"):
        out.append(f"result {report['not_stored']}")
    out.append(ENDINGS[report["exit_code"]] + (f"  [{LABEL}]" if double else ""))
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    from verl_ascend_ext.tooling.selftest import runner, store

    only = [i.strip() for i in args.only.split(",") if i.strip()] if args.only else None
    try:
        with contextlib.redirect_stdout(sys.stderr):  # what torch or vLLM print must not mix into --json
            report = runner.run(args.device, only, args.vllm_ascend_source)
    except Exception as err:  # a harness failure is "could not run", never a pass or a failure of a fix
        report = {"schema": 1, "requested_device": args.device, "lines": [], "not_numeric": [], "counts": {},
                  "errors": [f"could not run: {type(err).__name__}: {err}"], "exit_code": 2}
    if not args.no_store and report.get("device"):
        path, why = store.save(report)
        report["stored"], report["not_stored"] = path, why
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return int(report["exit_code"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="verl-ascend selftest")
    add_arguments(parser)
    return run(parser.parse_args(argv))
