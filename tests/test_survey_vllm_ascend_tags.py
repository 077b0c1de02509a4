"""scripts/survey_vllm_ascend_tags.py on a small git repository made from the released vLLM-Ascend 0.23.0 sources.

The real survey runs on a vLLM-Ascend checkout (docs/glm52.md); here three commits of the 0.23.0 files stand
in for its history: v0.22.0 (skipped: not after v0.23.0), v0.23.0 as released, and v0.24.0rc1 with the edit
that tag made to the routed-experts import; an rc of a dev build is skipped too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from glm52_ascend_fixtures import copy_tree, mutate
from repo import REPO
from subprocesses import run_command

from verl_ascend_ext.runtime.registry import registry

SCRIPT = REPO / "scripts" / "survey_vllm_ascend_tags.py"
WORKER = "vllm_ascend/patch/worker/__init__.py"


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


def make_repo(root: Path) -> Path:
    repo = copy_tree(root / "repo")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "0.23.0")
    git(repo, "tag", "v0.22.0")
    git(repo, "tag", "v0.23.0")
    mutate(repo, WORKER, 'if vllm_version_is("0.23.0"):\n    _V2_MODEL_RUNNER_SUPPORTED = False\n'
           "else:\n    _V2_MODEL_RUNNER_SUPPORTED = True\n",
           '_V2_MODEL_RUNNER_SUPPORTED = not vllm_version_is("0.24.0")\n')
    git(repo, "commit", "-qam", "0.24.0rc1")
    git(repo, "tag", "v0.24.0rc1")
    git(repo, "tag", "v0.25.0.dev1")
    return repo


def test_survey_lists_each_tag_after_the_base_with_its_statuses(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    proc = run_command([sys.executable, SCRIPT, repo / ".git", "--include-after", "--json"], check=False)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [r["ref"] for r in rows] == ["v0.23.0", "v0.24.0rc1"]
    assert rows[1]["version"].startswith("0.24.0rc1 (")
    assert {i: p["status"] for i, p in rows[0]["patches"].items()} == dict.fromkeys(rows[0]["patches"], "will-apply")
    capture = rows[1]["patches"]["glm52-ascend-routed-experts-capture"]
    assert capture["status"] == "refused" and "what changed" in capture["detail"]
    table = run_command([sys.executable, SCRIPT, repo / ".git"], check=False).stdout
    row = table.splitlines()[2]
    records = [r for r in registry().records if r.distribution == "vllm-ascend"]
    assert row.startswith("| `v0.24.0rc1` 0.24.0rc1 (") and len(row.split("|")) == 3 + len(records)  # ref + each
    assert "- `v0.24.0rc1` `glm52-ascend-routed-experts-capture`" in table


def test_not_a_git_directory_exit_2(tmp_path: Path) -> None:
    proc = run_command([sys.executable, SCRIPT, tmp_path], check=False, timeout=60)
    assert proc.returncode == 2 and "not a git directory" in proc.stderr
