"""Weight-sync fixes on real verl: two CPU ranks in a real gloo process group run ``update_weights``.

The scenario (tests/scenarios/weight_sync.py, documented there: what is real, which test doubles) makes
rank 0 reach the KV-cache resume 3 s after rank 1 (its offload is slow). With the barrier, rank 1's KV
resume cannot happen before rank 0 finished offloading; without it, it does. Full GC passes on the path
(both empty-cache calls of update_weights and both bucketed-transfer clean-ups) are counted with
``gc.callbacks`` with automatic collection disabled.
"""

from __future__ import annotations

import sys

import pytest
from repo import REPO
from subprocesses import last_json, run_command

pytestmark = pytest.mark.long_module  # verl's weight sync on gloo ranks, with and without the plugin (~50 s)
SCENARIO = str(REPO / "tests" / "scenarios" / "weight_sync.py")
IDS = ("weight-sync-kv-barrier", "weight-sync-light-empty-cache", "weight-sync-sender-no-full-gc",
       "weight-sync-receiver-no-full-gc")


def run_scenario(tmp_path, env: dict[str, str] | None = None) -> tuple[dict, dict]:
    proc = run_command([sys.executable, SCENARIO, str(tmp_path)], env, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rank0, rank1 = last_json(proc.stdout)["ranks"]
    for rank in (rank0, rank1):
        rank["at"] = {name: t for name, t in rank["events"]}
        assert rank["received"] == 12  # the real bucketed transfer delivered every tensor
    return rank0, rank1


def test_verl_090_with_plugin_barrier_and_no_full_gc(tmp_path) -> None:
    rank0, rank1 = run_scenario(tmp_path)
    for rank in (rank0, rank1):
        assert rank["statuses"] == dict.fromkeys(IDS, "applied")
        assert rank["wrapped"] == {"update_weights": True, "cleanup": True}
        assert rank["still_coroutine_function"] and rank["dispatch_attrs_kept"]  # Ray/verl still see the method
        assert rank["rollout_resume_restored"]
        assert rank["full_gc"] == 0
    # the non-leader resumed its KV cache only after the slow leader got through its offload to the barrier
    assert rank1["at"]["resume:kv_cache"] >= rank0["at"]["offloaded"]
    assert rank1["at"]["resume:kv_cache"] - rank1["at"]["offloaded"] > 2.0


def test_verl_090_without_plugin_races_and_collects(tmp_path) -> None:
    rank0, rank1 = run_scenario(tmp_path, {"VERL_USE_EXTERNAL_PLUGINS": "none"})
    assert rank0["statuses"] == {} and rank0["wrapped"] == {"update_weights": False, "cleanup": False}
    assert rank1["at"]["resume:kv_cache"] < rank0["at"]["offloaded"]  # resumed while rank 0 still held memory
    assert rank0["full_gc"] >= 1 and rank1["full_gc"] >= 1


@pytest.mark.verl091
def test_verl_091_fixed_upstream_but_its_unbounded_barrier_replaced(tmp_path) -> None:
    """verl 0.9.1 carries the GC fixes (recognised, nothing wrapped) and a barrier without a bound, which the
    kv-barrier record's variant replaces by the bounded one (tests/test_weight_sync_barrier.py: 4 ranks)."""
    rank0, rank1 = run_scenario(tmp_path)
    for rank in (rank0, rank1):
        assert rank["statuses"] == {**dict.fromkeys(IDS, "fixed-upstream"), "weight-sync-kv-barrier": "applied"}
        assert rank["wrapped"] == {"update_weights": True, "cleanup": False}
        assert rank["full_gc"] == 0  # upstream's own code, recognised correctly
        assert rank["still_coroutine_function"] and rank["dispatch_attrs_kept"]
    assert rank1["at"]["resume:kv_cache"] >= rank0["at"]["offloaded"]


def test_light_empty_cache_stands_down_without_the_update_weights_replacement(tmp_path) -> None:
    """The light clean-up is triggered by the kv-barrier replacement (a ContextVar it sets): killing that one
    switches the light one off too, in-process and in doctor's prediction, instead of leaving it inert."""
    from verl_ascend_ext.features.weight_sync.declaration import GATE, KV_BARRIER, LIGHT_EMPTY_CACHE
    from verl_ascend_ext.patching import engine

    gate_on = {GATE.env: "1"}
    predicted = engine.predict(LIGHT_EMPTY_CACHE, frozenset({KV_BARRIER.id}), gate_on)
    assert predicted.status.value == "disabled" and f"{KV_BARRIER.id} (disabled)" in predicted.detail
    assert engine.predict(LIGHT_EMPTY_CACHE, frozenset(), gate_on).status.value == "will-apply"

    rank0, rank1 = run_scenario(tmp_path, {"VERL_ASCEND_EXT_DISABLE": KV_BARRIER.id})
    for rank in (rank0, rank1):
        assert rank["statuses"][KV_BARRIER.id] == "disabled"
        assert rank["statuses"][LIGHT_EMPTY_CACHE.id] == "disabled"
        assert rank["wrapped"] == {"update_weights": False, "cleanup": True}
        assert rank["full_gc"] >= 1  # aggressive_empty_cache's own full GC, as without the fix
