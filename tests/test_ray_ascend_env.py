"""``verl-ascend doctor --ray`` on a real loopback Ray cluster whose raylets see different Ascend trees.

The head raylet runs with the variables CANN's ``set_env.sh`` exports for a CANN 9.1.0 tree (plus the
tests-only sysroot holding its driver 25.5.0); a second raylet sees a CANN 8.5.0 / driver 25.3.rc1
tree and was started with ``VERL_VLLM_ASCEND_GLM52_PATCH=1`` (the head without it). Trees are files only
(``ascend_trees``). The CLI must exit 1 and name that node for the toolkit, NNAL and driver, and must
not call the gate's raw spellings "same meaning" when the parsed values differ.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ascend_trees import full_node
from raycluster import NODES_TIMEOUT, driver_env, loopback_cluster
from repo import REPO
from subprocesses import run_command

CLI = str(Path(sys.executable).with_name("verl-ascend"))
GLM_GATE = "VERL_VLLM_ASCEND_GLM52_PATCH"

# Ray clusters started with other environments; verl 0.9.0 only, as test_ray_doctor.py says why
pytestmark = pytest.mark.long_module


def doctor_ray(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_command([CLI, "doctor", "--ray", "--address", address, *args], driver_env(), check=False, timeout=180,
                       cwd=REPO)


def test_a_raylet_with_another_cann_tree_fails_the_cluster_doctor(tmp_path: Path) -> None:
    head_env = full_node(tmp_path / "head")
    other_env = full_node(tmp_path / "other", cann="8.5.0", nnal_version="8.5.0", driver="25.3.rc1")
    with loopback_cluster(head_env=head_env) as cluster:
        other = cluster.add_node(num_cpus=1, env_vars={**other_env, GLM_GATE: "1"})
        cluster.wait_for_nodes(NODES_TIMEOUT)

        proc = doctor_ray(cluster.address, "--json")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        report = json.loads(proc.stdout)
        assert len(report["nodes"]) == 2
        head = next(n["node_id"] for n in report["nodes"] if n["is_head"])
        diffs = {d["key"]: d for d in report["differences"]}
        for key, mine, theirs in (("CANN toolkit", "9.1.0", "8.5.0"), ("NNAL/ATB", "9.1.0", "8.5.0"),
                                  ("driver", "25.5.0", "25.3.rc1")):
            assert diffs[key]["behaviour_changing"], key
            assert diffs[key]["values"] == {head: mine, other.node_id: theirs}, key
            assert diffs[key]["differing"] == [other.node_id], key
        assert "firmware" not in diffs  # same firmware in both trees
        assert diffs[f"gate {GLM_GATE}"]["values"] == {head: "off", other.node_id: "on"}
        assert diffs[f"gate {GLM_GATE} (raw)"]["note"] is None

        proc = doctor_ray(cluster.address)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        text = proc.stdout
        row = next(line for line in text.splitlines() if line.startswith("CANN toolkit "))
        assert f"{other.node_id[:8]} (" in row and row.rstrip().endswith(": 8.5.0")
        assert "[same meaning]" not in text and "PROBLEMS FOUND (exit 1)" in text
