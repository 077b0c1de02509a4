"""The job watch's stuck check, in the process that runs verl's trainer: at each look, is the job still making
progress (``stuck.Progress``); when it is not, every process's stacks on every node are recorded and said, and in
mode ``error`` the job ends (``JobStuck``, exit 1), naming how long it was idle, its bound, where the trainer waited
and who the rest wait on. Mode ``warn`` records and says it once a stall (again only after progress resumed).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Hashable
from typing import Any

from verl_ascend_ext.features.job_watch.stuck import Progress, apart, where
from verl_ascend_ext.patching.status import acted
from verl_ascend_ext.runtime.records import process_end, recorder, stacks, store
from verl_ascend_ext.runtime.records.reader import collect

logger = logging.getLogger("verl_ascend_ext.features.job_watch")

ASK_TIMEOUT = 5.0  # s each process has to write its stacks
EXIT_CODE = 1


class JobStuck(RuntimeError):
    """The job made no progress for longer than its bound (this process's end, recorded by the job watch)."""


class StuckCheck:
    """``look(now)`` at each of the watch's looks (``JobWatch.each_look``); ``progress`` reads the trainer's count."""

    def __init__(self, record_id: str, mode: str, floor: float, progress: Callable[[], Hashable], job: str,
                 began: float, far: Any = None) -> None:
        self.record_id, self.mode, self.read, self.job, self.far = record_id, mode, progress, job, far
        self.progress = Progress(floor, began)
        self.said_at: float | None = None  # the stall already said (warn mode), by when its progress last changed

    def look(self, now: float) -> None:
        self.progress.see(self.read(), now)
        if not self.progress.stuck(now) or self.said_at == self.progress.changed:
            return
        self.said_at = self.progress.changed
        verdict = self.verdict(now)
        recorder.stuck(verdict)
        acted(self.record_id)
        text = message(verdict)
        if self.mode == "error":
            logger.error("verl-ascend-ext: %s", text)
            print(f"JobStuck: {text}", file=sys.stderr, flush=True)
            process_end.exit_now(EXIT_CODE, JobStuck(text))
        logger.warning("verl-ascend-ext: %s (VERL_ASCEND_EXT_JOB_STUCK=warn: the job goes on)", text)

    def verdict(self, now: float) -> dict[str, Any]:
        """Every process's stacks on every node, grouped, with who the rest wait on."""
        records, _ = collect(store.base_dir())
        answers = stacks.ask(stacks.of_job_here(records, self.job), ASK_TIMEOUT)
        if self.far is not None:
            try:
                answers += self.far.stacks(ASK_TIMEOUT)
            except Exception as err:  # the verdict stands on this node's stacks, the others' said missing
                answers.append({"role": "the other nodes", "missing": f"not asked ({type(err).__name__}: {err})"})
        unique: dict[tuple[Any, Any], dict[str, Any]] = {}  # nodes sharing one directory each ask the same process
        for answer in answers:
            unique.setdefault((answer.get("host"), answer.get("pid") or id(answer)), answer)
        answers = list(unique.values())
        mine = next((a for a in answers if a.get("pid") == os.getpid() and "threads" in a), None)
        return {"at": time.time(), "idle_s": round(self.progress.idle(now), 1),
                "bound_s": round(self.progress.bound(), 1), "steps": self.progress.value,
                "phase": phase(mine), "groups": stacks.group(answers),
                "apart": [f"{stacks.label_of(a)}: {_place(a)}" for a in apart(answers)], "mode": self.mode}


def phase(answer: dict[str, Any] | None) -> str:
    """Where the trainer waits (``stacks.waiting_in``): the innermost frame in verl, else the innermost frame."""
    if answer is None:
        return "unknown (the trainer's own stacks were not written)"
    frames = [vars(f) for f in stacks.waiting_in([stacks.Thread(t["ident"], t["current"],
                                                                [stacks.Frame(**f) for f in t["frames"]])
                                                   for t in answer["threads"]])]
    in_verl = [f for f in frames if f"{os.sep}verl{os.sep}" in f["file"]]
    chosen = (in_verl or frames)[:1]
    return " ".join(f"{f['func']} ({os.path.basename(f['file'])}:{f['line']})" for f in chosen) or "no Python frame"


def _place(answer: dict[str, Any]) -> str:
    place = where(answer)
    if place is None:
        return str(answer.get("missing"))
    return " <- ".join(f"{func} ({os.path.basename(file)}:{line})" for file, line, func in place) or "no frame"


def message(verdict: dict[str, Any]) -> str:
    groups = "; ".join(f"{len(g['processes'])} process(es): {g['where']}" for g in verdict["groups"])
    text = (f"this job made no progress for {verdict['idle_s']:.0f} s (its bound: {verdict['bound_s']:.0f} s, 5x "
            f"its longest step so far, at least VERL_ASCEND_EXT_JOB_STUCK_TIMEOUT); the trainer's step count stays "
            f"{verdict['steps']}; the trainer waits in {verdict['phase']}. Where the job's processes wait: {groups}.")
    if verdict["apart"]:
        text += " Apart from the rest (what they likely wait on): " + "; ".join(verdict["apart"]) + "."
    return text + (" Fix: read the process apart (its log, its stacks in `verl-ascend status`); `verl-ascend "
                   "stacks --ray` shows them again while the job runs. The last whole checkpoint resumes.")
