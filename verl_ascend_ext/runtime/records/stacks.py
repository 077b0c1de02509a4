"""Python stacks on request, in every process that records, without ptrace: where each process of a job waits.

At the end of its boot every process that records (``recorder.start``) opens ``<its record>.stacks`` (append mode)
and registers it with ``faulthandler`` for ``SIGNAL``: a real-time signal that none of verl, vLLM, vLLM-Ascend,
Ray, torch or transformers handles (Ray and torch use SIGUSR1/SIGUSR2; checked in their sources), left alone where
a handler is already installed. faulthandler's handler is C code: it writes every thread's Python stack even while
a native call holds the GIL, and costs nothing until the signal comes. ``ask`` empties each process's file, sends
the signal, and reads what each wrote within ``timeout``; a process that writes nothing is "not answering" (stuck in
a native call with the signal blocked, stopped, or gone). ``group`` puts processes that wait in the same place
together (``waiting_in``). Only the standard library is imported.
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import IO, Any

SIGNAL = signal.SIGRTMIN + 6
SUFFIX = ".stacks"
SETTLE_S = 0.3  # s a stacks file must stay the same size to count as written whole
FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<func>\S+)')
THREAD = re.compile(r"^(?P<current>Current thread|Thread) (?P<ident>0x[0-9a-f]+)")

_armed: IO[str] | None = None  # the open stacks file of this process (kept open: the handler writes to its fd)


def stacks_path(record_path: str) -> str:
    """Where the process of the record at ``record_path`` writes its stacks."""
    return record_path.removesuffix(".json") + SUFFIX


def arm(record_path: str) -> bool:
    """Have this process write its threads' stacks to ``stacks_path(record_path)`` on ``SIGNAL``; False where the
    signal already has a handler (someone else's) or the file cannot be opened."""
    global _armed
    if signal.getsignal(SIGNAL) not in (signal.SIG_DFL, None) and _armed is None:
        return False
    try:
        handle = open(stacks_path(record_path), "a", encoding="utf-8")  # noqa: SIM115 (kept open for the handler)
    except OSError:
        return False
    faulthandler.register(SIGNAL, file=handle, all_threads=True, chain=False)
    if _armed is not None:
        _armed.close()
    _armed = handle
    return True


@dataclass
class Frame:
    file: str
    line: int
    func: str

    def short(self) -> str:
        return f"{self.func} ({os.path.basename(self.file)}:{self.line})"


@dataclass
class Thread:
    ident: str
    current: bool
    frames: list[Frame] = field(default_factory=list)  # most recent call first, as faulthandler writes them


def parse(text: str) -> list[Thread]:
    """faulthandler's dump: each thread with its frames, most recent call first."""
    threads: list[Thread] = []
    for line in text.splitlines():
        head = THREAD.match(line)
        if head:
            threads.append(Thread(head["ident"], head["current"] == "Current thread"))
            continue
        frame = FRAME.match(line)
        if frame and threads:
            threads[-1].frames.append(Frame(frame["file"], int(frame["line"]), frame["func"]))
    return threads


RAY_TASK_LOOP = ("main_loop", f"ray{os.sep}_private{os.sep}worker.py")  # a Ray worker's main thread between tasks
# threads that only keep house (this plugin's record flusher and its job watch, Ray's GC manager, tqdm's monitor):
# never where a process's work waits
HOUSEKEEPING = (f"verl_ascend_ext{os.sep}runtime{os.sep}records{os.sep}", f"ray{os.sep}_private{os.sep}gc_collect",
                f"tqdm{os.sep}_monitor.py")


def waiting_in(threads: list[Thread]) -> list[Frame]:
    """Where a process waits: its main thread's stack (faulthandler lists it last); where the main thread sits in
    Ray's task loop (an async or threaded actor, whose task runs in another thread), the deepest of its other threads
    that is not housekeeping (``HOUSEKEEPING``): idle event-loop and pool threads are shallow, the thread that
    carries the work, blocked, is deep."""
    if not threads:
        return []
    main = threads[-1]
    top = main.frames[0] if main.frames else None
    if top is not None and top.func == RAY_TASK_LOOP[0] and top.file.endswith(RAY_TASK_LOOP[1]) and len(threads) > 1:
        working = [t for t in threads[:-1] if not any(h in f.file for f in t.frames for h in HOUSEKEEPING)]
        return max(working or threads[:-1], key=lambda t: len(t.frames)).frames
    return main.frames or next((t.frames for t in threads if t.current), [])


def ask(records: Iterable[dict[str, Any]], timeout: float) -> list[dict[str, Any]]:
    """Ask each live process of ``records`` (this host's, with a record file) for its stacks: each answer is the
    record's identity with ``stacks`` (``parse``) or ``missing`` saying why there is none."""
    asked: list[tuple[dict[str, Any], str]] = []
    answers: list[dict[str, Any]] = []
    for rec in records:
        who = {k: rec.get(k) for k in ("host", "pid", "proc_start", "role", "actor_class", "ranks")}
        path = stacks_path(str(rec.get("file") or ""))
        if not os.path.exists(path):
            answers.append({**who, "missing": "not armed (no stacks file: an older verl-ascend-ext, or the signal "
                                              "was taken by another handler)"})
            continue
        try:
            os.truncate(path, 0)
            os.kill(int(rec["pid"]), SIGNAL)
        except OSError as err:
            answers.append({**who, "missing": f"not asked ({type(err).__name__}: {err})"})
            continue
        asked.append((who, path))
    sizes: dict[str, tuple[int, float]] = {}
    deadline = time.monotonic() + timeout
    pending = {path for _, path in asked}
    while pending and time.monotonic() < deadline:
        for path in list(pending):
            size = os.path.getsize(path)
            last = sizes.get(path)
            if size and last and last[0] == size and time.monotonic() - last[1] >= SETTLE_S:
                pending.discard(path)
            elif not last or last[0] != size:
                sizes[path] = (size, time.monotonic())
        time.sleep(0.05)
    for who, path in asked:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        threads = parse(text)
        if not threads:
            answers.append({**who, "missing": f"not answering within {timeout:g} s (stopped, gone, or stuck in a "
                                              "native call with the signal blocked)"})
        else:
            answers.append({**who, "threads": [{"ident": t.ident, "current": t.current,
                                                "frames": [vars(f) for f in t.frames]} for t in threads]})
    return answers


def of_job_here(records: Iterable[dict[str, Any]], job: str | None) -> list[dict[str, Any]]:
    """The live processes of ``job`` on this host (as ``reader.collect`` gives them: ``alive`` set), Ray's idle pool
    workers (which never got an actor) and records gathered from other nodes left out."""
    from verl_ascend_ext.runtime.records.gathered import PREFIX
    from verl_ascend_ext.runtime.records.outcome import is_idle_pool_worker

    host = socket.gethostname()
    return [r for r in records if r.get("job") == job and r.get("host") == host and r.get("alive")
            and not is_idle_pool_worker(r) and not str(r.get("namespace", "")).startswith(PREFIX)]


def label_of(answer: dict[str, Any]) -> str:
    ranks = answer.get("ranks") or {}
    rank = f" rank {ranks['rank']}" if "rank" in ranks else ""
    actor = f" {answer['actor_class']}" if answer.get("actor_class") else ""
    return f"{answer.get('role')}{actor}{rank} (host {answer.get('host')}, pid {answer.get('pid')})"


def group(answers: list[dict[str, Any]], depth: int = 4) -> list[dict[str, Any]]:
    """The answers grouped by where they wait (``waiting_in``: its ``depth`` innermost frames), the largest group
    first; the processes that did not answer last, as one group."""
    groups: dict[tuple[tuple[str, int, str], ...], list[dict[str, Any]]] = {}
    silent = []
    for answer in answers:
        if "threads" not in answer:
            silent.append(answer)
            continue
        threads = [Thread(t["ident"], t["current"], [Frame(**f) for f in t["frames"]]) for t in answer["threads"]]
        frames = waiting_in(threads)[:depth]
        groups.setdefault(tuple((f.file, f.line, f.func) for f in frames), []).append(answer)
    out = [{"where": " <- ".join(Frame(*key).short() for key in frames) or "(no Python frame)",
            "processes": [label_of(a) for a in members]}
           for frames, members in sorted(groups.items(), key=lambda item: -len(item[1]))]
    if silent:
        out.append({"where": "did not answer", "processes": [f"{label_of(a)}: {a['missing']}" for a in silent]})
    return out
