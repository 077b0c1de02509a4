"""One switch, one behaviour (issue 62): the fully-async fail-closed generation has its own gate, independent of the
job watch's; a setting that makes another feature wrong is named by doctor and refused at run time (the watch with
process ends off: it cannot tell a clean exit from a loss, so it does not start, and says why)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from verl_ascend_ext.features.fully_async_generation import declaration as generation
from verl_ascend_ext.features.job_watch import checks, declaration, patch_code
from verl_ascend_ext.features.job_watch.targets import WATCH_ID
from verl_ascend_ext.patching.status import forget, stood_down_on
from verl_ascend_ext.runtime.findings import INFO, OK, WARN
from verl_ascend_ext.runtime.records import process_end

WATCH_THREAD = "verl-ascend-ext-job-watch"


def test_the_fully_async_generation_has_its_own_gate() -> None:
    assert generation.GENERATION_FAILS_CLOSED.gate is generation.GATE
    assert generation.GATE.env != declaration.GATE.env
    off_watch = {declaration.GATE.env: "0"}
    assert generation.GATE.read(off_watch) is True  # the watch off leaves verl #6387 fixed
    assert declaration.GATE.read({generation.GATE.env: "0"}) is True


@pytest.mark.parametrize(("environ", "status"), [
    ({}, OK),
    ({"VERL_ASCEND_EXT_JOB_WATCH": "0"}, INFO),
    ({"VERL_ASCEND_EXT_JOB_WATCH": "0", "VERL_ASCEND_EXT_PROCESS_END": "0"}, INFO),
    ({"VERL_ASCEND_EXT_PROCESS_END": "0"}, WARN),
    ({"VERL_ASCEND_EXT_JOB_WATCH": "1", "VERL_ASCEND_EXT_PROCESS_END": "off"}, WARN),
])
def test_doctor_warns_on_the_watch_without_process_ends_and_only_then(environ: dict[str, str], status: str) -> None:
    [found] = checks.doctor_findings(environ, declaration.GATE)
    assert found.status == status, found
    if status == WARN:
        assert process_end.GATE.env in found.detail and "does not start" in found.detail and "Fix:" in found.detail


def _watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == WATCH_THREAD]


def test_the_watch_refuses_to_start_without_process_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("VERL_ASCEND_EXT_JOB", "job-switch-pairs")
    monkeypatch.setenv("VERL_ASCEND_EXT_STATUS_DIR", str(tmp_path))
    monkeypatch.setenv(process_end.GATE.env, "0")
    forget(WATCH_ID)
    with caplog.at_level(logging.WARNING, logger="verl_ascend_ext"), patch_code.watching(WATCH_ID):
        assert _watch_threads() == []
    assert any("not started" in path and process_end.GATE.env in path for path in stood_down_on(WATCH_ID))
    assert "the job watch did not start" in caplog.text and process_end.GATE.env in caplog.text
    forget(WATCH_ID)


def test_the_watch_starts_with_process_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_ASCEND_EXT_JOB", "job-switch-pairs")
    monkeypatch.setenv("VERL_ASCEND_EXT_STATUS_DIR", str(tmp_path))
    monkeypatch.delenv(process_end.GATE.env, raising=False)
    forget(WATCH_ID)
    with patch_code.watching(WATCH_ID):
        assert len(_watch_threads()) == 1
    assert stood_down_on(WATCH_ID) == []
    forget(WATCH_ID)
