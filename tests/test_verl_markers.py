"""The verl-release marker hook (tests/conftest.py): a test on a release it is not for fails, naming why.

Real pytest runs a scratch test file in a subprocess with the project's pytest settings (``-c pyproject.toml``)
and tests/conftest.py loaded as a plugin (``-p conftest``), so the hook under test is the suite's own.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from repo import REPO, verl_version
from subprocesses import run_command

OWN = {"0.9.0": None, "0.9.1": "verl091"}  # the marker (None: unmarked) of tests for the installed release
OTHER = {"0.9.0": "verl091", "0.9.1": None}  # ... and of tests for the other one


def run_pytest_on(tmp_path: Path, markers: list[str | None]) -> tuple[int, str]:
    """pytest, as the suite runs it, on one trivial test per entry of ``markers``."""
    tests = "".join(f"{f'@pytest.mark.{m}' + chr(10) if m else ''}def test_{i}():\n    pass\n\n\n"
                    for i, m in enumerate(markers))
    (tmp_path / "test_probe.py").write_text(f"import pytest\n\n\n{tests}")
    proc = run_command([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", REPO / "pyproject.toml",
                        "-p", "conftest", tmp_path / "test_probe.py"], check=False, cwd=tmp_path, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.anyverl
def test_wrong_release_fails_naming_the_installed_verl_and_test_sh(tmp_path: Path) -> None:
    installed = verl_version()
    assert installed in OTHER, f"written for verl 0.9.0/0.9.1, installed {installed}"
    code, out = run_pytest_on(tmp_path, [OTHER[installed]])
    assert code == 1 and "1 error" in out and "skipped" not in out, out  # failed: not skipped, not passed
    assert f"but verl {installed} is installed" in out and "scripts/test.sh" in out, out


@pytest.mark.anyverl
def test_own_release_and_anyverl_run(tmp_path: Path) -> None:
    code, out = run_pytest_on(tmp_path, [OWN[verl_version()], "anyverl"])
    assert code == 0 and "2 passed" in out, out
