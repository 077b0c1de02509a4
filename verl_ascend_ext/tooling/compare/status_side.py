"""The plugin's statuses of two runs side by side: per role and patch, what applied, acted, stood down, was refused
or found fixed upstream, and the lines where the two runs differ.

A run's status comes from its status directory (``VERL_ASCEND_EXT_STATUS_DIR`` of the job; every process's record,
read as ``verl-ascend status`` reads them, never written) or from the summary a baseline file carries. A directory
given for a console log must hold the records of that log's job: the driver pid the plugin's boot line printed in
the log must be among the directory's driver records.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from verl_ascend_ext.runtime.records.reader import collect
from verl_ascend_ext.runtime.records.report import idle, role_of
from verl_ascend_ext.runtime.records.schema import DRIVER
from verl_ascend_ext.tooling.compare.runs import Run, RunError

ACTS_OR_RAN = {"eager": "ran", "acts": "acted"}


def summary(directory: str | Path, run: Run | None = None) -> dict[str, Any]:
    """Per role and patch, one line of what happened in the job whose records ``directory`` holds (checked against
    ``run``'s driver when the run's log names it)."""
    if not Path(directory).is_dir():
        raise RunError(f"status directory {directory}: no such directory (the job's VERL_ASCEND_EXT_STATUS_DIR)")
    records, _ = collect(str(directory))
    records = [r for r in records if not idle(r)]
    if not records:
        raise RunError(f"status directory {directory}: no process record in it; pass the job's "
                       "VERL_ASCEND_EXT_STATUS_DIR")
    drivers = [r for r in records if r.get("role") == DRIVER]
    if run is not None and run.driver_pids:
        pids = {int(r["pid"]) for r in drivers}
        if not pids & set(run.driver_pids):
            raise RunError(f"status directory {directory} holds another job's records: its driver(s) pid "
                           f"{', '.join(map(str, sorted(pids))) or 'none'}, while {run.path} was written by a driver "
                           f"with pid {', '.join(map(str, run.driver_pids))}. Pass the status directory of that job.")
    per_role: dict[str, dict[str, dict[str, Any]]] = defaultdict(lambda: defaultdict(
        lambda: {"statuses": Counter(), "applied": 0, "acted": 0, "observed": "", "stood_down": set()}))
    for rec in records:
        for pid, patch in (rec.get("patches") or {}).items():
            if patch.get("status") == "pending" and not patch.get("imported"):
                continue  # its module was never imported in that process: nothing to compare
            entry = per_role[role_of(rec)][pid]
            entry["statuses"][patch.get("status")] += 1
            entry["observed"] = patch.get("observed", "eager")
            if patch.get("status") == "applied":
                entry["applied"] += 1
                entry["acted"] += bool(patch.get("exercised"))
            entry["stood_down"].update(patch.get("stood_down") or [])
    driver = max(drivers, key=lambda r: r.get("started", 0)) if drivers else {}
    return {"driver": {"host": driver.get("host"), "pid": driver.get("pid"), "versions": driver.get("versions")},
            "roles": {role: {pid: _line(entry) for pid, entry in sorted(patches.items())}
                      for role, patches in sorted(per_role.items())}}


def _line(entry: dict[str, Any]) -> str:
    parts = [" ".join(f"{status}:{count}" for status, count in sorted(entry["statuses"].items()))]
    verb = ACTS_OR_RAN.get(entry["observed"])
    if entry["applied"] and verb:
        parts.append(f"{verb} in {entry['acted']} of {entry['applied']}")
    if entry["stood_down"]:
        parts.append("stood down: " + "; ".join(sorted(entry["stood_down"])))
    return ", ".join(parts)


def differences(baseline: dict[str, Any], run: dict[str, Any]) -> list[dict[str, str]]:
    """The (role, patch) lines that differ between two summaries (absent on one side: "-")."""
    out = []
    roles = sorted(set(baseline["roles"]) | set(run["roles"]))
    for role in roles:
        b, r = baseline["roles"].get(role, {}), run["roles"].get(role, {})
        for pid in sorted(set(b) | set(r)):
            if b.get(pid) != r.get(pid):
                out.append({"role": role, "patch": pid, "baseline": b.get(pid, "-"), "run": r.get(pid, "-")})
    return out
