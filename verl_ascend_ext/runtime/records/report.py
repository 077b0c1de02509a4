"""What `verl-ascend status` reports: the records of any number of hosts (``reader.collect``) turned into counts
per patch and role, and problems.

``aggregate`` turns the records into the report: per patch (and per role) the count of each status
over active processes, and the problems:

- a process where a patch its environment turned on is not applied / fixed-upstream / already-applied
  once its target module was imported (refused, or still pending because an earlier patch of the module
  failed), or refused at all;
- a process whose gates or kill switch differ from the driver's (the newest active driver record; with
  no driver, the values most processes have);
- version skew: a distribution with different versions in different processes;
- a process that runs vLLM patches with ``VLLM_PLUGINS`` excluding this plugin (vLLM processes it
  starts will not load it).

Per patch and role it also counts, over the processes where the patch is applied, those where its
replacement has run at least once (``exercised``, for eager replacements; a replacement that runs inside
compiled code cannot report itself and is counted as not observable).

The counts are over active processes; once a job has ended (no record is alive) they are over the
ended processes instead, so the report still says what ran (``counted``: "active" or "ended"). Dead
processes are listed (``alive: false``) and are never compared or flagged. An idle Ray worker (never
given an actor, no target module imported) is listed but not counted. Exit 0 fine, 1 any problem, 2
the Ray cluster could not be reached (``--ray``, see ``cluster.status_ray``).

First of all the report holds the job's ``outcome`` (``outcome``): running, ended well or failed, and for
a failed job the process that failed first (role with its rank, host, pid, how), the root cause as far as the
records show it, and how the rest ended. A failed job exits 1 too.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from verl_ascend_ext.patching.gates import DISABLE_ENV
from verl_ascend_ext.patching.record import DONE, OFF, Status
from verl_ascend_ext.patching.status import DETAIL
from verl_ascend_ext.runtime.records.outcome import (
    FAILED,
    end_of,
    is_idle_pool_worker,
    label,
    newest_driver,
    outcome,
)
from verl_ascend_ext.runtime.records.schema import ACTS, EAGER, IMPORT, TRACED

VLLM_TARGETS = ("vllm.", "vllm_ascend.")
VLLM_ENTRY_POINT = "verl_ascend_ext"
NOT_OBSERVABLE = {TRACED: "not observable inside compiled code", IMPORT: "n/a (import-time patch)"}


def _key(rec: dict[str, Any]) -> tuple[str, int, Any]:
    return rec.get("host", "?"), int(rec.get("pid", 0)), rec.get("proc_start")


def merge(batches: Iterable[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One entry per process (several nodes may read the same shared directory); a known liveness wins."""
    out: dict[tuple[str, int, Any], dict[str, Any]] = {}
    for batch in batches:
        for rec in batch:
            known = out.get(_key(rec))
            if known is None or (known.get("alive") is None and rec.get("alive") is not None):
                out[_key(rec)] = rec
    return list(out.values())


def who(rec: dict[str, Any]) -> str:
    return f"{rec.get('host')} pid {rec.get('pid')} ({label(rec)})"


def role_of(rec: dict[str, Any]) -> str:
    """The role a report groups by: the role, and for a Ray actor its class (``ray-worker WorkerDict``)."""
    return str(rec.get("role")) + (f" {rec['actor_class']}" if rec.get("actor_class") else "")


def active(rec: dict[str, Any]) -> bool:
    return rec.get("alive") is not False


def _exercised(counted: list[dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, dict[str, Any]]]]:
    """Per patch, and per role and patch: in how many of the processes where it is applied its replacement ran (for
    an ``acts_when`` record: acted, and how often in all), and the paths on which it stood down."""
    per_patch: dict[str, dict[str, Any]] = {}
    per_role: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for rec in counted:
        for pid, p in (rec.get("patches") or {}).items():
            if p.get("status") != Status.APPLIED:
                continue
            observed = p.get("observed", EAGER)
            for entry in (per_patch.setdefault(pid, _tally(observed)),
                          per_role[role_of(rec)].setdefault(pid, _tally(observed))):
                entry["applied"] += 1
                entry["ran"] += bool(p.get("exercised"))
                if observed == ACTS:
                    entry["acts"] += int(p.get("acts") or 0)
                entry["stood_down"] = _merged_paths(entry["stood_down"], p.get("stood_down") or [])
    return (dict(sorted(per_patch.items())),
            {role: dict(sorted(per.items())) for role, per in sorted(per_role.items())})


def _merged_paths(known: list[str], more: list[str]) -> list[str]:
    """Stand-down paths of several processes, one per path text (``status.DETAIL`` parts a path from its detail,
    which differs by process: the first one seen is kept)."""
    by_path = {path.partition(DETAIL)[0]: path for path in reversed([*known, *more])}
    return [by_path[key] for key in sorted(by_path)]


def _tally(observed: str) -> dict[str, Any]:
    return {"observed": observed, "applied": 0, "ran": 0, "stood_down": [],
            **({"acts": 0} if observed == ACTS else {})}


def _live_driver(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The job's driver (``outcome.newest_driver``) while it is alive: the settings reference of live processes."""
    driver = newest_driver(records)
    return driver if driver is not None and active(driver) else None


def only_pending(statuses: dict[str, int]) -> bool:
    """A per-role row whose processes all have the patch pending (its module never imported there): `status` hides
    it from the table, `compare` from the side by side."""
    return set(statuses) == {Status.PENDING}


def replacement(entry: dict[str, Any] | None, times: bool = True) -> str:
    """One patch's ``_exercised`` entry as one line: 'ran in 2 of 2' for an eager patch applied in 2 processes,
    'acted in 1 of 2 (40 times)' for one that acts only on some calls (``PatchRecord.acts_when``; ``times``: with
    how often), why that cannot be told, or '-' (not applied). `status` and `compare` print the same line."""
    if not entry:
        return "-"
    if entry["observed"] in NOT_OBSERVABLE:
        return NOT_OBSERVABLE[entry["observed"]]
    if entry["observed"] == ACTS:
        return f"acted in {entry['ran']} of {entry['applied']}" + (
            f" ({entry['acts']} times)" if times and entry["acts"] else "")
    return f"ran in {entry['ran']} of {entry['applied']}"


def _settings(rec: dict[str, Any]) -> dict[str, Any]:
    disable = ",".join(sorted(p.strip() for p in str(rec.get("disable") or "").split(",") if p.strip()))
    return {**{k: ("on" if v else "off") for k, v in (rec.get("gates") or {}).items()},
            DISABLE_ENV: disable or "unset"}


def _patch_problems(rec: dict[str, Any]) -> list[str]:
    out = []
    for pid, p in sorted((rec.get("patches") or {}).items()):
        status = p.get("status")
        if status == Status.REFUSED or (status not in DONE and status not in OFF and p.get("imported")):
            module = str(p.get("target", "")).partition(":")[0]
            out.append(f"{who(rec)}: patch {pid} is {status} although its module {module} was imported"
                       + (f": {p.get('detail')}" if p.get("detail") else ""))
    env = rec.get("plugin_env") or {}
    allow = env.get("VLLM_PLUGINS")
    on = [pid for pid, p in (rec.get("patches") or {}).items()
          if p.get("status") not in OFF and str(p.get("target", "")).startswith(VLLM_TARGETS)]
    if allow is not None and VLLM_ENTRY_POINT not in {x.strip() for x in allow.split(",")} and on:
        out.append(f"{who(rec)}: VLLM_PLUGINS={allow!r} excludes {VLLM_ENTRY_POINT} while vLLM patches are on "
                   f"({', '.join(sorted(on))}): vLLM processes started from here will not load the plugin. Fix: "
                   f"add '{VLLM_ENTRY_POINT}' to VLLM_PLUGINS")
    return out


def aggregate(records: list[dict[str, Any]], notes: list[str] | None = None) -> dict[str, Any]:
    """The status report of ``records`` (any hosts): processes, summary, by_role, problems, exit code."""
    records = sorted(records, key=lambda r: (r.get("host", ""), str(r.get("role")), int(r.get("pid", 0))))
    live = [r for r in records if active(r)]
    counted = [r for r in (live or records) if not is_idle_pool_worker(r)]
    summary: dict[str, Counter] = defaultdict(Counter)
    by_role: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    for rec in counted:
        for pid, p in (rec.get("patches") or {}).items():
            summary[pid][p.get("status")] += 1
            by_role[role_of(rec)][pid][p.get("status")] += 1
    problems: list[str] = []
    for rec in live:
        problems += _patch_problems(rec)
    driver = _live_driver(live)
    if live:
        if driver is not None:
            reference, ref_name = _settings(driver), f"driver {who(driver)}"
        else:
            counts = Counter(json.dumps(_settings(r), sort_keys=True) for r in live)
            reference, ref_name = json.loads(counts.most_common(1)[0][0]), "most processes (no active driver record)"
        for rec in live:
            own = _settings(rec)
            diff = [f"{k}={own.get(k, '-')} ({reference.get(k, '-')} in the reference)"
                    for k in sorted(set(own) | set(reference)) if own.get(k) != reference.get(k)]
            if diff:
                problems.append(f"{who(rec)}: settings differ from {ref_name}: {'; '.join(diff)}")
    versions: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for rec in live:
        for dist, version in (rec.get("versions") or {}).items():
            versions[dist][version].append(rec)
    for dist, seen in sorted(versions.items()):
        if len(seen) > 1:
            parts = [f"{v} in {len(rs)} process(es) (e.g. {', '.join(who(r) for r in rs[:3])})"
                     for v, rs in sorted(seen.items(), key=lambda kv: -len(kv[1]))]
            problems.append(f"version skew: {dist} " + "; ".join(parts))
    processes = [{
        "host": r.get("host"), "pid": r.get("pid"), "role": r.get("role"), "actor_class": r.get("actor_class"),
        "label": label(r), "ranks": r.get("ranks") or {}, "ip": r.get("ip"),
        "ended": r.get("ended"), "end": end_of(r), "errors": r.get("errors") or [],
        "loaded_by": r.get("loaded_by"), "alive": r.get("alive"), "idle": is_idle_pool_worker(r),
        "namespace": r.get("namespace"),
        "started": r.get("started"), "dead_since": r.get("dead_since"), "versions": r.get("versions"),
        "patches": {pid: p.get("status") for pid, p in sorted((r.get("patches") or {}).items())},
        "exercised": sorted(pid for pid, p in (r.get("patches") or {}).items() if p.get("exercised")),
    } for r in records]
    exercised, by_role_exercised = _exercised(counted)
    job = outcome(records)
    kept_after_sleep = [{"host": r.get("host"), "pid": r.get("pid"), "label": label(r), "sleeps": r["sleeps"][-1]["n"],
                         "first": r["sleeps"][0]["in_use"], "last": r["sleeps"][-1]["in_use"],
                         "most": max(s["in_use"] for s in r["sleeps"]), "meter": r["sleeps"][-1]["meter"],
                         "woke_s": r["sleeps"][-1].get("woke_s")}
                        for r in records if r.get("sleeps")]
    return {
        "outcome": job,
        "processes": processes,
        "counted": "active" if live else "ended",
        "summary": {pid: dict(sorted(c.items())) for pid, c in sorted(summary.items())},
        "by_role": {role: {pid: dict(c) for pid, c in sorted(per.items())} for role, per in sorted(by_role.items())},
        "exercised": exercised, "by_role_exercised": by_role_exercised, "kept_after_sleep": kept_after_sleep,
        "driver": None if driver is None else {"host": driver.get("host"), "pid": driver.get("pid")},
        "active": len(live), "dead": len(records) - len(live),
        "notes": list(notes or []), "problems": problems,
        "exit_code": 1 if problems or job["state"] == FAILED or job["lost_mid_job"]
        or (job["stuck"] and job["state"] == "running") else 0,
    }
