"""The CANN toolkit and NNAL a recipe's stack needs: the ``[cann]`` table of its manifest, checked on NPU nodes.

::

    [cann]
    toolkit = "9.1.0"   # CANN version, as ascend_toolkit_install.info spells it (version=...)
    nnal = "9.1.0"      # NNAL version, as nnal/atb/latest/version.info spells it (Ascend-cann-atb : ...)
    source = "..."      # where the versions come from

The installed versions are read the way ``verl-ascend doctor`` reads them (``ascend_env.stack``:
files only). On a GPU run, or a login node (``--no-device``), nothing is checked.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_ascend_ext.runtime.ascend_stack.infofile import is_unknown
from verl_ascend_ext.runtime.ascend_stack.stack import cann_info, nnal_info
from verl_ascend_ext.runtime.findings import ERROR, NOT_CHECKED, OK, WARN, Finding
from verl_ascend_ext.tooling.ascend_env.torch_npu_cann import same_cann
from verl_ascend_ext.tooling.recipes.manifest import ManifestError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

KEYS = {"toolkit", "nnal", "source"}
PARTS = (("toolkit", "CANN toolkit", cann_info), ("nnal", "NNAL/ATB", nnal_info))


@dataclass(frozen=True)
class CannPin:
    toolkit: str | None
    nnal: str | None
    source: str


def load_cann_pin(path: Path) -> CannPin | None:
    """The ``[cann]`` table of the manifest at ``path``; None when it has none."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ManifestError(f"{path}: cannot read manifest: {err}") from err
    table = data.get("cann")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ManifestError(f"{path}: [cann] must be a table with {sorted(KEYS)}")
    unknown = set(table) - KEYS
    if unknown:
        raise ManifestError(f"{path}: [cann] has unknown field(s) {sorted(unknown)}; known: {sorted(KEYS)}")
    for key in ("toolkit", "nnal"):
        if key in table and (not isinstance(table[key], str) or not table[key].strip()):
            raise ManifestError(f"{path}: [cann] {key} must be a version string such as \"9.1.0\", got {table[key]!r}")
    if not table.get("source"):
        raise ManifestError(f"{path}: [cann] needs a 'source' naming where the versions come from")
    return CannPin(toolkit=table.get("toolkit"), nnal=table.get("nnal"), source=str(table["source"]))


def cann_findings(manifest_path: Path, device: str, no_device: bool, environ: Mapping[str, str]) -> list[Finding]:
    """One finding per pinned part (toolkit, NNAL): ok / error (absent or another version) / warn (unreadable)."""
    pin = load_cann_pin(manifest_path)
    if pin is None or device != "npu":
        return []
    findings = []
    for key, label, read in PARTS:
        wanted = getattr(pin, key)
        if wanted is None:
            continue
        found: dict[str, Any] | None = read(environ)
        here = "not installed here" if found is None else f"{found['version']} here"
        if no_device:
            findings.append(Finding("cann", label, NOT_CHECKED, f"needed on NPU nodes only ({here}); wants {wanted} "
                                    f"({pin.source})"))
        elif found is None:
            findings.append(Finding("cann", label, ERROR, f"no {label} found on this node; the recipe's stack needs "
                                    f"{wanted} ({pin.source}). Install it and source its set_env.sh"))
        elif is_unknown(found["version"]):
            findings.append(Finding("cann", label, WARN, f"version {found['version']}; wanted {wanted}"))
        elif not same_cann(found["version"], wanted):
            findings.append(Finding("cann", label, ERROR, f"{found['version']} ({found.get('file')}) is not {wanted}, "
                                    f"the version of the recipe's stack ({pin.source})"))
        else:
            findings.append(Finding("cann", label, OK, f"{found['version']} ({found.get('file')}) matches {wanted}"))
    return findings
