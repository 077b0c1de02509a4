"""One read of the status directory per look in verl's trainer (``reader.read_shared``, issue 62): the job's watch
and the sleep-memory metric read the same directory through one cache, and a read younger than the watch's interval
is handed out again rather than repeated. Records are written where the reader reads (``tests/records.py``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from records import record, write_record

from verl_ascend_ext.runtime.records import reader
from verl_ascend_ext.runtime.records.reader import read_shared
from verl_ascend_ext.runtime.records.watch import JobWatch


class Clock:
    def __init__(self) -> None:
        self.t = 500.0

    def __call__(self) -> float:
        return self.t


def pids(records: list[dict]) -> list[int]:
    return sorted(r["pid"] for r in records)


def test_a_read_younger_than_max_age_is_handed_out_again_an_older_one_is_repeated(tmp_path: Path) -> None:
    clock = Clock()
    write_record(tmp_path, record(pid=1))
    assert pids(read_shared(str(tmp_path), max_age=1.0, now=clock)[0]) == [1]
    write_record(tmp_path, record(pid=2))
    clock.t += 0.9
    assert pids(read_shared(str(tmp_path), max_age=1.0, now=clock)[0]) == [1]  # the read of 0.9 s ago
    clock.t += 0.1
    assert pids(read_shared(str(tmp_path), max_age=1.0, now=clock)[0]) == [1, 2]
    write_record(tmp_path, record(pid=3))
    assert pids(read_shared(str(tmp_path), max_age=0.0, now=clock)[0]) == [1, 2, 3]  # max_age 0: always afresh


def test_each_caller_gets_its_own_copies(tmp_path: Path) -> None:
    write_record(tmp_path, record(pid=1))
    first, _ = read_shared(str(tmp_path), max_age=60.0)
    first[0]["alive"] = "changed by one caller"
    first.append({"pid": 99})
    second, _ = read_shared(str(tmp_path), max_age=60.0)
    assert pids(second) == [1] and "alive" not in second[0], second


def test_the_watchs_look_and_the_metrics_read_are_one_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The watch looks (interval 1 s), the sleep metric reads within that second: the directory is read once."""
    write_record(tmp_path, record(pid=1, job="job-1"))
    reads = []
    real = reader.read_records
    monkeypatch.setattr(reader, "read_records", lambda *a, **k: reads.append(a) or real(*a, **k))
    JobWatch("job-1", str(tmp_path), lambda _: None, by="test", interval=1.0).look()
    records, _ = read_shared(str(tmp_path))
    assert len(reads) == 1 and pids(records) == [1], reads


def test_unchanged_files_are_parsed_once_and_removed_ones_leave_the_cache(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    parsed = []
    real = json.loads
    monkeypatch.setattr(reader.json, "loads", lambda data, *a, **k: parsed.append(1) or real(data, *a, **k))
    write_record(tmp_path, record(pid=1))
    gone = write_record(tmp_path, record(pid=2))
    assert pids(read_shared(str(tmp_path), max_age=0.0)[0]) == [1, 2] and len(parsed) == 2
    assert pids(read_shared(str(tmp_path), max_age=0.0)[0]) == [1, 2] and len(parsed) == 2
    write_record(tmp_path, record(pid=1, updated=200.0))
    gone.unlink()
    assert pids(read_shared(str(tmp_path), max_age=0.0)[0]) == [1] and len(parsed) == 3
    assert list(reader._shared.caches[os.path.abspath(tmp_path)]) == [str(tmp_path / "session_x" / "node-a-1-1.json")]


def test_a_forked_child_starts_with_no_shared_read(tmp_path: Path) -> None:
    write_record(tmp_path, record(pid=1))
    read_shared(str(tmp_path), max_age=60.0)
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's exit code is the assertion
        os._exit(0 if reader._shared.newest == {} and not reader._shared.lock.locked() else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert os.path.abspath(tmp_path) in reader._shared.newest
