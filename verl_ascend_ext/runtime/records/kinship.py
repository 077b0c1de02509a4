"""Kinship between a job's processes, from their records: which process started which (``ppid``, on one host) and
which Ray actor owns which (the actor that created it, on any host: a map of actor ids, ``identity.ray_actor_owners``,
read from Ray's actor table by the job's watch when it needs it).

Both are lines along which one death ends another: vLLM ends the children of a parent that died, and Ray ends every
actor an actor owned when it dies (its fate sharing), by SIGTERM. The job's watch dates a silent death by a kin's
recorded end only (``watch.date_silent_deaths``); the outcome orders failures of one time parent first
(``ancestors``). Only the standard library is imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def ancestors(rec: dict[str, Any], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of ``rec``'s parent, its parent's parent, ... on its host (by ``ppid``), nearest first."""
    by_pid = {(r.get("host"), r.get("pid")): r for r in records}
    out: list[dict[str, Any]] = []
    parent = by_pid.get((rec.get("host"), rec.get("ppid")))
    while parent is not None and parent is not rec and not any(parent is known for known in out):
        out.append(parent)
        parent = by_pid.get((parent.get("host"), parent.get("ppid")))
    return out


class Kinship:
    """The parent and owner links of ``records`` (the records of one job), indexed once; ``owners``: actor id -> the
    id of the actor that owns it."""

    def __init__(self, records: list[dict[str, Any]], owners: Mapping[str, str] | None = None) -> None:
        self.owners = dict(owners or {})
        self.by_pid = {(r.get("host"), r.get("pid")): r for r in records}
        self.by_actor: dict[str, list[dict[str, Any]]] = {}
        for rec in records:
            if rec.get("actor_id"):
                self.by_actor.setdefault(rec["actor_id"], []).append(rec)

    def parents(self, rec: dict[str, Any]) -> list[dict[str, Any]]:
        """The process that started ``rec`` (its ``ppid`` on its host) and the Ray actor that owns it (every record
        of that actor: a restarted actor has several), where the job recorded them."""
        parent = self.by_pid.get((rec.get("host"), rec.get("ppid")))
        owners = self.by_actor.get(self.owners.get(rec.get("actor_id") or "", ""), [])
        return ([parent] if parent is not None else []) + owners

    def forebears(self, rec: dict[str, Any]) -> list[dict[str, Any]]:
        """``rec``'s parents, their parents, ... (``parents``), nearest first: the processes whose death ends it."""
        out: list[dict[str, Any]] = []
        todo = self.parents(rec)
        while todo:
            nxt = todo.pop(0)
            if nxt is rec or any(nxt is known for known in out):
                continue
            out.append(nxt)
            todo.extend(self.parents(nxt))
        return out

    def descends(self, rec: dict[str, Any], forebear: dict[str, Any]) -> bool:
        """Whether ``forebear`` is one of ``rec``'s forebears (started it, owns it, or one of theirs does)."""
        return any(known is forebear for known in self.forebears(rec))
