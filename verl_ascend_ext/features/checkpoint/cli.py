"""The ``verl-ascend export-check EXPORT_DIR --reference REF_DIR [--json]`` subcommand, for exports made before.

Runs the in-training check's own ``check_export`` with the mode of ``VERL_ASCEND_EXT_EXPORT_CHECK``
and writes the same report beside the export. Exit 0 when the export passes (or the mode is ``warn``
or ``off``), 1 when it fails in ``error`` mode, 2 when the check cannot run (any mode) or the mode is
invalid. Imports neither torch nor verl; the check's modules (safetensors) load only when it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from verl_ascend_ext.features.checkpoint.mode import MODE_ENV, export_check_mode
from verl_ascend_ext.patching.gates import GateValueError

if TYPE_CHECKING:
    from verl_ascend_ext.features.checkpoint.export_check import ExportReport


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "export-check", help="check a Hugging Face export against its reference checkpoint",
        description="Check the safetensors headers of EXPORT_DIR (integrity of every shard, the index) and its "
                    "tensor names, shapes and dtypes against REF_DIR, allowing only the model family's declared "
                    f"omissions and conversions. Mode: {MODE_ENV}=error|warn|off (default error). Exit 1 when the "
                    "export fails in error mode, 2 when the check cannot run. Tensor data is never read; nothing "
                    "is modified; the report is written beside EXPORT_DIR.")
    parser.add_argument("export", metavar="EXPORT_DIR", help="the exported Hugging Face checkpoint directory")
    parser.add_argument("--reference", metavar="REF_DIR", required=True,
                        help="the checkpoint the run started from (its index, or a single model.safetensors)")
    parser.add_argument("--fsdp", action="store_true",
                        help="the export was written by verl's FSDP save: F32 tensors of a BF16/F16 reference "
                             "(the actor's FP32 master weights) are accepted as a lossless widening")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")


def run(args: argparse.Namespace) -> int:
    from verl_ascend_ext.features.checkpoint.conversions import FSDP_MASTER_WEIGHTS
    from verl_ascend_ext.features.checkpoint.export_check import (
        ExportCheckError,
        ExportInputError,
        ExportReport,
        check_export,
    )

    try:
        mode = export_check_mode()
    except GateValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        conversions = (FSDP_MASTER_WEIGHTS,) if args.fsdp else ()
        report = check_export(args.export, args.reference, mode, conversions=conversions)
        code = 2 if report.error and not report.ok else 0  # warn mode: a check that could not run
    except ExportInputError as err:
        report, code = ExportReport(export=args.export, reference=args.reference, model_type=None, mode=mode,
                                    ok=False, error=str(err)), 2
    except ExportCheckError as err:
        if err.report is None:
            raise
        report, code = err.report, 1
    if args.json:
        print(json.dumps({**report.as_dict(), "report_path": report.report_path, "exit_code": code}, indent=1))
    else:
        print(_text(report), file=sys.stderr if code == 2 else sys.stdout)
    return code


def _text(report: ExportReport) -> str:
    if report.error:
        return f"export check ({MODE_ENV}={report.mode}): {report.error}"
    verdict = "OK" if report.ok else ("FAILED" if report.mode == "error" else "FAILED (warn mode: not an error)")
    lines = [f"export check ({MODE_ENV}={report.mode}): {verdict}",
             f"  export    {report.export}: {report.tensors.get('export', 0)} tensors in "
             f"{report.shards.get('export', 0)} shard(s)",
             f"  reference {report.reference}: {report.tensors.get('reference', 0)} tensors in "
             f"{report.shards.get('reference', 0)} shard(s), model_type {report.model_type!r}"]
    lines += [f"  - {line}" for line in report.findings()]
    if report.omitted:
        lines.append(f"  omitted as declared: {len(report.omitted)} tensor(s)")
    lines += [f"  converted as declared: {count} tensor(s) ({what})" for what, count in report.converted.items()]
    if report.extra:
        lines.append(f"  not in the reference (allowed): {len(report.extra)} tensor(s), e.g. {report.extra[0]}")
    if report.stray_shards:
        lines.append(f"  files the export's index does not name (ignored): {', '.join(report.stray_shards)}")
    lines.append(f"  report: {report.report_path or 'not written'}")
    return "\n".join(lines)
