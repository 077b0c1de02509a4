"""Check a Hugging Face export against the reference checkpoint the run started from, and act per mode.

Headers and index JSON only (``shards.py``: the safetensors library, no torch, tensor data never read):
per-shard integrity, then names, shapes and dtypes against the reference (``compare.py``). Nothing in
either directory is modified; the verdict is a JSON report written beside the export directory. The
in-training check (``patch_code.py``) and ``verl-ascend export-check`` both call ``check_export``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_ascend_ext.features.checkpoint.compare import Comparison, compare
from verl_ascend_ext.features.checkpoint.conversions import Conversion
from verl_ascend_ext.features.checkpoint.mode import MODE_ENV, MODES, export_check_mode
from verl_ascend_ext.features.checkpoint.shards import (
    INDEX,
    SINGLE_FILE,
    CheckpointInputError,
    Inventory,
    read_checkpoint,
)

logger = logging.getLogger("verl_ascend_ext")

__all__ = ["MODES", "MODE_ENV", "ExportCheckError", "ExportInputError", "ExportReport", "check_export",
           "export_check_mode", "inspect_export", "report_path_for"]

REPORT_SUFFIX = ".export_check.json"
_SHOWN = 20


class ExportCheckError(RuntimeError):
    """The export fails the check (or cannot be checked); ``report`` is the report when one was made."""

    def __init__(self, message: str, report: ExportReport | None = None) -> None:
        super().__init__(message)
        self.report = report


class ExportInputError(ExportCheckError):
    """The check cannot run: a directory is absent or empty, or the reference is not a usable baseline."""


@dataclass(kw_only=True)
class ExportReport(Comparison):
    """The verdict, written as JSON beside the export (every field but ``report_path``): the comparison and more."""

    export: str
    reference: str
    model_type: str | None
    mode: str
    ok: bool
    error: str | None = None
    tensors: dict[str, int] = field(default_factory=dict)
    shards: dict[str, int] = field(default_factory=dict)
    integrity: list[str] = field(default_factory=list)
    stray_shards: list[str] = field(default_factory=list)
    plugin_status: dict[str, Any] | None = None  # the driver's record and the job summary at save time
    report_path: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "report_path"}

    def findings(self) -> list[str]:
        """One plain line per kind of failure (first names only); empty when the export passes."""
        lines = [f"integrity: {p}" for p in self.integrity[:_SHOWN]]
        if len(self.integrity) > _SHOWN:
            lines.append(f"integrity: +{len(self.integrity) - _SHOWN} more problem(s) in the report")
        if self.missing:
            lines.append(f"lacks {len(self.missing)} tensor(s) of the reference that no declared omission for "
                         f"model_type {self.model_type!r} covers: {_show(self.missing)}")
        if self.unreadable:
            lines.append(f"{len(self.unreadable)} tensor(s) of the reference are indexed in shard(s) that are absent "
                         f"or unreadable (see integrity): {_show(self.unreadable)}")
        if self.mismatched:
            rows = [f"{r['name']} ({r['reference']} in the reference, {r['export']} exported)"
                    for r in self.mismatched]
            lines.append(f"{len(rows)} tensor(s) differ in shape or dtype: {_show(rows)}")
        lines += [f"diagnosis: {d}" for d in self.diagnoses]
        return lines


def report_path_for(export: Path) -> Path:
    """Where the report goes: beside the export directory, never inside it."""
    export = export.resolve()
    return export.parent / f"{export.name}{REPORT_SUFFIX}"


def read_reference(reference: Path) -> Inventory:
    """The reference checkpoint's tensors; ExportInputError (naming the file) when it is not a usable baseline."""
    present = sorted(p.name for p in reference.glob("*.safetensors")) if reference.is_dir() else []
    if reference.is_dir() and present and not (reference / INDEX).is_file() and present != [SINGLE_FILE]:
        shown = ", ".join(present[:5]) + (f" (+{len(present) - 5} more)" if len(present) > 5 else "")
        lone = (f"{reference / present[0]} is its only file, named like one shard of a sharded checkpoint, and "
                if len(present) == 1 else f"it holds {shown} and ")
        raise ExportInputError(
            f"cannot check the export: the reference checkpoint {reference} has no {INDEX}; {lone}without the "
            f"index the full set of tensor names it defines is unknown (only a single {SINGLE_FILE} is read "
            f"without one). Fix: point the model path at a complete Hugging Face checkpoint (with its index), "
            f"or set {MODE_ENV}=warn or off to save without this check.")
    try:
        inventory = read_checkpoint(reference, "reference checkpoint")
    except CheckpointInputError as err:
        raise ExportInputError(f"cannot check the export: {err}") from None
    if inventory.problems:
        raise ExportInputError(
            f"cannot check the export: the reference checkpoint {reference} is not a usable baseline: "
            f"{'; '.join(inventory.problems[:_SHOWN])}. Fix: repair or re-download the reference checkpoint.")
    if inventory.stray_shards:
        logger.warning("verl-ascend-ext export check: %s has *.safetensors files its index does not name "
                       "(ignored): %s", reference, _show(inventory.stray_shards))
    return inventory


def inspect_export(export: str | os.PathLike[str], reference: str | os.PathLike[str], mode: str,
                   conversions: Sequence[Conversion] = ()) -> ExportReport:
    """Read both checkpoints and compare them; no side effect. ExportInputError if the check cannot run.

    ``conversions``: dtype conversions allowed besides the model family's (what the save path does).
    """
    export_dir, reference_dir = Path(export), Path(reference)
    config = _reference_config(reference_dir)
    wanted = read_reference(reference_dir)
    try:
        have = read_checkpoint(export_dir, "export")
    except CheckpointInputError as err:
        raise ExportInputError(f"cannot check the export: {err}") from None
    result = compare(wanted.tensors, have.tensors, config, have.unreadable, conversions)
    return ExportReport(
        export=str(export_dir), reference=str(reference_dir), model_type=config.get("model_type"), mode=mode,
        ok=not (have.problems or result.missing or result.mismatched),
        tensors={"export": len(have.tensors), "reference": len(wanted.tensors)},
        shards={"export": len(have.shards), "reference": len(wanted.shards)},
        integrity=have.problems, stray_shards=have.stray_shards, **vars(result),
    )


def check_export(export: str | os.PathLike[str], reference: str | os.PathLike[str], mode: str,
                 plugin_status: dict[str, Any] | None = None, conversions: Sequence[Conversion] = ()) -> ExportReport:
    """Check ``export`` against ``reference``, write the report beside the export, act per ``mode``.

    ``error``: raise ExportCheckError (ExportInputError when the check cannot run) carrying the report;
    ``warn``: log and return the report; ``off``: return a report saying so, reading nothing.
    ``plugin_status`` (``provenance.job_status``) is stored in the report as it is. ``conversions``: dtype
    conversions allowed besides the model family's (e.g. ``conversions.FSDP_MASTER_WEIGHTS``).
    """
    export_dir, reference_dir = Path(export), Path(reference)
    if mode == "off":
        return ExportReport(export=str(export_dir), reference=str(reference_dir), model_type=None, mode=mode,
                            ok=True, error=f"not checked: {MODE_ENV}=off")
    try:
        report = inspect_export(export_dir, reference_dir, mode, conversions)
    except ExportInputError as err:
        if mode == "error":
            raise
        logger.warning("%s", err)  # warn mode: a check that cannot run never stops training
        return ExportReport(export=str(export_dir), reference=str(reference_dir), model_type=None, mode=mode,
                            ok=False, error=str(err), plugin_status=plugin_status)
    report.plugin_status = plugin_status
    path = report_path_for(export_dir)
    try:
        path.write_text(json.dumps(report.as_dict(), indent=1) + "\n")
        report.report_path = str(path)
    except OSError as err:
        logger.warning("verl-ascend-ext export check: report not written (%s): %s", path, err)
    _log_notes(report)
    if not report.ok:
        message = (f"verl-ascend-ext export check: the Hugging Face export {export_dir} does not match the "
                   f"reference checkpoint {reference_dir}:\n  - " + "\n  - ".join(report.findings()) +
                   f"\nThe exported files were left as written; report: {report.report_path or 'not written'}.")
        if mode == "error":
            raise ExportCheckError(
                f"{message} Fix: find why the export differs (a rank killed mid-save, a bridge that did not merge "
                f"or dropped tensors), or declare the omission or conversion in verl_ascend_ext/features/checkpoint/"
                f"omissions.py or conversions.py if the model really stores it so, or set {MODE_ENV}=warn to save "
                f"anyway.", report)
        logger.warning("%s", message)
    return report


def _log_notes(report: ExportReport) -> None:
    if report.stray_shards:
        logger.warning("verl-ascend-ext export check: %s has *.safetensors files its index does not name (left from "
                       "an earlier save? not counted): %s", report.export, _show(report.stray_shards))
    if report.extra:
        logger.warning("verl-ascend-ext export check: %d tensor(s) in %s are not in the reference %s: %s",
                       len(report.extra), report.export, report.reference, _show(report.extra))
    if report.omitted:
        logger.info("verl-ascend-ext export check: %d tensor(s) omitted as declared (%s)", len(report.omitted),
                    "; ".join(report.declared_omissions))
    for description, count in report.converted.items():
        logger.info("verl-ascend-ext export check: %d tensor(s) converted as declared (%s)", count, description)


def _reference_config(reference: Path) -> dict[str, Any]:
    config_file = reference / "config.json"
    if not config_file.is_file():
        return {}
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as err:
        raise ExportInputError(f"cannot check the export: {config_file} is not readable JSON: {err}") from err
    if not isinstance(config, dict):
        raise ExportInputError(f"cannot check the export: {config_file} is not a JSON object")
    return config


def _show(names: list[str]) -> str:
    more = f" (+{len(names) - _SHOWN} more)" if len(names) > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more
