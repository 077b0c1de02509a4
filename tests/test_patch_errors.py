"""One path for errors of patch code: the engine reports an exception of ours that escapes a replacement, under the
record's id, at the line that raised; an exception of the original it wraps is upstream's and is not reported.

The replacements are built by the engine (``replacement.build``) around real patch code of this package (the
checkpoint export check, which raises when it cannot check); the originals are small functions of this test.
A booted process recording such an error in its record file: ``tests/test_refusal.py`` (a refusal at import
and at discovery) and the engine tier (the bounded barrier's timeout in a real job, ``tests/engine``).
"""

from __future__ import annotations

import asyncio
import inspect
import linecache
import os
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from verl_ascend_ext.features.checkpoint import patch_code
from verl_ascend_ext.features.checkpoint.export_check import ExportCheckError
from verl_ascend_ext.patching import replacement as replacement_module
from verl_ascend_ext.patching import status
from verl_ascend_ext.patching.replacement import build, reported

RECORD = "checkpoint-export-check-fsdp"


@pytest.fixture
def escaped() -> Iterator[list[tuple[str, BaseException, str | None]]]:
    seen: list[tuple[str, BaseException, str | None]] = []
    status.on_error(lambda *args: seen.append(args))
    try:
        yield seen
    finally:
        status.on_error(None)


def saving_manager(tmp_path: Any) -> SimpleNamespace:
    """What verl's FSDP checkpoint manager looks like to the export check: rank 0 writing an HF export, with a model
    path that is not a local directory (so the check cannot run and, in mode ``error``, raises)."""
    return SimpleNamespace(should_save_hf_model=True, rank=0, model_path=str(tmp_path / "hub-id"))


def line_of(where: str) -> str:
    path, _, line = where.rpartition(":")
    return linecache.getline(path, int(line)).strip()


def test_an_error_of_the_patch_code_is_reported_under_the_record_at_its_raise(tmp_path, escaped,
                                                                                monkeypatch) -> None:
    monkeypatch.setenv("VERL_ASCEND_EXT_STATUS_DIR", str(tmp_path / "status"))

    def save_checkpoint(self: Any, local_path: str) -> str:  # verl's save, done
        return "saved"

    replacement = build(patch_code.check_fsdp_hf_export, save_checkpoint, RECORD, (), traced=False,
                        reports_itself=True)
    with pytest.raises(ExportCheckError, match="no local reference checkpoint") as raised:
        replacement(saving_manager(tmp_path), str(tmp_path / "ckpt"))
    ((by, err, where),) = escaped
    assert (by, err) == (RECORD, raised.value)
    assert where.startswith(inspect.getsourcefile(patch_code) + ":"), where
    assert line_of(where).startswith("raise ExportCheckError("), where  # the line that raised, in the patch code


def test_an_error_of_the_original_is_upstreams_and_not_reported(tmp_path, escaped) -> None:
    def save_checkpoint(self: Any, local_path: str) -> str:
        raise OSError("disk full")  # verl's own save fails

    replacement = build(patch_code.check_fsdp_hf_export, save_checkpoint, RECORD, (), traced=False,
                        reports_itself=True)
    with pytest.raises(OSError, match="disk full"):
        replacement(saving_manager(tmp_path), str(tmp_path / "ckpt"))
    assert escaped == []


def test_an_exception_escaping_nested_replacements_is_reported_once(escaped) -> None:
    err = ValueError("x")
    status.escaped("outer", err, "a.py:1")
    status.escaped("inner", err, "a.py:1")
    assert [by for by, _, _ in escaped] == ["outer"]


def test_nothing_is_reported_before_a_recorder_listens(escaped) -> None:
    """Early in the boot nothing records yet: the exception is not marked, so the boot's own report still takes it."""
    status.on_error(None)
    err = ValueError("early")
    status.escaped("some-patch", err, None)
    seen: list[str] = []
    status.on_error(lambda by, *_: seen.append(by))
    status.escaped("boot", err, None)
    assert seen == ["boot"]


@pytest.fixture
def this_file_is_ours(monkeypatch) -> None:
    """Count this test module as the package's code (``replacement.ours`` reads ``PACKAGE_DIR`` per call), so that
    patch code defined here is "ours" and an exception raised in it is one the engine must report."""
    monkeypatch.setattr(replacement_module, "PACKAGE_DIR", os.path.dirname(os.path.abspath(__file__)) + os.sep)


def run_cancelled_or_failing(fail: bool) -> None:
    """An async replacement whose patch code (ours) awaits: cancelled while it waits, or raising after the wait."""
    async def update_weights(self: Any) -> None:
        return None

    async def impl(original: Any, self: Any) -> Any:
        await asyncio.sleep(0 if fail else 10)
        if fail:
            raise RuntimeError("barrier broken")
        return await original(self)

    replacement = build(impl, update_weights, "weight-sync-kv-barrier", (), traced=False)

    async def main() -> None:
        task = asyncio.ensure_future(replacement(object()))
        await asyncio.sleep(0)
        if not fail:
            task.cancel()
        with pytest.raises(RuntimeError if fail else asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_cancellation_of_an_async_replacement_is_no_error(escaped, this_file_is_ours) -> None:
    """Cancelled inside our own patch code: not reported; the same code raising is (the test can tell the two)."""
    run_cancelled_or_failing(fail=False)
    assert escaped == []
    run_cancelled_or_failing(fail=True)
    ((by, err, where),) = escaped
    assert (by, type(err)) == ("weight-sync-kv-barrier", RuntimeError)
    assert line_of(where) == 'raise RuntimeError("barrier broken")', where


def test_a_staticmethod_records_function_reports_its_own_errors(escaped, this_file_is_ours) -> None:
    """The spawn entry point is installed as it is (pickled by reference): ``reported`` gives it the same path as a
    replacement the engine builds: an exception of ours escaping it is reported under its record at the raise."""

    @reported("glm52-vllm-engine-core-entry")
    def entry() -> None:
        raise RuntimeError("entry failed")

    with pytest.raises(RuntimeError, match="entry failed") as raised:
        entry()
    ((by, err, where),) = escaped
    assert (by, err) == ("glm52-vllm-engine-core-entry", raised.value)
    assert line_of(where) == 'raise RuntimeError("entry failed")', where
    from verl_ascend_ext.features.glm52.vllm import patch_code as vllm_patch_code

    assert getattr(vllm_patch_code.run_engine_core, "_verl_ascend_ext_reported_by", None) == \
        "glm52-vllm-engine-core-entry"
