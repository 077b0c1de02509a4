"""`verl-ascend status`: gather the process records (this machine, or every alive Ray node) and report them.

The entry point above ``records.report`` (aggregation of records) and ``cluster.status_ray`` (collection
across a Ray cluster), so that neither imports the other. Reading changes nothing on disk; ``--prune`` is the
explicit step that removes old records of dead processes (``records.prune``).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from typing import Any

from verl_ascend_ext.runtime.records.outcome import ALL_JOBS, FAILED, format_outcome, one_job
from verl_ascend_ext.runtime.records.reader import collect
from verl_ascend_ext.runtime.records.recorder import FLUSH_EVERY, LAG_NOTE
from verl_ascend_ext.runtime.records.report import aggregate, merge, only_pending
from verl_ascend_ext.runtime.records.report import replacement as ran
from verl_ascend_ext.runtime.records.store import DIR_ENV, base_dir, open_base
from verl_ascend_ext.tooling.selftest import store as selftest_store
from verl_ascend_ext.tooling.tables import table


def main(as_json: bool = False, directory: str | None = None, ray: bool = False, address: str | None = None,
         timeout: float = 120.0, prune: bool = False, job: str | None = None) -> int:
    """``verl-ascend status``; ``job``: the job whose records are read (default: the newest driver's; ``"*"``: all)."""
    base = directory or base_dir()
    if directory is not None and not ray and not os.path.isdir(directory):
        print(f"verl-ascend status: error: no status directory at {directory}. {_where_jobs_record()}",
              file=sys.stderr)
        return 2
    if prune:
        return _prune(base)
    if ray:
        from verl_ascend_ext.tooling.cluster.status_ray import collect_cluster

        directory = directory or os.environ.get(DIR_ENV)
        batches, notes, node_problems, error, actors = collect_cluster(address, timeout, directory)
        if error is not None:
            report = {"processes": [], "summary": {}, "by_role": {}, "problems": [], "notes": [error],
                      "exit_code": 2}
            if as_json:
                print(json.dumps(report, indent=2))
            print(f"verl-ascend status --ray: error: {error}", file=sys.stderr)
            return 2
        records = merge(batches)
    else:
        node_problems, actors = [], []
        records, notes = collect(base)
        if directory is not None and not records:  # asked for this directory: nothing read is no "OK"
            print(f"verl-ascend status: error: {_nothing_read(directory, notes)}", file=sys.stderr)
            return 2
    every = len(records)
    records, job_id, chosen = one_job(records, job)
    if job is not None and job != ALL_JOBS and not records:
        print(f"verl-ascend status: error: no record of job {job} among the {every} read from {base}. Fix: pass a job "
              "id `verl-ascend status --all` shows, or leave out --job", file=sys.stderr)
        return 2
    report = aggregate(records, notes)
    report["job"], report["job_selection"] = job_id, chosen
    report["selftest"] = selftest_store.report_section(base=base)  # this host's status dir; never the exit code
    report["declared_by"] = _declared_by(report)
    report["acts_when"] = _acts_when(report)
    report["counts_lag_s"] = FLUSH_EVERY
    if ray:
        from verl_ascend_ext.tooling.cluster.status_ray import describe, without_record

        report["without_plugin"] = without_record(actors, records)
        node_problems = node_problems + [describe(a) for a in report["without_plugin"]]
    if node_problems:
        report["problems"] = node_problems + report["problems"]
        report["exit_code"] = 1
    print(json.dumps(report, indent=2) if as_json else format_report(report))
    return report["exit_code"]


def _nothing_read(directory: str, notes: list[str]) -> str:
    """Why ``--dir DIRECTORY`` gave no record, and the fix: the reader refused the directory, or it holds none."""
    try:
        os.close(open_base(directory, create=False))
    except OSError as err:
        return (f"status directory {directory} not read: {err}. Fix: pass the job's {DIR_ENV}, a directory only "
                f"this user can write (chmod 700), or leave out --dir ({base_dir()} here)")
    said = f" ({'; '.join(notes)})" if notes else ""
    return f"status directory {directory} holds no process record{said}. {_where_jobs_record()}"


def _where_jobs_record() -> str:
    return (f"A job's processes record into {DIR_ENV} as set in its driver's environment, else {base_dir({})} (this "
            f"user's default; now {base_dir()} here); check the path, or leave out --dir")


def _prune(base: str) -> int:
    """``--prune``: remove this host's records of dead processes older than the keep time; say what went."""
    from verl_ascend_ext.runtime.records.prune import KEEP_ENV, keep_seconds, prune

    keep = keep_seconds()
    removed = prune(base, keep=keep)
    print(f"verl-ascend status --prune: removed {len(removed)} record(s) of dead processes of this host last written "
          f"more than {keep:g} s ago ({KEEP_ENV}) from {base}")
    return 0


def _declared_by(report: dict[str, Any]) -> dict[str, str]:
    """The distribution that declares each patch in the report, as installed where `status` runs."""
    from verl_ascend_ext.runtime.registry import FeatureDeclarationError, registry

    try:
        known = registry().declared_by
    except FeatureDeclarationError:
        known = {}
    ids = {*report["summary"], *(pid for proc in report["processes"] for pid in proc["patches"])}
    return {pid: known.get(pid, "not installed here") for pid in sorted(ids)}


def _acts_when(report: dict[str, Any]) -> dict[str, str]:
    """For each patch in the report that acts only on some calls, when it does (its record's ``acts_when``)."""
    from verl_ascend_ext.runtime.registry import FeatureDeclarationError, registry

    try:
        records = registry().records
    except FeatureDeclarationError:
        return {}
    ids = {*report["summary"], *(pid for proc in report["processes"] for pid in proc["patches"])}
    return {r.id: r.acts_when for r in records if r.acts_when and r.id in ids}


def _woke(seconds: float | None) -> str:
    """The seconds of a worker's wake-ups before its last sleep (the wake-up-time records), or "-": none timed."""
    return "-" if seconds is None else f"{seconds:.2f} s"


def format_report(report: dict[str, Any]) -> str:
    out = [f"verl-ascend status: {report['active']} active process(es), {report['dead']} dead"]
    out += [f"  {report['job_selection']}", ""] if report.get("job_selection") else [""]
    if "outcome" in report and report["processes"]:
        out += format_outcome(report["outcome"])
    rows = []
    for p in report["processes"]:
        counts = Counter(p["patches"].values())
        state = "alive" if p["alive"] else p.get("end") or ("dead" if p["alive"] is False else "?")
        role = p["label"] + (" (idle)" if p.get("idle") else "")
        rows.append([p["host"], str(p["pid"]), role, ",".join(p["loaded_by"] or []), state,
                     " ".join(f"{s}:{n}" for s, n in sorted(counts.items())), str(len(p.get("exercised") or []))])
    if rows:
        out.append(table(rows, ["host", "pid", "role", "loaded by", "state", "patches", "ran"]))
    if report["summary"]:
        whose = "active processes" if report.get("counted", "active") == "active" else \
            "the job has ended: its processes' last records"
        exercised = report.get("exercised", {})
        declared = report.get("declared_by", {})
        out += ["", f"Per patch ({whose}; idle Ray workers not counted)", f"  {LAG_NOTE}"]
        out.append(table([[pid, declared.get(pid, ""), " ".join(f"{s}:{n}" for s, n in c.items()),
                           ran(exercised.get(pid))] for pid, c in report["summary"].items()],
                         ["patch", "declared by", "statuses", "replacement"]))
        by_role_exercised = report.get("by_role_exercised", {})
        role_rows = [[role, pid, " ".join(f"{s}:{n}" for s, n in c.items()),
                      ran(by_role_exercised.get(role, {}).get(pid))]
                     for role, per in report["by_role"].items() for pid, c in per.items() if not only_pending(c)]
        hidden = sum(1 for per in report["by_role"].values() for c in per.values() if only_pending(c))
        out += ["", "Per role" + (f" ({hidden} row(s) only pending, their module never imported there, not shown; "
                                  "--json has all)" if hidden else "")]
        out.append(table(role_rows, ["role", "patch", "statuses", "replacement"]))
        acts_when = report.get("acts_when", {})
        if acts_when:
            out += ["", "Counted only where the fix acted (a call that needs no change is not counted)"]
            out += [f"  {pid}: acts when {when}" for pid, when in sorted(acts_when.items())]
        stood = [(role, pid, entry["stood_down"]) for role, per in by_role_exercised.items()
                 for pid, entry in per.items() if entry.get("stood_down")]
        if stood:
            out += ["", "Stood down (called, did not act, on these paths)"]
            out += [f"  {role}  {pid}: stood down: {'; '.join(paths)}" for role, pid, paths in stood]
    kept = report.get("kept_after_sleep") or []
    if kept:
        gib = 1 << 30
        out += ["", "Memory in use after sleep (rollout workers; sleep-memory records)"]
        out.append(table([[k["host"], str(k["pid"]), k["label"], str(k["sleeps"]), f"{k['first'] / gib:.2f} GiB",
                           f"{k['last'] / gib:.2f} GiB", f"{k['most'] / gib:.2f} GiB", _woke(k.get("woke_s")),
                           k["meter"]] for k in kept],
                         ["host", "pid", "role", "sleeps", "first", "last", "most", "woke before last", "read by"]))
    if report["notes"]:
        out += ["", "Notes"] + [f"  {n}" for n in report["notes"]]
    if report["problems"]:
        out += ["", "Problems"] + [f"  {p}" for p in report["problems"]]
    if "selftest" in report:
        out += selftest_store.format_section(report["selftest"])
    failed = (report.get("outcome") or {}).get("state") == FAILED
    out += ["", "JOB FAILED (exit 1)" + ("; problems found too" if report["problems"] else "") if failed else
            "PROBLEMS FOUND (exit 1)" if report["exit_code"] == 1 else
            "no process recorded" if not report["processes"] else "OK"]
    return "\n".join(out)
