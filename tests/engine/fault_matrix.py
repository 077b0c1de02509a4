"""The fault matrix (issue 48): each role of a hybrid and of a fully-async job of verl's own trainer on the CPU,
killed (SIGKILL) or stopped (SIGSTOP) mid-job, and how the job ended.

A cell is a declaration: a job of ``grpo/jobs.py``'s machinery (``JobSpec``) with a fault (``JobSpec.kill``: the
process, found in the job's records once step 1's checkpoint is complete; ``job.RankKiller``). For each cell the
table gives the job's exit code, the seconds from the fault to the driver's end, what ``verl-ascend status`` names
first (role, how), and the last whole checkpoint (verl's tracker, with its step directory present); with
``--resume``, a job of the same declaration without the fault then starts from a copy of the cell's checkpoint
directory (verl's ``resume_mode=auto``) and the column says whether it ended well past that step. A cell whose
process was never found says so (the role does not exist in that mode). A stopped process (``stop:``) is ended by
the job watch's bound on a stopped process (``VERL_ASCEND_EXT_JOB_WATCH_STOPPED_TIMEOUT``, lowered here to
``STOPPED_TIMEOUT``); its seconds from the fault to the job's end include that bound, which the table says. A job
that nothing ends stops at the harness's timeout (``--timeout``), which the table says too. Each cell is judged
(``fault_verdict.py``: the job failed within its bound, status named the faulted process first, the checkpoint is
whole and, with ``--resume``, resumes); the script exits 1 when any cell missed, the table's last column saying why.

    ENGINE_PY=$(bash scripts/setup_vllm_engine.sh | tail -1)
    $ENGINE_PY tests/engine/fault_matrix.py [--cells NAME,NAME] [--timeout S] [--workdir DIR] [--resume]
        [--doc docs/status.md]

CI runs the cells that ride its jobs (``tests/engine``: actor rank 1 in hybrid mode, the EngineCore in fully-async
mode, a stalled rank, the route check over a whole step's corrupted routes, the EngineCore on the node the
TaskRunner is not on of a job on two nodes, ``stuck/block-rank1`` on the ``off`` job). The two-node
cells (``two-nodes/...``, ``fully-async-two-nodes/...``: the trainer's ranks on the head, the rollout replica on the
second node, as the recipe's trainer nodes and rollout nodes) fault the node that holds none of the training's
driving actors (verl's TaskRunner; fully-async: its task runner and trainer), the second node in namespaces of its
own (``tests/nsnode.py``: another machine to the plugin); their status column reads the status directory of the
node that drives the training alone (the other node's records gathered there); ``node-far`` kills that whole node
(its PID 1: every process of it) and fires only where that node is not the head (killing the head is losing the
cluster's GCS: another failure); a far cell whose placement left no such node is run again (``PLACEMENT_TRIES``).
The stuck cell (``stuck/block-rank1``, the hybrid job) holds actor rank 1 in a
native call after its step-1 weight update: nothing dies, the job watch's stuck check (floor lowered to
``STUCK_FLOOR``) must end the job and name that rank apart; its seconds run from the last completed step. The same
for ``stuck/engine-never-answers`` (a vLLM worker of the hybrid job held in native code in a wake-up: the engine
never answers, alive and not stopped) and ``stuck/fully-async-starved`` (the fully-async rollouter held in native
code: the trainer starved of samples), each naming the held process apart. The
one-rank route check (``moe/route-check-one-sample``: one sample's routes corrupted) is a cell here: its seconds run
from the check's error to the driver's end.
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

from fault_verdict import Outcome, misses  # noqa: E402
from grpo.job import TRACKER, Job, run  # noqa: E402
from grpo.jobs import JOBS, JobSpec  # noqa: E402

HYBRID = JobSpec("hybrid", verl="0.9.0", steps=2, save_every=1)
FULLY_ASYNC = JobSpec("fully-async", verl="0.9.0", mode="fully-async", actor="megatron",
                      layout={"tensor_model_parallel_size": 2}, steps=3, save_every=1,
                      recipe="glm5_2_megatron_fully_async")
# two Ray nodes (each its own status directory, the second in namespaces of its own: as two machines): the faults on
# the node that holds none of the training's driving actors (job.TRAINING: verl's TaskRunner; fully-async: its task
# runner and trainer); fully-async: the trainer's ranks on the head, the rollout replica on the second node
TWO_NODES = JobSpec("two-nodes", verl="0.9.0", nodes=2, steps=2, save_every=1)
FULLY_ASYNC_TWO_NODES = replace(FULLY_ASYNC, name="fully-async-two-nodes", nodes=2)
FAULTS = (
    (HYBRID, ("trainer-rank1", "engine-core", "stop:engine-core", "vllm-worker", "actor:AgentLoopWorkerTQ",
             "actor:vLLMHttpServer", "actor:TaskRunnerV1")),
    (TWO_NODES, ("engine-core-far", "vllm-worker-far", "stop:vllm-worker-far", "actor:vLLMHttpServer-far",
                 "node-far")),
    (FULLY_ASYNC, ("trainer-rank1", "actor:FullyAsyncRollouter", "actor:MessageQueue", "engine-core",
                  "stop:engine-core", "vllm-worker", "actor:CheckpointEngineWorker", "actor:AgentLoopWorker",
                  "actor:vLLMHttpServer")),
    (FULLY_ASYNC_TWO_NODES, ("engine-core-far", "node-far")),
)
# a stopped process is lost after VERL_ASCEND_EXT_JOB_WATCH_STOPPED_TIMEOUT seconds (default 600); the stop cells
# lower it so that the matrix measures the bound ending the job, not the default's ten minutes
STOPPED_TIMEOUT = 30
CELLS = {f"{base.name}/{fault}": replace(
    base, name=f"{base.name}-{fault.replace(':', '-')}", kill=f"{fault}@saved-1",
    faults={"VERL_ASCEND_EXT_JOB_WATCH_STOPPED_TIMEOUT": str(STOPPED_TIMEOUT)} if fault.startswith("stop:") else {})
    for base, faults in FAULTS for fault in faults}
# R3 routes of one sample corrupted (each rollout server's first of step 2): the route check fires on the actor rank
# that trains it; no process is killed, the fault is that rank's RouteCheckError
ROUTE_CELL = "moe/route-check-one-sample"
CELLS[ROUTE_CELL] = replace(JOBS["moe"], name="moe-route-check-one-sample",
                            faults={"GRPO_PROBE_CORRUPT_ROUTES": "one@1"})


# a job that stops making progress (the job watch's stuck check, floor lowered to STUCK_FLOOR s): actor rank 1 held
# in a native call that keeps the GIL right after its weight update at step 1's end (after that save), the
# weight-sync barrier's own bound raised out of the way; rank 0 waits in the barrier's gloo collective
STUCK_FLOOR = 10
PLACEMENT_TRIES = 4  # runs of a far cell until Ray places the training's driving actors on one node (node-far: the
# head), about half the time
STUCK_CELL = "stuck/block-rank1"  # the hybrid job, nothing killed
FLOOR = {"VERL_ASCEND_EXT_JOB_STUCK_TIMEOUT": str(STUCK_FLOOR)}
CELLS[STUCK_CELL] = replace(HYBRID, name="hybrid-stuck-block-rank1", faults={
    "GRPO_PROBE_FAULT": "block", "GRPO_PROBE_FAULT_RANK": "1", "GRPO_PROBE_FAULT_SYNC": "2",
    "VERL_ASCEND_EXT_WEIGHT_SYNC_BARRIER_TIMEOUT": "3600", **FLOOR})
# the rollout engine never answering (alive, not stopped): a vLLM worker held in native code at its 5th wake-up (two
# a weight sync: the trainer's first, then one after each step's save: the 5th follows step 2's), before step 3's
# generation; its EngineCore, its server and the trainer wait on it
ENGINE_CELL = "stuck/engine-never-answers"
CELLS[ENGINE_CELL] = replace(HYBRID, name="hybrid-stuck-engine-never-answers", steps=3,
                             faults={"GRPO_PROBE_BLOCK_ENGINE_WAKE": "5", **FLOOR})
# the fully-async trainer starved of samples: the rollouter held in native code as it starts its first sample once
# step 1's checkpoint is whole
STARVED_CELL = "stuck/fully-async-starved"
CELLS[STARVED_CELL] = replace(FULLY_ASYNC, name="fully-async-stuck-starved",
                              faults={"GRPO_PROBE_BLOCK_ROLLOUTER": "1", **FLOOR})
# each stuck cell: what the verdict must name apart (the process the fault held)
STUCK_CELLS = {STUCK_CELL: "WorkerDict rank 1", ENGINE_CELL: "vllm-worker", STARVED_CELL: "FullyAsyncRollouter"}


def last_whole_checkpoint(job: Job) -> str:
    tracker = job.checkpoints / TRACKER
    step = tracker.read_text().strip() if tracker.exists() else ""
    if not step:
        return "none"
    return f"step {step}" + ("" if (job.checkpoints / f"global_step_{step}" / "actor").is_dir() else " (MISSING)")


def resumed(spec: JobSpec, job: Job, workdir: Path, timeout: float) -> str:
    """Whether the cell's last whole checkpoint resumes: the same job without the fault, from a copy of the cell's
    checkpoint directory, ends well with a later step's checkpoint."""
    before = last_whole_checkpoint(job)
    if not before.startswith("step ") or before.endswith("(MISSING)"):
        return before
    again = replace(spec, name=f"{spec.name}-resumed", kill="", faults={}, resumes=spec.name, resume_step=None,
                    steps=spec.steps + 1)
    after = run(again, workdir / again.name, before=job, timeout=timeout)
    if after.returncode != 0:
        return f"{before}; its resume exit {after.returncode} (see {workdir / again.name})"
    return f"{before}; resumed to {last_whole_checkpoint(after)}"


def route_row(job: Job) -> tuple[list[str], Outcome]:
    """The one-rank route check's cell: the seconds from the check's error (its record's time) to the driver's end."""
    report = job.status_json() if job.returncode in (0, 1) else {}
    first = report.get("outcome", {}).get("first_failure") or {}
    pid = (report.get("outcome", {}).get("driver") or {}).get("pid")
    driver = next((p for p in report.get("processes", []) if p.get("role") == "driver" and p.get("pid") == pid), {})
    end = (driver.get("ended") or {}).get("at")
    seconds = None if end is None or first.get("at") is None else end - first["at"]
    named = f"{first.get('role')}: {first.get('how')}" if first else "nothing"
    checkpoint = last_whole_checkpoint(job)
    outcome = Outcome(job.returncode, True, seconds, "RouteCheckError" in str(first.get("how")), checkpoint)
    return [ROUTE_CELL, str(job.returncode), "-" if seconds is None else f"{seconds:.1f}", named, checkpoint], outcome


def stuck_row(cell: str, job: Job) -> tuple[list[str], Outcome, float | None]:
    """A stuck cell: the seconds from the job's last progress (its last completed step, as the verdict dates it) to
    the driver's end, and whether the verdict names the held process apart; the verdict's bound for the judgement."""
    report = job.status_json() if job.returncode in (0, 1) else {}
    stuck = report.get("outcome", {}).get("stuck") or {}
    pid = (report.get("outcome", {}).get("driver") or {}).get("pid")
    driver = next((p for p in report.get("processes", []) if p.get("role") == "driver" and p.get("pid") == pid), {})
    end = (driver.get("ended") or {}).get("at")
    seconds = None if end is None or not stuck else end - (stuck["at"] - stuck["idle_s"])
    apart = "; ".join(stuck.get("apart") or []) or "nobody"
    named = f"STUCK (bound {stuck['bound_s']:.0f} s); apart: {apart}" if stuck else "no stuck verdict"
    checkpoint = last_whole_checkpoint(job)
    outcome = Outcome(job.returncode, bool(stuck), seconds, STUCK_CELLS[cell] in apart, checkpoint)
    after = "-" if seconds is None else f"{seconds:.1f} (from the last step)"
    return [cell, str(job.returncode), after, named, checkpoint], outcome, stuck.get("bound_s")


def row(cell: str, job: Job, timeout: float) -> tuple[list[str], Outcome]:
    if cell == ROUTE_CELL:
        return route_row(job)
    if job.killed is None:
        return ([cell, str(job.returncode), "-", "the fault never fired: no such process in this mode", "-"],
                Outcome(job.returncode, False, None, False, "-"))
    # on two nodes: the trainer's node's directory alone, where the other node's records were gathered (the post-mortem
    # a user reads after the cluster is gone)
    status_dir = job.trainer_status_dir() if job.spec.nodes > 1 else None
    first = (job.status_json(status_dir) if job.returncode in (0, 1) else {}).get("outcome", {}).get(
        "first_failure") or {}
    node = cell.endswith("/node-far")
    faulted = str(first.get("role")).startswith("ray-node") if node else \
        (first.get("host"), first.get("pid")) == (job.killed_host, job.killed)
    which = ("the faulted node" if node else "the killed process") if faulted else "ANOTHER"
    named = f"{first.get('role')} ({which}): {first.get('how')}" if first else "nothing"
    timed_out = job.fault_to_end is None or job.fault_to_end >= timeout - 1
    after = "timeout" if timed_out else f"{job.fault_to_end:.1f}"
    if cell.split("/")[1].startswith("stop:") and after != "timeout":
        after += f" (bound {STOPPED_TIMEOUT} s)"
    checkpoint = last_whole_checkpoint(job)
    outcome = Outcome(job.returncode, True, None if timed_out else job.fault_to_end, bool(first) and faulted,
                      checkpoint)
    return [cell, str(job.returncode), after, named, checkpoint], outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default="", help=f"comma-separated cells (default: all): {', '.join(CELLS)}")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a job may run (default 900)")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the jobs here (default: a temporary dir)")
    parser.add_argument("--resume", action="store_true", help="resume each cell's last whole checkpoint (a job more)")
    parser.add_argument("--doc", type=Path, default=None,
                        help="write each mode's table into this document's <!-- fault-matrix: MODE --> block")
    args = parser.parse_args()
    chosen = [c for c in args.cells.split(",") if c] or list(CELLS)
    unknown = [c for c in chosen if c not in CELLS]
    if unknown:
        parser.error(f"unknown cell(s) {', '.join(unknown)}; known: {', '.join(CELLS)}")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fault-matrix-"))
    rows = []
    missed = 0
    started = time.monotonic()
    for cell in chosen:
        spec = CELLS[cell]
        job = run(spec, workdir / spec.name, timeout=args.timeout)
        for attempt in range(2, PLACEMENT_TRIES + 1):  # a far cell fires where Ray left a node to the rest
            if not cell.endswith("-far") or job.killed is not None:
                break
            print(f"{cell}: no node without the training's driving actors (or, node-far, only the head): attempt "
                  f"{attempt}", flush=True)
            job = run(spec, workdir / f"{spec.name}-{attempt}", timeout=args.timeout)
        bound = STOPPED_TIMEOUT if cell.split("/")[1].startswith("stop:") else None
        if cell in STUCK_CELLS:
            cells, outcome, bound = stuck_row(cell, job)
        else:
            cells, outcome = row(cell, job, args.timeout)
        if args.resume:
            cells[-1] = resumed(spec, job, workdir, args.timeout)
            outcome = replace(outcome, resumed=cells[-1])
        why = misses(outcome, bound)
        missed += bool(why)
        rows.append([*cells, "yes" if not why else "MISS: " + "; ".join(why)])
        print(" | ".join(rows[-1]), flush=True)
    table = markdown(rows)
    print("\n" + table)
    print(f"\n{len(rows)} cell(s) in {time.monotonic() - started:.0f} s, {missed} missed their expectation "
          f"(fault_verdict.py); jobs kept in {workdir}")
    if args.doc is not None:
        write_doc(args.doc, rows, f"on {time.strftime('%Y-%m-%d')} (commit {_commit()}, {_cpu()}; the run took "
                                  f"{time.monotonic() - started:.0f} s)")
    return 1 if missed else 0


def write_doc(doc: Path, rows: list[list[str]], run: str) -> None:
    """Each mode's rows into its block of ``doc`` (``write_block``), with how many of its cells met expectation."""
    for mode in sorted({r[0].split("/")[0] for r in rows}):
        mine = [r for r in rows if r[0].startswith(mode + "/")]
        met = sum(1 for r in mine if r[-1] == "yes")
        write_block(doc, mode, f"Run by `tests/engine/fault_matrix.py --doc` {run}: {met} of {len(mine)} cell(s) met "
                               f"their expectation.\n\n{markdown(mine)}")


HEADER = ["cell (mode/fault)", "exit", "s fault->end", "status names first", "last whole checkpoint", "met"]


def markdown(rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER),
                      *("| " + " | ".join(r) + " |" for r in rows)])


def write_block(doc: Path, mode: str, text: str) -> None:
    """Replace the block between ``<!-- fault-matrix: MODE -->`` and ``<!-- /fault-matrix: MODE -->`` in ``doc``
    (the table the document shows is the one a run wrote, never copied by hand); a document without the markers is
    an error naming them."""
    begin, end = f"<!-- fault-matrix: {mode} -->", f"<!-- /fault-matrix: {mode} -->"
    body = doc.read_text()
    if begin not in body or end not in body:
        raise SystemExit(f"fault_matrix.py: {doc} has no block {begin} ... {end} for the {mode} cells: add the two "
                         "lines where the table goes")
    head, rest = body.split(begin, 1)
    doc.write_text(f"{head}{begin}\n{text}\n{end}{rest.split(end, 1)[1]}")


def _commit() -> str:
    import subprocess

    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True)
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=HERE, capture_output=True).returncode != 0
    return (proc.stdout.strip() or "?") + (" with uncommitted changes" if dirty else "")


def _cpu() -> str:
    import os

    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "?")
    return f"{model}, {os.cpu_count()} cores"


if __name__ == "__main__":
    sys.exit(main())
