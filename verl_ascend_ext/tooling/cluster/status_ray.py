"""`verl-ascend status --ray`: the process records of every alive node of a running Ray cluster, and the actors
that ran without the plugin.

Uses the doctor's machinery (``doctor_ray``: connection with a fail-fast reachability check, a watchdog
bounding the whole command by ``--timeout``; ``node_ask``: one ``num_cpus=0`` task pinned to each alive node). The
task (``node_records``, imported by reference: every node that ran the plugin has it installed) reads
the node's status directory, namespaces ``local`` and the cluster's Ray session (the task runs in that
session), with this host's liveness (reading only), and returns the records. Ray's table of actors then names every
actor of the job that left no record (``without_record``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import Any


def node_records(directory: str | None) -> dict[str, Any]:
    """Run on one node: its records (``directory`` or the node's default status directory) and notes."""
    import platform

    from verl_ascend_ext.runtime.records.identity import ray_session
    from verl_ascend_ext.runtime.records.reader import collect
    from verl_ascend_ext.runtime.records.schema import LOCAL_NAMESPACE
    from verl_ascend_ext.runtime.records.store import DIR_ENV, base_dir

    base = base_dir({**os.environ, DIR_ENV: directory}) if directory else base_dir()  # ${NAME}: this node's
    namespaces = [LOCAL_NAMESPACE]
    session = ray_session(sys.argv)
    if session is not None:
        namespaces.append(session)
    records, notes = collect(base, namespaces)
    return {"hostname": platform.node(), "base": base, "namespaces": namespaces, "records": records, "notes": notes}


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """This process's standard output (file descriptor 1, which Ray's own threads print to: "node ... has been
    marked dead") goes to standard error while the block runs: ``--json`` prints JSON only."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def collect_cluster(address: str | None, timeout: float, directory: str | None
                    ) -> tuple[list[list[dict[str, Any]]], list[str], list[str], str | None, list[dict[str, Any]]]:
    """(record batches per node, notes, node problems, error, the cluster's actors): error is set when the cluster is
    unreachable or no node holds a record (naming where each looked); the actors are Ray's table of every actor it
    knows (``actor_table``). Ray's output while connected goes to standard error (``stdout_to_stderr``)."""
    with stdout_to_stderr():
        return _collect_cluster(address, timeout, directory)


def _collect_cluster(address: str | None, timeout: float, directory: str | None
                     ) -> tuple[list[list[dict[str, Any]]], list[str], list[str], str | None, list[dict[str, Any]]]:
    from verl_ascend_ext.features.device.node_ask import alive_nodes, ask_each
    from verl_ascend_ext.tooling.cluster.doctor_ray import ClusterError, _connect, _watchdog

    target = address or os.environ.get("RAY_ADDRESS") or "auto"
    deadline = time.monotonic() + timeout
    timer = _watchdog(timeout, target, "status --ray")
    try:
        ray = _connect(target)
        try:
            nodes = alive_nodes(ray)
            answers = ask_each(ray, nodes, node_records, (directory,), deadline)
            try:
                actors, unread = actor_table(ray), None
            except Exception as err:  # another Ray's GCS tables: the records are still read, the gap said
                actors, unread = [], (f"Ray's actor table not read ({type(err).__name__}: {err}): actors that ran "
                                      "without the plugin are not named")
        finally:
            ray.shutdown()
    except ClusterError as err:
        return [], [], [], str(err), []
    finally:
        timer.cancel()
    batches, notes, problems, looked = [], [] if unread is None else [unread], [], []
    for node, answer in zip(nodes, answers, strict=True):
        label = f"node {node['NodeID'][:8]} ({node.get('NodeManagerAddress', '')})"
        if "error" in answer:
            problems.append(f"{label}: {answer['error']}")
            continue
        batches.append(answer["records"])
        notes += [f"{label}: {n}" for n in answer["notes"]]
        looked.append(f"{label}: {answer['base']}")
    if looked and not any(batches):
        return [], notes, problems, (f"no process record on any of the {len(looked)} node(s) that answered; looked in "
                                     f"{'; '.join(looked)}. Fix: pass the job's VERL_ASCEND_EXT_STATUS_DIR as --dir "
                                     "(a ${NAME} in it, quoted, is expanded on each node), or leave it out"), actors
    return batches, notes, problems, None, actors


def actor_table(ray: Any) -> list[dict[str, Any]]:
    """Every actor the cluster's GCS knows (alive and dead, every job): what ``ray list actors`` shows, read from the
    GCS directly (Ray's state API goes through the dashboard, which a cluster may run without)."""
    from ray._private.state import state

    return [{"actor_id": row["ActorID"], "class_name": row["ActorClassName"], "job_id": row["JobID"],
             "state": row["State"], "pid": int(row.get("Pid") or 0),
             "ip": (row.get("Address") or {}).get("IPAddress", ""),
             "node_id": (row.get("Address") or {}).get("NodeID", "")}
            for row in state.actor_table(None).values()]


def without_record(actors: list[dict[str, Any]], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The actors of the records' Ray jobs that left no record: they ran without this plugin (a node without it, or
    whose environment leaves it out). An actor left a record when one names its actor id, or its address and pid (a
    record written before its process became the actor, and not since: a short-lived actor killed by Ray within the
    flusher's delay); it is the job's when its Ray job is that of an actor that left one. Actors that never got a
    process are not counted."""
    recorded_ids = {r["actor_id"] for r in records if r.get("actor_id")}
    recorded_at = {(r.get("ip"), int(r.get("pid") or 0)) for r in records}
    jobs = {a["job_id"] for a in actors if a["actor_id"] in recorded_ids or (a["ip"], a["pid"]) in recorded_at}
    return [a for a in actors if a["job_id"] in jobs and a["pid"] and a["actor_id"] not in recorded_ids
            and (a["ip"], a["pid"]) not in recorded_at]


def describe(actor: dict[str, Any]) -> str:
    """One problem line of ``status --ray`` for an actor that left no record."""
    return (f"ray actor {actor['class_name'].rpartition('.')[2]} (actor {actor['actor_id'][:12]}, pid {actor['pid']}, "
            f"node {actor['node_id'][:8]} at {actor['ip']}, {actor['state'].lower()}): ran without the plugin (no "
            "record: its node lacks verl-ascend-ext, or its environment leaves it out; `verl-ascend doctor --ray` "
            "names the node)")


def ask_nodes(address: str | None, timeout: float, task: Any, args: tuple[Any, ...]
              ) -> tuple[list[dict[str, Any]], list[str], str | None]:
    """``task(*args)`` on every alive node of the cluster (``verl-ascend stacks --ray``): the answers, where each
    node looked (its answer's ``base``; a node that did not answer, why) and an error when the cluster is
    unreachable. Ray's output goes to standard error while connected."""
    from verl_ascend_ext.features.device.node_ask import alive_nodes, ask_each
    from verl_ascend_ext.tooling.cluster.doctor_ray import ClusterError, _connect, _watchdog

    target = address or os.environ.get("RAY_ADDRESS") or "auto"
    with stdout_to_stderr():
        timer = _watchdog(timeout, target, "stacks --ray")
        try:
            ray = _connect(target)
            try:
                nodes = alive_nodes(ray)
                answers = ask_each(ray, nodes, task, args, time.monotonic() + timeout)
            finally:
                ray.shutdown()
        except ClusterError as err:
            return [], [], str(err)
        finally:
            timer.cancel()
    looked = [f"node {n['NodeID'][:8]}: {a.get('base', a.get('error'))}" for n, a in zip(nodes, answers, strict=True)]
    return [a for a in answers if "answers" in a], looked, None
