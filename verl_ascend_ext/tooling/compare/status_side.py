"""The plugin's statuses of two runs side by side: per role and patch, what applied, acted, stood down, was refused
or found fixed upstream, and the lines where the two runs differ.

A run's status comes from its status directory (``VERL_ASCEND_EXT_STATUS_DIR`` of the job; every process's record,
read as ``verl-ascend status`` reads them, never written) or from the summary a baseline file carries. A directory
given for a console log must hold the records of that log's job: the driver pid the plugin's boot line printed in
the log must be among the directory's driver records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verl_ascend_ext.patching.status import DETAIL
from verl_ascend_ext.runtime.records.outcome import newest_driver
from verl_ascend_ext.runtime.records.reader import collect
from verl_ascend_ext.runtime.records.report import aggregate, is_idle_pool_worker, only_pending, replacement
from verl_ascend_ext.runtime.records.schema import ACTS, DRIVER, EAGER
from verl_ascend_ext.tooling.compare.runs import Run, RunError


def summary(directory: str | Path, run: Run | None = None) -> dict[str, Any]:
    """Per role and patch, one line of what happened in the job whose records ``directory`` holds (checked against
    ``run``'s driver when the run's log names it): the counts and the replacement line of ``verl-ascend status``'s
    per-role table (``records.report``: the same processes counted, the same rule), without how often a patch
    acted (that differs run to run)."""
    if not Path(directory).is_dir():
        raise RunError(f"status directory {directory}: no such directory (the job's VERL_ASCEND_EXT_STATUS_DIR)")
    records, _ = collect(str(directory))
    if not [r for r in records if not is_idle_pool_worker(r)]:
        raise RunError(f"status directory {directory}: no process record in it; pass the job's "
                       "VERL_ASCEND_EXT_STATUS_DIR")
    drivers = [r for r in records if r.get("role") == DRIVER]
    if run is not None and run.driver_pids:
        pids = {int(r["pid"]) for r in drivers}
        if not pids & set(run.driver_pids):
            raise RunError(f"status directory {directory} holds another job's records: its driver(s) pid "
                           f"{', '.join(map(str, sorted(pids))) or 'none'}, while {run.path} was written by a driver "
                           f"with pid {', '.join(map(str, run.driver_pids))}. Pass the status directory of that job.")
    report = aggregate(records)
    driver = newest_driver(records) or {}
    roles: dict[str, dict[str, str]] = {}
    for role, patches in sorted(report["by_role"].items()):
        exercised = report["by_role_exercised"].get(role, {})
        lines = {pid: _line(statuses, exercised.get(pid)) for pid, statuses in sorted(patches.items())
                 if not only_pending(statuses)}
        if lines:
            roles[role] = lines
    return {"driver": {"host": driver.get("host"), "pid": driver.get("pid"), "versions": driver.get("versions")},
            "roles": roles}


def _line(statuses: dict[str, int], exercised: dict[str, Any] | None) -> str:
    """A path's detail (a shape of the first call, after ``status.DETAIL``) differs by run: left out."""
    parts = [" ".join(f"{status}:{count}" for status, count in sorted(statuses.items()))]
    if exercised and exercised["applied"] and exercised["observed"] in (EAGER, ACTS):
        parts.append(replacement(exercised, times=False))
    if exercised and exercised["stood_down"]:
        parts.append("stood down: " + "; ".join(path.partition(DETAIL)[0] for path in exercised["stood_down"]))
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
