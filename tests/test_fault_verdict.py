"""The fault matrix's judgement of a cell (``tests/engine/fault_verdict.py``): a cell that missed any part of its
expectation is a miss, named, so that ``fault_matrix.py`` exits non-zero (issue 62)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "engine"))
from fault_verdict import KILL_BOUND, STOP_SLACK, Outcome, misses

MET = Outcome(returncode=1, fired=True, fault_to_end=3.2, names_faulted_first=True, checkpoint="step 1")


def test_a_cell_that_failed_fast_named_and_whole_is_met() -> None:
    assert misses(MET) == []
    assert misses(Outcome(1, True, 35.0, True, "step 1"), stop_bound=30.0) == []
    assert misses(Outcome(1, True, 3.0, True, "step 1", resumed="step 1; resumed to step 3")) == []


@pytest.mark.parametrize(("outcome", "stop_bound", "why"), [
    (Outcome(0, True, 3.2, True, "step 1"), None, "did not fail (exit 0)"),
    (Outcome(None, True, None, False, "step 1"), None, "did not fail"),
    (Outcome(1, True, None, True, "step 1"), None, "harness's timeout"),
    (Outcome(1, True, KILL_BOUND + 1, True, "step 1"), None, "bound 30 s"),
    (Outcome(1, True, 30.0 + STOP_SLACK + 1, True, "step 1"), 30.0, "bound 40 s"),
    (Outcome(1, True, 3.2, False, "step 1"), None, "did not name the faulted process"),
    (Outcome(1, True, 3.2, True, "step 1 (MISSING)"), None, "no whole checkpoint"),
    (Outcome(1, True, 3.2, True, "none"), None, "no whole checkpoint"),
    (Outcome(1, True, 3.2, True, "step 1", resumed="step 1; its resume exit 1 (see d)"), None, "did not resume"),
    (Outcome(1, False, None, False, "-"), None, "never fired"),
])
def test_each_part_of_the_expectation_missed_is_named(outcome: Outcome, stop_bound: float | None, why: str) -> None:
    found = misses(outcome, stop_bound)
    assert found and any(why in reason for reason in found), found


def test_every_miss_of_a_cell_is_listed() -> None:
    assert len(misses(Outcome(0, True, None, False, "none"))) == 4
