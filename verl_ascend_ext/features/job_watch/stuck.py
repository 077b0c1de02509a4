"""When a job is stuck: no progress for longer than a bound that adapts to the job, and who the rest wait on.

Progress is what the trainer already counts: its ``global_steps`` (verl's v1 PPO trainer and the fully-async trainer
both keep it), read by the job watch's thread at each look; nothing is added to the step's path. ``Progress`` keeps
when the count last changed and the longest time between two changes so far (the first one from ``fit``'s start: a
first step with its compile and cold caches). The job is stuck when the count has not changed for longer than
``FACTOR`` times that longest time, and never before ``floor`` seconds (``VERL_ASCEND_EXT_JOB_STUCK_TIMEOUT``);
before the first step completes, the bound is ``FIRST_STEP`` times the floor. A slow job whose steps keep
completing is never stuck: each completed step resets the clock, and a slower step raises the bound.

``apart`` reads the stacks of a stuck job (``records.stacks``): within each kind of process (role and actor class)
of which there are several, one that waits elsewhere than all the others, which share one place, is the one the
others wait on (the one rank not in the collective); a process that did not answer is apart too; and where a single
process of the whole job waits in none of the places a process waits for work or for another (``WAITS``: its
innermost frame a poll, a select, a condition's wait, a queue's get, Ray's get, zmq's receive...; or a collective),
that one is where the job's work stopped (a rollouter or an engine worker held in native code: one of a kind, or one
of two that are not ranks of a collective). Where several are, none is named by that rule (their stacks are still
shown). Only the standard library is imported (and ``records.stacks``).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from verl_ascend_ext.runtime.records.stacks import Frame, Thread, waiting_in

FACTOR = 5.0  # the bound: this many times the longest time between two steps so far (3x: 1 % false alarms)
FIRST_STEP = 4.0  # before the first step completes: this many times the floor (an hour by default)


@dataclass
class Progress:
    """The job's progress as the watch sees it (see the module)."""

    floor: float
    began: float
    value: Hashable = None
    changed: float = field(default=0.0)
    longest: float = 0.0  # the longest time between two changes (the first from ``began``)
    changes: int = 0

    def __post_init__(self) -> None:
        self.changed = self.changed or self.began

    def see(self, value: Hashable, now: float) -> None:
        """The count as read at ``now``."""
        if self.changes == 0 and self.value is None:
            self.value = value
            if value is None:
                return
        if value != self.value:
            self.longest = max(self.longest, now - self.changed)
            self.value, self.changed = value, now
            self.changes += 1

    def bound(self) -> float:
        """Seconds without progress after which the job is stuck."""
        if self.changes == 0:
            return FIRST_STEP * self.floor
        return max(self.floor, FACTOR * self.longest)

    def idle(self, now: float) -> float:
        return now - self.changed

    def stuck(self, now: float) -> bool:
        return self.idle(now) > self.bound()


def kind_of(answer: dict[str, Any]) -> tuple[Any, Any]:
    return answer.get("role"), answer.get("actor_class")


def where(answer: dict[str, Any], depth: int = 4) -> tuple[tuple[Any, ...], ...] | None:
    """Where a process waits (``stacks.waiting_in``: ``depth`` innermost frames), or None where it did not answer."""
    threads = answer.get("threads")
    if not threads:
        return None
    frames = waiting_in([Thread(t["ident"], t["current"], [Frame(**f) for f in t["frames"]]) for t in threads])
    return tuple((f.file, f.line, f.func) for f in frames[:depth])


def apart(answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The processes the rest of their kind wait on (see the module): each kind of several processes where all but
    one share a place; every process that did not answer; the one process of the job, where only one is, that waits
    in no known waiting place."""
    out = [a for a in answers if "threads" not in a]
    kinds: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for answer in answers:
        if "threads" in answer:
            kinds.setdefault(kind_of(answer), []).append(answer)
    for members in kinds.values():
        if len(members) < 3:
            if len(members) == 2 and where(members[0]) != where(members[1]):
                out += [m for m in members if _waits_alone(m, members)]
            continue
        places: dict[Any, list[dict[str, Any]]] = {}
        for member in members:
            places.setdefault(where(member), []).append(member)
        if len(places) == 2:
            small = min(places.values(), key=len)
            if len(small) == 1:
                out += small
    working = [a for a in answers if "threads" in a and _working(a)]
    if len(working) == 1 and not any(a is working[0] for a in out):
        out += working
    return out


# where a process waits for work or for another (its innermost Python frame: a C call it makes, such as libc's
# ``sleep`` or a lock's acquire, is not a frame of its own): a poll or select, a condition's or an event's wait, a
# queue's get, Ray's get of objects or its task loop, zmq's receive, a thread pool's idle worker, a join
WAITS = frozenset(("wait", "poll", "select", "get", "get_objects", "recv", "recv_multipart", "recv_pyobj", "acquire",
                   "_worker", "main_loop", "accept", "join", "run_forever", "_run_once", "read", "readline",
                   "acquire_read", "dequeue"))


def _working(answer: dict[str, Any]) -> bool:
    """Waiting in none of ``WAITS`` and in no collective: where its work stopped (or still working). A thread whose
    innermost Python frame is ``threading.Thread.run`` runs a target written in C (an actor's event loop or pool
    thread, measured in CI's fully-async stuck cell): it waits there."""
    place = where(answer, depth=1)
    if not place:
        return False
    file, _, func = place[0]
    idle_thread = func == "run" and str(file).endswith("threading.py")
    return str(func) not in WAITS and not idle_thread and not _in_collective(answer)


def _waits_alone(member: dict[str, Any], pair: list[dict[str, Any]]) -> bool:
    """Of two processes of one kind waiting in different places: the one not waiting in a collective (its peer's
    innermost frames name one: ``all_reduce``, ``all_gather``, ``barrier``, ``broadcast``...)."""
    other = pair[1] if pair[0] is member else pair[0]
    return _in_collective(other) and not _in_collective(member)


COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier", "all_to_all", "send", "recv")


def _in_collective(answer: dict[str, Any]) -> bool:
    """Whether it waits in a collective: one of its 3 innermost frames names one (deeper ones are its callers,
    which may be on the way to one they never reached)."""
    place = where(answer, depth=3) or ()
    return any(any(name in str(func) for name in COLLECTIVES) for _, _, func in place)
