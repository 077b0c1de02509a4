"""Compare the tensor names of a Hugging Face export with the reference checkpoint the run started from.

Pure file reading (safetensors headers and index JSON; no torch, no safetensors package): the export
is never modified. The verdict is written as a small JSON report beside the export directory.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..patching.gates import GateValueError
from .omissions import omissions_for

logger = logging.getLogger("verl_ascend_ext")

MODE_ENV = "VERL_ASCEND_EXT_EXPORT_CHECK"
MODES = ("error", "warn", "off")
DEFAULT_MODE = "error"
INDEX = "model.safetensors.index.json"
REPORT_SUFFIX = ".export_check.json"
_SHOWN = 20


class ExportCheckError(RuntimeError):
    """The export lacks tensors of the reference that no declared omission covers (or cannot be checked)."""


def export_check_mode(environ: Mapping[str, str] | None = None) -> str:
    """``VERL_ASCEND_EXT_EXPORT_CHECK`` (error|warn|off, default error); raise naming the variable on a bad value."""
    env = os.environ if environ is None else environ
    raw = env.get(MODE_ENV)
    if raw is None:
        return DEFAULT_MODE
    value = raw.strip().lower()
    if value not in MODES:
        raise GateValueError(
            f"{MODE_ENV}={raw!r} is not a mode of the checkpoint export check. Use one of {', '.join(MODES)} "
            f"(error: a checkpoint missing undeclared tensors fails the save; warn: log it; off: no check), "
            f"or unset it for '{DEFAULT_MODE}'."
        )
    return value


def safetensors_names(path: Path) -> set[str]:
    """Tensor names in one ``.safetensors`` file, read from its header only."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ExportCheckError(f"{path} is not a safetensors file (shorter than its 8-byte header length)")
        (size,) = struct.unpack("<Q", head)
        if size > os.fstat(f.fileno()).st_size - 8:
            raise ExportCheckError(f"{path} is not a complete safetensors file (header length {size} exceeds the file)")
        try:
            header = json.loads(f.read(size))
        except ValueError as err:
            raise ExportCheckError(f"{path} has an unreadable safetensors header: {err}") from err
    if not isinstance(header, dict):
        raise ExportCheckError(f"{path} has a safetensors header that is not a JSON object")
    return {name for name in header if name != "__metadata__"}


def _index_names(index: Path) -> set[str]:
    try:
        return set(json.loads(index.read_text())["weight_map"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ExportCheckError(f"{index} is not a readable safetensors index (needs a 'weight_map'): {err!r}") from err


def reference_names(reference: Path) -> set[str]:
    """Tensor names of the reference checkpoint: its safetensors index, or the header of its single file."""
    index = reference / INDEX
    if index.is_file():
        return _index_names(index)
    files = sorted(reference.glob("*.safetensors"))
    if len(files) == 1 and files[0].name == "model.safetensors":
        return safetensors_names(files[0])  # the Hugging Face single-file layout has no index by convention
    found = ", ".join(f.name for f in files[:5]) or "no *.safetensors files"
    raise ExportCheckError(
        f"cannot check the export: the reference checkpoint {reference} has no {INDEX} ({found}), so the full "
        f"set of tensor names it defines is unknown. Fix: point the model path at a complete Hugging Face "
        f"checkpoint (with its index), or set {MODE_ENV}=warn or off to save without this check."
    )


def exported_names(export: Path) -> set[str]:
    """Tensor names actually written, read from the headers of the export's files.

    With an index, only the files it lists count (a shard left over from an earlier save into the same
    directory must not stand in for a tensor this export lacks); each must exist. Without one, every
    ``*.safetensors`` file of the directory is read.
    """
    index = export / INDEX
    if index.is_file():
        try:
            files = sorted({str(f) for f in json.loads(index.read_text())["weight_map"].values()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise ExportCheckError(f"{index} is not a readable safetensors index: {err!r}") from err
        absent = [f for f in files if not (export / f).is_file()]
        if absent:
            raise ExportCheckError(f"the export index {index} lists files that were not written: {', '.join(absent)}")
        paths = [export / f for f in files]
    else:
        paths = sorted(export.glob("*.safetensors"))
    names: set[str] = set()
    for path in paths:
        names |= safetensors_names(path)
    return names


@dataclass
class ExportReport:
    export: str
    reference: str
    model_type: str | None
    mode: str
    ok: bool
    missing: list[str] = field(default_factory=list)
    omitted: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    declared_omissions: list[str] = field(default_factory=list)
    plugin_status: dict[str, Any] | None = None  # the driver's record and the job summary at save time
    report_path: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "report_path"}


def report_path_for(export: Path) -> Path:
    """Where the report goes: beside the export directory, never inside it."""
    export = export.resolve()
    return export.parent / f"{export.name}{REPORT_SUFFIX}"


def check_export(export: str | os.PathLike[str], reference: str | os.PathLike[str], mode: str,
                 plugin_status: dict[str, Any] | None = None) -> ExportReport:
    """Compare ``export`` with ``reference``, write the report beside the export, act per ``mode``.

    ``plugin_status`` (``provenance.job_status``) is stored in the report as it is."""
    export_dir, reference_dir = Path(export), Path(reference)
    try:
        config = _reference_config(reference_dir)
        want = reference_names(reference_dir)
        have = exported_names(export_dir)
    except ExportCheckError as err:
        if mode == "error":
            raise
        logger.warning("%s", err)  # warn mode: a check that cannot run never stops training
        return ExportReport(export=str(export_dir), reference=str(reference_dir), model_type=None, mode=mode,
                            ok=False)
    declared = omissions_for(config)
    missing, omitted = [], []
    for name in sorted(want - have):
        (omitted if any(o.matches(name, config) for o in declared) else missing).append(name)
    report = ExportReport(
        export=str(export_dir), reference=str(reference_dir), model_type=config.get("model_type"), mode=mode,
        ok=not missing, missing=missing, omitted=omitted, extra=sorted(have - want),
        declared_omissions=[f"{o.family}: {o.description}" for o in declared], plugin_status=plugin_status,
    )
    path = report_path_for(export_dir)
    try:
        path.write_text(json.dumps(report.as_dict(), indent=2) + "\n")
        report.report_path = str(path)
    except OSError as err:
        logger.warning("verl-ascend-ext export check: report not written (%s): %s", path, err)
    if report.extra:
        logger.warning("verl-ascend-ext export check: %d tensor(s) in %s are not in the reference %s: %s",
                       len(report.extra), export_dir, reference_dir, _show(report.extra))
    if report.omitted:
        logger.info("verl-ascend-ext export check: %d tensor(s) omitted as declared (%s)", len(report.omitted),
                    "; ".join(report.declared_omissions))
    if missing:
        message = (
            f"verl-ascend-ext export check: the Hugging Face export {export_dir} lacks {len(missing)} tensor(s) of "
            f"the reference checkpoint {reference_dir} that no declared omission for model_type "
            f"{config.get('model_type')!r} covers: {_show(missing)}. The exported files were left as written; "
            f"report: {path}."
        )
        if mode == "error":
            raise ExportCheckError(f"{message} Fix: find why the bridge dropped them, or declare the omission in "
                                   f"verl_ascend_ext/checkpoint/omissions.py if the model really does not need them, "
                                   f"or set {MODE_ENV}=warn to save anyway.")
        logger.warning("%s", message)
    return report


def _reference_config(reference: Path) -> dict[str, Any]:
    config_file = reference / "config.json"
    if not config_file.is_file():
        return {}
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as err:
        raise ExportCheckError(f"{config_file} is not readable JSON: {err}") from err
    if not isinstance(config, dict):
        raise ExportCheckError(f"{config_file} is not a JSON object")
    return config


def _show(names: list[str]) -> str:
    more = f" (+{len(names) - _SHOWN} more)" if len(names) > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more
