"""One classification of a process's end (``runtime.records.ends``, issue 62) and the kinship the job's watch dates
along (``runtime.records.kinship``, with Ray's owner links as its actor table gives them).

``how_failed`` is what the watch, the outcome's failure events and `status`'s line per process all ask; each case
below is asserted through all three, so that they cannot drift apart again. Records are built through the schema's
factory (``tests/records.py``). Reading the owner links from a real Ray cluster: ``tests/test_ray_actor_owners.py``.
"""

from __future__ import annotations

import pytest
from records import record

from verl_ascend_ext.runtime.records.ends import NO_WORD, STOPPED, Failure, how_failed
from verl_ascend_ext.runtime.records.kinship import Kinship, ancestors
from verl_ascend_ext.runtime.records.outcome import end_of, failure_events
from verl_ascend_ext.runtime.records.watch import loss_words

ERROR = [{"type": "RuntimeError", "message": "outer"}, {"type": "ValueError", "message": "inner"}]
SEEN = {"host": "node-a", "pid": 4242, "proc_start": 1, "role": "engine-core", "at": 150.0, "how": NO_WORD,
        "by": "the job watch of pid 9"}
STOP = {**SEEN, "how": f"{STOPPED} for 600 s (SIGSTOP, SIGTSTP or a tracer), ..."}

# (ended, alive, seen) -> (kind, the watch's words, the outcome's event kind, status's line)
CASES = [
    ({"at": 100.0, "how": "signal", "signal": "SIGTERM", "code": None, "error": []}, False, None,
     ("signal", "ended by SIGTERM", "signal", "SIGTERM")),
    ({"at": 100.0, "how": "exception", "code": 1, "error": ERROR}, False, None,
     ("exception", "ended by exception ValueError", "exception", "exception ValueError")),
    ({"at": 100.0, "how": "exit", "code": 2, "error": ERROR}, False, None,
     ("exit", "ended with exit 2", "exit", "exit 2 after RuntimeError")),
    ({"at": 100.0, "how": "exit", "code": 0, "error": []}, False, None, (None, None, None, "exit 0")),
    ({"at": 100.0, "how": "exit", "code": None, "error": []}, False, None, (None, None, None, "exited")),
    (None, False, None, (NO_WORD, NO_WORD, None, "ended without a word (last record ")),
    (None, False, SEEN, (NO_WORD, NO_WORD, "died", "ended without a word (seen dead ")),
    (None, None, SEEN, (NO_WORD, NO_WORD, "died", "ended without a word (seen dead ")),
    (None, None, None, (None, None, None, "?")),
    (None, True, None, (None, None, None, "running")),
    (None, True, SEEN, (None, None, None, "running")),  # a notice of an earlier life: it runs
    (None, True, STOP, (STOPPED, STOP["how"], "died", "running, stopped for 600 s")),
    (None, False, STOP, (STOPPED, STOP["how"], "died", "ended without a word, after it was seen stopped for 600 s")),
]


@pytest.mark.parametrize(("ended", "alive", "seen", "expected"), CASES)
def test_one_classification_answers_the_watch_the_outcome_and_status_alike(ended, alive, seen, expected) -> None:
    kind, words, event, line = expected
    rec = record(ended=ended, alive=alive, updated=5.0)
    failure = how_failed(rec, alive, seen)
    assert (failure and failure.kind) == kind, failure
    assert (failure and loss_words(failure)) == words, failure
    events = [ev["kind"] for ev in failure_events(rec, seen)]
    assert events == ([event] if event else []), events
    assert end_of(rec, seen=seen).startswith(line), end_of(rec, seen=seen)


def test_a_recorded_end_decides_even_while_the_process_still_runs() -> None:
    """A process that recorded its SIGTERM and has not exited yet is on its way out: the watch loses it."""
    rec = record(ended={"at": 100.0, "how": "signal", "signal": "SIGTERM", "code": None, "error": []})
    assert how_failed(rec, True) == Failure("signal", "SIGTERM", 100.0, signal="SIGTERM")


def test_a_failures_time_comes_from_the_end_or_the_notice() -> None:
    exit_1 = {"at": 100.0, "how": "exit", "code": 1, "error": ERROR}
    assert how_failed(record(ended=exit_1), False).at == 100.0
    assert how_failed(record(), False, SEEN).at == 150.0 and how_failed(record(), False, SEEN).by == SEEN["by"]
    assert how_failed(record(), False).at is None  # nobody saw when


def kin_records() -> dict[str, dict]:
    """A rollouter (actor aa) owning a server (bb) that started an EngineCore, which started a worker; a stranger."""
    out = {"rollouter": record(pid=10, actor_id="aa" * 16, ppid=1),
           "server": record(pid=11, actor_id="bb" * 16, ppid=2),
           "stranger": record(pid=14, actor_id="cc" * 16, ppid=2)}
    out["core"] = record(pid=12, role="engine-core", ppid=11)
    out["worker"] = record(pid=13, role="vllm-worker", ppid=12)
    return out


def test_kinship_follows_parents_and_ray_owners_across_both() -> None:
    recs = kin_records()
    kin = Kinship(list(recs.values()), {"bb" * 16: "aa" * 16})
    assert [r["pid"] for r in kin.forebears(recs["worker"])] == [12, 11, 10]  # ppid, ppid, then the server's owner
    assert kin.descends(recs["server"], recs["rollouter"]) and kin.descends(recs["worker"], recs["rollouter"])
    assert not kin.descends(recs["rollouter"], recs["server"])  # kin one way: the owner is not owned
    assert not any(kin.descends(recs["stranger"], r) or kin.descends(r, recs["stranger"])
                   for name, r in recs.items() if name != "stranger")
    assert [r["pid"] for r in ancestors(recs["worker"], list(recs.values()))] == [12, 11]  # by ppid only


def test_kinship_ends_on_a_loop_of_links() -> None:
    """Records that name each other (a reused pid, a hand-made record) end the walk rather than loop."""
    a = record(pid=20, actor_id="dd" * 16, ppid=21)
    b = record(pid=21, actor_id="ee" * 16, ppid=20)
    assert [r["pid"] for r in Kinship([a, b], {"dd" * 16: "ee" * 16, "ee" * 16: "dd" * 16}).forebears(a)] == [21]
