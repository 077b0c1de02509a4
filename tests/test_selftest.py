"""`verl-ascend selftest --device cpu`: every numeric GLM-5.2 fix holds on the NPU test double, and the check can fail.

Real: vLLM-Ascend 0.23.0's released method bodies (the cached wheel sources, scripts/fetch_vllm_ascend.sh), vLLM
0.23.0's CustomOp / RMSNorm / config (scripts/fetch_vllm.sh), the engine applying the real records, torch.compile
with the aot_eager and inductor backends, the real CLI in fresh interpreters, the status directory. Simulated: the
NPU kernels (verl_ascend_ext/tooling/selftest/npu_test_double.py), labelled in every line.
Not here: device graphs (CPU has none: "not run"), CUDA and NPU (see docs/selftest.md).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest
from glm52_ascend_fixtures import released_sources
from subprocesses import run_command, run_python

from verl_ascend_ext.tooling.selftest.cli import LABEL, format_report

pytestmark = pytest.mark.long_module  # its fixture runs the self-test eagerly and compiled (~20 s)
BIN = Path(sys.executable).parent
RMSNORM, KV = "glm52-ascend-rmsnorm-add-then-norm", "glm52-ascend-sfa-keep-kv-b-proj"
INDEXERS = ("glm52-ascend-indexer-scale-base", "glm52-ascend-indexer-scale-a5", "glm52-ascend-indexer-scale-cp")
TRACED = (RMSNORM, *INDEXERS)
COMPILED = ("compiled[aot_eager]", "compiled[inductor]")


def selftest(tmp: Path, *args: str, env: dict[str, str] | None = None, check: bool = False):
    return run_command([BIN / "verl-ascend", "selftest", "--device", "cpu", *args],
                       {"VERL_ASCEND_EXT_STATUS_DIR": str(tmp / "status"),
                        "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"), **(env or {})},
                       check=check, timeout=900)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """One whole selftest on the CPU double (shared by the tests below: it compiles every traced record twice)."""
    tmp = tmp_path_factory.mktemp("selftest")
    proc = selftest(tmp, "--json", "--vllm-ascend-source", str(released_sources()))
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout), tmp


def lines_of(report: dict) -> dict[tuple[str, str], dict]:
    return {(line["record"], line["mode"]): line for line in report["lines"]}


def test_every_numeric_fix_holds_eagerly_and_compiled_on_the_double(run: tuple[dict, Path]) -> None:
    report, _ = run
    lines = lines_of(report)
    assert report["double"] is True and LABEL in report["stack"] and "0.23.0" in report["stack"]
    for rid in TRACED:
        for mode in ("eager", *COMPILED):
            assert lines[(rid, mode)]["status"] == "holds", lines[(rid, mode)]
        assert (lines[(rid, "graph")]["status"], lines[(rid, "graph")]["detail"]) == ("not run",
                                                                                     "no device graphs on CPU")
    assert lines[(KV, "eager")]["status"] == "holds"
    assert lines[(KV, "compiled, graph")]["status"] == "not run"
    assert report["counts"] == {"holds": 13, "FAILS": 0, "not run": 5, "could not run": 0}
    # the records whose fix changes no numbers are named, not silently dropped
    assert {"glm52-ascend-camem-sync-before-sleep", "glm52-ascend-routed-experts-capture"} <= set(
        report["not_numeric"])


def test_the_fix_is_what_moved_the_number(run: tuple[dict, Path]) -> None:
    """Where the bug bites the released code misses the intended maths and the fix meets it; elsewhere both agree."""
    report, _ = run
    for line in report["lines"]:
        for case in line["cases"]:
            assert case["fixed"]["matches"] is True, (line["record"], line["mode"], case)
            assert case["runs"]["fixed"].endswith(f"the fix ({line['record']})")
            assert "the fix" not in case["runs"]["released"]
            assert case["released"]["matches"] is (not case["bug_expected"]), (line["record"], line["mode"], case)
    rms = lines_of(report)[(RMSNORM, "compiled[inductor]")]["cases"]
    residual = next(c for c in rms if c["case"] == "residual+bias")
    # sub-ulp bug: inside the bf16 tolerance, but closer to the fused (unrounded) sum than to the intended maths
    assert residual["released"]["within_tolerance"] is True
    assert residual["released"]["mean_error"] > residual["released"]["mean_error_to_bug"]
    assert residual["fixed"]["mean_error"] < residual["fixed"]["mean_error_to_bug"]
    kv = lines_of(report)[(KV, "eager")]["cases"][0]
    assert kv["released"]["problem"].startswith("the bug: RuntimeError")  # the weight update fails


def test_every_text_line_says_it_is_the_double(run: tuple[dict, Path]) -> None:
    report, _ = run
    text = format_report(report).splitlines()
    result_lines = [t for t in text if t.startswith("glm52-")]
    assert len(result_lines) == len(report["lines"]) and all(t.endswith(f"[{LABEL}]") for t in result_lines)
    assert text[-1] == f"ALL HOLD (exit 0)  [{LABEL}]"


def test_status_and_doctor_show_when_and_where_it_last_ran(run: tuple[dict, Path]) -> None:
    report, tmp = run
    stored = tmp / "status" / ".selftest" / f"{socket.gethostname()}.json"
    assert report["stored"] == str(stored) and stored.stat().st_mode & 0o777 == 0o600
    assert json.loads(stored.read_text())["lines"] == report["lines"]
    env = {"VERL_ASCEND_EXT_STATUS_DIR": str(tmp / "status")}
    status = json.loads(run_command([BIN / "verl-ascend", "status", "--json"], env, check=False).stdout)
    doctor = json.loads(run_command([BIN / "verl-ascend", "doctor", "--json"], env, check=False).stdout)
    for section in (status["selftest"], doctor["selftest"]):
        (result,) = section["results"]
        assert result["host"] == socket.gethostname() and result["exit_code"] == 0
        assert result["started"] == report["started"] and "all hold" in result["summary"]
    text = run_command([BIN / "verl-ascend", "status"], env, check=False).stdout
    assert "Selftest (last `verl-ascend selftest` per host)" in text and f"on {socket.gethostname()} (cpu;" in text


BROKEN = """
import sys
import torch
import wrapt
from verl_ascend_ext.tooling.selftest.cli import main

PATCH_CODE = "verl_ascend_ext.features.glm52.ascend.patch_code."


def norm_right_only_eagerly(rmsnorm):  # a fix dynamo would lose: it holds eagerly only
    real = rmsnorm.add_then_rms_norm

    def broken(original, self, x, residual=None):
        if torch.compiler.is_compiling():
            return original(self, x, residual)
        return real(original, self, x, residual)

    rmsnorm.add_then_rms_norm = broken


def scale_twice(sfa):
    def broken(original, sfa_impl, q_li, q_li_scale, q_li_shape_ori, weights, *args, **kwargs):
        weights = sfa.scale_weights(sfa.scale_weights(weights, sfa_impl), sfa_impl)
        return original(sfa_impl, q_li, q_li_scale, q_li_shape_ori, weights, *args, **kwargs)

    sfa.scale_device_operator_weights = broken


# the patch code imports torch_npu (the selftest's double), so it is mutated when the engine first imports it
wrapt.register_post_import_hook(norm_right_only_eagerly, PATCH_CODE + "rmsnorm")
wrapt.register_post_import_hook(scale_twice, PATCH_CODE + "sfa")
sys.exit(main(sys.argv[1:]))
"""


def test_a_broken_replacement_fails_naming_record_and_mode(tmp_path: Path) -> None:
    only = f"{RMSNORM},glm52-ascend-indexer-scale-a5"
    proc = run_command([sys.executable, "-c", BROKEN, "--device", "cpu", "--only", only, "--no-store",
                        "--vllm-ascend-source", str(released_sources())],
                       {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}, check=False, timeout=900)
    assert proc.returncode == 1, proc.stdout[-6000:] + proc.stderr[-4000:]
    out = {tuple(t.split()[:2]): t for t in proc.stdout.splitlines() if t.startswith("glm52-")}
    assert out[(RMSNORM, "eager")].split()[2] == "holds:"
    for mode in COMPILED:
        line = out[(RMSNORM, mode)]
        assert line.split()[2] == "FAILS:" and "residual" in line and "released maths" in line, line
    for mode in ("eager", *COMPILED):
        line = out[("glm52-ascend-indexer-scale-a5", mode)]
        assert line.split()[2] == "FAILS:" and "A5DeviceAdaptor: max error" in line and "outside" in line, line
    assert proc.stdout.rstrip().endswith(f"A FIX FAILS (exit 1)  [{LABEL}]")


HARNESS = """
import sys
sys.modules["vllm.model_executor.layers.layernorm"] = None  # an import this stack lacks
from verl_ascend_ext.tooling.selftest.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_harness_failure_is_could_not_run_not_a_verdict(tmp_path: Path) -> None:
    proc = run_command([sys.executable, "-c", HARNESS, "--device", "cpu", "--only", RMSNORM, "--no-store", "--json",
                        "--vllm-ascend-source", str(released_sources())], check=False, timeout=600)
    assert proc.returncode == 2, proc.stdout[-4000:] + proc.stderr[-4000:]
    (line,) = json.loads(proc.stdout)["lines"]
    assert line["status"] == "could not run" and "vLLM is not importable here" in line["detail"], line


def test_bad_input_and_missing_source_exit_2(tmp_path: Path) -> None:
    bad = selftest(tmp_path, "--vllm-ascend-source", str(tmp_path / "nowhere"), "--no-store")
    assert bad.returncode == 2 and f"could not run: --vllm-ascend-source: {tmp_path / 'nowhere'}: no such file" \
        in bad.stdout, bad.stdout
    unknown = selftest(tmp_path, "--only", "no-such-patch", "--no-store", "--json")
    report = json.loads(unknown.stdout)
    assert unknown.returncode == 2 and "no-such-patch" in report["errors"][0] and RMSNORM in report["errors"][0]
    missing = selftest(tmp_path, "--json", "--no-store")  # no vllm-ascend installed here, none given
    report = json.loads(missing.stdout)
    assert missing.returncode == 2 and report["counts"]["holds"] == 0
    assert {line["record"] for line in report["lines"]} == {*TRACED, KV}
    assert all(line["status"] == "not run" and "no vLLM-Ascend source at hand" in line["detail"]
               for line in report["lines"])


def test_recipe_check_runs_it_only_on_an_npu_node(tmp_path: Path) -> None:
    """--no-device, --skip-selftest, a GPU check, no NPU found; with vLLM-Ascend "installed" (the released tree on
    PYTHONPATH) and the NPU claimed present, the real subprocess runs and reports that it could not run here."""
    code = """
        import json
        from verl_ascend_ext.tooling.recipes.check import selftest_findings
        from verl_ascend_ext.tooling.recipes.manifest import load_manifest
        from verl_ascend_ext.tooling.recipes import get_recipe
        import os
        glm = load_manifest(get_recipe("glm5_2_megatron").manifest)
        qwen = load_manifest(get_recipe("qwen3_5_35b_megatron").manifest)
        env = dict(os.environ)
        cases = {"no_device": (glm, "npu", True, False, True), "skip": (glm, "npu", False, True, True),
                 "gpu": (glm, "gpu", False, False, True), "no_npu": (glm, "npu", False, False, False),
                 "qwen": (qwen, "npu", False, False, True), "npu": (glm, "npu", False, False, True)}
        out = {k: [[f.status.value, f.detail] for f in selftest_findings(*v, env)] for k, v in cases.items()}
        print(json.dumps(out))
    """
    out = json.loads(run_python(code, pythonpath=str(released_sources())).stdout.splitlines()[-1])
    assert out["no_device"] == [["not checked here", "not run: --no-device (not a training node); run "
                                 "`verl-ascend selftest` on one NPU node before the job"]]
    assert out["skip"][0][1].startswith("skipped (--skip-selftest)")
    assert "this check is for gpu" in out["gpu"][0][1] and "no NPU found here" in out["no_npu"][0][1]
    assert "applies no patch the selftest checks" in out["qwen"][0][1]
    (status, detail), = out["npu"]
    assert status == "warn" and "could not run: --device npu: no usable NPU here" in detail, out["npu"]


def _dry_run(name: str, **env: str):
    from verl_ascend_ext.tooling.recipes import get_recipe

    path = f"{BIN}:{os.environ.get('PATH', '')}"
    return run_command(["bash", get_recipe(name).script], {"PATH": path, "PYTHON": sys.executable, "DRY_RUN": "1",
                                                           "VERL_ASCEND_RECIPE_DEVICE_CHECK": "0", **env},
                       check=False, timeout=600)


def test_run_script_skip_switch_reaches_the_report() -> None:
    skipped = _dry_run("glm5_2_megatron", VERL_ASCEND_RECIPE_SELFTEST="0")
    assert skipped.returncode == 0 and "skipped (--skip-selftest)" in skipped.stderr, skipped.stderr
    bad = _dry_run("glm5_2_megatron", VERL_ASCEND_RECIPE_SELFTEST="maybe")
    assert bad.returncode == 2 and "VERL_ASCEND_RECIPE_SELFTEST='maybe' is not 1 or 0" in bad.stderr
