"""The fully-async GLM-5.2 recipe, its node-layout check and the nine pinned repositories of the GLM-5.2 manifests.

Verified how: the overrides come from the real run script (bash, emit mode) and are composed by real
Hydra against the installed verl's ``verl/experimental/fully_async_policy/config`` (verl 0.9.0 and
0.9.1, ``anyverl``); the fully-async main's own checks import the real verl in a fresh interpreter;
the launch command's overrides are given to a real ``hydra.main`` rooted at that config folder, run
from a foreign working directory. Manifest pins are compared with crafted dist-info / real git
checkouts. Only the NPU is absent: the device probe fails for real on this CPU machine.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from repo import verl_version
from subprocesses import last_json, run_command, run_python, scrubbed_env

from verl_ascend_ext.runtime.findings import ERROR, NOT_CHECKED, OK, WARN
from verl_ascend_ext.tooling.recipes import get_recipe
from verl_ascend_ext.tooling.recipes.manifest import check_manifest, load_manifest

BIN = Path(sys.executable).parent
NAME = "glm5_2_megatron_fully_async"
ENTRY = "verl.experimental.fully_async_policy.fully_async_main"
CONFIG = "fully_async_ppo_megatron_trainer"
# The dependency header of upstream verl's two GLM-5.2 scripts (examples/ascend_extras/grpo_trainer/).
UPSTREAM_PINS = {
    "vllm": ("https://github.com/vllm-project/vllm.git", "releases/v0.23.0",
             "0fc695fc6d1d82e9a5ac6835ac8e4e1c83703665"),
    "vllm-ascend": ("https://github.com/vllm-project/vllm-ascend.git", "releases/v0.23.0",
                    "dc55ef82f8236585c8f2ee237f5b43507cae8686"),
    "Megatron-LM": ("https://github.com/NVIDIA/Megatron-LM.git", "core_v0.18.0",
                    "ba7b5ebce12af60627a80985792a1449ce45f46c"),
    "MindSpeed": ("https://gitcode.com/Ascend/MindSpeed.git", "core_r0.18.0",
                  "1881e01a996074b30d424349237d55a2c608e6b7"),
    "MegatronAdaptor": ("https://gitcode.com/Ascend/MegatronAdaptor.git", "core_r0.18.0",
                        "eb0e5043438dd753099432bc3b3d8e5916ed1844"),
    "TransformerEngineNPU": ("https://gitcode.com/Ascend/TransformerEngineNPU.git", "main",
                             "e40ec34036eb7e04ad11b983f8c6b0dc9fcd88f9"),
    "MindSpeed-Ops": ("https://gitcode.com/Ascend/MindSpeed-Ops.git", "master",
                      "dbee3f41b156bb051fc046facf69548400be2be1"),
    "MindSpeed-Bridge": ("https://gitcode.com/Ascend/MindSpeed-Bridge.git", "master",
                         "d82eec3ce2b31deb82cc5474b6813498efded908"),
    "Megatron-Bridge": ("https://github.com/NVIDIA-NeMo/Megatron-Bridge.git", "v0.5.0",
                        "fcbb6031103d0ca845c1a54d4fee55ecfcca17b6"),
}


def script_env(**extra: str) -> dict[str, str]:
    """What a recipe script runs with: the scrubbed environment, this venv first on PATH, ``extra``."""
    return scrubbed_env({"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHON": sys.executable, **extra})


def emitted(**env: str) -> tuple[str, list[str]]:
    from verl_ascend_ext.tooling.recipes.compose import script_overrides

    return script_overrides(get_recipe(NAME).script, script_env(**env))


def compose(user: list[str], **env: str):
    """Recipe + user overrides composed in-process (Hydra only; verl is not imported)."""
    from verl_ascend_ext.tooling.recipes.compose import Tagged, check_config, split_config_name

    qualified, overrides = emitted(**env)
    entry, config_name = split_config_name(qualified)
    assert (entry, config_name) == (ENTRY, CONFIG)
    tagged = [Tagged(o, "recipe") for o in overrides] + [Tagged(o, "user") for o in user]
    return check_config(config_name, tagged, verl_version=f"verl {verl_version()}", validate=False, entry=entry)


def layout(user: list[str], **env: str):
    from verl_ascend_ext.tooling.recipes.fully_async import layout_findings

    result = compose(user, **env)
    assert result.config is not None, [f.detail for f in result.findings]
    return layout_findings(result.config, result.setters)


@pytest.mark.anyverl
def test_composes_against_fully_async_config_and_passes_its_main_checks() -> None:
    """The whole preflight but the device, in a fresh interpreter (imports verl for the main's checks)."""
    code = """
        import json
        from verl_ascend_ext.tooling.recipes.check import run_check
        out = {}
        for key, user in [("clean", []), ("no_logprobs", ["actor_rollout_ref.rollout.calculate_log_probs=False"]),
                          ("bad_ep", ["actor_rollout_ref.rollout.expert_parallel_size=32"])]:
            report, code = run_check("glm5_2_megatron_fully_async", user_overrides=user, no_device=True)
            out[key] = {"code": code, "report": report}
        print(json.dumps(out))
    """
    out = last_json(run_python(code, env=script_env()).stdout)
    clean = out["clean"]["report"]
    rows = [(f["section"], f["subject"], f["status"]) for f in clean["findings"]]
    assert out["clean"]["code"] == 0, [f for f in clean["findings"] if f["status"] == ERROR]
    assert clean["verl"] == verl_version() and (clean["entry"], clean["config_name"]) == (ENTRY, CONFIG)
    composed = next(f["detail"] for f in clean["findings"] if f["subject"] == CONFIG)
    assert "verl/experimental/fully_async_policy/config" in composed
    assert ("config", "fully_async_validate", OK) in [tuple(r) for r in rows]
    assert not any(f["subject"] == "validate_config" for f in clean["findings"])  # the fully-async main runs none
    got = set(map(tuple, rows))
    assert {("layout", "training actor", OK), ("layout", "rollout", OK), ("layout", "pools", OK)} <= got
    assert ("gates", "VERL_VLLM_ASCEND_GLM52_PATCH", OK) in got and ("device", "npu", NOT_CHECKED) in got
    assert {name for section, name, status in got if section == "manifest" and status == NOT_CHECKED} \
        >= set(UPSTREAM_PINS)
    # what the rollouter asserts, and what verl's rollout dataclass asserts, are reported before launch
    for key, needle in [("no_logprobs", "calculate_log_probs must be True"),
                        ("bad_ep", "expert_parallel_size must be equal to tensor_model_parallel_size")]:
        assert out[key]["code"] == 1
        found = [f for f in out[key]["report"]["findings"] if f["subject"] == "fully_async_validate"]
        assert found and found[0]["status"] == ERROR and needle in found[0]["detail"], found


@pytest.mark.anyverl
def test_mistyped_and_wrongly_typed_fully_async_overrides_are_caught_with_suggestions() -> None:
    bad = ["async_training.staleness_treshold=0.5", "rollout.nnode=4", "async_training.partial_rollout=maybe",
           "async_training.trigger_parameter_sync_step=two"]
    result = compose(bad)
    found = {f.override: f for f in result.findings if f.status == ERROR}
    assert set(found) == set(bad), {k: v.detail for k, v in found.items()}
    assert all(f.source == "user" for f in found.values())
    assert "did you mean async_training.staleness_threshold" in found[bad[0]].detail
    assert "did you mean rollout.nnodes" in found[bad[1]].detail
    assert "defaults to True (bool)" in found[bad[2]].detail
    assert "'two' (str)" in found[bad[3]].detail


@pytest.mark.anyverl
def test_recipe_layout_is_the_upstream_one_and_divides() -> None:
    findings = {f.subject: f for f in layout([])}
    assert all(f.status == OK for f in findings.values()), {k: f.detail for k, f in findings.items()}
    training = findings["training actor"].detail
    assert "training world size 256 (trainer.nnodes=16 x trainer.n_gpus_per_node=16)" in training
    assert "TP4 x PP8 x CP4 = 128, data parallel 2" in training
    assert "4 vLLM replica(s) of TP8 x DP8 x PP1 = 64, EP64" in findings["rollout"].detail
    assert "disjoint: 256 training + 256 rollout devices" in findings["pools"].detail


@pytest.mark.anyverl
def test_non_dividing_node_layouts_are_reported_with_their_numbers() -> None:
    train = [f for f in layout(["trainer.nnodes=3"]) if f.status == ERROR]
    assert [f.subject for f in train] == ["training actor", "training actor"]
    assert "training world size 48 (trainer.nnodes=3 x trainer.n_gpus_per_node=16) is not divisible by " \
           "TP*PP*CP = 4*8*4 = 128" in train[0].detail
    assert "ETP*EP*PP = 1*32*8 = 256" in train[1].detail
    assert {(f.override, f.source) for f in train} == {("trainer.nnodes=3", "user")}

    rollout = [f for f in layout([], NNODES_ROLLOUT="3") if f.status == ERROR]
    assert len(rollout) == 1 and rollout[0].override == "rollout.nnodes=3" and rollout[0].source == "recipe"
    assert ("rollout world size 48 (rollout.nnodes=3 x rollout.n_gpus_per_node=16) is not a multiple of one vLLM "
            "replica, TP*DP*PP = 8*8*1 = 64: verl would start 0 replica(s) and leave 48 device(s) idle") \
        in rollout[0].detail
    odd = [f.detail for f in layout(["actor_rollout_ref.rollout.tensor_model_parallel_size=6",
                                     "actor_rollout_ref.rollout.expert_parallel_size=48"]) if f.status == ERROR]
    assert len(odd) == 2 and "rollout world size 256" in odd[0] and "is not divisible by the rollout TP = 6" in odd[0]
    assert "TP*DP*PP = 6*8*1 = 48: verl would start 5 replica(s) and leave 16 device(s) idle" in odd[1]


@pytest.mark.anyverl
def test_pools_must_be_disjoint_and_rollout_devices_set_on_rollout() -> None:
    found = {f.subject: f for f in layout(["actor_rollout_ref.hybrid_engine=True", "actor_rollout_ref.rollout.nnodes=8",
                                           "async_training.use_trainer_do_validate=True",
                                           "rollout.n_gpus_per_node=8"])}
    assert found["pools"].status == WARN and "not disjoint" in found["pools"].detail
    hybrid = [f for f in layout(["actor_rollout_ref.hybrid_engine=True"]) if f.subject == "pools"]
    assert hybrid[0].status == ERROR and "hybrid_engine must be False" in hybrid[0].detail
    ignored = found["actor_rollout_ref.rollout.nnodes"]
    assert ignored.status == ERROR and ignored.override == "actor_rollout_ref.rollout.nnodes=8"
    assert "overwrites it with rollout.nnodes=16; set rollout.nnodes instead" in ignored.detail
    per_node = found["devices per node"]
    assert per_node.status == WARN and "trainer.n_gpus_per_node=16 but rollout.n_gpus_per_node=8" in per_node.detail


def test_missing_search_path_is_reported_with_the_fix() -> None:
    """Without the recipe's hydra.searchpath override, verl's relative search path finds nothing here."""
    from verl_ascend_ext.tooling.recipes.compose import Tagged, check_config, verl_config_dir

    _, overrides = emitted()
    tagged = [Tagged(o, "recipe") for o in overrides if not o.startswith("hydra.searchpath=")]
    result = check_config(CONFIG, tagged, verl_version="verl", validate=False, entry=ENTRY)
    (finding,) = result.findings
    assert finding.status == ERROR and "Could not load" in finding.detail
    assert f"add the override 'hydra.searchpath=[file://{verl_config_dir()}]'" in finding.detail


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_command(["bash", get_recipe(NAME).script, *args], script_env(**env), check=False)


def test_dry_run_prints_the_exact_fully_async_launch_command() -> None:
    proc = _run("trainer.total_epochs=1", DRY_RUN="1", VERL_ASCEND_RECIPE_DEVICE_CHECK="0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1 and "0 blocking problem(s)" in proc.stderr
    _, overrides = emitted()
    assert shlex.split(proc.stdout) == ["env", "VERL_VLLM_ASCEND_GLM52_PATCH=1", sys.executable, "-m", ENTRY,
                                        f"--config-name={CONFIG}", *overrides, "trainer.total_epochs=1"]
    for fact in ["actor_rollout_ref.hybrid_engine=False", "trainer.nnodes=16", "trainer.n_gpus_per_node=16",
                 "rollout.nnodes=16", "rollout.n_gpus_per_node=16",
                 "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=8",
                 "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
                 "actor_rollout_ref.actor.megatron.expert_model_parallel_size=32",
                 "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1",
                 "actor_rollout_ref.actor.megatron.context_parallel_size=4",
                 "actor_rollout_ref.rollout.tensor_model_parallel_size=8",
                 "actor_rollout_ref.rollout.data_parallel_size=8", "actor_rollout_ref.rollout.expert_parallel_size=64",
                 "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
                 "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
                 "algorithm.rollout_correction.rollout_rs=seq_mean_k1",
                 "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
                 "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1824",
                 "async_training.partial_rollout=True", "async_training.staleness_threshold=0.3",
                 "async_training.trigger_parameter_sync_step=4", "data.max_prompt_length=2048",
                 "data.max_response_length=32768", "actor_rollout_ref.actor.megatron.router_replay.mode=R3",
                 "actor_rollout_ref.rollout.enable_rollout_routing_replay=True",
                 "actor_rollout_ref.actor.checkpoint.strict=False", "+ray_kwargs.ray_init.address=auto"]:
        assert fact in overrides, fact
    assert not any("ray_init.address" in o for o in emitted(RAY_ADDRESS_OVERRIDE="")[1])


def test_dry_run_stops_on_a_non_dividing_node_layout_naming_the_numbers() -> None:
    proc = _run(DRY_RUN="1", VERL_ASCEND_RECIPE_DEVICE_CHECK="0", NNODES_TRAIN="3")
    assert proc.returncode == 1 and proc.stdout == ""
    assert "training world size 48 (trainer.nnodes=3 x trainer.n_gpus_per_node=16) is not divisible by " \
           "TP*PP*CP = 4*8*4 = 128" in proc.stderr
    assert "caused by recipe override: trainer.nnodes=3" in proc.stderr and "DO NOT LAUNCH" in proc.stderr


def test_script_stops_without_npu_when_device_check_is_on() -> None:
    proc = _run(DRY_RUN="1")
    assert proc.returncode == 3 and proc.stdout == ""
    assert "glm5_2_megatron_fully_async is for Ascend NPUs only, and no NPU is available" in proc.stderr
    assert "VERL_ASCEND_RECIPE_DEVICE_CHECK=0" in proc.stderr


@pytest.mark.anyverl
def test_launch_overrides_compose_under_a_real_hydra_main_from_any_directory(tmp_path: Path) -> None:
    """verl's fully-async config finds ppo_megatron_trainer through a search path relative to the working
    directory; the recipe's hydra.searchpath override makes the launch work from anywhere, and is needed."""
    from verl_ascend_ext.tooling.recipes.compose import verl_config_dir

    app = tmp_path / "app.py"
    app.write_text(textwrap.dedent(f"""
        import hydra, json
        @hydra.main(config_path={str(verl_config_dir(ENTRY))!r}, config_name="fully_async_ppo_trainer",
                    version_base=None)
        def main(cfg):
            engine = cfg.actor_rollout_ref.rollout.checkpoint_engine
            print(json.dumps({{"trainer": cfg.trainer.nnodes, "rollout": cfg.rollout.nnodes,
                              "strategy": cfg.actor_rollout_ref.actor.strategy,
                              "bucket": engine.update_weights_bucket_megabytes}}))
        main()
    """))
    _, overrides = emitted()
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()

    def launch(args: list[str]) -> subprocess.CompletedProcess[str]:
        return run_command([sys.executable, app, f"--config-name={CONFIG}", *args, f"hydra.run.dir={tmp_path / 'out'}"],
                           script_env(VERL_USE_EXTERNAL_PLUGINS="none"), check=False, timeout=120, cwd=elsewhere)

    ok = launch(overrides)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout.strip().splitlines()[-1]) == {"trainer": 16, "rollout": 16, "strategy": "megatron",
                                                              "bucket": 1824}
    searchpath = [o for o in overrides if o.startswith("hydra.searchpath=")]
    assert len(searchpath) == 1
    broken = launch([o for o in overrides if o not in searchpath])
    assert broken.returncode != 0 and "ppo_megatron_trainer" in broken.stderr


# ---- the nine pinned repositories of both GLM-5.2 manifests ----

@pytest.mark.parametrize("recipe", ["glm5_2_megatron", NAME])
def test_glm_manifests_pin_all_nine_upstream_repositories(recipe: str) -> None:
    pins = {p.name: p for p in load_manifest(get_recipe(recipe).manifest).packages}
    for name, (repo, branch, commit) in UPSTREAM_PINS.items():
        pin = pins[name]
        assert (pin.repo, pin.branch, pin.commit, pin.on) == (repo, branch, commit, "npu"), name


def _dist_info(site: Path, name: str, version: str, direct_url: dict) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "direct_url.json").write_text(json.dumps(direct_url))


def test_new_pins_are_checked_on_npu_nodes_by_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The four added pins, as the real manifest names them: a matching git install is OK, another commit is
    an error naming both, a checkout found only by its module is read with git, a missing one blocks."""
    manifest = load_manifest(get_recipe(NAME).manifest)
    pins = {p.name: p for p in manifest.packages}
    site = tmp_path / "site"
    ops, bridge = pins["MindSpeed-Ops"], pins["Megatron-Bridge"]
    _dist_info(site, ops.distribution, "0.1", {"url": ops.repo, "vcs_info": {"vcs": "git", "commit_id": ops.commit}})
    _dist_info(site, bridge.distribution, "0.5.0",
               {"url": bridge.repo, "vcs_info": {"vcs": "git", "commit_id": "1" * 40, "requested_revision": "v0.5.0"}})
    checkout = tmp_path / "checkout"
    module = checkout / pins["MindSpeed-Bridge"].module
    module.mkdir(parents=True)
    (module / "__init__.py").write_text("")
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "c"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(checkout))
    four = ("TransformerEngineNPU", "MindSpeed-Ops", "MindSpeed-Bridge", "Megatron-Bridge")
    got = {f.subject: f for f in check_manifest(manifest, "npu", no_device=False) if f.subject in four}
    assert got["MindSpeed-Ops"].status == OK and ops.commit[:12] in got["MindSpeed-Ops"].detail
    assert got["Megatron-Bridge"].status == ERROR
    assert f"commit {'1' * 12} is not {bridge.commit}" in got["Megatron-Bridge"].detail
    assert got["MindSpeed-Bridge"].status == ERROR and f"commit {head[:12]} is not" in got["MindSpeed-Bridge"].detail
    assert "not pip-installed (git rev-parse HEAD)" in got["MindSpeed-Bridge"].detail
    assert got["TransformerEngineNPU"].status == ERROR and "not installed" in got["TransformerEngineNPU"].detail
    # on a login node (--no-device) they are not failures
    login = {f.subject: f.status for f in check_manifest(manifest, "npu", no_device=True) if f.subject in four}
    assert login == dict.fromkeys(four, NOT_CHECKED)


def test_gate_and_checkpoint_expectations_are_those_of_the_glm_recipe() -> None:
    from verl_ascend_ext.tooling.recipes.check import gate_findings

    recipe = get_recipe(NAME)
    manifest = load_manifest(recipe.manifest)

    def statuses(env: dict[str, str]) -> dict[str, str]:
        return {f.subject: f.status for f in gate_findings(manifest, recipe.script, env)}

    assert statuses({}) == {"VERL_VLLM_ASCEND_GLM52_PATCH": OK, "VERL_ASCEND_EXT_CHECKPOINT_FIXES": OK,
                            "checkpoint-export-check": OK}
    # checkpoint.strict=False relies on the export check: its gate off, its patch disabled or its mode off block
    assert statuses({"VERL_ASCEND_EXT_CHECKPOINT_FIXES": "0"})["VERL_ASCEND_EXT_CHECKPOINT_FIXES"] == ERROR
    assert statuses({"VERL_ASCEND_EXT_DISABLE": "checkpoint-export-check"})["checkpoint-export-check"] == ERROR
    assert statuses({"VERL_ASCEND_EXT_EXPORT_CHECK": "off"})["VERL_ASCEND_EXT_EXPORT_CHECK"] == ERROR
