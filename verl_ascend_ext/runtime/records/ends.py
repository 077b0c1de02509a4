"""Whether and how a process failed, told in one place (``how_failed``), from its record and its liveness.

A process failed when its record holds an end (``ended``, written by ``process_end``) by a signal, an exception or a
non-zero exit; when it holds none and the process is gone ("ended without a word": SIGKILL, the OOM killer, a native
crash, a lost host); or when the job's watch saw it stopped too long (a notice whose ``how`` begins with ``STOPPED``),
dead since or not. An exit 0, or an interpreter that just finished (code None), is no failure; a recorded end decides
even while the process is still alive (it is on its way out).

Three readers ask, each in its own words: the job's watch (``watch``: is a process of the job lost now?), the job's
outcome (``outcome.failure_events``: a record's dated failures) and `verl-ascend status`'s line on how each process
ended (``outcome.end_of``). Only the standard library is imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from verl_ascend_ext.runtime.records.schema import ENDINGS, EXCEPTION, EXIT, SIGNAL

NO_WORD = "ended without a word"
STOPPED = "stopped"  # how a notice of a process stopped too long begins (``records.watch``)


@dataclass(frozen=True)
class Failure:
    """How a process failed. ``kind``: ``SIGNAL``, ``EXCEPTION`` or ``EXIT`` (a recorded end), ``NO_WORD`` (gone with
    no end) or ``STOPPED`` (seen stopped too long). ``what``: the signal's name, ``exception <type>`` (the innermost
    of the chain), ``exit <code>``; ``NO_WORD``, or the notice's ``how``. ``at``: when, from the recorded end or the
    notice; None where nobody saw when (a silent death without a notice)."""

    kind: str
    what: str
    at: float | None = None
    signal: str | None = None
    code: int | None = None
    chain: list[dict[str, Any]] = field(default_factory=list)  # a recorded end's exceptions, outermost first
    by: str | None = None  # who saw it (a notice's ``by``)

    @property
    def recorded(self) -> bool:
        """Whether the process recorded this end itself (a signal, an exception, an exit)."""
        return self.kind in ENDINGS


def stopped_too_long(notice: Mapping[str, Any] | None) -> bool:
    """Whether a notice is of a process the job's watch found stopped too long (not of a death)."""
    return notice is not None and str(notice.get("how", "")).startswith(STOPPED)


def failing_end(ended: Mapping[str, Any] | None) -> Failure | None:
    """A recorded end (``ended``) as a failure: by a signal, an exception or a non-zero exit; None for any other."""
    if not ended:
        return None
    how, code, chain = ended.get("how"), ended.get("code"), list(ended.get("error") or [])
    at = ended.get("at")
    if how == SIGNAL:
        return Failure(SIGNAL, str(ended.get("signal")), at, signal=ended.get("signal"), code=code, chain=chain)
    if how == EXCEPTION:
        return Failure(EXCEPTION, f"exception {(chain or [{}])[-1].get('type')}", at, code=code, chain=chain)
    if how == EXIT and code not in (0, None):
        return Failure(EXIT, f"exit {code}", at, code=code, chain=chain)
    return None


def how_failed(rec: Mapping[str, Any], alive: bool | None,
               seen: Mapping[str, Any] | None = None) -> Failure | None:
    """Whether and how the process of ``rec`` failed, given whether it runs (``alive``; None: not known here, e.g.
    another host's) and the first notice another process wrote of it (``seen``: ``outcome.deaths_seen``). Its
    recorded end decides when it has one; else a notice of a stop too long, or of its death where it is not seen
    running; else, gone, it ended without a word (with no time); else it did not fail (or nothing is known)."""
    if rec.get("ended"):
        return failing_end(rec["ended"])
    if seen is not None and (alive is not True or stopped_too_long(seen)):
        kind = STOPPED if stopped_too_long(seen) else NO_WORD
        return Failure(kind, str(seen.get("how") or NO_WORD), seen.get("at"), by=seen.get("by"))
    if alive is False:
        return Failure(NO_WORD, NO_WORD)
    return None
