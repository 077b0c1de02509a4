"""The one env scrub and the subprocess helpers of the tests: ``verl_ascend_ext.testing.subprocesses`` (shipped in the
kit, so feature packages run theirs the same way), importable here as plain ``import subprocesses``
(pyproject's ``[tool.pytest.ini_options] pythonpath = ["tests"]``), also from the engine venv's pytest."""

from verl_ascend_ext.testing.subprocesses import (
    KEPT,
    SCRUBBED_NAMES,
    SCRUBBED_PREFIXES,
    last_json,
    run_command,
    run_python,
    scrubbed,
    scrubbed_env,
)

__all__ = ["KEPT", "SCRUBBED_NAMES", "SCRUBBED_PREFIXES", "last_json", "run_command", "run_python", "scrubbed",
           "scrubbed_env"]
