"""The sleep-memory feature's doctor checks: the gate, a retired setting still set, and vLLM-Ascend's extra clean-up
after sleep.

The clean-up (``additional_config.enable_sleep_mode_extra_cleanup``, off by default) is read statically from the
installed vLLM-Ascend's source (nothing imported); whether a job ran with it is read from this host's records of the
newest job (each NPU worker's sleeps carry it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from verl_ascend_ext.features.sleep_memory.series import CLEANUP_OVERRIDE
from verl_ascend_ext.features.sleep_memory.settings import RETIRED
from verl_ascend_ext.patching.gates import Gate
from verl_ascend_ext.runtime.findings import INFO, WARN, Finding, gate_check

NAME = "memory after sleep"
CLEANUP_NAME = "vLLM-Ascend extra clean-up after sleep"
RETIRED_NAME = "retired sleep-memory setting"
CLEANUP_OPTION = "enable_sleep_mode_extra_cleanup"
CONFIG_MODULE = "vllm_ascend.ascend_config"
TOP_LEVEL, RL_CONFIG, NONE = "additional_config", "rl_config", "none"  # how a release takes the clean-up
# 0.23.0-0.26.0rc reads the top-level key; main rejects it (ValueError naming rl_config), so naming it is not enough
TOP_LEVEL_READ = r"additional_config\.get\(\s*[\"']enable_sleep_mode_extra_cleanup[\"']"
RL_OVERRIDE = ("'++actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.rl_config={enabled: true, "
               "sleep_mode_extra_cleanup: true}'")


def doctor_findings(environ: Mapping[str, str], gate: Gate) -> list[Finding]:
    """The gate as ``environ`` sets it, a retired setting it still sets, and the extra clean-up where vLLM-Ascend is
    installed."""
    found = gate_check(NAME, environ, gate, "each rollout worker records the device memory it keeps after every sleep "
                       "(the step metric rollout/memory_in_use_after_sleep_gib); a growing trend warns; vLLM's 'Memory "
                       "usage increased after sleeping.' names the series",
                       "what the rollout keeps after sleep is only in vLLM's log lines; a leak shows first as an OOM "
                       "or vLLM's bare assert")
    retired = [Finding.check(RETIRED_NAME, WARN, f"{old} is set but no longer read: the growth warning reads a trend "
                             f"over a window of sleeps now (docs/sleep-memory.md); set {new} for its length, or unset "
                             f"{old}")
               for old, new in RETIRED.items() if environ.get(old, "").strip()]
    cleanup = cleanup_finding()
    return [found, *retired] + ([cleanup] if cleanup else [])


def cleanup_form() -> tuple[str | None, str]:
    """How the installed vLLM-Ascend takes the extra clean-up: ``TOP_LEVEL``, ``RL_CONFIG``, ``NONE`` (None: not
    installed), read from its source, and its version."""
    from verl_ascend_ext.patching.engine import installed_version
    from verl_ascend_ext.patching.source import find_module_file

    version = installed_version("vllm-ascend")
    path = find_module_file(CONFIG_MODULE)
    if version is None or path is None:
        return None, version or "not installed"
    text = path.read_text(encoding="utf-8", errors="replace")
    if re.search(TOP_LEVEL_READ, text):
        return TOP_LEVEL, version
    return (RL_CONFIG if "sleep_mode_extra_cleanup" in text else NONE), version


def cleanup_finding(records: list[dict[str, Any]] | None = None) -> Finding | None:
    """None where vLLM-Ascend is not installed; otherwise whether it has the clean-up and whether the newest job on
    this host ran with it off (``records``: this host's, read from the status directory when not given)."""
    form, version = cleanup_form()
    if form is None:
        return None
    if form == NONE:
        return Finding.check(CLEANUP_NAME, INFO, f"vLLM-Ascend {version} has no extra clean-up after sleep: nothing to "
                             "switch on")
    setting, fix = ((CLEANUP_OPTION, f"{CLEANUP_OVERRIDE} (the recipes set it)") if form == TOP_LEVEL else
                    ("rl_config.sleep_mode_extra_cleanup", f"{RL_OVERRIDE} (this release takes it there and rejects "
                     f"the recipes' top-level {CLEANUP_OPTION}: drop that override)"))
    off = ranks_without_cleanup(records)
    if off:
        return Finding.check(CLEANUP_NAME, WARN, f"the newest job on this host ran vLLM-Ascend {version} with "
                             f"{setting} off ({off}): more device memory stays in use after each sleep "
                             f"(vllm-ascend #9585: 3.2 -> 0.7 GiB with expert parallel). Fix: {fix}")
    return Finding.check(CLEANUP_NAME, INFO, f"vLLM-Ascend {version} has {setting}, off unless the job sets it: "
                         f"{fix}; `verl-ascend recipe check` says whether a recipe has it")


def ranks_without_cleanup(records: list[dict[str, Any]] | None = None) -> str:
    """The newest job's NPU workers whose last sleep ran without the extra clean-up, in words ('' when none)."""
    from verl_ascend_ext.runtime.records import store
    from verl_ascend_ext.runtime.records.outcome import label, one_job
    from verl_ascend_ext.runtime.records.reader import read_records

    if records is None:
        records, _ = read_records(store.base_dir())
    mine, _, _ = one_job(records)
    off = [f"{label(r)} on {r.get('host')} pid {r.get('pid')}" for r in mine
           if (r.get("sleeps") or [{}])[-1].get("cleanup") is False]
    return "; ".join(off)
