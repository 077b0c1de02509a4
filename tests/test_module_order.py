"""The order the test phases hand modules to xdist workers in (tests/conftest.py, scripts/test.sh's
``--no-loadscope-reorder``): modules marked ``long_module`` first, then the rest by number of tests, most first.

Real pytest collects scratch test files in a subprocess with the project's settings and tests/conftest.py loaded as a
plugin, so the hook under test is the suite's own; a real 2-worker xdist run shows the first module each worker got.
"""

from __future__ import annotations

import sys
from pathlib import Path

from repo import REPO
from subprocesses import run_command

MODULES = {  # module -> (tests, marked long_module)
    "test_a_few.py": (2, False), "test_b_many.py": (5, False), "test_c_long.py": (1, True), "test_d_one.py": (1, False),
}


def write_modules(directory: Path) -> None:
    for name, (count, long) in MODULES.items():
        mark = "pytestmark = pytest.mark.long_module\n\n\n" if long else ""
        tests = "".join(f"def test_{i}():\n    pass\n\n\n" for i in range(count))
        (directory / name).write_text(f"import pytest\n\n{mark}{tests}")


def pytest_in(directory: Path, *args: str) -> str:
    proc = run_command([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-c", REPO / "pyproject.toml",
                        "-p", "conftest", *args, str(directory)], check=False, cwd=directory, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_long_modules_first_then_by_number_of_tests(tmp_path: Path) -> None:
    write_modules(tmp_path)
    out = pytest_in(tmp_path, "--collect-only", "-q")
    modules = list(dict.fromkeys(Path(line.partition("::")[0]).name for line in out.splitlines() if "::" in line))
    assert modules == ["test_c_long.py", "test_b_many.py", "test_a_few.py", "test_d_one.py"], out


def test_xdist_hands_them_out_in_that_order(tmp_path: Path) -> None:
    write_modules(tmp_path)
    out = pytest_in(tmp_path, "-v", "-n", "2", "--dist", "loadfile", "--no-loadscope-reorder")
    first: dict[str, str] = {}  # worker -> the module of the first test it ran
    for line in out.splitlines():
        if line.startswith("[gw"):
            first.setdefault(line.split()[0], Path(line.split()[-1].partition("::")[0]).name)
    assert sorted(first.values()) == ["test_b_many.py", "test_c_long.py"], out
