"""Where a training job's wall time goes: Ray up, driver start-up, the cluster check, the task runner, the worker
group, the model load, the vLLM servers up to ready, each step (and its save), the end of training, the teardown.

Reads what a job of ``tests/engine`` (``tests/engine/grpo/job.py``: the ``on``, ``moe``, ``fully-async``, ... jobs)
already leaves in its directory, and runs nothing:

- ``job.log``: the Ray head's stderr and the driver's output, every Ray worker's lines under its ``(Actor pid=N)``
  prefix. The lines of Python's logging, Hydra's, Ray's (ms), vLLM's ``WARNING MM-DD HH:MM:SS`` (whole seconds) and
  torch's ``W1206 HH:MM:SS.us`` carry a time; an untimed line (verl's ``print``s, the step lines) is placed after the
  timed line above it (the driver prints its workers' lines in the order Ray streams them);
- the plugin's process records under ``status/``: ``started`` (the plugin's boot in the process), ``ended.at`` (the
  driver's: its exit call or uncaught error, before its interpreter's shutdown), ``ppid`` (a vLLM server's
  EngineCore and worker), ``sleeps`` (a vLLM worker's first sleep);
- the Ray session's name (``status/session_<date>_<time>_<us>_<pid>``: when the Ray head began);
- the files' own times: ``job.log``'s birth time (``statx``: job.py opens it as its clock starts; else the empty
  ``transfers/``'s mtime, made just before; else the Ray session's start), ``argv.json`` (written once the Ray head
  printed its address), ``rollouts/N.jsonl`` (dumped at the end of step N), ``ckpt/latest_checkpointed_iteration.txt``;
- verl's step metrics: ``timing_s/step``, ``timing_s/gen``, ``timing_s/save_checkpoint``, the weight sync's.

Steps: verl's ``main_ppo`` (hybrid) times a step with its save inside; its end is anchored on ``rollouts/N.jsonl``
(else on its step line's place), its start ``timing_s/step`` before. The fully-async trainer's step N runs from its
first ``Requesting N samples`` line to step N+1's (its save, outside the step's timer, included), its metrics
printed with the next step's line under ``training/global_step``.

The phases partition the wall time: each runs from the end of the one above it to the event that ends it, named in
its ``how``; an indented row is a part of the phase above it (not counted twice). A phase whose end event is missing
from the job's traces while a later one is there is "not observable" (its time goes to the next phase); after a job
failed, the phases it never got to are "not reached". The wall time: the job's row of the CI phase table
(``--phase-log``, the file ``CI_PHASE_LOG`` names while scripts/test.sh runs; whole seconds), else from the job's start
to its last trace (the last record's end or update, the last write to job.log: job.py's kill of what is left after
that is not seen).

    python benchmarks/job_time_breakdown.py --jobs /tmp/pytest-of-root/pytest-current/jobs0
    python benchmarks/job_time_breakdown.py JOB_DIR [JOB_DIR ...] [--phase-log FILE] [--json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import statistics
import struct
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from verl_ascend_ext.runtime.records.reader import read_records  # noqa: E402  (the repository's own package)
from verl_ascend_ext.tooling.compare.runs import number, parse_step_line  # noqa: E402

ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Ray's prefix of a worker's line: "(WorkerDict pid=123) ", "(pid=123) " (before the actor is named), a vLLM
# child's inside its server's: "(vLLMHttpServer pid=5) (EngineCore pid=7) "; "(raylet) " and the like
PREFIX = re.compile(r"\((?:(?P<name>[A-Za-z_][\w.<>-]*) )?pid=(?P<pid>\d+)(?:, ip=[^)]*)?\) |\((?P<ray>[a-z_]+)\) ")
FULL = r"(?P<date>\d{4}-\d\d-\d\d) (?P<time>\d\d:\d\d:\d\d)[,.](?P<frac>\d{3})"
STAMPS = (  # (pattern, has the year)
    (re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):" + FULL + r":"), True),  # logging's basic format
    (re.compile(r"^\[" + FULL + r"\]\["), True),  # Hydra's
    (re.compile(r"^" + FULL + r"\b"), True),  # Ray's, transfer_queue's
    (re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<md>\d\d-\d\d) (?P<time>\d\d:\d\d:\d\d) \["),
     False),  # vLLM's (whole seconds)
    (re.compile(r"^(?:\[rank\d+\]:)?\[?[DIWEF](?P<mmdd>\d{4}) (?P<time>\d\d:\d\d:\d\d)\.(?P<frac>\d{3})"),
     False),  # torch's / glog's
)
STEP_LINE = re.compile(r"step:(\d+) - (.*)")
SESSION = re.compile(r"^session_(\d{4}-\d\d-\d\d)_(\d\d-\d\d-\d\d)_(\d{6})_\d+$")
CONNECTED = re.compile(r"INFO worker\.py:\d+ -- Connected to Ray cluster")
CLUSTER_CHECK = re.compile(r"verl-ascend-ext: cluster check\b.*?(?:agree \(|in )(?P<s>\d+(?:\.\d+)?) s\b")
CREATE_WG = re.compile(r"colocated worker base class|create worker group")  # verl's, right before it
MODEL_READY = re.compile(r"actor and ref model engine initialized|FullyAsyncTrainer created and initialized")
TRAINER_READY = re.compile(r"all initialize finished, ready to fit|\[ASYNC MAIN\] All components initialized")
SERVER_READY = re.compile(r"Application startup complete|Starting vLLM API server|\[api_router\.py:|"
                          r"Default vLLM sampling parameters")
SAVING = re.compile(r"Saving checkpoint to (?P<path>\S*global_step_(?P<step>\d+))")
TOTAL_STEPS = re.compile(r"^trainer\.total_training_steps=(\d+)$")
AT_FDCWD, STATX_BTIME = -100, 0x800
REQUESTING = re.compile(r"\[FullyAsyncTrainer\] Requesting \d+ samples from queue")  # a fully-async step's start
GLOBAL_STEPS = re.compile(r"\[FullyAsyncTrainer\] global_steps: (\d+) local_trigger_step")  # its compute is done
TRAINERS = ("TaskRunnerV1", "TaskRunner", "FullyAsyncTaskRunner", "FullyAsyncTrainer")  # where step lines come from


@dataclass
class Line:
    """One line of job.log: its process (Ray's prefix: the outermost actor's name and pid, the innermost pid; None:
    the driver or the Ray head), its text without the prefix, and its time when it carries one."""

    index: int
    outer: str | None
    outer_pid: int | None
    pid: int | None
    text: str
    t: float | None = None


@dataclass
class Row:
    name: str
    start: float | None  # epoch seconds
    end: float | None
    how: str
    level: int = 0  # 0: a phase of the partition; 1: a part of the phase above it
    status: str = "ok"  # ok | not observable | not reached | not finished
    seconds: float | None = None  # a part's own duration when its start is not known (a timing_s/ metric)


@dataclass
class Breakdown:
    job: str
    directory: str
    start: float | None
    start_how: str
    wall: float | None
    wall_how: str
    outcome: str
    rows: list[Row] = field(default_factory=list)
    start_up: float | None = None  # seconds before the first step's generation
    first_step: int = 1  # the first step the job ran (a resumed job's is the one after its checkpoint's)
    notes: list[str] = field(default_factory=list)


# --- job.log ------------------------------------------------------------------------------------------------------


def parse_log(text: str, year: int) -> list[Line]:
    """Every line of ``text`` with its process and its time (``year`` for the stamps that have none)."""
    lines = []
    for index, raw in enumerate(ANSI.sub("", text).splitlines()):
        outer = outer_pid = pid = None
        rest = raw
        while True:
            found = PREFIX.match(rest)
            if not found:
                break
            if found["pid"]:
                if outer_pid is None:
                    outer, outer_pid = found["name"], int(found["pid"])
                pid = int(found["pid"])
            else:
                outer = outer or found["ray"]
            rest = rest[found.end():]
        lines.append(Line(index, outer, outer_pid, pid, rest, stamp(rest, year)))
    return lines


def stamp(text: str, year: int) -> float | None:
    """The epoch time a line's leading stamp says (local time, as the job's processes wrote it), or None."""
    for pattern, full in STAMPS:
        found = pattern.match(text)
        if not found:
            continue
        groups = found.groupdict()
        if full:
            when, frac = f"{groups['date']} {groups['time']}", groups["frac"]
        elif "md" in groups:
            when, frac = f"{year}-{groups['md']} {groups['time']}", None
        else:
            when, frac = f"{year}-{groups['mmdd'][:2]}-{groups['mmdd'][2:]} {groups['time']}", groups["frac"]
        try:
            seconds = time.mktime(time.strptime(when, "%Y-%m-%d %H:%M:%S"))
        except ValueError:
            return None
        return seconds + (int(frac) / 1000 if frac else 0.0)
    return None


def first(lines: list[Line], pattern: re.Pattern[str], driver: bool | None = None) -> Line | None:
    """The first line matching ``pattern`` (``driver``: only the driver's own lines / only Ray workers' lines)."""
    for line in lines:
        if driver is not None and (line.outer_pid is None) != driver:
            continue
        if pattern.search(line.text):
            return line
    return None


def placed(lines: list[Line], line: Line) -> tuple[float | None, float | None]:
    """When an untimed line was written: after the last timed line above it, before the first timed line below it
    (the driver prints its workers' lines as Ray streams them, in the order they came: a lag of a second at most)."""
    if line.t is not None:
        return line.t, line.t
    before = next((x.t for x in reversed(lines[:line.index]) if x.t is not None), None)
    after = next((x.t for x in lines[line.index + 1:] if x.t is not None), None)
    return before, after


def step_metrics(lines: list[Line]) -> dict[int, dict[str, float]]:
    """step -> {metric: value} of verl's console logger (the fully-async trainer's two lines a step merged)."""
    out: dict[int, dict[str, float]] = {}
    for line in lines:
        found = STEP_LINE.search(line.text)
        if not found:
            continue
        parsed = {key: number(text) for key, text in parse_step_line(found.group(2)).items()}  # compare's reader
        values = {key: value for key, value in parsed.items() if value is not None}
        step = int(values.get("training/global_step", found.group(1)))  # fully-async: the step the metrics are of
        out.setdefault(step, {}).update(values)
    return out


def step_line(lines: list[Line], step: int) -> Line | None:
    pattern = re.compile(rf"(?:^|\s)step:{step} - .*timing_s/step:")
    return first(lines, pattern)


# --- the job's directory ------------------------------------------------------------------------------------------


def records_of(directory: Path) -> list[dict[str, Any]]:
    """Every process record of the job (each node's status directory: ``status``, ``status-node<i>``)."""
    out: list[dict[str, Any]] = []
    for status in sorted(directory.glob("status*")):
        if status.is_dir():
            out += read_records(str(status))[0]
    return out


def birth_time(path: Path) -> float | None:
    """When ``path`` was made (Linux ``statx``'s ``stx_btime``, through libc), or None where that is not known (no
    statx, a file system without it). A copy's is the copy's: the caller checks it against the other times."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        statx = libc.statx
    except (OSError, AttributeError):
        return None
    buf = ctypes.create_string_buffer(256)  # struct statx: 256 bytes
    if statx(AT_FDCWD, os.fsencode(path), 0, STATX_BTIME, buf) != 0:
        return None
    mask = struct.unpack_from("=I", buf, 0)[0]
    if not mask & STATX_BTIME:
        return None
    seconds, nanoseconds = struct.unpack_from("=qI", buf, 80)  # stx_btime: after stx_atime, at byte 80
    return seconds + nanoseconds / 1e9


def mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def ray_session_start(directory: Path) -> float | None:
    """When the Ray head began: its session's name (``session_2026-12-06_11-54-11_394893_31856``, local time)."""
    for status in sorted(directory.glob("status*")):
        for entry in sorted(status.glob("session_*")):
            found = SESSION.match(entry.name)
            if found:
                when = time.strptime(f"{found[1]} {found[2]}", "%Y-%m-%d %H-%M-%S")
                return time.mktime(when) + int(found[3]) / 1e6
    return None


def planned_steps(directory: Path) -> int | None:
    try:
        argv = json.loads((directory / "argv.json").read_text())
    except (OSError, ValueError):
        return None
    for arg in argv if isinstance(argv, list) else []:
        found = TOTAL_STEPS.match(str(arg))
        if found:
            return int(found[1])
    return None


def phase_log_walls(path: Path | None) -> dict[str, float]:
    """job name -> wall seconds, from the CI phase table's file (rows ``  training job NAME (verl X)``, tab, seconds,
    tab, outcome)."""
    if path is None:
        return {}
    walls = {}
    for line in path.read_text(errors="replace").splitlines():
        name, _, rest = line.partition("\t")
        found = re.match(r"^\s*training job (\S+) \(", name)
        seconds = rest.partition("\t")[0]
        if found and re.fullmatch(r"\d+(?:\.\d+)?", seconds):
            walls[found[1]] = float(seconds)
    return walls


def end_of(record: dict[str, Any]) -> float | None:
    ended = record.get("ended")
    return ended.get("at") if isinstance(ended, dict) else None


def outcome(driver: dict[str, Any] | None) -> str:
    if driver is None:
        return "unknown (no driver record)"
    ended = driver.get("ended")
    if not isinstance(ended, dict):
        return "unknown (the driver's record has no end)"
    errors = ended.get("error") or []
    what = f": {errors[0].get('type')}" if errors and isinstance(errors[0], dict) else ""
    return f"{ended.get('how')} (exit {ended.get('code')}){what}"


# --- the breakdown ------------------------------------------------------------------------------------------------


class Partition:
    """Phases end to end: each from the end of the one above to its own end event."""

    def __init__(self, start: float | None) -> None:
        self.rows: list[Row] = []
        self.cursor = start
        self.pending: list[Row] = []  # phases whose end was not seen (their time goes to the next phase seen)

    def phase(self, name: str, end: float | None, how: str, absorbs: bool = True) -> Row:
        """The next phase, to ``end`` (None: not seen); ``absorbs``: it takes the time of the phases above it whose
        end was not seen (False: they stay pending, "not reached" after a failure)."""
        row = Row(name, self.cursor, end, how)
        if end is None:
            row.status, row.end, row.start = "not observable", None, None
            self.pending.append(row)
        else:
            if self.pending and absorbs:
                row.how += f" (includes: {'; '.join(p.name for p in self.pending)})"
                self.pending = []
            if self.cursor is None:
                row.status = "not observable"
                row.start = None
            self.cursor = end
        self.rows.append(row)
        return row

    def part(self, name: str, start: float | None, end: float | None, how: str, seconds: float | None = None,
             status: str = "ok") -> Row:
        row = Row(name, start, end, how, level=1, status=status, seconds=seconds)
        self.rows.append(row)
        return row

    def close(self, failed: bool) -> None:
        """The phases whose end never came: "not reached" after a failure (else "not observable")."""
        for row in self.pending:
            if failed:
                row.status = "not reached"
        self.pending = []


def breakdown(directory: Path, wall_s: float | None = None, boot_year: int | None = None) -> Breakdown:
    """The phases of the job in ``directory`` (``wall_s``: its wall time from the CI phase table)."""
    records = records_of(directory)
    driver = next((r for r in records if r.get("role") == "driver"), None)
    by_class: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        by_class.setdefault(rec.get("actor_class") or rec.get("role") or "?", []).append(rec)

    transfers = directory / "transfers"
    session = ray_session_start(directory)
    made = birth_time(directory / "job.log")
    if made is not None and made <= min(t for t in (mtime(directory / "job.log"), mtime(directory / "argv.json"),
                                                     session, made) if t is not None):
        start, start_how = made, "job.log made (its birth time), as job.py's clock starts"
    elif transfers.is_dir() and not any(transfers.iterdir()):
        start, start_how = mtime(transfers), "transfers/ made (its mtime: empty), right before job.py's clock starts"
    elif session is not None:
        start, start_how = session, ("the Ray session's name (transfers/ has files: job.py's start and ray_head.py's "
                                     "import of Ray before it are not observable)")
    else:
        start, start_how = None, "not observable"
    year = boot_year or time.localtime(start if start is not None else time.time()).tm_year
    log_path = directory / "job.log"
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    lines = parse_log(text, year)
    metrics = step_metrics(lines)

    last_trace = max([t for t in [mtime(log_path), *(end_of(r) for r in records),
                                  *(r.get("updated") for r in records)] if t is not None], default=None)
    exact = start_how.startswith(("job.log", "transfers"))
    if wall_s is not None and start is not None and exact:
        end, wall, wall_how = start + wall_s, wall_s, "the CI phase table's row for the job (whole seconds)"
    elif start is not None and last_trace is not None:
        end, wall, wall_how = last_trace, last_trace - start, ("from the job's start to its last trace (job.py's kill "
                                                                "of what is left after it is not seen)")
    else:
        end, wall, wall_how = None, wall_s, "not observable"
    result = Breakdown(directory.name, str(directory), start, start_how, wall, wall_how, outcome(driver))
    driver_end = end_of(driver) if driver else None
    failed = driver is None or not isinstance(driver.get("ended"), dict) or driver["ended"].get("code") not in (0, None)
    part = Partition(start)

    # Ray, the driver, the cluster check
    part.phase("Ray up: ray_head.py starts, imports Ray", session if exact else None,
               "to the Ray session's name (status/session_...)")
    part.phase("Ray up: head node and raylet start, address printed", mtime(directory / "argv.json"),
               "to argv.json (written once ray_head.py printed the address)")
    connected = first(lines, CONNECTED, driver=True)
    part.phase("driver start-up: python, imports, Hydra config, ray.init", connected.t if connected else None,
               "to the driver's 'Connected to Ray cluster' (Ray's line)")
    check = first(lines, CLUSTER_CHECK, driver=True)
    checked = None
    if check is not None:  # its WARNING line; a ClusterCheckError's line in the driver's traceback has no time
        checked = check.t if check.t is not None else placed(lines, check)[1] or driver_end
    part.phase("cluster check (the plugin's, after ray.init)", checked, "to the plugin's cluster-check line" + (
        "" if check is None or check.t is not None else " (its error, untimed: the driver's next timed line or end)"))
    if check is not None and checked is not None:
        own = float(CLUSTER_CHECK.search(check.text)["s"])  # type: ignore[index]
        part.part("the check itself (the seconds its line says)", checked - own, checked, "its line", own)

    # the task runner, the worker group, the model
    created = first(lines, CREATE_WG, driver=False)
    ranks = sorted(by_class.get("WorkerDict", []), key=lambda r: r.get("started") or 0)
    created_t = placed(lines, created)[0] if created else None
    if created_t is None and ranks:
        created_t = ranks[0].get("started")
    runner = next((r for cls in TRAINERS for r in by_class.get(cls, [])), None)
    row = part.phase("task runner: actor up, verl imports, config, data set", created_t,
                     "to verl's 'colocated worker base class' line, as it creates the worker group (else the first "
                     "WorkerDict record's start)")
    if runner is not None and runner.get("started") and row.start is not None:
        part.part(f"Ray starts the {runner.get('actor_class')} process", row.start, runner["started"],
                  "to its record's start (the plugin's boot in it)")
    named = [next((x.t for x in lines if x.outer == "WorkerDict" and x.outer_pid == r["pid"] and x.t is not None),
                  None) for r in ranks]
    constructed = max(named) if ranks and all(t is not None for t in named) else None
    row = part.phase(f"worker group init: {len(ranks)} WorkerDict processes up, imports", constructed,
                     "to the last rank's first line as Ray's 'WorkerDict' (the actor's __init__ began)")
    if ranks and ranks[-1].get("started") and row.start is not None:
        part.part("Ray starts the WorkerDict processes", row.start, ranks[-1]["started"],
                  "to the last rank's record start (the plugin's boot in it)")
    model = first(lines, MODEL_READY, driver=False)
    part.phase("model load: the ranks' init_model", placed(lines, model)[0] if model else None,
               "to verl's 'actor and ref model engine initialized' (fully-async: the trainer's 'created and "
               "initialized', placed after the timed line above it)")

    # the vLLM servers
    servers = sorted((r for r in records if r.get("role") == "vllm-frontend"
                      or r.get("actor_class") == "vLLMHttpServer"), key=lambda r: r.get("started") or 0)
    teachers = teacher_servers(directory)
    ready: dict[int, tuple[float | None, str]] = {}
    for server in servers:
        line = next((x for x in lines if x.outer_pid == server["pid"] and x.t is not None
                     and SERVER_READY.search(x.text)), None)
        if line is not None:
            ready[server["pid"]] = (line.t, "its vLLM 'API server' line (whole seconds)")
            continue
        sleeps = [s.get("at") for r in children(records, server["pid"], "vllm-worker") for s in r.get("sleeps") or []
                  if s.get("n") == 1]
        ready[server["pid"]] = ((max(sleeps), "its worker's first sleep (after the first weight sync)") if sleeps
                                else (None, "no ready line, no sleep"))
    if servers:
        since = part.cursor
        others = sorted((r["started"], r.get("actor_class") or r.get("role")) for r in records
                        if since is not None and r.get("actor_class") not in (None, "WorkerDict", "vLLMHttpServer")
                        and since <= (r.get("started") or 0) < (servers[0].get("started") or 0))
        part.phase("other actors until the first vLLM server starts", servers[0].get("started"),
                   "to the first vLLMHttpServer record's start" + (": " if others else "") +
                   ", ".join(f"{cls} up +{t - since:.0f} s" for t, cls in others if since is not None))
    ready_times = [t for t, _ in ready.values() if t is not None]
    part.phase(f"vLLM servers up to ready ({len(servers)})",
               max(ready_times) if servers and len(ready_times) == len(servers) else None,
               "to the last server's ready line")
    for server in servers:
        cores = children(records, server["pid"], "engine-core")
        workers = [w for c in cores for w in children(records, c["pid"], "vllm-worker")]
        t0 = server.get("started")
        inner = []
        for what, recs in (("EngineCore", cores), ("worker", workers)):
            began = [r["started"] for r in recs if r.get("started")]
            if began and t0 is not None:
                inner.append(f"{what} +{min(began) - t0:.0f} s")
        label = "teacher" if server["pid"] in teachers else "rollout" if teachers else "server"
        t1, how = ready[server["pid"]]
        part.part(f"vLLM {label} pid {server['pid']}: up to ready", t0, t1,
                  ", ".join([*inner, f"ready: {how}"]), status="ok" if t1 is not None else "not reached")
    fit = first(lines, TRAINER_READY)
    part.phase("trainer ready: first weight sync, managers", placed(lines, fit)[0] if fit else None,
               "to verl's 'all initialize finished, ready to fit' (fully-async: '[ASYNC MAIN] All components "
               "initialized', placed after the timed line above it)")

    # the steps
    steps(part, directory, lines, metrics, driver_end, failed and (fit is not None or bool(metrics)), result)

    # the end
    if driver_end is not None and part.cursor is not None and driver_end > part.cursor:
        part.phase("end of training to the driver's end" if not failed else "the failure to the driver's end",
                   driver_end, "to the driver record's end (its exit call or uncaught error)", absorbs=False)
    elif driver_end is None:
        part.phase("to the driver's end", None, "the driver's record has no end", absorbs=False)
    last_end = max([t for t in (end_of(r) for r in records) if t is not None], default=None)
    part.phase("teardown: the driver's shutdown, Ray ends the job's processes, job.py kills the rest", end,
               "to the job's end (" + wall_how + ")", absorbs=False)
    if last_end is not None and driver_end is not None:
        part.part("to the last record's end (Ray's SIGTERM to the job's workers)", driver_end, last_end,
                  "the records' ends")
    part.close(failed)
    result.rows = part.rows
    first_step = next((r for r in part.rows if r.name.startswith(f"step {result.first_step}") and r.level == 0),
                      None)
    if first_step is not None and first_step.start is not None and start is not None:
        result.start_up = first_step.start - start
    return result


def children(records: list[dict[str, Any]], ppid: int, role: str) -> list[dict[str, Any]]:
    return sorted((r for r in records if r.get("ppid") == ppid and r.get("role") == role),
                  key=lambda r: r.get("started") or 0)


def teacher_servers(directory: Path) -> set[int]:
    """Pids of the vLLM servers that answered only unseeded requests (the teacher's scoring: ``tokens/``, the test
    probe's), empty when the job has no such directory."""
    seeded: dict[int, set[bool]] = {}
    for path in (directory / "tokens").glob("*.jsonl"):
        if not path.stem.isdigit():
            continue
        for line in path.read_text(errors="replace").splitlines():
            try:
                seeded.setdefault(int(path.stem), set()).add(json.loads(line).get("seed") is None)
            except ValueError:
                continue
    if not any(False in unseeded for unseeded in seeded.values()):
        return set()  # no request carried a seed (a fully-async job's): nothing tells a teacher from the rollout
    return {pid for pid, unseeded in seeded.items() if unseeded == {True}}


def steps(part: Partition, directory: Path, lines: list[Line], metrics: dict[int, dict[str, float]],
          driver_end: float | None, failed_in_fit: bool, result: Breakdown) -> None:
    """Each step's row, from its start to the next one's (its save included), then the step the job failed in and
    those it never reached. ``failed_in_fit``: the job failed after its trainer was ready."""
    fully_async = any(REQUESTING.search(x.text) for x in lines)
    spans, unfinished = (fully_async_spans if fully_async else sync_spans)(directory, lines, metrics)
    planned = planned_steps(directory)
    if unfinished is not None and (not failed_in_fit or (planned is not None and unfinished[0] > planned)):
        unfinished = None  # the fully-async trainer's last request, answered by the end of training
    done = sorted(spans)
    first_step = result.first_step = done[0] if done else unfinished[0] if unfinished else 1
    first_start = spans[done[0]][0] if done else unfinished[1] if unfinished else None
    if done or unfinished:
        part.phase(f"fit set-up before step {first_step}'s generation" + ("" if first_step == 1 else " (resumed)"),
                   first_start, "to the first step's start: " + (
                       "the trainer's first 'Requesting N samples' line (placed after the timed line above it)"
                       if fully_async else "its end less timing_s/step"))
    later = [metrics[k]["timing_s/step"] for k in done[1:] if "timing_s/step" in metrics.get(k, {})]
    for k in done:
        _, end, how = spans[k]
        part.phase(f"step {k}", end, how)
        m = metrics.get(k, {})
        for key, label in (("timing_s/step", "the step timer"), ("timing_s/gen", "generation"),
                           ("timing_s/save_checkpoint", "checkpoint save"), ("timing_s/update_weights", "weight sync"),
                           ("timing_s/timing_s/param_sync", "weight sync"), ("timing_s/param_sync", "weight sync")):
            if key in m and (key != "timing_s/step" or fully_async):
                part.part(f"{label} of step {k} ({key})", None, None, "verl's step metric", seconds=m[key])
        if k == first_step and later and "timing_s/step" in m:
            part.part(f"of which step {k}'s start-up (its time over the later steps' median)", None, None,
                      "agent-loop workers, first requests: an estimate",
                      seconds=m["timing_s/step"] - statistics.median(later))
    last = done[-1] if done else first_step - 1
    if unfinished is None and failed_in_fit and (planned is None or last < planned):
        unfinished = (last + 1, part.cursor)
    if unfinished is not None and driver_end is not None and part.cursor is not None:
        nxt = unfinished[0]
        row = part.phase(f"step {nxt} (not finished: the job failed in it)", driver_end,
                         "from the last step's end to the driver's end")
        row.status = "not finished"
        saving = next((x for x in lines if (f := SAVING.search(x.text)) and int(f["step"]) == nxt), None)
        if saving is not None:
            tracker = directory / "ckpt" / "latest_checkpointed_iteration.txt"
            saved = tracker.read_text().strip() == str(nxt) if tracker.exists() else False
            part.part(f"checkpoint save of step {nxt}" + ("" if saved else " (not finished)"),
                      placed(lines, saving)[0], mtime(tracker) if saved else driver_end,
                      "verl's 'Saving checkpoint' line to " + (
                          "ckpt/latest_checkpointed_iteration.txt (written after the save)" if saved else
                          "the driver's end (verl's tracker never named this step)"))
        last = nxt
    if planned is not None:
        for k in range(last + 1, planned + 1):
            part.phase(f"step {k}", None, "")
    if not done:
        result.notes.append("no step finished")


Spans = dict[int, tuple[float | None, float | None, str]]  # step -> (start, end, how)


def sync_spans(directory: Path, lines: list[Line], metrics: dict[int, dict[str, float]]
               ) -> tuple[Spans, tuple[int, float | None] | None]:
    """verl's main_ppo: each step's end anchored on the file it leaves (``rollouts/N.jsonl``, dumped after its timer
    stops) or its step line's place in job.log, its start ``timing_s/step`` before (the save is inside the step's
    timer); the steps without an anchor chained to their neighbours."""
    done = sorted(k for k, m in metrics.items() if "timing_s/step" in m)
    ends: dict[int, tuple[float, str]] = {}
    for k in done:
        dumped = mtime(directory / "rollouts" / f"{k}.jsonl")
        if dumped is not None:
            ends[k] = (dumped, f"rollouts/{k}.jsonl written (the step's end)")
    if not ends:
        for k in done:
            line = step_line(lines, k)
            low = placed(lines, line)[0] if line else None
            if low is not None:
                ends[k] = (low, "its step line (placed after the timed line above it)")
    spans: Spans = {}
    for k in done:
        if k in ends:
            t, how = ends[k]
            spans[k] = (t - metrics[k]["timing_s/step"], t, how)
    for k in done:  # forward from the anchored steps, then backward
        if k not in spans and k - 1 in spans and spans[k - 1][1] is not None:
            s = spans[k - 1][1]
            spans[k] = (s, s + metrics[k]["timing_s/step"], f"after step {k - 1}, timing_s/step long")
    for k in reversed(done):
        if k not in spans and k + 1 in spans and spans[k + 1][0] is not None:
            e = spans[k + 1][0]
            spans[k] = (e - metrics[k]["timing_s/step"], e, f"before step {k + 1}, timing_s/step long")
    for k, (s, e, how) in spans.items():
        spans[k] = (s, e, f"timing_s/step {metrics[k]['timing_s/step']:.1f} s; end: {how}")
    return spans, None


def fully_async_spans(directory: Path, lines: list[Line], metrics: dict[int, dict[str, float]]
                      ) -> tuple[Spans, tuple[int, float | None] | None]:
    """verl's fully-async trainer: step N starts at its first 'Requesting N samples from queue' line (the one before
    its 'global_steps: N' line) and ends where step N+1 starts (its save, outside the step's timer, included); the
    last step ends at verl's tracker naming it. A request after the last 'global_steps' line: a step not finished."""
    starts: dict[int, float | None] = {}
    pending: Line | None = None
    for line in lines:
        if REQUESTING.search(line.text):
            pending = pending or line
            continue
        found = GLOBAL_STEPS.search(line.text)
        if found and int(found[1]) not in starts:
            starts[int(found[1])] = placed(lines, pending)[0] if pending else None
            pending = None
    unfinished = ((max(starts, default=0) + 1), placed(lines, pending)[0]) if pending else None
    tracker = directory / "ckpt" / "latest_checkpointed_iteration.txt"
    saved = tracker.read_text().strip() if tracker.exists() else ""
    spans: Spans = {}
    for k, start in sorted(starts.items()):
        if k + 1 in starts:
            end, how = starts[k + 1], f"to step {k + 1}'s first request for samples"
        elif unfinished is not None and unfinished[0] == k + 1:
            end, how = unfinished[1], f"to step {k + 1}'s first request for samples"
        elif saved == str(k):
            end, how = mtime(tracker), "to verl's tracker naming it (ckpt/latest_checkpointed_iteration.txt)"
        else:
            end, how = None, "its end is not in the job's traces"
        timer = metrics.get(k, {}).get("timing_s/step")
        spans[k] = (start, end, (f"step timer {timer:.1f} s (the save after it); " if timer else "") + how)
    return spans, unfinished


# --- output -------------------------------------------------------------------------------------------------------


def table(b: Breakdown) -> str:
    wall = f"{b.wall:.0f} s" if b.wall is not None else "?"
    lines = [f"job {b.job} ({b.directory}): wall {wall} ({b.wall_how}); start: {b.start_how}; driver: {b.outcome}"]
    width = max(len(r.name) + 2 * r.level for r in b.rows) if b.rows else 10
    lines.append(f"  {'phase':<{width}}  {'start s':>8}  {'dur s':>7}  {'share':>6}  how")
    for r in b.rows:
        name = "  " * r.level + r.name
        offset = f"{r.start - b.start:8.1f}" if r.start is not None and b.start is not None else f"{'':8}"
        duration = r.seconds if r.seconds is not None else (r.end - r.start if r.end is not None and r.start is not None
                                                            else None)
        if r.status in ("not observable", "not reached"):
            cells = f"{'':8}  {r.status:>16}"
        else:
            share = f"{duration / b.wall:6.1%}" if duration is not None and b.wall else f"{'':6}"
            cells = f"{offset}  {duration:7.1f}  {share}" if duration is not None else f"{offset}  {'?':>7}  {'':6}"
        lines.append(f"  {name:<{width}}  {cells}  {r.how}")
    k = b.first_step
    which = f"step {k}'s generation" + ("" if k == 1 else ": the job resumed")
    if b.start_up is not None and b.wall:
        inside = next((r.seconds for r in b.rows if r.name.startswith(f"of which step {k}'s start-up")), None)
        lines.append(f"start-up (before {which}) {b.start_up:.0f} s of {b.wall:.0f} s "
                     f"({b.start_up / b.wall:.0%})" + (f"; and about {inside:.0f} s more inside step {k} (its time "
                                                      "over the later steps' median)" if inside and inside > 0 else ""))
    else:
        lines.append(f"start-up (before {which}): not observable (no step finished)")
    lines += [f"note: {n}" for n in b.notes]
    return "\n".join(lines)


def as_json(b: Breakdown) -> dict[str, Any]:
    out = asdict(b)
    for row in out["rows"]:
        for key in ("start", "end"):
            row[f"{key}_s"] = None if row[key] is None or b.start is None else round(row[key] - b.start, 3)
        if row["seconds"] is None and row["start"] is not None and row["end"] is not None:
            row["seconds"] = row["end"] - row["start"]
        row["seconds"] = None if row["seconds"] is None else round(row["seconds"], 3)
        row["share"] = None if row["seconds"] is None or not b.wall else round(row["seconds"] / b.wall, 4)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("dirs", nargs="*", type=Path, help="job directories (job.log, status/, ...)")
    parser.add_argument("--jobs", type=Path, help="a directory of job directories: every one of them")
    parser.add_argument("--phase-log", type=Path, help="the CI phase table's file (CI_PHASE_LOG): each job's wall")
    parser.add_argument("--json", action="store_true", help="one JSON object per job, a list")
    args = parser.parse_args(argv)
    dirs = list(args.dirs)
    if args.jobs:
        dirs += sorted(p for p in args.jobs.iterdir() if (p / "job.log").exists())
    if not dirs:
        parser.error("name job directories, or --jobs DIR")
    walls = phase_log_walls(args.phase_log)
    results = [breakdown(d, walls.get(d.name)) for d in dirs]
    if args.json:
        print(json.dumps([as_json(b) for b in results], indent=1))
    else:
        print("\n\n".join(table(b) for b in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
