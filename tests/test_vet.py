"""`verl-ascend vet` on real release artifacts: wheels, an sdist, source trees, a package folder, mutated copies.

Fixtures: scripts/fetch_vet_artifacts.sh (run by scripts/test.sh) keeps the verl 0.9.0 / 0.9.1 wheels and the
verl 0.9.1 sdist as downloaded, and the vLLM 0.23.0 / 0.33.0 and vLLM-Ascend 0.23.0 wheels repacked to the
files vet reads plus their METADATA; the source-tree cases use the trees of scripts/fetch_vllm.sh and
scripts/fetch_vllm_ascend.sh. A missing fixture fails the test. Vet's statuses are compared with doctor's
prediction on what is really installed here (verl 0.9.0, vLLM 0.23.0): the same code must give the same answer.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import repo
from glm52_ascend_fixtures import copy_tree, mutate, released_sources
from subprocesses import run_command
from test_glm52_vllm_core import released_core

from verl_ascend_ext.patching.engine import predict
from verl_ascend_ext.runtime.registry import registry
from verl_ascend_ext.tooling.vet import format_report, vet

CACHE = repo.CACHE / "vet-artifacts"
GLM_GATE = "VERL_VLLM_ASCEND_GLM52_PATCH"
VLLM_IDS = ["glm52-vllm-wake-up-resume-when-awake", "glm52-vllm-dp-no-dummy-forward-asleep",
            "glm52-vllm-engine-core-entry"]
ASCEND_IDS = ["glm52-ascend-rmsnorm-add-then-norm", "glm52-ascend-sfa-keep-kv-b-proj",
              "glm52-ascend-indexer-scale-base", "glm52-ascend-indexer-scale-a5", "glm52-ascend-indexer-scale-cp",
              "glm52-ascend-camem-sync-before-sleep", "glm52-ascend-routed-experts-capture"]
SLEEP_VLLM_IDS = ["sleep-memory-cuda", "sleep-memory-cpu"]


def artifact(glob: str) -> str:
    found = sorted(CACHE.glob(glob))
    assert len(found) == 1, f"fixture {CACHE}/{glob} missing: run scripts/fetch_vet_artifacts.sh (scripts/test.sh does)"
    return str(found[0])


def statuses(report: dict, ids: list[str] | None = None) -> dict[str, str]:
    return {p["id"]: p["status"] for p in report["patches"] if ids is None or p["id"] in ids}


def distribution_ids(distribution: str) -> list[str]:
    return [r.id for r in registry().records if r.distribution == distribution]


def all_gates_on() -> dict[str, str]:
    return {gate.env: "1" for gate in registry().gates}


# ---- wheels and the sdist -------------------------------------------------------------------------

def test_vllm_0_23_wheel_will_apply_as_doctor_predicts_on_the_installed_0_23() -> None:
    report, code = vet([artifact("vllm-0.23.0-*.whl")])
    assert code == 0 and report["artifacts"][0] | {"path": ""} == {
        "path": "", "kind": "wheel", "distribution": "vllm", "version": "0.23.0", "version_source": "metadata",
        "packages": ["vllm"], "versions": {"vllm": "0.23.0"}, "version_sources": {"vllm": "metadata"}}
    assert statuses(report, VLLM_IDS) == dict.fromkeys(VLLM_IDS, "will-apply")
    installed = {r.id: predict(r, frozenset(), all_gates_on()).status.value
                 for r in registry().records if r.distribution == "vllm"}
    assert installed == statuses(report, distribution_ids("vllm"))  # doctor on the real vLLM 0.23.0 says the same
    assert statuses(report, SLEEP_VLLM_IDS) == dict.fromkeys(SLEEP_VLLM_IDS, "will-apply")
    wake = next(p for p in report["patches"] if p["id"] == VLLM_IDS[0])
    assert wake["where"].startswith(artifact("vllm-0.23.0-*.whl") + "!/vllm/v1/engine/core.py:")
    assert statuses(report, ASCEND_IDS) == dict.fromkeys(ASCEND_IDS, "not-installed")


def test_vllm_0_33_wheel_is_fixed_upstream() -> None:
    report, code = vet([artifact("vllm-0.33.0-*.whl")])
    assert code == 0 and report["artifacts"][0]["version"] == "0.33.0"
    assert statuses(report, VLLM_IDS) == dict.fromkeys(VLLM_IDS, "fixed-upstream")
    assert statuses(report, SLEEP_VLLM_IDS) == dict.fromkeys(SLEEP_VLLM_IDS, "will-apply")  # the same sleep shape


def test_vllm_ascend_0_23_wheel_will_apply() -> None:
    report, code = vet([artifact("vllm_ascend-0.23.0-*.whl")])
    assert code == 0 and report["artifacts"][0]["distribution"] == "vllm-ascend"
    assert statuses(report, ASCEND_IDS) == dict.fromkeys(ASCEND_IDS, "will-apply")
    assert statuses(report, ["sleep-memory-ascend"]) == {"sleep-memory-ascend": "will-apply"}
    assert report["foreign_copies"] == []


def test_verl_0_9_0_wheel_as_doctor_predicts_on_the_installed_0_9_0() -> None:
    report, code = vet([artifact("verl-0.9.0-*.whl")])
    verl_ids = distribution_ids("verl")
    installed = {r.id: predict(r, frozenset(), all_gates_on()).status.value
                 for r in registry().records if r.distribution == "verl"}
    assert statuses(report, verl_ids) == installed
    assert code == 0
    # verl 0.9.0 has no in-tree GLM-5.2 copy: its apply_npu_vllm_patches exists but is not the copy
    assert [(c["target"].rpartition(":")[2], c["recognised"]) for c in report["foreign_copies"]] == \
        [("apply_npu_vllm_patches", False)]


def test_verl_0_9_1_wheel_and_sdist_agree_and_show_verls_in_tree_copy() -> None:
    wheel, code = vet([artifact("verl-0.9.1-*.whl")])
    sdist, sdist_code = vet([artifact("verl-0.9.1.tar.gz")])
    assert code == sdist_code == 0
    assert sdist["artifacts"][0] | {"path": ""} == {"path": "", "kind": "sdist", "distribution": "verl",
                                                     "version": "0.9.1", "version_source": "metadata",
                                                     "packages": ["verl"], "versions": {"verl": "0.9.1"},
                                                     "version_sources": {"verl": "metadata"}}
    assert statuses(wheel) == statuses(sdist)
    copies = {c["target"].rpartition(":")[2] for c in wheel["foreign_copies"] if c["recognised"]}
    assert copies == {"patch_vllm_glm52_partial_wake_up", "patch_vllm_ascend_glm52", "patch_camem_sleep",
                      "apply_npu_vllm_patches"}
    assert all(c["where"].startswith(artifact("verl-0.9.1-*.whl") + "!/verl/utils/vllm/npu_vllm_patch.py:")
               for c in wheel["foreign_copies"])


def test_verl_0_9_1_with_vllm_ascend_0_23_stands_down_except_the_cp_path() -> None:
    report, code = vet([artifact("verl-0.9.1-*.whl"), artifact("vllm_ascend-0.23.0-*.whl")])
    expected = dict.fromkeys(ASCEND_IDS, "already-applied") | {"glm52-ascend-indexer-scale-cp": "will-apply"}
    assert code == 0 and statuses(report, ASCEND_IDS) == expected


# ---- source directories ---------------------------------------------------------------------------

def test_unpacked_tree_and_package_folder() -> None:
    tree, code = vet([str(released_sources())])
    folder, folder_code = vet([str(released_sources() / "vllm_ascend")])
    assert code == folder_code == 0
    assert tree["artifacts"][0]["version"] == folder["artifacts"][0]["version"] == "0.23.0"  # from the dist-info
    assert statuses(tree, ASCEND_IDS) == statuses(folder, ASCEND_IDS) == dict.fromkeys(ASCEND_IDS, "will-apply")
    layernorm = next(p for p in folder["patches"] if p["id"] == ASCEND_IDS[0])
    assert layernorm["where"].startswith(str(released_sources().resolve() / "vllm_ascend/ops/layernorm.py"))


def test_checkout_without_metadata_is_vetted_with_an_unknown_version(tmp_path: Path) -> None:
    core = tmp_path / "vllm" / "vllm" / "v1" / "engine" / "core.py"
    core.parent.mkdir(parents=True)
    shutil.copyfile(released_core("0.31.0"), core)
    report, code = vet([str(tmp_path / "vllm")])
    assert code == 0 and report["artifacts"][0]["version"] == "unknown"
    assert report["artifacts"][0]["version_source"] == "no metadata, no version file, no git tag"
    assert statuses(report, VLLM_IDS) == dict.fromkeys(VLLM_IDS, "fixed-upstream")
    assert {r["id"] for r in report["ranges"]} == set(distribution_ids("vllm"))
    assert all(r["inside"] is None and r["meaning"].startswith("cannot tell") for r in report["ranges"])
    assert "What the versions mean for each record's range" in format_report(report)


def test_a_git_checkout_is_vetted_at_its_nearest_tag_said_as_assumed(tmp_path: Path) -> None:
    """A vLLM git tree without metadata: the version is the nearest tag's (``git describe``), shown as assumed, and
    each record's range is judged against it (0.31.0 is among the releases the vLLM-core records were read on)."""
    tree = tmp_path / "vllm"
    core = tree / "vllm" / "v1" / "engine" / "core.py"
    core.parent.mkdir(parents=True)
    shutil.copyfile(released_core("0.31.0"), core)
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "release"], ["tag", "v0.31.0"],
                 ["commit", "-q", "--allow-empty", "-m", "after"]):
        subprocess.run([*git, *args], check=True)
    report, code = vet([str(tree)])
    artifact = report["artifacts"][0]
    assert code == 0 and artifact["version"] == "0.31.0", artifact
    assert artifact["version_source"].startswith("assumed from git describe: v0.31.0-1-g"), artifact
    assert "1 commit(s) after it" in artifact["version_source"]
    assert statuses(report, VLLM_IDS) == dict.fromkeys(VLLM_IDS, "fixed-upstream")  # the code decides, as without
    rows = {r["id"]: r for r in report["ranges"]}
    assert set(rows) == set(distribution_ids("vllm"))  # the records of the vetted distribution only
    for pid in VLLM_IDS:
        assert rows[pid]["vetted"] == "0.31.0" and rows[pid]["inside"] is True, rows[pid]
        assert rows[pid]["meaning"].startswith("inside: the record was written on this code")
    subprocess.run([*git, "tag", "v0.40.0"], check=True)  # a later release than any record was read on
    later = {r["id"]: r for r in vet([str(tree)])[0]["ranges"]}
    assert all(later[pid]["inside"] is False and later[pid]["meaning"].startswith("outside") for pid in VLLM_IDS)


def test_mutated_source_directory_is_refused_exit_1(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path / "vllm-ascend")
    mutate(tree, "vllm_ascend/ops/layernorm.py", "torch_npu.npu_add_rms_norm(x, residual",
           "torch_npu.npu_add_rms_norm_v2(x, residual")
    proc = run_command([sys.executable, "-m", "verl_ascend_ext.tooling.cli", "vet", tree, "--json"], check=False,
                       timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    refused = {p["id"]: p["detail"] for p in report["patches"] if p["status"] == "refused"}
    assert list(refused) == ["glm52-ascend-rmsnorm-add-then-norm"]
    assert str(tree / "vllm_ascend/ops/layernorm.py") in refused["glm52-ascend-rmsnorm-add-then-norm"]
    text = run_command([sys.executable, "-m", "verl_ascend_ext.tooling.cli", "vet", tree], check=False, timeout=120)
    assert text.returncode == 1 and "A GATED PATCH WOULD BE REFUSED (exit 1)" in text.stdout


def test_mutated_vllm_tree_is_refused(tmp_path: Path) -> None:
    core = tmp_path / "vllm" / "v1" / "engine" / "core.py"
    core.parent.mkdir(parents=True)
    text = released_core("0.33.0").read_text()
    old = "        fully_awake = not self.model_executor.is_sleeping\n"
    assert text.count(old) == 1
    core.write_text(text.replace(old, "        fully_awake = True\n"))
    report, code = vet([str(tmp_path)])
    assert code == 1 and statuses(report, VLLM_IDS)["glm52-vllm-wake-up-resume-when-awake"] == "refused"


# ---- unusable input -------------------------------------------------------------------------------

def test_unusable_input_exit_2(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not an artifact")
    (tmp_path / "broken.whl").write_text("not a zip")
    (tmp_path / "empty").mkdir()
    bad_wheel = tmp_path / "other-1.0-py3-none-any.whl"
    with zipfile.ZipFile(bad_wheel, "w") as archive:
        archive.writestr("other/__init__.py", "")
    cases = {str(tmp_path / "missing.whl"): "no such file or directory",
             str(tmp_path / "notes.txt"): "not a wheel (.whl), an sdist",
             str(tmp_path / "broken.whl"): "not a readable wheel",
             str(tmp_path / "empty"): "no package this plugin patches was found",
             str(bad_wheel): "no package this plugin patches was found"}
    for path, message in cases.items():
        report, code = vet([path])
        assert code == 2 and report["errors"][0].startswith(path) and message in report["errors"][0], report
    twice, code = vet([artifact("vllm-0.23.0-*.whl"), artifact("vllm-0.33.0-*.whl")])
    assert code == 2 and "package 'vllm' is also in" in twice["errors"][0]
    proc = run_command([sys.executable, "-m", "verl_ascend_ext.tooling.cli", "vet", tmp_path / "notes.txt"],
                       check=False, timeout=120)
    assert proc.returncode == 2 and "UNUSABLE INPUT (exit 2)" in proc.stdout


def test_one_tree_holding_two_packages_vets_both(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path / "site")  # vllm_ascend/ and its dist-info (0.23.0) ...
    core = tree / "vllm" / "v1" / "engine" / "core.py"  # ... plus vLLM 0.33.0's engine core, without metadata
    core.parent.mkdir(parents=True)
    shutil.copyfile(released_core("0.33.0"), core)
    report, code = vet([str(tree)])
    assert code == 0 and report["artifacts"][0]["packages"] == ["vllm", "vllm_ascend"]
    assert report["artifacts"][0]["versions"] == {"vllm": "unknown", "vllm-ascend": "0.23.0"}
    assert statuses(report, VLLM_IDS) == dict.fromkeys(VLLM_IDS, "fixed-upstream")
    assert statuses(report, ASCEND_IDS) == dict.fromkeys(ASCEND_IDS, "will-apply")
