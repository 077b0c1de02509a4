"""The acts contract (``verl_ascend_ext.testing.acts``) on every record of this package: a replacement that can call
the original without doing its work declares ``acts_when``, reports ``acted`` exactly where it acts
(``acts_cases.py``), and a mutant reporting acting on a stand-down path is caught."""

from __future__ import annotations

from acts_cases import CASES

from verl_ascend_ext.runtime.registry import registry
from verl_ascend_ext.testing import check_acts


def test_every_record_keeps_the_acts_contract_and_every_mutant_is_killed() -> None:
    findings = check_acts(registry().records, CASES)
    failed = [str(f) for f in findings if not f.ok]
    assert failed == [], "\n".join(failed)
    acting = {r.id for r in registry().records if r.acts_when}
    mutants = {f.record for f in findings if f.check == "mutant"}
    assert mutants == acting, acting - mutants  # every acts_when record was mutated, and each mutant killed
    cases = {(f.record, f.detail.split(": reported")[0]) for f in findings if f.check == "case"}
    assert len(cases) == len(CASES)


def test_a_record_whose_replacement_can_stand_down_must_declare_when_it_acts() -> None:
    """An eager record (no ``acts_when``) whose patch code can return the original as it is: refused by the kit."""
    kv_b_proj = next(r for r in registry().records if r.id == "glm52-ascend-sfa-keep-kv-b-proj")
    undeclared = kv_b_proj._replace(acts_when="")
    failed = [f for f in check_acts([undeclared], CASES) if not f.ok]
    assert [f.check for f in failed] == ["declared", "declared"], failed
    assert "can return the original as it is" in failed[0].detail and "reports acted" in failed[1].detail, failed


def test_a_mutant_no_case_catches_survives_and_fails_the_contract() -> None:
    """With its stand-down cases left out, the 'acted on every call' mutant of a record survives: a failure."""
    wake_up = "glm52-vllm-wake-up-resume-when-awake"
    acting_only = [c for c in CASES if c.record == wake_up and c.acts]
    records = [r for r in registry().records if r.id == wake_up]
    survived = [f for f in check_acts(records, acting_only) if f.check == "mutant" and not f.ok]
    assert survived and "survived" in survived[0].detail, survived

