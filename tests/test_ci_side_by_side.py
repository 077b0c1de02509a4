"""benchmarks/ci_side_by_side.py: it reads the phase table scripts/test.sh prints and each pytest summary, compares
runs by phase, and makes a new machine's HOME with the package index's configuration and no cache."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from repo import REPO

SPEC = importlib.util.spec_from_file_location("ci_side_by_side", REPO / "benchmarks" / "ci_side_by_side.py")
bench = sys.modules[SPEC.name] = importlib.util.module_from_spec(SPEC)  # its dataclass looks itself up
SPEC.loader.exec_module(bench)


def log(verl090: int, engine: int, job: int, tests_failed: bool = False, closing: bool = True) -> str:
    """A run's log as scripts/test.sh and pytest -q write it, and this script's closing line."""
    summary = "1 failed, 741 passed, 1 warning" if tests_failed else "742 passed, 1 warning"
    outcome = "FAILED (exit 1)" if tests_failed else "ok"
    lines = [
        "........ [100%]",
        f"{summary} in {verl090}.12s (0:05:49)",
        "==== 43 passed in 1132.50s (0:18:52) ====",
        "",
        "Phases (wall time; a training job runs inside the engine tier's pytest phase, a background part beside the",
        "parts after it)",
        "  set-up: project venv (.venv)                              85 s  ok",
        f"  pytest: verl 0.9.0                                      {verl090:>4} s  {outcome}",
        f"    training job on (verl 0.9.0)                          {job:>4} s  exit 1",
        f"  pytest: engine tier (tests/engine)                     {engine:>4} s  ok",
        "  total (wall)                                            1782 s  (29 min 42 s)",
        "\tCommand being timed: \"bash .ci/run\"",
    ]
    if closing:
        lines.append("ci_side_by_side: rev=9e9111a exit=0 wall_s=1782 busy_cores=1.46 peak_used_gib=12.3")
    return "\n".join(lines) + "\n"


def test_the_parser_reads_back_the_table_scripts_test_sh_prints(tmp_path) -> None:
    """test.sh logs and prints its phases through scripts/phases.py (run as test.sh runs it); the benchmark reads the
    printed table back through the same module."""
    script = (REPO / "scripts" / "test.sh").read_text()
    assert '"$SCRIPTS/phases.py" add' in script and '"$SCRIPTS/phases.py" print' in script
    phases_log = tmp_path / "phases"
    tool = [sys.executable, str(REPO / "scripts" / "phases.py")]
    for name, seconds, outcome in (("set-up: project venv (.venv)", "85", "ok"),
                                   ("pytest: verl 0.9.0", "349", "FAILED (exit 1)"),
                                   ("  training job on (verl 0.9.0)", "179", "exit 1")):
        subprocess.run([*tool, "add", str(phases_log), name, seconds, outcome], check=True)
    printed = subprocess.run([*tool, "print", str(phases_log), "1782"], check=True, capture_output=True,
                             text=True).stdout
    assert bench.parse_log(printed, "x").phases == {
        "set-up: project venv (.venv)": (85.0, "ok"), "pytest: verl 0.9.0": (349.0, "FAILED (exit 1)"),
        "training job on (verl 0.9.0)": (179.0, "exit 1"), "total (wall)": (1782.0, "(29 min 42 s)")}
    assert printed.splitlines()[2].startswith("CPU: ")  # the machine, under the heading
    # the total against CI's budget (40 min on a new 2-core machine), on its own line
    assert printed.splitlines()[-1].strip() == "budget 40 min on a new 2-core machine: 10 min 18 s left", printed
    over = subprocess.run([*tool, "print", str(phases_log), "2700"], check=True, capture_output=True, text=True)
    assert over.stdout.splitlines()[-1].strip().endswith("OVER by 5 min 0 s"), over.stdout


def test_the_table_names_the_cpu_its_bf16_and_amx_flags_and_the_onednn_ceiling(tmp_path, monkeypatch) -> None:
    """A failure of a bf16 comparison can be tied to the machine: the model, each flag present or absent."""
    import phases

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9B14\nflags\t\t: fpu avx2 avx512f avx512_bf16\n\n"
                       "processor\t: 1\nmodel name\t: AMD EPYC 9B14\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    line = phases.machine(cpuinfo)
    assert line.startswith("CPU: AMD EPYC 9B14, ") and line.endswith(
        "; avx2 avx512f avx512_bf16 no-amx_bf16 no-amx_tile no-amx_int8"), line
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert phases.machine(cpuinfo).endswith("no-amx_int8; ONEDNN_MAX_CPU_ISA=AVX2")
    assert "flags unknown (" in phases.machine(tmp_path / "missing")


def test_phases_inner_rows_pytest_summaries_and_figures_are_read() -> None:
    run = bench.parse_log(log(349, 1132, 179), "new")
    assert run.phases["pytest: verl 0.9.0"] == (349.0, "ok")
    assert run.phases["training job on (verl 0.9.0)"] == (179.0, "exit 1")
    assert run.phases["total (wall)"] == (1782.0, "(29 min 42 s)")
    assert run.phases["pytest run 1"] == (349.12, "742 passed, 1 warning")
    assert run.phases["pytest run 2"] == (1132.5, "43 passed")
    assert "Command being timed" not in "".join(run.phases)
    assert run.figures == {"rev": "9e9111a", "exit": "0", "wall_s": "1782", "busy_cores": "1.46",
                           "peak_used_gib": "12.3"}


def test_runs_compare_by_phase_with_ratios_to_the_first_and_failures_marked() -> None:
    base = bench.parse_log(log(400, 1200, 180, closing=False), "base")
    new = bench.parse_log(log(300, 1200, 90, tests_failed=True), "new")
    table = bench.comparison([base, new]).splitlines()
    row = {line.split("  ")[0]: line for line in table}
    assert row["pytest: verl 0.9.0"].split()[-1] == "0.75" and " !" in row["pytest: verl 0.9.0"]
    assert row["training job on (verl 0.9.0)"].split()[-1] == "0.50"
    assert row["pytest: engine tier (tests/engine)"].split()[-1] == "1.00"
    assert row["wall_s"].split()[-2:] == ["-", "1782"]  # the base's log has no closing line
    assert "  new pytest run 1: 1 failed, 741 passed, 1 warning" in table


def test_a_new_machine_home_holds_the_index_configuration_and_no_cache(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    old = tmp_path / "old-home"
    (old / ".config" / "pip").mkdir(parents=True)
    (old / ".config" / "pip" / "pip.conf").write_text("[global]\nindex-url = file:///index\n")
    (old / ".gitconfig").write_text("[user]\nname = ci\n")
    (old / ".cache" / "pip" / "wheels").mkdir(parents=True)
    (old / ".cache" / "verl-ascend-ext").mkdir(parents=True)
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: old))
    new = tmp_path / "new-home"
    bench.new_machine_home(new)
    assert (new / ".config" / "pip" / "pip.conf").read_text() == "[global]\nindex-url = file:///index\n"
    assert (new / ".gitconfig").exists()
    assert sorted(p.relative_to(new).as_posix() for p in new.rglob("*")) == [
        ".config", ".config/pip", ".config/pip/pip.conf", ".gitconfig"]
