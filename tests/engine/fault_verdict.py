"""What a cell of the fault matrix (``fault_matrix.py``) must show, and whether it did: pure, so that the judgement
is tested without running a job (``tests/test_fault_verdict.py``).

A cell meets its expectation when the job failed (a non-zero exit, not the harness's timeout), ended within the
bound from the fault (``KILL_BOUND`` seconds for a kill; a stopped process: the watch's bound on it plus
``STOP_SLACK``), ``verl-ascend status`` named the faulted process first, the last whole checkpoint is there, and,
where the cell was resumed, the resumed job ended well past it. Anything else is a miss, named."""

from __future__ import annotations

from dataclasses import dataclass

KILL_BOUND = 30.0  # seconds from a kill to the job's end (issue 48's goal: worst <= 30 s; median ~3 s measured)
STOP_SLACK = 10.0  # seconds past the stopped-process bound (the watch looks every second; teardown is a few)


@dataclass(frozen=True)
class Outcome:
    """What one cell's job did, as the matrix read it."""

    returncode: int | None
    fired: bool  # the fault found its process
    fault_to_end: float | None  # seconds from the fault to the driver's end; None: not measured (timeout)
    names_faulted_first: bool  # status's first failure is the faulted process (route cell: the checking rank)
    checkpoint: str  # "step N", "step N (MISSING)" or "none"
    resumed: str | None = None  # fault_matrix.resumed's text when --resume ran


def misses(outcome: Outcome, stop_bound: float | None = None) -> list[str]:
    """Why the cell missed its expectation (empty: it met it); ``stop_bound`` is the stopped-process bound of a
    ``stop:`` cell (None for a kill)."""
    if not outcome.fired:
        return ["the fault never fired (no such process in this mode)"]
    found = []
    if outcome.returncode in (0, None):
        found.append(f"the job did not fail (exit {outcome.returncode})")
    bound = KILL_BOUND if stop_bound is None else stop_bound + STOP_SLACK
    if outcome.fault_to_end is None:
        found.append("the job did not end by itself (the harness's timeout ended it)")
    elif outcome.fault_to_end > bound:
        found.append(f"it ended {outcome.fault_to_end:.1f} s after the fault (bound {bound:g} s)")
    if not outcome.names_faulted_first:
        found.append("status did not name the faulted process first")
    if not outcome.checkpoint.startswith("step ") or outcome.checkpoint.endswith("(MISSING)"):
        found.append(f"no whole checkpoint ({outcome.checkpoint})")
    if outcome.resumed is not None and "resumed to step" not in outcome.resumed:
        found.append(f"the checkpoint did not resume ({outcome.resumed})")
    return found
