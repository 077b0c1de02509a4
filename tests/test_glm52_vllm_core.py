"""GLM-5.2 vLLM-core patches: recognisers on every released vLLM 0.23.0 ... 0.33.0, the patches/ diffs, real
vLLM 0.23.0 classes on CPU (wake-up, DP busy loop, spawned engine-core children), doctor's prediction and
coexistence with verl 0.9.1's in-tree copy in both load orders.

Fixtures come from scripts/fetch_vllm.sh (run by scripts/test.sh): vLLM 0.23.0 installed with --no-deps,
and vllm/v1/engine/core.py of every later release under $VERL_ASCEND_EXT_CACHE/vllm-src/<version>/. A
missing fixture fails the test (never skips). How the real-vLLM scenarios are driven, and what in them is a
test double, is said in tests/scenarios/glm52_vllm_core.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import repo
from repo import REPO
from subprocesses import last_json, run_command

from verl_ascend_ext.features.glm52.vllm import declaration as glm52_vllm
from verl_ascend_ext.patching import engine
from verl_ascend_ext.patching.record import PatchRecord, Status
from verl_ascend_ext.patching.source import clear_cache

pytestmark = pytest.mark.long_module  # its fixture starts vLLM's engine core modules (~30 s)
CACHE = repo.CACHE / "vllm-src"
FETCH = REPO / "scripts" / "fetch_vllm.sh"
SCENARIO = REPO / "tests" / "scenarios" / "glm52_vllm_core.py"
CORE = "vllm/v1/engine/core.py"
PINNED = "0.23.0"
GATE = glm52_vllm.GATE.env
WAKE, DUMMY, ENTRY = glm52_vllm.WAKE_UP, glm52_vllm.DUMMY_BATCH, glm52_vllm.ENGINE_CORE_ENTRY
IDS = [r.id for r in glm52_vllm.RECORDS]


def later_releases() -> list[str]:
    """The later releases the fetch script caches (one list, kept in the script)."""
    found = re.search(r'^LATER="([^"]+)"', FETCH.read_text(), re.M)
    assert found, f"{FETCH} has no LATER=\"...\" list"
    return found.group(1).split()


def released_core(version: str) -> Path:
    path = CACHE / version / CORE
    assert path.is_file(), f"fixture missing: {path}. Run scripts/fetch_vllm.sh (scripts/test.sh does) first."
    return path


def predict_on(record: PatchRecord, core_py: Path, monkeypatch: pytest.MonkeyPatch,
               gate_value: str = "on") -> engine.PatchStatus:
    """Doctor's prediction for ``record`` as if ``core_py`` were the installed vllm/v1/engine/core.py."""
    real = engine.find_module_file
    monkeypatch.setattr(engine, "find_module_file",
                        lambda module: core_py if module == "vllm.v1.engine.core" else real(module))
    return engine.predict(record, frozenset(), {GATE: gate_value})


def copy_release(version: str, root: Path) -> Path:
    target = root / CORE
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(released_core(version), target)
    return target


# ---- recognisers on released sources ------------------------------------------------------------

def test_fixture_covers_every_release_from_0_24_to_newest() -> None:
    versions = later_releases()
    assert versions[0] == "0.24.0" and "0.33.0" in versions  # 0.33.0: newest on the index when written
    for version in [PINNED, *versions]:
        released_core(version)


@pytest.mark.parametrize("version", later_releases())
def test_later_release_is_fixed_upstream(version: str, monkeypatch: pytest.MonkeyPatch) -> None:
    core_py = released_core(version)
    got = {r.id: predict_on(r, core_py, monkeypatch) for r in glm52_vllm.RECORDS}
    assert {k: v.status for k, v in got.items()} == dict.fromkeys(IDS, Status.FIXED_UPSTREAM), got


def test_pinned_release_will_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    core_py = released_core(PINNED)
    got = {r.id: predict_on(r, core_py, monkeypatch) for r in glm52_vllm.RECORDS}
    assert {k: v.status for k, v in got.items()} == dict.fromkeys(IDS, Status.WILL_APPLY), got
    assert got[DUMMY.id].where.endswith(":785")  # found on EngineCore, which DPEngineCoreProc inherits it from


MUTATIONS = [
    (WAKE, "resume before waking the executor",
     "        if tags is None or tags:\n            self.model_executor.wake_up(tags)\n\n"
     "        # Resume scheduling (applies to all levels)\n        self.resume_scheduler()\n",
     "        self.resume_scheduler()\n"
     "        if tags is None or tags:\n            self.model_executor.wake_up(tags)\n"),
    (WAKE, "no 'scheduling' tag filter",
     '            tags = [t for t in tags if t != "scheduling"]\n', "            pass\n"),
    (WAKE, "resume guarded by something else",
     "        # Resume scheduling (applies to all levels)\n        self.resume_scheduler()\n",
     "        if self.is_scheduler_paused():\n            self.resume_scheduler()\n"),
    (WAKE, "extra work after resuming",
     "        # Resume scheduling (applies to all levels)\n        self.resume_scheduler()\n",
     "        self.resume_scheduler()\n        self._reset_caches()\n"),
    (WAKE, "executor woken without the tags",
     "        if tags is None or tags:\n            self.model_executor.wake_up(tags)\n",
     "        if tags is None or tags:\n            self.model_executor.wake_up(None)\n"),
    (DUMMY, "dummy pass without the logging context",
     "                with self.log_iteration_details(None):\n                    self.execute_dummy_batch()\n",
     "                self.execute_dummy_batch()\n"),
    (DUMMY, "sleep check on another object",
     "                with self.log_iteration_details(None):\n                    self.execute_dummy_batch()\n",
     "                elif not self.is_sleeping():\n                    with self.log_iteration_details(None):\n"
     "                        self.execute_dummy_batch()\n"),
    (DUMMY, "idle engines run the dummy pass too",
     "                    # All engines are idle.\n                    continue\n",
     "                    # All engines are idle.\n                    pass\n"),
    (DUMMY, "execute_dummy_batch does more than the executor's dummy batch",
     "    def execute_dummy_batch(self):\n        self.model_executor.execute_dummy_batch()\n",
     "    def execute_dummy_batch(self):\n        self.model_executor.execute_dummy_batch()\n"
     "        self.step_counter += 1\n"),
    (ENTRY, "entry point no longer static",
     "    @staticmethod\n    def run_engine_core(", "    def run_engine_core("),
    (ENTRY, "entry point no longer runs the busy loop",
     "            engine_core.run_busy_loop()\n", "            engine_core.run()\n"),
]


@pytest.mark.parametrize(("record", "label", "old", "new"), MUTATIONS, ids=[m[1] for m in MUTATIONS])
def test_mutated_copy_is_refused(record: PatchRecord, label: str, old: str, new: str, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    core_py = copy_release(PINNED, tmp_path)
    text = core_py.read_text()
    assert text.count(old) == 1, f"mutation '{label}' no longer matches the released source"
    core_py.write_text(text.replace(old, new))
    clear_cache()
    got = predict_on(record, core_py, monkeypatch)
    assert got.status is Status.REFUSED, got
    assert str(core_py) in got.detail and record.id in got.detail


# ---- patches/vllm diffs -------------------------------------------------------------------------

DIFFS = {"0001-wake-up-resume-when-awake.diff": WAKE, "0002-dp-no-dummy-forward-asleep.diff": DUMMY}


def apply_diffs(root: Path, names: list[str]) -> Path:
    core_py = copy_release(PINNED, root)
    for name in names:
        subprocess.run(["patch", "-p1", "-s", "-d", str(root), "-i", str(REPO / "patches" / "vllm" / name)],
                       check=True)
    clear_cache()
    return core_py


@pytest.mark.parametrize("name", sorted(DIFFS))
def test_diff_applies_and_is_recognised_as_the_fix(name: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    readme = REPO / "patches" / "vllm" / name.replace(".diff", ".md")
    assert DIFFS[name].id in readme.read_text()
    assert predict_on(DIFFS[name], released_core(PINNED), monkeypatch).status is Status.WILL_APPLY
    core_py = apply_diffs(tmp_path, [name])
    assert predict_on(DIFFS[name], core_py, monkeypatch).status is Status.FIXED_UPSTREAM
    other = next(r for n, r in DIFFS.items() if n != name)
    assert predict_on(other, core_py, monkeypatch).status is Status.WILL_APPLY  # each diff fixes only its own
    assert predict_on(ENTRY, core_py, monkeypatch).status is Status.WILL_APPLY  # one fix still needs carrying


def test_both_diffs_leave_nothing_to_carry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    core_py = apply_diffs(tmp_path, sorted(DIFFS))
    assert {r.id: predict_on(r, core_py, monkeypatch).status for r in glm52_vllm.RECORDS} == \
        dict.fromkeys(IDS, Status.FIXED_UPSTREAM)


# ---- doctor -------------------------------------------------------------------------------------

def test_doctor_lists_each_item_with_its_prediction() -> None:
    from verl_ascend_ext.tooling.doctor import build_report

    on = {p["id"]: p["status"] for p in build_report({GATE: "1"})[0]["patches"]}
    off = {p["id"]: p["status"] for p in build_report({})[0]["patches"]}
    assert {i: on[i] for i in IDS} == dict.fromkeys(IDS, "will-apply")  # vLLM 0.23.0 installed, verl 0.9.0
    assert {i: off[i] for i in IDS} == dict.fromkeys(IDS, "gate-off")


@pytest.mark.verl091
def test_doctor_predicts_verls_in_tree_copy() -> None:
    from verl_ascend_ext.tooling.doctor import build_report

    report = {p["id"]: p for p in build_report({GATE: "1"})[0]["patches"]}
    assert {i: report[i]["status"] for i in IDS} == dict.fromkeys(IDS, "already-applied"), report
    assert "verl's in-tree GLM-5.2 patch" in report[WAKE.id]["detail"]
    assert "npu_vllm_patch.py" in report[WAKE.id]["detail"]
    # verl enables its copy for 1/true/yes only; with "on" ours is the only copy that applies.
    on = {p["id"]: p["status"] for p in build_report({GATE: "on"})[0]["patches"]}
    assert {i: on[i] for i in IDS} == dict.fromkeys(IDS, "will-apply")


# ---- real vLLM 0.23.0 on CPU --------------------------------------------------------------------

def run_scenarios(runs: dict[str, tuple[str, dict[str, str]]]) -> dict[str, dict]:
    """Run scenario modes concurrently, each in a fresh interpreter (vLLM's import costs ~8 s)."""

    def one(mode_env: tuple[str, dict[str, str]]) -> dict:
        mode, env = mode_env
        proc = run_command([sys.executable, str(SCENARIO), mode], env, check=False, timeout=400)
        assert proc.returncode == 0, f"scenario {mode} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
        return last_json(proc.stdout)

    with ThreadPoolExecutor(len(runs)) as pool:
        return dict(zip(runs, pool.map(one, runs.values()), strict=True))


@pytest.fixture(scope="module")
def engine_runs() -> dict[str, dict]:
    assert json.loads(subprocess.run([sys.executable, "-c", "import importlib.metadata as m, json;"
                                      "print(json.dumps(m.version('vllm')))"],
                                     capture_output=True, text=True, check=True).stdout) == PINNED, \
        "vLLM 0.23.0 is not installed in this environment: run scripts/fetch_vllm.sh"
    return run_scenarios({"on": ("engine", {GATE: "1"}), "off": ("engine", {GATE: "0"})})


def test_real_classes_patched_with_gate_on(engine_runs: dict) -> None:
    parent = engine_runs["on"]["parent"]
    assert parent["statuses"] == dict.fromkeys(IDS, "applied")
    assert parent["wake_up_layers"] == 1 and parent["dummy_layers"] == 1
    assert parent["dummy_own_attribute"] is True  # the wrapper sits on DPEngineCoreProc, not on EngineCore
    assert parent["entry"] == "verl_ascend_ext.features.glm52.vllm.patch_code.run_engine_core"


def test_weights_only_wake_does_not_resume_full_wake_resumes_once(engine_runs: dict) -> None:
    wake = engine_runs["on"]["wake"]
    assert wake["weights_only"] == [0, True]  # KV cache still asleep: scheduler stays paused
    assert wake["then_kv_cache"] == [1, False]  # fully awake: resumed once
    assert wake["full_wake_total"] == 2  # a full wake-up after a new sleep resumes once more
    assert wake["rpc"] == ["sleep", "wake_up", "wake_up", "sleep", "wake_up"]  # executor calls unchanged


def test_no_dummy_forward_while_asleep(engine_runs: dict) -> None:
    assert engine_runs["on"]["dummy_asleep"] == 0
    assert engine_runs["on"]["dummy_awake"] == 1


def test_gate_off_leaves_vllm_untouched_and_reproduces_the_bug(engine_runs: dict) -> None:
    off = engine_runs["off"]
    assert off["parent"]["statuses"] == dict.fromkeys(IDS, "gate-off")
    assert off["parent"]["wake_up_layers"] == 0 and off["parent"]["dummy_own_attribute"] is False
    assert off["parent"]["entry"] == "vllm.v1.engine.core.EngineCoreProc.run_engine_core"
    assert off["wake"]["weights_only"] == [1, True]  # vLLM 0.23.0 resumes while the KV cache sleeps
    assert off["dummy_asleep"] == 1  # and runs a dummy forward on a sleeping executor


def test_spawned_engine_core_children_gate_on(engine_runs: dict) -> None:
    spawn = engine_runs["on"]["spawn"]
    assert spawn["exitcodes"] == [0, 0, 0]
    entry = spawn["entry"]  # target=EngineCoreProc.run_engine_core, as vLLM's CoreEngineProcManager starts it
    assert entry["loaded_by"] == ["vllm-engine-core"] and entry["gate"] == "1"
    assert entry["statuses"] == dict.fromkeys(IDS, "applied") and entry["wake_up_layers"] == 1
    plugin = spawn["plugin"]  # vllm.plugins.load_general_plugins(), as EngineCore.__init__ and Ray actors do
    assert plugin["loaded_by"] == ["vllm"]
    assert plugin["statuses"] == dict.fromkeys(IDS, "applied") and plugin["dummy_layers"] == 1
    gate_off = spawn["entry-gate-off"]  # our entry point as target, child environment with the gate off
    assert gate_off["statuses"] == dict.fromkeys(IDS, "gate-off")
    assert gate_off["wake_up_layers"] == 0 and gate_off["dummy_own_attribute"] is False


def test_spawned_engine_core_children_gate_off(engine_runs: dict) -> None:
    spawn = engine_runs["off"]["spawn"]
    assert spawn["exitcodes"] == [0, 0]
    assert spawn["entry"]["loaded_by"] == [] and spawn["entry"]["wake_up_layers"] == 0  # vLLM's own entry point
    assert spawn["plugin"]["statuses"] == dict.fromkeys(IDS, "gate-off")
    assert spawn["plugin"]["wake_up_layers"] == 0


def test_unpatch_deletes_the_inherited_wrapper(engine_runs: dict) -> None:
    undone = engine_runs["on"]["unpatch"]
    assert undone["restored"] == dict.fromkeys(IDS, True)
    assert undone["dummy_own_attribute"] is False and undone["dummy_is_inherited"] is True
    assert undone["wake_up_layers"] == 0 and undone["entry"] == "vllm.v1.engine.core"


# ---- coexistence with verl 0.9.1's in-tree copy -------------------------------------------------

@pytest.fixture(scope="module")
def order_runs() -> dict[str, dict]:
    return run_scenarios({"ours": ("ours-first", {GATE: "1"}), "verl": ("verl-first", {GATE: "1"})})


@pytest.mark.verl091
@pytest.mark.parametrize("first", ["ours", "verl"])
def test_each_target_patched_once_in_either_order(first: str, order_runs: dict) -> None:
    run = order_runs[first]
    assert run["wake_up_layers"] == 1 and run["dummy_layers"] == 1, run
    assert run["originals_untouched"] is True  # no marker written through to vLLM's functions
    assert run["wake"]["weights_only"] == [0, True] and run["wake"]["then_kv_cache"] == [1, False]
    assert run["dummy_asleep"] == 0 and run["dummy_awake"] == 1
    if first == "ours":
        assert run["statuses"] == dict.fromkeys(IDS, "applied")
        # verl did not replace it
        assert run["entry"] == "verl_ascend_ext.features.glm52.vllm.patch_code.run_engine_core"
    else:
        assert run["statuses"] == dict.fromkeys(IDS, "already-applied")
        assert run["entry"] == "verl.utils.vllm.npu_vllm_patch._glm52_run_engine_core"
