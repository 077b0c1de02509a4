"""The fault matrix (issue 48): each role of a hybrid and of a fully-async job of verl's own trainer on the CPU,
killed (SIGKILL) or stopped (SIGSTOP) mid-job, and how the job ended.

A cell is a declaration: a job of ``grpo/jobs.py``'s machinery (``JobSpec``) with a fault (``JobSpec.kill``: the
process, found in the job's records once step 1's checkpoint is complete; ``job.RankKiller``). For each cell the
table gives the job's exit code, the seconds from the fault to the driver's end, what ``verl-ascend status`` names
first (role, how), and the last whole checkpoint (verl's tracker, with its step directory present). A cell whose
process was never found says so (the role does not exist in that mode). A stopped process (``stop:``) is ended by
the job watch's bound on a stopped process (``VERL_ASCEND_EXT_JOB_WATCH_STOPPED_TIMEOUT``, lowered here to
``STOPPED_TIMEOUT``); its seconds from the fault to the job's end include that bound, which the table says. A job
that nothing ends stops at the harness's timeout (``--timeout``), which the table says too.

    ENGINE_PY=$(bash scripts/setup_vllm_engine.sh | tail -1)
    $ENGINE_PY tests/engine/fault_matrix.py [--cells NAME,NAME] [--timeout S] [--workdir DIR]

CI runs the cells that ride its jobs (``tests/engine``: actor rank 1 in hybrid mode, trainer rank 1 and the
EngineCore in fully-async mode, the EngineCore in hybrid mode, a stalled rank, the route check on one rank).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from grpo.job import TRACKER, Job, run  # noqa: E402
from grpo.jobs import JobSpec  # noqa: E402

HYBRID = JobSpec("hybrid", verl="0.9.0", steps=2, save_every=1)
FULLY_ASYNC = JobSpec("fully-async", verl="0.9.0", mode="fully-async", actor="megatron",
                      layout={"tensor_model_parallel_size": 2}, steps=3, save_every=1,
                      recipe="glm5_2_megatron_fully_async")
FAULTS = (
    (HYBRID, ("trainer-rank1", "engine-core", "stop:engine-core", "vllm-worker", "actor:AgentLoopWorker",
             "actor:vLLMHttpServer", "actor:TaskRunner")),
    (FULLY_ASYNC, ("trainer-rank1", "actor:FullyAsyncRollouter", "actor:MessageQueue", "engine-core",
                  "stop:engine-core", "vllm-worker", "actor:CheckpointEngineWorker", "actor:FullyAsyncAgentLoopWorker",
                  "actor:vLLMHttpServer")),
)
# a stopped process is lost after VERL_ASCEND_EXT_JOB_WATCH_STOPPED_TIMEOUT seconds (default 600); the stop cells
# lower it so that the matrix measures the bound ending the job, not the default's ten minutes
STOPPED_TIMEOUT = 30
CELLS = {f"{base.name}/{fault}": replace(
    base, name=f"{base.name}-{fault.replace(':', '-')}", kill=f"{fault}@saved-1",
    faults={"VERL_ASCEND_EXT_JOB_WATCH_STOPPED_TIMEOUT": str(STOPPED_TIMEOUT)} if fault.startswith("stop:") else {})
    for base, faults in FAULTS for fault in faults}


def last_whole_checkpoint(job: Job) -> str:
    tracker = job.checkpoints / TRACKER
    step = tracker.read_text().strip() if tracker.exists() else ""
    if not step:
        return "none"
    return f"step {step}" + ("" if (job.checkpoints / f"global_step_{step}" / "actor").is_dir() else " (MISSING)")


def row(cell: str, job: Job, timeout: float) -> list[str]:
    if job.killed is None:
        return [cell, str(job.returncode), "-", "the fault never fired: no such process in this mode", "-"]
    first = (job.status_json() if job.returncode in (0, 1) else {}).get("outcome", {}).get("first_failure") or {}
    named = f"{first.get('role')} ({'the killed process' if first.get('pid') == job.killed else 'ANOTHER'}): " \
            f"{first.get('how')}" if first else "nothing"
    after = "timeout" if job.fault_to_end is None or job.fault_to_end >= timeout - 1 else f"{job.fault_to_end:.1f}"
    if cell.split("/")[1].startswith("stop:") and after != "timeout":
        after += f" (bound {STOPPED_TIMEOUT} s)"
    return [cell, str(job.returncode), after, named, last_whole_checkpoint(job)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default="", help=f"comma-separated cells (default: all): {', '.join(CELLS)}")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a job may run (default 900)")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the jobs here (default: a temporary dir)")
    args = parser.parse_args()
    chosen = [c for c in args.cells.split(",") if c] or list(CELLS)
    unknown = [c for c in chosen if c not in CELLS]
    if unknown:
        parser.error(f"unknown cell(s) {', '.join(unknown)}; known: {', '.join(CELLS)}")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fault-matrix-"))
    rows = []
    started = time.monotonic()
    for cell in chosen:
        spec = CELLS[cell]
        job = run(spec, workdir / spec.name, timeout=args.timeout)
        rows.append(row(cell, job, args.timeout))
        print(" | ".join(rows[-1]), flush=True)
    header = ["cell (mode/fault)", "exit", "s fault->end", "status names first", "last whole checkpoint"]
    print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print(f"\n{len(rows)} cell(s) in {time.monotonic() - started:.0f} s; jobs kept in {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
