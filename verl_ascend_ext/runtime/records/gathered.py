"""Other nodes' records of a job, gathered into the status directory of the process that drives it.

On a cluster each node records in its own status directory (its own disk, or a ``${NAME}`` path of its own): after
the job, when the cluster is gone, another node's records stay on that node, and ``verl-ascend status --dir`` on the
driver's host would not see the process that failed there. The job's watch on every node (``features.job_watch``)
hands its node's records of the job to the trainer's process when the job ends or a loss ends it, and they are
written here: one namespace directory a node (``gathered-<node id>``), the files named as on that node. A record
read twice (the same process in its own directory and gathered, where nodes share one directory) is the newest
copy (``newest_copies``). While the job runs, the watches also report their nodes' rollout workers' sleeps
(``sleeper``), kept in the trainer's process (``heard``) for the job's sleep-memory metric. Only the standard library
is imported.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable
from typing import Any

from verl_ascend_ext.runtime.records import store

PREFIX = "gathered-"
READER_FIELDS = ("file", "namespace", "alive")  # what a reader adds in memory: not part of a record on disk


def namespace(node_id: str) -> str:
    """The namespace directory a node's gathered records go to."""
    return f"{PREFIX}{node_id[:16]}"


def write(base: str, node_id: str, records: Iterable[dict[str, Any]]) -> int:
    """Write ``records`` (another node's, as its reader returned them) under ``base``; returns how many."""
    written = 0
    base_fd = store.open_base(base)
    try:
        ns_fd = store.open_dir(namespace(node_id), dir_fd=base_fd)
        try:
            for rec in records:
                name = str(rec.get("file") or "").rpartition("/")[2] or store.record_name(
                    str(rec.get("host")), int(rec.get("pid") or 0), rec.get("proc_start"))
                body = {k: v for k, v in rec.items() if k not in READER_FIELDS}
                store.write_atomic(ns_fd, name, json.dumps(body, sort_keys=True).encode())
                written += 1
        finally:
            os.close(ns_fd)
    finally:
        os.close(base_fd)
    return written


def newest_copies(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record a process (host, pid, start): the one written last, where a directory holds it twice."""
    newest: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
    for rec in records:
        key = (rec.get("host"), rec.get("pid"), rec.get("proc_start"))
        if key not in newest or (rec.get("updated") or 0.0) > (newest[key].get("updated") or 0.0):
            newest[key] = rec
    kept = {id(rec) for rec in newest.values()}
    return [rec for rec in records if id(rec) in kept]


class Heard:
    """The sleeps the other nodes' rollout workers recorded, as their nodes' watches last reported them (the job's
    sleep-memory metric covers every node): per process, its first and its newest sleep (what the metric reads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sleepers: dict[tuple[Any, Any, Any], dict[str, Any]] = {}

    def add(self, sleepers: Iterable[dict[str, Any]]) -> None:
        with self.lock:
            for rec in sleepers:
                self.sleepers[(rec.get("host"), rec.get("pid"), rec.get("proc_start"))] = rec

    def records(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.sleepers.values())


heard = Heard()  # this process's (the trainer's), filled by its job watch


def sleeper(rec: dict[str, Any]) -> dict[str, Any]:
    """What a node's watch reports of a rollout worker that slept: who it is, its job, its first and newest sleep."""
    sleeps = rec["sleeps"]
    return {"host": rec.get("host"), "pid": rec.get("pid"), "proc_start": rec.get("proc_start"), "job": rec.get("job"),
            "role": rec.get("role"), "ranks": rec.get("ranks") or {}, "updated": rec.get("updated"),
            "sleeps": [sleeps[0], sleeps[-1]] if len(sleeps) > 1 else [sleeps[0]]}
