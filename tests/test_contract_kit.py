"""The contract kit's own verdicts on a pattern, on real verl 0.9.0 source (the cached wheel, read statically).

tests/test_contract.py shows every registered pattern killed; here the kit shows it can say otherwise: a pattern
that no single edit breaks alone is dead, and a dead pattern fails the contract until its fingerprint keeps it
with a reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from repo import CACHE

from verl_ascend_ext.patching import Fingerprint, Gate, PatchRecord
from verl_ascend_ext.testing import Release, from_artifact
from verl_ascend_ext.testing.contract import judge, predicted, unexplained
from verl_ascend_ext.testing.mutations import mutant, patterns, write_mutant
from verl_ascend_ext.testing.releases import link_copy

GATE = Gate("KIT_TEST_GATE", default=False, doc="-")
ASSERT = r"^\s+assert dict2\[key\] == dict1\[key\]"
COMPARE = r"\bdict2\[key\] == dict1\[key\]"  # within ASSERT's match: no edit breaks one alone
MERGE = r"^\s+dict1\[key\] = val$"


def record(kept: tuple[tuple[str, str], ...] = ()) -> PatchRecord:
    return PatchRecord(
        id="kit-test-union", feature="kit_test", why="-", target="verl.utils.py_functional:union_two_dict", gate=GATE,
        distribution="verl", versions=">=0.9.0,<0.10",
        original=Fingerprint(contains=(ASSERT, COMPARE, MERGE), description="assert, then merge", kept=kept),
        fixed=Fingerprint.never_matching("-"), wrapper="m:f", upstream="-", remove_when="-", traced=False)


@pytest.fixture(scope="module")
def verl090(tmp_path_factory: pytest.TempPathFactory) -> Release:
    wheel = CACHE / "vet-artifacts" / "verl-0.9.0-py3-none-any.whl"
    assert wheel.is_file(), f"{wheel} missing: run scripts/setup_tests.sh"
    return from_artifact(wheel, tmp_path_factory.mktemp("verl090"))


def verdicts(rec: PatchRecord, release: Release, work: Path) -> dict[str, str]:
    on = {GATE.env: "1"}
    out = {}
    for i, pattern in enumerate(patterns(rec)):
        found = mutant(pattern, release)
        copy = link_copy(release, work / f"m{i}", Path(found.definition.path))
        written = write_mutant(found, release, copy)
        result = judge(found, release, predicted(rec, release, on), predicted(rec, copy, on), written)
        out[pattern.regex] = result
    return out


def test_a_pattern_no_edit_breaks_alone_is_dead_and_fails_without_a_reason(verl090: Release, tmp_path: Path) -> None:
    results = verdicts(record(), verl090, tmp_path)
    assert {regex: r.outcome for regex, r in results.items()} == {ASSERT: "dead", COMPARE: "dead", MERGE: "killed"}
    assert "will-apply -> refused" in results[MERGE].detail
    assert "every edit that breaks it also changes" in results[COMPARE].detail
    failures = unexplained(results.values())
    assert len(failures) == 2 and all(f.detail.startswith("dead pattern with no reason") for f in failures)
    assert [any(repr(regex) in f.detail for f in failures) for regex in (ASSERT, COMPARE)] == [True, True]


def test_a_kept_reason_keeps_a_dead_pattern(verl090: Release, tmp_path: Path) -> None:
    kept = ((ASSERT, "the assert is what the fix replaces"), (COMPARE, "documents the comparison"))
    results = verdicts(record(kept), verl090, tmp_path)
    assert results[COMPARE].outcome == "dead" and results[COMPARE].reason == "documents the comparison"
    assert unexplained(results.values()) == []
