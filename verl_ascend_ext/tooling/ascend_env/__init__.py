"""The Ascend environment in the doctor: CANN, NNAL/ATB, driver, firmware, npu-smi, NPU variables, duplicate installs.

``ascend_report`` gives the ``ascend`` object of ``verl-ascend doctor --json`` (keys ``cann``, ``nnal``,
``driver``, ``firmware``, ``npu_smi``, ``env``; null where absent), ``ascend_findings`` the doctor
checks derived from it (torch_npu vs CANN from torch_npu's matching table, unreadable version files,
conflicting toolkit variables, the test sysroot), ``duplicate_findings`` one check per distribution
installed more than once. Everything is read from files and the environment (see ``stack``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from verl_ascend_ext.runtime.ascend_stack.infofile import is_unknown
from verl_ascend_ext.runtime.ascend_stack.stack import (
    SYSROOT_ENV,
    cann_info,
    driver_info,
    env_values,
    firmware_info,
    nnal_info,
    npu_smi,
)
from verl_ascend_ext.runtime.findings import INFO, WARN, Finding
from verl_ascend_ext.tooling.ascend_env.duplicates import describe, duplicate_installs
from verl_ascend_ext.tooling.ascend_env.torch_npu_cann import compatibility

COMPONENTS = ("cann", "nnal", "driver", "firmware")
LABELS = {"cann": "CANN toolkit", "nnal": "NNAL/ATB", "driver": "driver", "firmware": "firmware"}


def ascend_report(environ: Mapping[str, str]) -> dict[str, Any]:
    return {"cann": cann_info(environ), "nnal": nnal_info(environ), "driver": driver_info(environ),
            "firmware": firmware_info(environ), "npu_smi": npu_smi(environ), "env": env_values(environ)}


def ascend_findings(ascend: Mapping[str, Any], torch_npu_version: str | None,
                    environ: Mapping[str, str]) -> list[Finding]:
    findings = []
    for key in COMPONENTS:
        part = ascend[key]
        if part is not None and is_unknown(part["version"]):
            findings.append(Finding.check(LABELS[key], WARN, f"version {part['version']}"))
    cann = ascend["cann"]
    if cann is not None and cann.get("note"):
        findings.append(Finding.check("CANN toolkit", WARN, cann["note"]))
    compat = compatibility(torch_npu_version, cann["version"] if cann else None)
    if compat is not None:
        findings.append(compat)
    if environ.get(SYSROOT_ENV):
        findings.append(Finding.check("ascend sysroot", INFO,
                                      f"{SYSROOT_ENV}={environ[SYSROOT_ENV]} stands in for / (tests only)"))
    return findings


def duplicate_findings(names: Iterable[str]) -> tuple[list[dict[str, Any]], list[Finding]]:
    """(duplicates as data, one ``warn`` check per duplicated distribution)."""
    dups = duplicate_installs(names)
    return dups, [Finding.check(f"duplicate install {d['distribution']}", WARN, describe(d)) for d in dups]


def format_section(ascend: Mapping[str, Any]) -> list[str]:
    """The doctor's text lines for the ``ascend`` object."""
    out = ["", "Ascend environment (files only; nothing is run on the device)"]
    for key in COMPONENTS:
        part = ascend[key]
        if part is None:
            out.append(f"  {LABELS[key] + ':':<15} not installed")
            continue
        where = part.get("file") or part.get("home") or ""
        via = part.get("selected_by") or part.get("root_from")
        out.append(f"  {LABELS[key] + ':':<15} {part['version']}" + (f"  ({where}; via {via})" if where else ""))
    smi = ascend["npu_smi"]
    out.append(f"  {'npu-smi:':<15} {smi['path'] if smi else 'not found'}")
    env = ascend["env"] or {}
    out.append(f"  {'variables:':<15} " + (", ".join(f"{k}={v}" for k, v in env.items()) if env else
                                          "none of ASCEND_RT_VISIBLE_DEVICES, HCCL_*, PYTORCH_NPU_ALLOC_CONF set"))
    return out
