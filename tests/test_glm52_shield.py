"""Shield: where our recogniser finds the GLM-5.2 fix upstream, verl 0.9.1's in-tree copy stands down, not raising.

verl 0.9.1's ``patch_vllm_glm52_partial_wake_up`` recognises the fixed vLLM by string checks that know only
the 0.24/0.25 shapes and raises "unsupported" on later releases. With our plugin booted, the engine marks the
upstream functions it recognised as fixed with the marker verl checks (attribute only). Run with verl 0.9.1's
real function on the real core.py of every vLLM release from 0.24.0 to 0.33.0 (how the released module is
loaded, and what in it is a stand-in, is said in tests/scenarios/glm52_shield.py); the same runs without our
plugin show what the shield changes. The engine part (mark, re-apply, unpatch) runs on a plain module.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from packaging.version import Version
from repo import REPO
from subprocesses import last_json, run_command, run_python
from test_glm52_vllm_core import GATE, IDS, PINNED, later_releases, released_core

SCENARIO = REPO / "tests" / "scenarios" / "glm52_shield.py"
NEWEST = "0.33.0"
# Unknown code (neither the fix nor the code to fix): a vLLM 0.33.0 copy whose dummy pass lost its sleep check,
# and one whose wake-up resumes whatever the executor's state.
MUTATIONS = {
    "dummy-without-sleep-check": ("                elif not self.model_executor.is_sleeping:\n"
                                  "                    with self.capture_iteration_details(None) as",
                                  "                else:\n"
                                  "                    with self.capture_iteration_details(None) as"),
    "wake-up-always-resumes": ("        fully_awake = not self.model_executor.is_sleeping\n",
                               "        fully_awake = True\n"),
}


def mutated_copies(root: Path) -> dict[str, str]:
    paths = {}
    text = released_core(NEWEST).read_text()
    for label, (old, new) in MUTATIONS.items():
        assert text.count(old) == 1, f"mutation '{label}' no longer matches vLLM {NEWEST}'s core.py"
        path = root / label / "vllm" / "v1" / "engine" / "core.py"
        path.parent.mkdir(parents=True)
        path.write_text(text.replace(old, new))
        paths[label] = str(path)
    return paths


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, dict]]:
    """{mode: {label: result}} for every later release, the pinned one and the mutated copies."""
    paths = {v: str(released_core(v)) for v in [PINNED, *later_releases()]}
    paths.update(mutated_copies(tmp_path_factory.mktemp("mutated")))
    by_path = {p: label for label, p in paths.items()}

    def one(mode: str) -> dict[str, dict]:
        proc = run_command([sys.executable, str(SCENARIO), mode, *paths.values()], {GATE: "1"}, check=False,
                           timeout=600)
        assert proc.returncode == 0, f"scenario {mode} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        return {by_path[p]: r for p, r in last_json(proc.stdout).items()}

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(("with-ours", "verl-alone"), pool.map(one, ("with-ours", "verl-alone")), strict=True))


@pytest.mark.verl091
def test_verl_copy_alone_raises_where_its_string_checks_miss(runs: dict) -> None:
    alone = runs["verl-alone"]
    raised = {v for v in later_releases() if alone[v]["error"]}
    assert raised == {v for v in later_releases() if Version(v) >= Version("0.26.0")}, alone
    assert all("unsupported" in alone[v]["error"] for v in raised)


@pytest.mark.verl091
@pytest.mark.parametrize("version", later_releases())
def test_verl_copy_stands_down_where_ours_recognises_the_fix(version: str, runs: dict) -> None:
    got = runs["with-ours"][version]
    assert got["error"] is None, got
    assert got["statuses"] == dict.fromkeys(IDS, "fixed-upstream")
    assert got["verl_log"] == ["GLM-5.2 vLLM partial wake-up patch already present"]
    assert got["markers"] == {"wake_up": True, "dummy": True}  # the marker verl checks, on vLLM's functions
    assert got["wake_up_released"] and got["dummy_released"]  # code untouched: still the released functions
    assert got["entry"] == "vllm.v1.engine.core.EngineCoreProc.run_engine_core"  # verl did not replace it


@pytest.mark.verl091
def test_pinned_release_ours_applies_and_verl_stands_down(runs: dict) -> None:
    got = runs["with-ours"][PINNED]
    assert got["error"] is None and got["statuses"] == dict.fromkeys(IDS, "applied"), got
    assert got["verl_log"] == ["GLM-5.2 vLLM partial wake-up patch already present"]
    assert not got["wake_up_released"]
    assert got["entry"] == "verl_ascend_ext.features.glm52.vllm.patch_code.run_engine_core"
    assert runs["verl-alone"][PINNED]["verl_log"] == ["GLM-5.2 vLLM partial wake-up patch applied"]


@pytest.mark.verl091
@pytest.mark.parametrize("label", sorted(MUTATIONS))
def test_unknown_code_both_refuse(label: str, runs: dict) -> None:
    ours = runs["with-ours"][label]
    assert ours["error"].startswith("PatchRefusedError: verl-ascend-ext refused patch"), ours
    assert not ours["imported"]  # the import that reached the unknown code failed: verl's copy never ran
    alone = runs["verl-alone"][label]
    assert alone["error"].startswith("RuntimeError: VERL_VLLM_ASCEND_GLM52_PATCH found an unsupported"), alone
    assert alone["markers"] == {"wake_up": False, "dummy": False}


# ---- the engine part, on a plain module -----------------------------------------------------------

FIXED_MODULE = '''
class Engine:
    def wake_up(self, tags=None):
        self.model_executor.wake_up(tags)
        if not self.model_executor.is_sleeping:
            self.resume_scheduler()
'''

ENGINE = """
import json
import fake_engine as m
from verl_ascend_ext.features.glm52.vllm.declaration import WAKE_UP
from verl_ascend_ext.patching import apply, unpatch
record = WAKE_UP._replace(target="fake_engine:Engine.wake_up")
released = vars(m.Engine)["wake_up"]
marker = "_verl_vllm_ascend_glm52_patched"
first = apply(record)
out = {"status": first.status.value, "detail": first.detail, "marked": getattr(m.Engine.wake_up, marker, False),
       "same_function": vars(m.Engine)["wake_up"] is released,
       "again": apply(record).status.value}  # our own mark is not taken for another copy's
out["unpatched"] = unpatch(record.id)
out["mark_withdrawn"] = not hasattr(released, marker)
# another copy's marker on the function: we stand down (and never withdraw a mark we did not set)
setattr(released, marker, True)
out["foreign"] = apply(record).status.value
unpatch(record.id)
out["foreign_mark_kept"] = getattr(released, marker, False)
print(json.dumps(out))
"""


@pytest.mark.anyverl
def test_engine_marks_fixed_upstream_function_and_takes_the_mark_back(tmp_path: Path) -> None:
    (tmp_path / "fake_engine.py").write_text(FIXED_MODULE)
    out = last_json(run_python(ENGINE, pythonpath=str(tmp_path)).stdout)
    assert out.pop("detail").endswith("marked the upstream function with _verl_vllm_ascend_glm52_patched so other "
                                      "copies of this fix stand down")
    assert out == {"status": "fixed-upstream", "marked": True, "same_function": True, "again": "fixed-upstream",
                   "unpatched": False, "mark_withdrawn": True, "foreign": "already-applied",
                   "foreign_mark_kept": True}

