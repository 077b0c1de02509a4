"""``verl-ascend ... | head``: a reader that closes the pipe early ends the command quietly (no traceback), with the
shell's status for SIGPIPE (issue 62)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from repo import REPO

from verl_ascend_ext.tooling.cli import SIGPIPE_EXIT


@pytest.mark.parametrize("args", [["catalogue"], ["status", "--all"], ["status", "--all", "--json"], ["doctor"]])
def test_a_closed_pipe_ends_the_command_quietly(args: list[str], tmp_path) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line: every write fails with EPIPE
    env = {**os.environ, "VERL_ASCEND_EXT_STATUS_DIR": str(tmp_path)}
    try:
        proc = subprocess.run([sys.executable, "-m", "verl_ascend_ext.tooling.cli", *args], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=REPO, timeout=120, check=False)
    finally:
        os.close(write_end)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.returncode == SIGPIPE_EXIT, (proc.returncode, proc.stderr)
