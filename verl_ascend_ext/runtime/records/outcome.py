"""How a job ended, from its processes' records: the outcome, the process that failed first and why.

A record says how its process ended (``ended``, from ``process_end``) and which errors the plugin raised in
it (``errors``, at the moment they were raised); whether and how that end, or the lack of one, is a failure is
``ends.how_failed``'s (the job's watch asks it too). A process whose record is dead without an end ended
"without a word" (SIGKILL, the OOM killer, a native crash, a lost host); when another process noticed its death
(``seen_dead``: the job's watch in the trainer's process, ``records.watch``), the time it was first seen dead is
its time of death; otherwise only the time its record was last written is known, which may date from its boot. A
process the watch found stopped too long (a notice whose ``how`` begins with ``STOPPED``) failed when it was first
seen stopped, whether it has died since or is still stopped.

The job's outcome: running while its driver (the newest driver record) runs; failed when the driver failed (an
exception, a signal, a non-zero exit, or no word) or when a process doing the job's work (a Ray actor, a vLLM
process: ``does_job_work``) was lost before the job's teardown began (``teardown``: when the trainer's ``fit``
ended, else the driver's end): it ended without a word (seen dead then), by a signal, an exception or a non-zero
exit, even if the driver then exited 0; ended well otherwise. For a failed job:

- first failure: the earliest failure with a known time (an error the plugin raised, an exception, a signal, a
  non-zero exit, a death seen by another process) in any process; except that, when none of those precedes it,
  an error in the driver's chain that is Ray's report of a death (``ActorDiedError``, ``WorkerCrashedError``, ...)
  naming the actor (its id, which a Ray worker's record holds) or the pid of a process that ended without a word
  and was never seen dead names that process: it died before anyone could report it;
- root cause: that failure's innermost message, and the processes it names (``pid N``) with how each ended;
- the rest: how every other process ended, counted (a failed Ray job's teardown).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from typing import Any

from verl_ascend_ext.runtime.records.ends import NO_WORD, STOPPED, how_failed, stopped_too_long
from verl_ascend_ext.runtime.records.kinship import ancestors
from verl_ascend_ext.runtime.records.schema import (
    DRIVER,
    ENGINE_CORE,
    EXCEPTION,
    EXIT,
    RAY_WORKER,
    SIGNAL,
    VLLM_FRONTEND,
    VLLM_WORKER,
)

DEATH_REPORT = re.compile(r"(Actor|Worker|Node|Owner|Raylet)(Died|Crashed)")  # Ray's exception names
ACTOR_ID = re.compile(r"\bactor_id:\s*([0-9a-f]{8,})")  # Ray's ActorDiedError: "\tactor_id: 6f1c..."
PID = re.compile(r"\bpid(?:[:=]\s*|\s+)(\d+)")  # "pid: 8367" (Ray), "pid 8367" (ours), "pid=8367"
RUNNING, ENDED_WELL, FAILED, UNKNOWN = "running", "ended well", "failed", "unknown"
DIED = "died"  # a failure event: a death without a word (or a stop too long), seen by another process
WORKING_ROLES = (RAY_WORKER, VLLM_FRONTEND, ENGINE_CORE, VLLM_WORKER)


def is_idle_pool_worker(rec: dict[str, Any]) -> bool:
    """A Ray worker from Ray's pool that never got an actor or task and imported no patch target."""
    return (rec.get("role") == RAY_WORKER and not rec.get("actor_class")
            and not any(p.get("imported") for p in (rec.get("patches") or {}).values()))


def does_job_work(rec: dict[str, Any]) -> bool:
    """A process that does the job's work (a Ray actor, a vLLM process; one known only from a notice of its loss):
    its loss mid-job fails the job."""
    return (rec.get("role") in WORKING_ROLES and not is_idle_pool_worker(rec)) or bool(rec.get("noticed_only"))


def identity_of(rec: dict[str, Any]) -> tuple[Any, Any, Any]:
    return rec.get("host"), rec.get("pid"), rec.get("proc_start")


def deaths_seen(records: list[dict[str, Any]]) -> dict[tuple[Any, Any, Any], dict[str, Any]]:
    """(host, pid, start) -> the first notice of that process's death in any record (``seen_dead``)."""
    out: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
    for rec in records:
        for notice in rec.get("seen_dead") or []:
            key = (notice.get("host"), notice.get("pid"), notice.get("proc_start"))
            if key not in out or (notice.get("at") or 0.0) < (out[key].get("at") or 0.0):
                out[key] = notice
    return out


def noticed_only(records: list[dict[str, Any]], seen: dict[tuple[Any, Any, Any], dict[str, Any]]
                 ) -> list[dict[str, Any]]:
    """A record for each death noticed of a process that left no record here (another node's process whose record
    was not gathered, a lost node): what the notice says of it, its liveness unknown."""
    have = {identity_of(rec) for rec in records}
    return [{"host": n.get("host"), "pid": n.get("pid"), "proc_start": n.get("proc_start"), "role": n.get("role"),
             "alive": None, "noticed_only": True} for key, n in seen.items() if key not in have]


def causal_key(at: float | None, rec: dict[str, Any], records: list[dict[str, Any]], died: bool) -> tuple:
    """The order of failures: by time; at the same time a silent death before a recorded end, a parent before its
    child."""
    return at or 0.0, not died, len(ancestors(rec, records))


def label(rec: dict[str, Any]) -> str:
    """Role, actor class and ranks: ``ray-worker WorkerDict rank 1``, ``engine-core dp rank 0``."""
    out = str(rec.get("role"))
    if rec.get("actor_class"):
        out += f" {rec['actor_class']}"
    ranks = rec.get("ranks") or {}
    if "rank" in ranks:
        out += f" rank {ranks['rank']}"
    if "dp_rank" in ranks:
        out += f" dp rank {ranks['dp_rank']}"
    return out


def format_time(t: float | None) -> str:
    """A time as the report prints it: local date and time to the second (``2026-12-05 14:03:27``), ``?`` unknown."""
    return "?" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def silent(rec: dict[str, Any]) -> bool:
    """Dead (seen on this host) with no recorded end."""
    failure = how_failed(rec, rec.get("alive"))
    return failure is not None and failure.kind == NO_WORD


def end_of(rec: dict[str, Any], last_record: bool = True, seen: dict[str, Any] | None = None) -> str:
    """One line on how the process ended (or that it runs); for one that ended without a word, when it was seen dead
    (``seen``: a notice) or else the time of its last record, unless ``last_record`` is false."""
    if rec.get("alive"):
        return f"running, {seen.get('how')} (seen by {seen.get('by')})" if stopped_too_long(seen) else "running"
    failure = how_failed(rec, rec.get("alive"), seen)
    ended = rec.get("ended")
    if not ended:
        if failure is None:
            return "?"
        if not last_record:
            return NO_WORD
        if failure.kind == STOPPED:
            return f"{NO_WORD}, after it was seen {failure.what} at {format_time(failure.at)} by {failure.by}"
        if seen is not None:
            return f"{NO_WORD} (seen dead {format_time(failure.at)} by {failure.by})"
        return f"{NO_WORD} (last record {format_time(rec.get('updated'))})"
    if failure is not None and failure.kind != EXIT:
        return failure.what
    code = ended.get("code")
    text = "exited" if code is None else f"exit {code}"
    if ended.get("error"):
        text += f" after {(ended['error'])[0].get('type')}"
    return text


def failure_events(rec: dict[str, Any], seen: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The failures ``rec`` recorded, each with its time: errors the plugin raised, then a failing end; for a
    process that ended without a word and was seen dead (``seen``), its death then; for one seen stopped too long,
    dead since or not, that stop."""
    out = [{"at": e.get("at"), "kind": "raised", "by": e.get("by"), "chain": [e]} for e in rec.get("errors") or []]
    failure = how_failed(rec, rec.get("alive"), seen)
    if failure is not None and failure.recorded:
        out.append({"at": failure.at, "kind": failure.kind, "signal": failure.signal, "code": failure.code,
                    "chain": failure.chain})
    elif failure is not None and seen is not None:
        out.append({"at": failure.at, "kind": DIED, "by": failure.by, "how": failure.what, "chain": []})
    return out


def _find(records: list[dict[str, Any]], pid: int) -> dict[str, Any] | None:
    """The newest record of ``pid`` (a message names a pid, not a host)."""
    found = [r for r in records if int(r.get("pid", -1)) == pid]
    return max(found, key=lambda r: r.get("started", 0)) if found else None


def _who(rec: dict[str, Any], seen: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"host": rec.get("host"), "pid": rec.get("pid"), "role": label(rec), "ranks": rec.get("ranks") or {},
            "ended": end_of(rec, seen=seen), "last_record": rec.get("updated")}


def _died_first(records: list[dict[str, Any]], chain: list[dict[str, Any]]) -> tuple[dict[str, Any], dict] | None:
    for entry in reversed(chain):  # innermost first
        if not DEATH_REPORT.search(str(entry.get("type"))):
            continue
        message = str(entry.get("message"))
        named = [r for actor in ACTOR_ID.findall(message) for r in records if r.get("actor_id") == actor]
        named += [r for pid in PID.findall(message) if (r := _find(records, int(pid))) is not None]
        for rec in named:
            if silent(rec):
                return rec, entry
    return None


def newest_driver(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The job's driver: of the driver records, the one started last (alive or not); None without one. Every reader
    of the records (the outcome, the settings reference of ``report``, ``compare``'s status side) takes this one."""
    drivers = [r for r in records if r.get("role") == DRIVER]
    return max(drivers, key=lambda r: r.get("started", 0)) if drivers else None


def lost_mid_job(records: list[dict[str, Any]], driver: dict[str, Any],
                 seen: dict[tuple[Any, Any, Any], dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(event, record) of each process doing the job's work that was lost before the job's teardown began: when
    its trainer's ``fit`` ended (``teardown``, written by the process the job watch ran in), else the driver's end."""
    teardowns = [r["teardown"] for r in records if r.get("teardown") is not None]
    until = min(teardowns) if teardowns else (driver.get("ended") or {}).get("at")
    if until is None:
        return []
    return [(ev, rec) for rec in records if rec is not driver and does_job_work(rec)
            for ev in failure_events(rec, seen.get(identity_of(rec)))
            if ev["kind"] != "raised" and ev["at"] is not None and ev["at"] < until]


def lost_while_running(records: list[dict[str, Any]], driver: dict[str, Any],
                       seen: dict[tuple[Any, Any, Any], dict[str, Any]]) -> list[dict[str, Any]]:
    """The processes doing the job's work that failed while the job runs (its driver alive), as its watch would find
    them: dead without a word, ended by a signal, an exception or an error exit, or stopped too long; none after the
    job's teardown began (its trainer's ``fit`` ended)."""
    teardowns = [r["teardown"] for r in records if r.get("teardown") is not None]
    until = min(teardowns) if teardowns else None
    out = []
    for rec in records:
        if rec is driver or not does_job_work(rec):
            continue
        failure = how_failed(rec, rec.get("alive"), seen.get(identity_of(rec)))
        if failure is None or (until is not None and failure.at is not None and failure.at >= until):
            continue
        if until is not None and failure.at is None and (rec.get("updated") or 0.0) >= until:
            continue  # a silent death whose last record follows the teardown's start: the teardown's
        out.append(rec)
    return out


ALL_JOBS = "*"


def one_job(records: list[dict[str, Any]], job: str | None = None) -> tuple[list[dict[str, Any]], str | None, str]:
    """The records of one job (``job``; default: the newest driver's), the job's id, and a sentence saying what was
    chosen and what was left out. ``job`` ``ALL_JOBS`` keeps every record. Records of no job (written before
    records named their job, or by a process that is of none) are kept when the chosen job is the newest driver's
    and that driver's record names no job either."""
    if job == ALL_JOBS:
        jobs = {r.get("job") for r in records if r.get("job")}
        return records, None, f"every job's records ({len(jobs)} job(s), --all)"
    if job is None:
        driver = newest_driver(records)
        job = None if driver is None else driver.get("job")
        if job is None:
            return records, None, "records name no job (an older verl-ascend-ext, or no driver recorded): all read"
        chosen = "the newest driver's"
    else:
        chosen = "--job"
    kept = [r for r in records if r.get("job") == job]
    left = len(records) - len(kept)
    text = f"job {job} ({chosen}): {len(kept)} record(s)"
    if left:
        text += f"; {left} record(s) of other jobs not shown (--all, or --job ID)"
    return kept, job, text


def outcome(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The job's outcome from every record of its status directory (see the module's docstring)."""
    driver = newest_driver(records)
    seen = deaths_seen(records)
    records = records + noticed_only(records, seen)
    events = sorted(((ev, rec) for rec in records for ev in failure_events(rec, seen.get(identity_of(rec)))),
                    key=lambda pair: causal_key(pair[0]["at"], pair[1], records, pair[0]["kind"] == DIED))
    mid_job = lost_mid_job(records, driver, seen) if driver is not None and not driver.get("alive") else []
    lost_now: list[dict[str, Any]] = []
    if driver is None:
        state = FAILED if events else UNKNOWN
    elif driver.get("alive"):
        state = RUNNING
        lost_now = lost_while_running(records, driver, seen)
    elif how_failed(driver, driver.get("alive")) is not None or mid_job:
        state = FAILED
    else:
        state = ENDED_WELL if driver.get("ended") else UNKNOWN
    verdicts = [{**rec["stuck"], "by": _who(rec)} for rec in records if rec.get("stuck")]
    out: dict[str, Any] = {"state": state, "driver": None if driver is None else _who(driver),
                           "stuck": max(verdicts, key=lambda v: v.get("at") or 0.0) if verdicts else None,
                           "first_failure": None, "root_cause": None, "named": [], "rest": {},
                           "lost_mid_job": [_who(rec, seen.get(identity_of(rec)))
                                            for rec in [*(rec for _, rec in mid_job), *lost_now]]}
    if state not in (FAILED, RUNNING) or (state == RUNNING and not events and not lost_now):
        return out  # (a running job found stuck: its verdict says it)
    driver_chain = [e for ev in (failure_events(driver) if driver else []) for e in ev["chain"]]
    died = _died_first([r for r in records if identity_of(r) not in seen], driver_chain)
    if died is not None and events and events[0][0]["kind"] == DIED:
        died = None  # a death seen with its time precedes what the driver's chain reports
    if died is not None:
        first, report = died
        out["first_failure"] = {**_who(first), "how": NO_WORD, "at": None}
        out["root_cause"] = (f"{label(first)} (host {first.get('host')}, pid {first.get('pid')}) {NO_WORD}; last "
                             f"record {format_time(first.get('updated'))}. Reported as {report.get('type')}: "
                             + str(report.get("message")).splitlines()[0])
        cause_entry = report
    elif events:
        event, first = events[0]
        innermost = event["chain"][-1] if event["chain"] else {}
        # a stop too long, a node lost: the notice says how; a death without a word is said as such
        stop = event["kind"] == DIED and (stopped_too_long(event) or event.get("how") not in (None, NO_WORD))
        how = {"raised": f"raised {innermost.get('type')} ({event.get('by')})", SIGNAL: str(event.get("signal")),
               EXCEPTION: f"exception {innermost.get('type')}",
               DIED: f"{event.get('how')}, seen by {event.get('by')}" if stop
               else f"{NO_WORD}, seen dead by {event.get('by')}"}.get(event["kind"], f"exit {event.get('code')}")
        out["first_failure"] = {**_who(first, seen.get(identity_of(first))), "how": how, "at": event["at"],
                                "where": innermost.get("where"), "chain": event["chain"]}
        if stop:
            since = "first seen stopped" if stopped_too_long(event) else "dated"
            out["root_cause"] = (f"{label(first)} (host {first.get('host')}, pid {first.get('pid')}) "
                                 f"{event.get('how')}; {since} {format_time(event['at'])}")
        elif event["kind"] == DIED:
            out["root_cause"] = (f"{label(first)} (host {first.get('host')}, pid {first.get('pid')}) {NO_WORD} "
                                 f"(SIGKILL, the OOM killer, a native crash); its last record "
                                 f"{format_time(first.get('updated'))}, seen dead {format_time(event['at'])}")
        else:
            out["root_cause"] = f"{innermost.get('type')}: {innermost.get('message')}" if innermost else how
        cause_entry = innermost
    elif lost_now:  # running, a process lost that nobody saw die: the one whose last record is the oldest
        first = min(lost_now, key=lambda rec: rec.get("updated") or 0.0)
        cause_entry = {}
        out["first_failure"] = {**_who(first), "how": NO_WORD, "at": None}
        out["root_cause"] = (f"{label(first)} (host {first.get('host')}, pid {first.get('pid')}) {NO_WORD} while the "
                             f"job runs; last record {format_time(first.get('updated'))}")
    elif driver is not None and silent(driver):
        first, cause_entry = driver, {}
        out["first_failure"] = {**_who(driver), "how": NO_WORD, "at": None}
        out["root_cause"] = f"the driver {NO_WORD}; last record {format_time(driver.get('updated'))}"
    else:
        return out
    named = []
    for pid in dict.fromkeys(PID.findall(str(cause_entry.get("message", "")))):
        rec = _find(records, int(pid))
        if rec is not None and rec is not first:
            named.append(_who(rec))
    out["named"] = named
    rest = Counter(f"{label(r)}: {end_of(r, last_record=False, seen=seen.get(identity_of(r)))}"
                   for r in records if r is not first and r is not driver)
    out["rest"] = dict(sorted(rest.items()))
    return out


def format_outcome(result: dict[str, Any]) -> list[str]:
    """The report's first lines."""
    state = result["state"]
    driver = result.get("driver")
    if state == ENDED_WELL:
        return [f"Job: ended well (driver pid {driver['pid']} on {driver['host']}: {driver['ended']})", ""]
    if state == UNKNOWN:
        return ["Job: outcome unknown (no driver record, or the driver's end was not recorded)", ""]
    lost = result.get("lost_mid_job") or []
    out = ["Job: FAILED" + (" (STUCK)" if result.get("stuck") else "") if state == FAILED else
           f"Job: running, {len(lost)} process(es) of it LOST (exit 1): the job may wait for ever on them" if lost else
           "Job: running, found STUCK (exit 1)" if result.get("stuck") else
           "Job: running; failures recorded so far"]
    stuck = result.get("stuck")
    if stuck:
        out.append(f"  STUCK: no progress for {stuck['idle_s']:.0f} s (bound {stuck['bound_s']:.0f} s; step count "
                   f"{stuck['steps']}), seen {format_time(stuck['at'])} by {stuck['by']['role']} (pid "
                   f"{stuck['by']['pid']}); the trainer waited in {stuck['phase']}")
        out += [f"    {len(g['processes'])} process(es) waited in {g['where']}: " + "; ".join(g["processes"])
                for g in stuck["groups"]]
        if stuck.get("apart"):
            out.append("    apart from the rest: " + "; ".join(stuck["apart"]))
    first = result.get("first_failure")
    if first:
        at = "" if first.get("at") is None else f" at {format_time(first['at'])}"
        where = f" in {first['where']}" if first.get("where") else ""
        out.append(f"  failed first: {first['role']} (host {first['host']}, pid {first['pid']}): "
                   f"{first['how']}{at}{where}")
        out.append(f"  root cause: {result.get('root_cause')}")
        for who in result.get("named") or []:
            out.append(f"  named there: {who['role']} (host {who['host']}, pid {who['pid']}): {who['ended']}")
    if driver and state == FAILED:
        out.append(f"  driver (host {driver['host']}, pid {driver['pid']}): {driver['ended']}")
    if lost:
        out.append(("  lost while it runs: " if state == RUNNING else
                    "  lost before the driver's teardown (the job FAILED even if the driver exited 0): ")
                   + "; ".join(f"{w['role']} (host {w['host']}, pid {w['pid']}): {w['ended']}"
                               for w in result["lost_mid_job"]))
    if result.get("rest"):
        out.append("  how the rest ended: " + "; ".join(f"{k} x{n}" if n > 1 else k
                                                        for k, n in result["rest"].items()))
    return [*out, ""]
