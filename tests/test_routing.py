"""The R3 route check on verl's real replay (verl 0.9.0, Megatron-Core's real TopKRouter on one gloo rank:
``tests/scenarios/routing.py``), and its checks and counts on small tensors.

verl 0.9.1's replay (``utils/megatron/router_replay_patch.py``) is byte for byte 0.9.0's; on 0.9.1 the contract
suite checks the three records (static and through a real import) and the engine tier's ``moe-resumed`` job runs
them in verl's trainer (``tests/engine/test_moe.py``).

What the scenario proves, gate on: good routes pass and the agreement verl's trainer logs
(``actor/rollout_actor_route_agreement``, ``_min``) is the share computed from the routes and the logits themselves;
all-zero routes (vllm#49184), a truncated sample (verl#6027) and an out-of-range expert stop with an error naming
the sample, its uid, the decoder layer, the likely cause and the fix. Gate off / no plugin: verl replays expert 0 for
every token of all-zero routes and trains on it without a word. Check killed, agreement kept: the logger shows 0.0.
"""

from __future__ import annotations

import sys
from functools import cache

import pytest
import torch
from repo import REPO
from subprocesses import last_json, run_command

from verl_ascend_ext.features.routing import agreement
from verl_ascend_ext.features.routing.checks import gate_finding, r3_finding
from verl_ascend_ext.features.routing.declaration import GATE
from verl_ascend_ext.features.routing.routes import (
    MIN_CONSTANT_TOKENS,
    RouteCheckError,
    RouterShape,
    check_micro_batch,
    checked_layers,
)
from verl_ascend_ext.runtime.findings import ERROR, INFO, OK

pytestmark = pytest.mark.long_module  # 10 fresh interpreters importing verl and Megatron

SCENARIO = str(REPO / "tests" / "scenarios" / "routing.py")
RANKS = str(REPO / "tests" / "scenarios" / "routing_ranks.py")
IDS = ("r3-route-check", "r3-route-agreement", "r3-route-agreement-metric")
METRIC, METRIC_MIN = "actor/rollout_actor_route_agreement", "actor/rollout_actor_route_agreement_min"
HOW_TO_SKIP = "To replay such routes anyway: VERL_ASCEND_EXT_ROUTE_CHECK=0, or VERL_ASCEND_EXT_DISABLE=r3-route-check."


@cache
def scenario(case: str, env: tuple[tuple[str, str], ...] = (), args: tuple[str, ...] = ()) -> dict:
    proc = run_command([sys.executable, SCENARIO, "--case", case, *args], dict(env), check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return last_json(proc.stdout)


# ---- verl's real replay -------------------------------------------------------------------------------------------

def test_good_routes_pass_and_the_logged_agreement_is_the_routes_own() -> None:
    out = scenario("good")
    assert "error" not in out, out["error"]
    assert out["statuses"] == dict.fromkeys(IDS, "applied")
    expected = out["expected"]  # per MoE layer: planted disagreements, and the tool tail verl replays as zeros
    assert expected[0] != expected[1]
    assert out["metrics"][METRIC] == pytest.approx(sum(expected) / len(expected), abs=1e-12)
    assert out["metrics"][METRIC_MIN] == pytest.approx(min(expected), abs=1e-12)
    assert out["metrics"]["actor/loss"] == 0.5  # verl's own metrics untouched
    # checked: 2 micro-batches x (old-log-prob forward + update forward); counted: once per layer and step; reported
    # once per update; the tool tail of sample 1 and the padding sample 3 pass (no false positive)
    assert out["acts"] == {"r3-route-check": 4, "r3-route-agreement": 2, "r3-route-agreement-metric": 1}
    assert out["stood_down"] == {i: [] for i in IDS}


def test_uint8_routes_of_a_256_expert_model_pass_as_verl_090_packs_them() -> None:
    """verl 0.9.0 hands the routes over as uint8; against 256 experts (GLM-5.2's) a uint8 comparison with 256 wraps
    to 0 and would call every route out of range: the check widens the ids first, on verl's real replay path."""
    out = scenario("good", (), ("--experts", "256", "--route-dtype", "uint8"))
    assert out["route_dtype"] == "torch.uint8" and "error" not in out, out.get("error")
    assert out["metrics"][METRIC] == pytest.approx(sum(out["expected"]) / len(out["expected"]), abs=1e-12)
    assert out["acts"]["r3-route-check"] == 4  # every micro-batch checked, none stood down
    assert out["stood_down"]["r3-route-check"] == []


def test_all_zero_routes_stop_naming_sample_layer_cause_and_fix() -> None:
    out = scenario("zeros")
    error = out["error"]
    assert error.startswith("RouteCheckError: verl-ascend-ext route check (r3-route-check): the R3 routes of sample 0 "
                            "of the 2 in this micro-batch (uid 'uid-a') must not be replayed: decoder layer 2: none "
                            "of its 13 tokens that feed its response has a route"), error
    assert "2 of its 2 MoE layers affected; 1 other sample(s) of this micro-batch fail too" in error
    assert "vllm#49184" in error and "verl would replay expert 0 for every token" in error
    assert "router_replay.mode=disabled" in error and error.endswith(HOW_TO_SKIP)
    assert "metrics" not in out and out["acts"]["r3-route-check"] == 0


def test_a_truncated_sample_stops_naming_where_its_routes_end() -> None:
    error = scenario("truncated")["error"]
    assert "sample 0 of the 2 in this micro-batch (uid 'uid-b')" in error, error  # the step's sample 2
    assert "decoder layer 2: its routes stop at token 8: the last 3 of its 11 tokens that feed its response have none" \
        in error
    assert "verl#6027" in error and error.endswith(HOW_TO_SKIP)


def test_an_expert_out_of_range_stops_naming_token_and_layer() -> None:
    error = scenario("range")["error"]
    assert "sample 0 of the 2 in this micro-batch (uid 'uid-a') must not be replayed: decoder layer 3: token 3 " \
           "replays experts [8, 1], outside the model's 8 experts (0-7)" in error, error


@pytest.mark.parametrize("env", [{"VERL_ASCEND_EXT_ROUTE_CHECK": "0"}, {"VERL_USE_EXTERNAL_PLUGINS": "none"}],
                         ids=["gate-off", "no-plugin"])
def test_without_the_check_verl_replays_expert_0_and_trains_on_it(env: dict[str, str]) -> None:
    out = scenario("zeros", tuple(env.items()))
    assert "error" not in out and out["metrics"] == {"actor/loss": 0.5}
    assert out["expert_0_only"] == 0.75  # every replayed token (3 of 4 in this batch) went to expert 0 alone
    assert set(out["statuses"].values()) == ({"gate-off"} if env.get(GATE.env) else {None})


def test_check_killed_the_logged_agreement_shows_the_broken_routes() -> None:
    out = scenario("zeros", (("VERL_ASCEND_EXT_DISABLE", "r3-route-check"),))
    assert out["statuses"]["r3-route-check"] == "disabled" and "error" not in out
    assert out["metrics"][METRIC] == 0.0 and out["metrics"][METRIC_MIN] == 0.0


def test_without_the_count_there_is_no_metric_to_report() -> None:
    out = scenario("good", (("VERL_ASCEND_EXT_DISABLE", "r3-route-agreement"),))
    assert out["statuses"] == {"r3-route-check": "applied", "r3-route-agreement": "disabled",
                               "r3-route-agreement-metric": "disabled"}  # it needs the count
    assert METRIC not in out["metrics"] and out["acts"]["r3-route-check"] == 4


def test_without_the_check_an_out_of_range_expert_fails_deep_in_verl() -> None:
    error = scenario("range", (("VERL_USE_EXTERNAL_PLUGINS", "none"),))["error"]
    assert error.startswith("RuntimeError: index 8 is out of bounds"), error  # no sample, no layer, no cause


def test_two_ranks_sum_the_counts_by_layer_and_report_the_same_values() -> None:
    """verl's real train_mini_batch on 2 gloo ranks holding different layers' counts (data and pipeline split)."""
    proc = run_command([sys.executable, RANKS], None, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = last_json(proc.stdout)
    assert out["exit_codes"] == [0, 0]
    for rank in out["ranks"]:  # layer 1: (3 + 1) / (4 + 4); layer 2: 2 / 2
        assert rank["metrics"] == {"loss": [0.5], "rollout_actor_route_agreement": [0.75],
                                   "rollout_actor_route_agreement_min": [0.5]}, rank
        assert rank["status"] == "applied" and rank["acts"] == 1
        assert all(left is None for left in rank["left_on_routers"])  # taken: the next step counts from zero


# ---- the checks on small tensors ---------------------------------------------------------------------------------

def jagged(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.nested_tensor(rows, layout=torch.jagged)


def batch(routes: list[torch.Tensor], responses: list[int]) -> tuple:
    """(routes, input_ids, attention_mask, response_mask) as verl's packing leaves them: left-padded prompts (a
    sample's tokens but its last ``responses[i]``), right-padded responses, every response token scored."""
    prompt = max(r.shape[0] - n for r, n in zip(routes, responses, strict=True))
    attention = torch.zeros(len(routes), prompt + max(responses), dtype=torch.long)
    response_mask = torch.zeros(len(routes), max(responses), dtype=torch.long)
    for i, (r, n) in enumerate(zip(routes, responses, strict=True)):
        attention[i, prompt - (r.shape[0] - n):prompt + n] = 1
        response_mask[i, :n] = 1
    ids = jagged([torch.zeros(int(a.sum()), dtype=torch.long) for a in attention])
    return jagged(routes), ids, attention, response_mask


def routed(tokens: int, layers: int = 2, topk: int = 2, experts: int = 8, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(tokens, layers, experts, generator=gen).topk(topk, dim=-1).indices


TOP2 = RouterShape(num_experts=8, topk=2, num_layers=2)
TOP1 = RouterShape(num_experts=8, topk=1, num_layers=2)


def test_routes_a_router_chose_pass() -> None:
    assert check_micro_batch(*batch([routed(40), routed(7, seed=1)], [30, 5]), TOP2, ["a", "b"]) is None


def test_one_expert_for_a_whole_long_sample_stops_also_with_top1() -> None:
    constant = torch.full((MIN_CONSTANT_TOKENS + 1, 2, 1), 3)
    with pytest.raises(RouteCheckError, match=r"all 32 tokens that feed its response replay the same experts \[3\] in "
                                              r"every one of its 2 MoE layer"):
        check_micro_batch(*batch([routed(10, topk=1), constant], [5, 20]), TOP1, ["a", "b"])


def test_one_expert_is_no_fault_for_a_short_sample_a_varied_one_or_a_model_using_every_expert() -> None:
    short = torch.full((MIN_CONSTANT_TOKENS, 2, 1), 3)  # 31 tokens feed its response: under the bound
    assert check_micro_batch(*batch([short], [20]), TOP1) is None
    varied = torch.full((50, 2, 1), 3)
    varied[40, 1, 0] = 4  # one token of one layer chose otherwise: a router's choice
    assert check_micro_batch(*batch([varied], [20]), TOP1) is None
    every = torch.tensor([0, 1]).expand(50, 2, 2).clone()  # 2 experts, top-2: every token uses both
    assert check_micro_batch(*batch([every], [20]), RouterShape(num_experts=2, topk=2, num_layers=2)) is None


def test_a_tool_tail_without_routes_passes_but_a_hole_before_the_last_response_token_does_not() -> None:
    routes, ids, attention, response_mask = batch([routed(20)], [12])
    response_mask[0, 9:] = 0  # the last 3 response tokens are a tool's: no route, no scored token after them
    tail = routes.values().clone()
    tail[17:] = 0
    assert check_micro_batch(jagged([tail]), ids, attention, response_mask, TOP2) is None
    hole = routes.values().clone()
    hole[4:6, 1] = 0
    with pytest.raises(RouteCheckError, match=r"decoder layer 2: 2 of its 16 tokens that feed its response have none "
                                              r"\(the first: token 4\).*lost these tokens' routes"):
        check_micro_batch(jagged([hole]), ids, attention, response_mask, TOP2, ["u"])


def test_route_rows_must_match_the_tokens_or_miss_only_the_last() -> None:
    routes, ids, attention, response_mask = batch([routed(9), routed(12)], [4, 6])
    one_short = jagged([routes.values()[:8], routes.values()[9:]])
    assert check_micro_batch(one_short, ids, attention, response_mask, TOP2) is None
    two_short = jagged([routes.values()[:7], routes.values()[9:]])
    with pytest.raises(RouteCheckError, match=r"sample 0 of the 2 in this micro-batch \(uid 'x'\) .*it has 7 route "
                                              r"rows for its 9 tokens \(verl replays 9 or 8\).*shorter than the "
                                              r"sample.*verl#6027"):
        check_micro_batch(two_short, ids, attention, response_mask, TOP2, ["x", "y"])


def test_routes_of_another_topk_are_refused_before_verl_misaligns_them() -> None:
    with pytest.raises(RouteCheckError, match=r"carry 2 experts per token; the actor's router picks moe_router_topk=1"):
        check_micro_batch(*batch([routed(9)], [4]), TOP1)


def packed(routes: list[torch.Tensor], responses: list[torch.Tensor]) -> tuple:
    """(routes, input_ids, None, response_mask) as verl's v1 trainer hands the Megatron engine a micro-batch: each
    sample ``prompts + responses`` unpadded, ``response_mask`` nested over its response (measured in the MoE job:
    no attention_mask)."""
    ids = jagged([torch.zeros(r.shape[0], dtype=torch.long) for r in routes])
    return jagged(routes), ids, None, jagged([r.long() for r in responses])


def test_packed_samples_of_the_v1_trainer_are_checked_by_their_response_rows() -> None:
    good = [routed(20), routed(9, seed=1)]
    tool = torch.tensor([1] * 9 + [0] * 3)  # 12 response tokens, the last 3 a tool's: no route, nothing scored after
    tail = good[0].clone()
    tail[17:] = 0
    assert check_micro_batch(*packed([tail, good[1]], [tool, torch.ones(4)]), TOP2, ["a", "b"]) is None
    zeros = torch.zeros_like(good[1])
    with pytest.raises(RouteCheckError, match=r"sample 1 of the 2 in this micro-batch \(uid 'b'\).*none of its 8 "
                                              r"tokens that feed its response has a route.*vllm#49184"):
        check_micro_batch(*packed([good[0], zeros], [torch.ones(12), torch.ones(4)]), TOP2, ["a", "b"])
    cut = good[0].clone()
    cut[14:] = 0  # routes stop 6 tokens before the last response token (19)
    with pytest.raises(RouteCheckError, match=r"its routes stop at token 14: the last 5 of its 19 tokens"):
        check_micro_batch(*packed([cut], [torch.ones(12)]), TOP2, ["a"])
    assert "do not end" in check_micro_batch(*packed([good[1]], [torch.ones(12)]), TOP2)


def test_without_the_masks_the_routes_are_not_checked_and_it_says_why() -> None:
    routes, ids, _, _ = batch([routed(9)], [4])
    assert "no attention_mask" in check_micro_batch(routes, ids, None, None, TOP2)


def test_layers_are_picked_as_verl_picks_them() -> None:
    shape = RouterShape(num_experts=8, topk=2, num_layers=4, moe_layer_freq=[0, 1, 0, 1])
    assert checked_layers(4, shape) == [(1, 2), (3, 4)]  # routes hold every layer: by layer, dense ones skipped
    assert checked_layers(2, shape) == [(0, 2), (1, 4)]  # routes hold MoE layers only: by ordinal
    assert checked_layers(4, RouterShape(8, 2, 4, moe_layer_freq=2)) == [(0, 1), (2, 3)]


def test_agreement_counts_sets_under_the_mask_and_reports_mean_and_min_over_layers() -> None:
    class Replay:
        pass

    first, second = Replay(), Replay()
    native = torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7]])
    target = torch.tensor([[1, 0], [2, 4], [4, 5], [0, 0]])  # same set, different set, same, different (masked out)
    mask = torch.tensor([True, True, True, False])
    assert agreement.count(first, native, target, mask) is True
    assert agreement.count(first, native, target, mask) is False  # counted again, reported once
    assert agreement.count(second, native, native, mask) is True
    table = agreement.take_counts([(2, first), (4, second), (3, Replay())], 4, "cpu")
    assert table.tolist() == [[0, 0], [4, 6], [0, 0], [3, 3]]
    assert agreement.metrics_of(table) == {agreement.METRIC: [(4 / 6 + 1.0) / 2], agreement.METRIC_MIN: [4 / 6]}
    assert getattr(first, agreement.COUNTS) is None  # taken: the next step starts from zero
    assert agreement.metrics_of(torch.zeros(4, 2, dtype=torch.long)) == {}


def test_agreement_counts_the_same_under_torch_compile_fullgraph() -> None:
    """The count runs inside the router's forward (``get_replay_topk``): traced whole by torch.compile, as a compiled
    router would trace it, it adds the same counts to the replay object as eagerly."""
    class Replay:
        pass

    def route(replay: Replay, native: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        agreement.count(replay, native, target, mask)
        agreement.count(replay, native, native, mask)
        return native * 2

    native = torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7]])
    target = torch.tensor([[1, 0], [2, 4], [4, 5], [0, 0]])
    mask = torch.tensor([True, True, True, False])
    eager, traced = Replay(), Replay()
    route(eager, native, target, mask)
    torch._dynamo.reset()
    out = torch.compile(route, fullgraph=True, backend="eager")(traced, native, target, mask)
    assert out.tolist() == (native * 2).tolist()
    assert getattr(traced, agreement.COUNTS).tolist() == getattr(eager, agreement.COUNTS).tolist() == [5, 6]


def test_doctor_shows_the_gate_and_verls_r3() -> None:
    assert gate_finding({}, GATE).status is OK and "(default)" in gate_finding({}, GATE).detail
    assert gate_finding({GATE.env: "0"}, GATE).status is INFO
    assert gate_finding({GATE.env: "maybe"}, GATE).status is ERROR
    finding = r3_finding()
    assert finding.status is OK and "router_replay_utils.py" in finding.detail
