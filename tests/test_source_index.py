"""The on-disk source index is keyed by content: a changed file is never judged by a stale entry, and an
entry that is corrupt, foreign or mis-shaped is ignored and rewritten, never trusted.

Each test points ``$VERL_ASCEND_EXT_CACHE`` at its own directory and calls ``source.clear_cache()`` where a
new process would start with empty in-process caches (the on-disk index is what carries over).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from verl_ascend_ext.patching import engine, source
from verl_ascend_ext.patching.gates import Gate
from verl_ascend_ext.patching.record import Fingerprint, PatchRecord, Status

OLD = "def step(x):\n    return x + 1\n"
NEW = "def step(x):\n    return x - 1\n"  # a one-character fix: same size
assert len(OLD) == len(NEW)

RECORD = PatchRecord(
    id="index-probe", feature="test", why="probe", target="probe_mod:step",
    gate=Gate("VERL_ASCEND_EXT_TEST_GATE", True, "test"),
    distribution="pytest", versions=">=0", wrapper="probe_mod:step", upstream="-", remove_when="-", traced=False,
    original=Fingerprint(contains=(r"return x \+ 1",), description="adds one"),
    fixed=Fingerprint(contains=(r"return x - 1",), description="subtracts one"),
)


@pytest.fixture
def index_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(source.INDEX_DIR_ENV, str(tmp_path / "cache"))
    source.clear_cache()
    yield tmp_path / "cache" / "source-index"
    source.clear_cache()


def verdict(path: Path) -> Status:
    return engine.classify(RECORD, source.definition_in_file(path, "step"), str(path))[0]


def entry_of(path: Path) -> Path:
    return source._index_file(source.content_digest(path.read_bytes()))


def test_same_path_mtime_and_size_with_new_bytes_gets_the_new_verdict(tmp_path: Path, index_home: Path) -> None:
    module = tmp_path / "probe_mod.py"
    module.write_text(OLD)
    stamp = os.stat(module)
    assert verdict(module) is Status.WILL_APPLY
    assert entry_of(module).is_file()

    module.write_text(NEW)
    os.utime(module, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # as a reproducible image build would
    after = os.stat(module)
    assert (after.st_mtime_ns, after.st_size) == (stamp.st_mtime_ns, stamp.st_size)
    source.clear_cache()  # a new process: only the on-disk index carries over

    assert verdict(module) is Status.FIXED_UPSTREAM
    assert len(list(index_home.glob("*.json"))) == 3  # one entry per content, plus the verdict store


def test_identical_content_at_another_path_shares_one_entry(tmp_path: Path, index_home: Path) -> None:
    first, second = tmp_path / "a" / "probe_mod.py", tmp_path / "b" / "probe_mod.py"
    for path in (first, second):
        path.parent.mkdir()
        path.write_text(OLD)
    assert source.definitions(first) == source.definitions(second)
    assert [p.name for p in index_home.glob("*-py*.json")] == [entry_of(first).name]


def _stored_entry(module: Path) -> dict:
    return json.loads(entry_of(module).read_text())


UNTRUSTED = {
    "not JSON": lambda good: b"\x00\xffnot json",
    "truncated": lambda good: json.dumps(good).encode()[:40],
    "a JSON list": lambda good: b"[1, 2, 3]",
    "another file's content": lambda good: json.dumps({**good, "content": "0" * 40}).encode(),
    "another Python": lambda good: json.dumps({**good, "python": "2.7"}).encode(),
    "another format": lambda good: json.dumps({**good, "format": source.INDEX_FORMAT - 1}).encode(),
    "definitions not a mapping": lambda good: json.dumps({**good, "definitions": ["step"]}).encode(),
    "a mis-shaped definition": lambda good: json.dumps(
        {**good, "definitions": {"step": [1, "1", "def step(x):\n    return x - 1"]}}).encode(),
    "the old layout": lambda good: json.dumps(good["definitions"]).encode(),
    "bases not lists of names": lambda good: json.dumps({**good, "bases": {"Probe": [1]}}).encode(),
    "no bases": lambda good: json.dumps({k: v for k, v in good.items() if k != "bases"}).encode(),
    "a module text that is not text": lambda good: json.dumps({**good, "module": ["def step"]}).encode(),
}


@pytest.mark.parametrize("kind", sorted(UNTRUSTED))
def test_untrusted_entry_is_ignored_and_rewritten(kind: str, tmp_path: Path, index_home: Path) -> None:
    module = tmp_path / "probe_mod.py"
    module.write_text(OLD)
    source.definitions(module)
    good = _stored_entry(module)
    assert good["definitions"]["step"] == [1, 1, "def step(x):\n    return x + 1"]

    entry_of(module).write_bytes(UNTRUSTED[kind](good))
    source.clear_cache()

    assert verdict(module) is Status.WILL_APPLY
    assert source.definitions(module)["step"] == (1, 1, "def step(x):\n    return x + 1")
    assert _stored_entry(module) == good  # rewritten with what the file really holds


def test_a_foreign_entry_under_the_right_name_does_not_decide(tmp_path: Path, index_home: Path) -> None:
    """An entry claiming the fix is in place, but made from other bytes, is not believed."""
    module = tmp_path / "probe_mod.py"
    module.write_text(OLD)
    digest = source.content_digest(module.read_bytes())
    index_home.mkdir(parents=True)
    source._index_file(digest).write_text(json.dumps({
        "format": source.INDEX_FORMAT, "python": source.PYTHON, "content": source.content_digest(NEW.encode()),
        "definitions": {"step": [1, 1, "def step(x):\n    return x - 1"]}}))
    assert verdict(module) is Status.WILL_APPLY
    assert _stored_entry(module)["content"] == digest


def test_corrupt_verdict_store_is_ignored_and_rewritten(tmp_path: Path, index_home: Path) -> None:
    module = tmp_path / "probe_mod.py"
    module.write_text(OLD)
    store = index_home / f"matches-{source.INDEX_FORMAT}.json"
    index_home.mkdir(parents=True)
    store.write_text('{"truncated": tr')
    assert verdict(module) is Status.WILL_APPLY
    stored = json.loads(store.read_text())
    assert stored and all(isinstance(v, bool) for v in stored.values())


def test_module_text_and_class_bases_come_from_the_index_in_a_new_process(tmp_path: Path, index_home: Path) -> None:
    module = tmp_path / "probe_mod.py"
    module.write_text("class Base:\n    def step(self):\n        return 1\n\n\nclass Child(Base):\n    pass\n")
    first = source.definition_in_file(module, "<module>").text
    assert source.definition_in_file(module, "Child.step", inherited=True).qualname == "Base.step"
    stored = _stored_entry(module)
    assert stored["module"] == first and stored["bases"] == {"Base": [], "Child": ["Base"]}
    source.clear_cache()  # a new process
    before = source.counts()
    assert source.definition_in_file(module, "<module>").text == first
    assert source.definition_in_file(module, "Child.step", inherited=True).qualname == "Base.step"
    after = source.counts()
    assert after["parsed"] == before["parsed"] and after["index_misses"] == before["index_misses"]
    assert after["index_hits"] == before["index_hits"] + 1


WARM_CHILD = """
import json
import verl_ascend_ext
verl_ascend_ext.activate()
from verl_ascend_ext.patching import source
from verl_ascend_ext.patching.prediction import predict_all
from verl_ascend_ext.runtime.registry import registry
predicted = {s.id: s.status.value for s in predict_all(registry().records).statuses}
print(json.dumps({"counts": source.counts(), "predicted": predicted}))
"""


def test_a_warm_process_parses_no_file(tmp_path: Path) -> None:
    """Predicting every record (verl's, vLLM 0.23.0's installed core.py, the vLLM-Ascend 0.23.0 set, whose records
    read whole modules and inherited methods) in a second process is served by the index the first one wrote: it
    parses no file and misses no entry, and decides every record the same way. ``apply`` reads the same entries
    (``definition_of_object`` reads the live function's file through ``definitions``); its time is what
    benchmarks/glm52_apply.py measures."""
    from glm52_ascend_fixtures import released_sources
    from subprocesses import last_json, run_python

    env = {"VERL_VLLM_ASCEND_GLM52_PATCH": "1", source.INDEX_DIR_ENV: str(tmp_path / "cache")}
    cold, warm = (last_json(run_python(WARM_CHILD, env, pythonpath=str(released_sources())).stdout) for _ in range(2))
    assert cold["counts"]["parsed"] >= cold["counts"]["index_misses"] > 5
    assert warm["counts"]["parsed"] == 0 and warm["counts"]["index_misses"] == 0, warm["counts"]
    assert warm["counts"]["index_hits"] == cold["counts"]["index_misses"]
    assert warm["predicted"] == cold["predicted"]
    decided = {k: v for k, v in warm["predicted"].items() if k.startswith("glm52-")}
    assert set(decided.values()) == {"will-apply"}, decided  # vLLM 0.23.0 and vLLM-Ascend 0.23.0 read, none refused
