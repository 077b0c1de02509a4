"""The bounded barrier before the KV-cache resume, on four ranks of a real gloo process group.

verl's real ``ActorRolloutRefWorker.update_weights`` runs in rounds on four spawned CPU ranks
(tests/scenarios/weight_sync_barrier.py: what is real, which test doubles); the barrier timeout is 5 s:
1. one rank slow by 2 s (inside the timeout): every rank passes and resumes its KV cache;
2. one rank stalled for 9 s (alive, not arriving): the other three fail after the timeout naming it (host, pid),
   the late rank then passes (a late arrival does not hang either);
3. one rank killed before the barrier: the other three fail within the timeout + 3 s naming it.
After each failure no thread is left inside the barrier. The same runs pass on verl 0.9.0 (the plugin adds the
barrier) and 0.9.1 (its own unbounded barrier is replaced by the bounded one). The anchor: verl 0.9.1's own
barrier (``await asyncio.to_thread(torch.distributed.barrier)``, its real update_weights with the plugin not
loaded) with a stalled rank is still waiting at timeout + 6 s, when the scenario dumps the stacks and kills it.
On 0.9.1 the two scenarios run concurrently (most of their time is spent waiting).
"""

from __future__ import annotations

import importlib.metadata
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from repo import REPO
from subprocesses import last_json, run_command

SCENARIO = str(REPO / "tests" / "scenarios" / "weight_sync_barrier.py")
TIMEOUT = 5.0
SLACK = 3.0  # "within the timeout + a few seconds"
ENV = "VERL_ASCEND_EXT_WEIGHT_SYNC_BARRIER_TIMEOUT"


BOUNDED = ("slow:1:2,stall:3:9,kill:2", {}, 12)
ANCHOR = ("slow:1:2,stall:3:600", {"VERL_USE_EXTERNAL_PLUGINS": "none"}, 6)  # verl 0.9.1 alone


def run_scenario(tmp_path, plan: str, env: dict[str, str], grace: float) -> dict:
    proc = run_command([sys.executable, SCENARIO, str(tmp_path), plan, "--grace", str(grace)],
                       {ENV: str(TIMEOUT), **env}, check=False, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return last_json(proc.stdout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    todo = {"bounded": BOUNDED}
    if importlib.metadata.version("verl") == "0.9.1":
        todo["anchor"] = ANCHOR
    with ThreadPoolExecutor(len(todo)) as pool:
        futures = {name: pool.submit(run_scenario, tmp_path_factory.mktemp(name), *args) for name, args in todo.items()}
        return {name: future.result() for name, future in futures.items()}


@pytest.fixture(scope="module")
def bounded(runs: dict[str, dict]) -> dict:
    return runs["bounded"]


def _round(out: dict, rank: int, number: int) -> dict:
    return next(e for e in out["ranks"][rank] if e["round"] == number)


@pytest.mark.anyverl
def test_the_plugin_barrier_is_the_one_that_ran(bounded: dict) -> None:
    for rank in range(4):
        assert _round(bounded, rank, 1)["statuses"] == {"weight-sync-kv-barrier": "applied"}


@pytest.mark.anyverl
def test_a_slow_rank_inside_the_timeout_lets_every_rank_pass(bounded: dict) -> None:
    for rank in range(4):
        first = _round(bounded, rank, 1)
        assert first["outcome"] == "ok" and first["resumed"] == ["weights", "kv_cache"], first
    assert _round(bounded, 0, 1)["left"] >= _round(bounded, 1, 1)["entered"]  # rank 0 waited for slow rank 1


@pytest.mark.anyverl
def test_a_stalled_rank_is_named_by_every_other_rank_after_the_timeout(bounded: dict) -> None:
    for rank in (0, 1, 2):
        second = _round(bounded, rank, 2)
        assert second["type"] == "WeightSyncBarrierTimeout", second
        assert "rank 3 (host " in second["error"] and "of 4 did not reach the barrier" in second["error"]
        assert f"raise {ENV} (now 5 s)" in second["error"] and second["resumed"] == ["weights"]
        assert TIMEOUT <= second["left"] - second["entered"] <= TIMEOUT + SLACK
        assert second["barrier_threads"] == []  # nothing left waiting
    late = _round(bounded, 3, 2)
    assert late["outcome"] == "ok" and late["resumed"] == ["weights", "kv_cache"]  # the others' keys were there


@pytest.mark.anyverl
def test_a_killed_rank_is_named_within_the_timeout(bounded: dict) -> None:
    assert bounded["exitcodes"][2] == 17 and bounded["hung"] == []
    assert [e["outcome"] for e in bounded["ranks"][2]] == ["ok", "error", "killed"]
    for rank in (0, 1, 3):
        third = _round(bounded, rank, 3)
        assert third["type"] == "WeightSyncBarrierTimeout", third
        assert "rank 2 (host " in third["error"] and f"(seen from rank {rank})" in third["error"]
        assert TIMEOUT <= third["left"] - third["entered"] <= TIMEOUT + SLACK
        assert third["barrier_threads"] == []
        assert bounded["exitcodes"][rank] == 0


@pytest.mark.verl091
def test_anchor_verl_091_in_tree_barrier_hangs_past_the_timeout(runs: dict[str, dict]) -> None:
    out = runs["anchor"]
    for rank in range(4):
        assert _round(out, rank, 1)["outcome"] == "ok" and _round(out, rank, 1)["statuses"] == {}
        assert [e["round"] for e in out["ranks"][rank]] == [1]  # no rank ever finished round 2
    assert out["hung"] == [0, 1, 2, 3]  # still running at timeout + 6 s, killed by the scenario
    for rank in (0, 1, 2):
        stack = out["stacks"][str(rank)]
        assert "torch/distributed/distributed_c10d.py" in stack and "in barrier" in stack, stack
    assert "in to" in out["stacks"]["3"]  # the stalled rank is still in its offload
