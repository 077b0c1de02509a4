"""How a job ended, from its processes' records: the outcome, the process that failed first and why.

A record says how its process ended (``ended``, from ``process_end``) and which errors the plugin raised in
it (``errors``, at the moment they were raised). A process whose record is dead without an end ended
"without a word" (SIGKILL, the OOM killer, a native crash, a lost host): only the time its record was last
written is known.

The job's outcome is its driver's (the newest driver record): running, ended well (exit 0, or an exit with
no error seen), or failed (an exception, a signal, a non-zero exit, or no word). For a failed job:

- first failure: the earliest recorded failure (an error the plugin raised, an exception, a signal, a
  non-zero exit) in any process; except that when an error in the chain the driver recorded is Ray's
  report of a death (``ActorDiedError``, ``WorkerCrashedError``, ...) naming the actor (its id, which a Ray
  worker's record holds) or the pid of a process that ended without a word, that process failed first: it
  died before anyone could report it;
- root cause: that failure's innermost message, and the processes it names (``pid N``) with how each ended;
- the rest: how every other process ended, counted (a failed Ray job's teardown).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from typing import Any

from verl_ascend_ext.runtime.records.schema import DRIVER, EXCEPTION, EXIT, SIGNAL

DEATH_REPORT = re.compile(r"(Actor|Worker|Node|Owner|Raylet)(Died|Crashed)")  # Ray's exception names
ACTOR_ID = re.compile(r"\bactor_id:\s*([0-9a-f]{8,})")  # Ray's ActorDiedError: "\tactor_id: 6f1c..."
PID = re.compile(r"\bpid(?:[:=]\s*|\s+)(\d+)")  # "pid: 8367" (Ray), "pid 8367" (ours), "pid=8367"
RUNNING, ENDED_WELL, FAILED, UNKNOWN = "running", "ended well", "failed", "unknown"
NO_WORD = "ended without a word"


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


def clock(t: float | None) -> str:
    return "?" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def silent(rec: dict[str, Any]) -> bool:
    """Dead (seen on this host) with no recorded end."""
    return rec.get("alive") is False and not rec.get("ended")


def end_of(rec: dict[str, Any], last_record: bool = True) -> str:
    """One line on how the process ended (or that it runs); for one that ended without a word, with the time of its
    last record unless ``last_record`` is false."""
    if rec.get("alive"):
        return "running"
    ended = rec.get("ended")
    if not ended:
        if rec.get("alive") is not False:
            return "?"
        return f"{NO_WORD} (last record {clock(rec.get('updated'))})" if last_record else NO_WORD
    how, code = ended.get("how"), ended.get("code")
    if how == SIGNAL:
        return str(ended.get("signal"))
    if how == EXCEPTION:
        first = (ended.get("error") or [{}])[-1]
        return f"exception {first.get('type')}"
    text = "exited" if code is None else f"exit {code}"
    if ended.get("error"):
        text += f" after {(ended['error'])[0].get('type')}"
    return text


def failure_events(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The failures ``rec`` recorded, each with its time: errors the plugin raised, then a failing end."""
    out = [{"at": e.get("at"), "kind": "raised", "by": e.get("by"), "chain": [e]} for e in rec.get("errors") or []]
    ended = rec.get("ended") or {}
    how, code = ended.get("how"), ended.get("code")
    if how in (EXCEPTION, SIGNAL) or (how == EXIT and code not in (0, None)):
        out.append({"at": ended.get("at"), "kind": how, "signal": ended.get("signal"), "code": code,
                    "chain": ended.get("error") or []})
    return out


def _find(records: list[dict[str, Any]], pid: int) -> dict[str, Any] | None:
    """The newest record of ``pid`` (a message names a pid, not a host)."""
    found = [r for r in records if int(r.get("pid", -1)) == pid]
    return max(found, key=lambda r: r.get("started", 0)) if found else None


def _who(rec: dict[str, Any]) -> dict[str, Any]:
    return {"host": rec.get("host"), "pid": rec.get("pid"), "role": label(rec), "ranks": rec.get("ranks") or {},
            "ended": end_of(rec), "last_record": rec.get("updated")}


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


def outcome(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The job's outcome from every record of its status directory (see the module's docstring)."""
    driver = newest_driver(records)
    events = sorted(((ev, rec) for rec in records for ev in failure_events(rec)),
                    key=lambda pair: pair[0]["at"] or 0.0)
    if driver is None:
        state = FAILED if events else UNKNOWN
    elif driver.get("alive"):
        state = RUNNING
    elif silent(driver) or any(ev["kind"] != "raised" for ev in failure_events(driver)):
        state = FAILED
    else:
        state = ENDED_WELL if driver.get("ended") else UNKNOWN
    out: dict[str, Any] = {"state": state, "driver": None if driver is None else _who(driver),
                           "first_failure": None, "root_cause": None, "named": [], "rest": {}}
    if state not in (FAILED, RUNNING) or (state == RUNNING and not events):
        return out
    driver_chain = [e for ev in (failure_events(driver) if driver else []) for e in ev["chain"]]
    died = _died_first(records, driver_chain)
    if died is not None:
        first, report = died
        out["first_failure"] = {**_who(first), "how": NO_WORD, "at": None}
        out["root_cause"] = (f"{label(first)} (host {first.get('host')}, pid {first.get('pid')}) {NO_WORD}; last "
                             f"record {clock(first.get('updated'))}. Reported as {report.get('type')}: "
                             + str(report.get("message")).splitlines()[0])
        cause_entry = report
    elif events:
        event, first = events[0]
        innermost = event["chain"][-1] if event["chain"] else {}
        how = {"raised": f"raised {innermost.get('type')} ({event.get('by')})", SIGNAL: str(event.get("signal")),
               EXCEPTION: f"exception {innermost.get('type')}"}.get(event["kind"], f"exit {event.get('code')}")
        out["first_failure"] = {**_who(first), "how": how, "at": event["at"], "where": innermost.get("where"),
                                "chain": event["chain"]}
        out["root_cause"] = f"{innermost.get('type')}: {innermost.get('message')}" if innermost else how
        cause_entry = innermost
    elif driver is not None and silent(driver):
        first, cause_entry = driver, {}
        out["first_failure"] = {**_who(driver), "how": NO_WORD, "at": None}
        out["root_cause"] = f"the driver {NO_WORD}; last record {clock(driver.get('updated'))}"
    else:
        return out
    named = []
    for pid in dict.fromkeys(PID.findall(str(cause_entry.get("message", "")))):
        rec = _find(records, int(pid))
        if rec is not None and rec is not first:
            named.append(_who(rec))
    out["named"] = named
    rest = Counter(f"{label(r)}: {end_of(r, last_record=False)}" for r in records if r is not first and r is not driver)
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
    out = ["Job: FAILED" if state == FAILED else "Job: running; failures recorded so far"]
    first = result.get("first_failure")
    if first:
        at = "" if first.get("at") is None else f" at {clock(first['at'])}"
        where = f" in {first['where']}" if first.get("where") else ""
        out.append(f"  failed first: {first['role']} (host {first['host']}, pid {first['pid']}): "
                   f"{first['how']}{at}{where}")
        out.append(f"  root cause: {result.get('root_cause')}")
        for who in result.get("named") or []:
            out.append(f"  named there: {who['role']} (host {who['host']}, pid {who['pid']}): {who['ended']}")
    if driver and state == FAILED:
        out.append(f"  driver (host {driver['host']}, pid {driver['pid']}): {driver['ended']}")
    if result.get("rest"):
        out.append("  how the rest ended: " + "; ".join(f"{k} x{n}" if n > 1 else k
                                                        for k, n in result["rest"].items()))
    return [*out, ""]
