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
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from repo import CACHE, REPO
from subprocesses import last_json, run_command

pytestmark = pytest.mark.long_module  # its fixture runs the barrier scenario on gloo ranks (~30 s)
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


WHEELS = CACHE / "vet-artifacts"
UPSTREAM = "            await asyncio.to_thread(torch.distributed.barrier)\n"


def _engine_workers(tmp_path: Path, version: str) -> Path:
    wheel = WHEELS / f"verl-{version}-py3-none-any.whl"
    assert wheel.is_file(), f"{wheel} missing: run scripts/fetch_vet_artifacts.sh (scripts/test.sh does)"
    with zipfile.ZipFile(wheel) as zf:
        path = tmp_path / version / "engine_workers.py"
        path.parent.mkdir()
        path.write_bytes(zf.read("verl/workers/engine_workers.py"))
    return path


def _classify(path: Path) -> tuple[str, str]:
    from verl_ascend_ext.features.weight_sync.declaration import KV_BARRIER
    from verl_ascend_ext.patching import engine, source

    definition = source.definition_in_file(path, KV_BARRIER.qualname)
    status, detail = engine.classify(KV_BARRIER, definition, str(path))
    return status.value, detail


def test_the_record_tells_no_barrier_an_unbounded_one_and_a_bounded_one_apart(tmp_path: Path) -> None:
    """On the released verl files: 0.9.0 (no barrier) and 0.9.1 (unbounded) are fixed by the record, each with its
    own replacement; a barrier given a timeout is upstream's fix; a barrier in another place is refused."""
    from verl_ascend_ext.features.weight_sync.declaration import KV_BARRIER
    from verl_ascend_ext.patching import engine, source

    v090, v091 = _engine_workers(tmp_path, "0.9.0"), _engine_workers(tmp_path, "0.9.1")
    assert _classify(v090) == ("will-apply", "recognised the code to fix: " + KV_BARRIER.original.description)
    assert _classify(v091) == ("will-apply", "recognised the code to fix: "
                               + KV_BARRIER.variants[0].original.description)
    wrappers = {engine.wrapper_for(KV_BARRIER, source.definition_in_file(p, KV_BARRIER.qualname)).rpartition(":")[2]
                for p in (v090, v091)}
    assert wrappers == {"barrier_before_kv_resume", "bounded_upstream_barrier"}
    text = v091.read_text()
    assert text.count(UPSTREAM) == 1
    bounded = tmp_path / "bounded.py"
    bounded.write_text(text.replace(UPSTREAM, "            await asyncio.to_thread(torch.distributed.monitored_barrier,"
                                              " timeout=timedelta(seconds=60), wait_all_ranks=True)\n"))
    assert _classify(bounded)[0] == "fixed-upstream"
    moved = tmp_path / "moved.py"
    moved.write_text(text.replace(UPSTREAM, "            await asyncio.to_thread(torch.distributed.barrier)\n"
                                            "            log_gpu_memory_usage('moved', logger=logger)\n"))
    status, detail = _classify(moved)
    assert status == "refused" and "original fingerprint" in detail and "variant 1 fingerprint" in detail
