"""Four CPU ranks in a real gloo process group run verl's real ``ActorRolloutRefWorker.update_weights`` in rounds.

Usage: python weight_sync_barrier.py OUTDIR PLAN [--world 4] [--grace 12]

``PLAN`` is a comma-separated list of rounds, ``kind:rank[:seconds]``: in that round, the named rank's offload
(the last step before the barrier preceding the KV-cache resume) is ``slow`` (sleeps the seconds, then goes on),
``stall`` (sleeps the seconds: a rank that is alive but does not arrive) or ``kill`` (the process exits before
the barrier, as a crashed rank does). Each rank appends one JSON line per round to OUTDIR/rank<N>.jsonl as it
happens: when it reached the barrier (``entered``: its offload is done), when update_weights returned or raised
(``left``), the error, and the threads found inside the barrier afterwards (none may be left there).
The barrier timeout is the environment's ``VERL_ASCEND_EXT_WEIGHT_SYNC_BARRIER_TIMEOUT``.

The parent never hangs: once every live rank reached the last round's barrier, it waits for them at most the
barrier timeout plus ``--grace`` seconds; ranks still running then are reported as ``hung``, with the stack of
each of their threads (faulthandler, on SIGUSR1), and killed. Prints one JSON line.

What is real: verl's ``update_weights`` (naive mode, read from the installed verl: the barrier it runs or
the plugin's replacement), verl's memory helpers and NPU platform, the gloo process group and its store.
Test doubles as in weight_sync.py (CPU-backed ``torch.npu``, rollout and training engine doubles; the rollout
here receives no weights: the transfer is tested there).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

KILLED = 17  # exit code of the killed rank


def parse_plan(plan: str) -> list[tuple[str, int, float]]:
    rounds = []
    for item in plan.split(","):
        kind, rank, *seconds = item.split(":")
        rounds.append((kind, int(rank), float(seconds[0]) if seconds else 0.0))
    return rounds


def barrier_threads() -> list[str]:
    """Threads whose current stack is inside a barrier (ours or torch's), other than this one."""
    import threading
    import traceback

    stuck = []
    for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident():
            continue
        names = [f.name for f in traceback.extract_stack(frame)]
        if any("barrier" in n for n in names):
            stuck.append(f"{ident}: {' > '.join(names[-4:])}")
    return stuck


def rank_main(rank: int, world: int, outdir: str, plan: str) -> None:
    import faulthandler

    stacks = open(Path(outdir, f"rank{rank}.stack"), "w")  # noqa: SIM115 (kept open for faulthandler)
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), WORLD_SIZE=str(world))
    import asyncio
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist
    import verl  # noqa: F401  (plugin discovery)
    from weight_sync import install_npu_double, rendezvous

    install_npu_double()
    from omegaconf import OmegaConf
    from verl.plugin.platform import get_platform
    from verl.plugin.platform.platform_npu import PlatformNPU

    PlatformNPU.is_ipc_supported = lambda self: False
    assert isinstance(get_platform(), PlatformNPU), type(get_platform())
    rendezvous(rank, world, outdir)
    from verl.workers.engine_workers import ActorRolloutRefWorker

    import verl_ascend_ext

    log = open(Path(outdir, f"rank{rank}.jsonl"), "a", buffering=1)  # noqa: SIM115 (one line per round, flushed)
    current: dict = {}

    class RolloutDouble:
        async def resume(self, tags: list[str]) -> None:
            current.setdefault("resumed", []).append(",".join(tags))

        async def update_weights(self, weights, **kwargs) -> None:
            for _ in weights:
                pass

    class EngineDouble:
        is_param_offload_enabled = True

        def get_per_tensor_param(self, layered_summon: bool, base_sync_done: bool):
            return ((f"layer.{i}.weight", torch.zeros(8)) for i in range(2)), None

        def to(self, device: str, **kwargs) -> None:
            kind, victim, seconds = current["plan"]
            if rank == victim:
                if kind == "kill":
                    log.write(json.dumps({"round": current["round"], "outcome": "killed", "at": time.time()}) + "\n")
                    os._exit(KILLED)
                time.sleep(seconds)  # slow or stalled
            current["entered"] = time.time()
            log.write(json.dumps({"round": current["round"], "event": "entered", "at": current["entered"]}) + "\n")

    worker = ActorRolloutRefWorker.__new__(ActorRolloutRefWorker)
    worker.__dict__.update(
        config=OmegaConf.create({"rollout": {"name": "vllm", "free_cache_engine": True,
                                             "checkpoint_engine": {"backend": "naive"}}}),
        rollout=RolloutDouble(), actor=SimpleNamespace(engine=EngineDouble()), layered_summon=False,
        peft_merge=False, base_sync_done=False,
    )
    statuses = {k: v.status.value for k, v in verl_ascend_ext.patch_statuses().items()
                if k == "weight-sync-kv-barrier"}
    dist.barrier()  # every rank imported and set up: the rounds start together
    log.write(json.dumps({"event": "ready", "at": time.time()}) + "\n")
    rounds = parse_plan(plan)
    for number, step in enumerate(rounds, start=1):
        current.clear()
        current.update(plan=step, round=number)
        try:
            asyncio.run(worker.update_weights(global_steps=number))
            outcome, error, kind = "ok", "", ""
        except Exception as err:  # what update_weights raises is the result under test
            outcome, error, kind = "error", str(err), type(err).__name__
        left = time.time()
        log.write(json.dumps({"round": number, "outcome": outcome, "error": error, "type": kind,
                              "entered": current.get("entered"), "left": left,
                              "resumed": current.get("resumed", []), "statuses": statuses,
                              "barrier_threads": barrier_threads()}) + "\n")
    # Stay until every rank that is not killed reported the last round: rank 0's process holds the store the
    # others may still read (a live trainer rank stays up after the error too). No process-group teardown.
    killed = {victim for kind, victim, _ in rounds if kind == "kill"}
    deadline = time.time() + 60
    while time.time() < deadline and not all(
            any(e.get("round") == len(rounds) and "outcome" in e for e in read_lines(Path(outdir, f"rank{r}.jsonl")))
            for r in range(world) if r not in killed):
        time.sleep(0.1)
    os._exit(0)


def read_lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]


def main() -> None:
    import multiprocessing as mp

    parser = argparse.ArgumentParser()
    parser.add_argument("outdir")
    parser.add_argument("plan")
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--grace", type=float, default=12.0)
    args = parser.parse_args()
    rounds = parse_plan(args.plan)
    timeout = float(os.environ.get("VERL_ASCEND_EXT_WEIGHT_SYNC_BARRIER_TIMEOUT") or 600)
    Path(args.outdir, "store.port").unlink(missing_ok=True)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, args.world, args.outdir, args.plan))
             for r in range(args.world)]
    started = time.time()
    for proc in procs:
        proc.start()
    last = len(rounds)
    files = [Path(args.outdir, f"rank{r}.jsonl") for r in range(args.world)]
    start_deadline = time.time() + 300  # imports and set-up
    reached = None
    while reached is None or time.time() < reached + timeout + args.grace:
        alive = [r for r, p in enumerate(procs) if p.is_alive()]
        if not alive:
            break
        if reached is None:
            kind, victim, _ = rounds[-1]
            waiting = [r for r in alive if not (r == victim and kind in ("stall", "kill"))]
            if all(any(e.get("round") == last and ("event" in e or "outcome" in e) for e in read_lines(files[r]))
                   for r in waiting):
                reached = time.time()
            elif time.time() > start_deadline:
                break
        time.sleep(0.2)
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for r in hung:
        os.kill(procs[r].pid, signal.SIGUSR1)
    time.sleep(1.0 if hung else 0)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
        proc.join()
    print(json.dumps({
        "timeout": timeout, "rounds": rounds, "hung": hung, "started": started,
        "ready": [next((e["at"] for e in read_lines(f) if e.get("event") == "ready"), None) for f in files],
        "exitcodes": [p.exitcode for p in procs],
        "ranks": [[e for e in read_lines(f) if "outcome" in e] for f in files],
        "stacks": {r: Path(args.outdir, f"rank{r}.stack").read_text() for r in hung},
    }))


if __name__ == "__main__":
    main()
