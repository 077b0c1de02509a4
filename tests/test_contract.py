"""The patch contract of EVERY registered record, on every cached release it concerns (``verl_ascend_ext.testing``).

One suite checks every record the same way (as ddtrace's contrib patch test cases and OpenTelemetry's
instrumentor tests check every integration): prediction == apply with every gate on, off and killed; the
target untouched when off or killed; one layer when on, still one after booting and applying again; and
one mutant of the real source per fingerprint pattern, whose verdict must change, predicted, in-process and
by doctor alike. A new record is covered without writing anything here.

Releases: what scripts/fetch_*.sh cache (verl 0.9.0 / 0.9.1 wheels imported for real; the installed vLLM
0.23.0 imported for real; vLLM 0.24.0 ... 0.33.0 ``core.py`` and vLLM-Ascend 0.23.0, which cannot be imported
here, as their released definitions in stand-in modules), vLLM-Ascend 0.23.0 with each diff of
patches/vllm-ascend/ applied and verl 0.9.0 with each diff of patches/verl/ (the fixed shapes no release carries
yet). The GLM-5.2 patch code imports
torch_npu: the in-process half installs the CPU test double (tests/scenarios/npu_test_double.py) first.
A missing fixture fails.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from glm52_ascend_fixtures import MAIN_LAYERNORM_BLOB, main_layernorm
from repo import CACHE, REPO

from verl_ascend_ext.runtime.records.reader import read_records
from verl_ascend_ext.runtime.registry import registry
from verl_ascend_ext.testing import ContractReport, Release, cached_releases, check_contract, with_diff
from verl_ascend_ext.testing.releases import copy_packages

pytestmark = pytest.mark.long_module  # its fixture runs the contract suite on every release (~80 s)

SUMMARIES: list[str] = []  # printed at the end of the run (conftest's pytest_terminal_summary)


_built: dict[str, object] = {}  # once per process, however a test runner batches this module's tests


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> list[Release]:
    if "releases" not in _built:
        _built["releases"] = _releases(tmp_path_factory)
    return _built["releases"]  # type: ignore[return-value]


def _releases(tmp_path_factory: pytest.TempPathFactory) -> list[Release]:
    work = tmp_path_factory.mktemp("releases")
    cached = cached_releases(CACHE, work)
    found = {(r.distribution, r.version) for r in cached}
    for wanted in [("verl", "0.9.0"), ("verl", "0.9.1"), ("vllm", "0.23.0"), ("vllm", "0.33.0"),
                   ("vllm-ascend", "0.23.0")]:
        assert wanted in found, f"fixture missing: {wanted} (run scripts/setup_tests.sh); found {sorted(found)}"
    ascend = next(r for r in cached if r.distribution == "vllm-ascend")
    diffs = sorted((REPO / "patches" / "vllm-ascend").glob("*.diff"))
    main = work / "ascend-main-layernorm" / "release"
    copy_packages(ascend.root, main, None)
    main_layernorm(main)  # vLLM-Ascend main's layernorm.py, rebuilt byte for byte (the RMSNorm record's variant)
    label = f"{ascend.label} + main's layernorm.py (blob {MAIN_LAYERNORM_BLOB[:10]})"
    rebuilt = ascend._replace(root=main, label=label)
    verl = next(r for r in cached if (r.distribution, r.version) == ("verl", "0.9.0"))
    verl_diffs = [with_diff(verl, d, work / f"verl-diff-{i}")._replace(only=recognised_by(d))  # its record only
                  for i, d in enumerate(sorted((REPO / "patches" / "verl").glob("*.diff")))]
    return cached + [with_diff(ascend, d, work / f"diff-{i}") for i, d in enumerate(diffs)] + [rebuilt] + verl_diffs


def recognised_by(diff: Path) -> tuple[str, ...]:
    """The records a diff's README names (``**Recognised by**: `id`, `id`.``)."""
    line = next(x for x in diff.with_suffix(".md").read_text().splitlines() if x.startswith("**Recognised by**"))
    return tuple(re.findall(r"`([^`]+)`", line))


@pytest.fixture(scope="module")
def report(releases: list[Release], tmp_path_factory: pytest.TempPathFactory) -> ContractReport:
    if "report" in _built:
        return _built["report"]  # type: ignore[return-value]
    work = tmp_path_factory.mktemp("contract")
    result = check_contract(registry().records, releases, work,
                            prepare={"vllm-ascend": ["verl_ascend_ext.tooling.selftest.npu_test_double:install"]})
    SUMMARIES.append(result.summary())
    _built["report"], _built["work"] = result, work
    return result


def test_every_record_is_checked_on_a_release(report: ContractReport) -> None:
    unchecked = [rid for rid, lines in report.halves.items() if not lines]
    assert unchecked == [], f"records no cached release covers: {unchecked}"


def test_every_record_keeps_the_contract(report: ContractReport) -> None:
    assert report.ok, "\n".join(str(f) for f in report.failures[:40])


def test_every_pattern_is_killed_or_kept_with_a_reason(report: ContractReport) -> None:
    killed, tested = report.score
    assert tested and killed >= tested * 0.9, report.summary()
    assert all(m.reason for m in report.mutations if m.outcome != "killed")


def test_the_suites_processes_record_in_a_status_directory_of_their_own(report: ContractReport) -> None:
    """Each mutant job runs doctor, which reads the status directory: the suite's own (under its work directory), not
    the machine's default one, which may hold thousands of other jobs' records (1.7 s a doctor, measured)."""
    records, _ = read_records(str(_built["work"] / "status"))  # type: ignore[operator]
    assert len({r["pid"] for r in records}) >= len(report.halves), len(records)  # a process a job at least
