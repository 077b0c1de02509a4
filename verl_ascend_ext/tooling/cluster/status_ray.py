"""`verl-ascend status --ray`: the process records of every alive node of a running Ray cluster.

Uses the doctor's machinery (``doctor_ray``: connection with a fail-fast reachability check, a watchdog
bounding the whole command by ``--timeout``, one ``num_cpus=0`` task pinned to each alive node). The
task (``node_records``, imported by reference: every node that ran the plugin has it installed) reads
the node's status directory, namespaces ``local`` and the cluster's Ray session (the task runs in that
session), with this host's liveness (reading only), and returns the records.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any


def node_records(directory: str | None) -> dict[str, Any]:
    """Run on one node: its records (``directory`` or the node's default status directory) and notes."""
    import platform

    from verl_ascend_ext.runtime.records.identity import ray_session
    from verl_ascend_ext.runtime.records.reader import collect
    from verl_ascend_ext.runtime.records.schema import LOCAL_NAMESPACE
    from verl_ascend_ext.runtime.records.store import base_dir

    base = directory or base_dir()
    namespaces = [LOCAL_NAMESPACE]
    session = ray_session(sys.argv)
    if session is not None:
        namespaces.append(session)
    records, notes = collect(base, namespaces)
    return {"hostname": platform.node(), "base": base, "namespaces": namespaces, "records": records, "notes": notes}


def collect_cluster(address: str | None, timeout: float, directory: str | None
                    ) -> tuple[list[list[dict[str, Any]]], list[str], list[str], str | None]:
    """(record batches per node, notes, node problems, error): error is set when the cluster is unreachable."""
    from verl_ascend_ext.tooling.cluster.doctor_ray import ClusterError, _watchdog, collect

    target = address or os.environ.get("RAY_ADDRESS") or "auto"
    deadline = time.monotonic() + timeout
    timer = _watchdog(timeout, target, "status --ray")
    try:
        nodes, answers = collect(target, deadline, task=node_records, args=(directory,))
    except ClusterError as err:
        return [], [], [], str(err)
    finally:
        timer.cancel()
    batches, notes, problems = [], [], []
    for node, answer in zip(nodes, answers, strict=True):
        label = f"node {node['NodeID'][:8]} ({node.get('NodeManagerAddress', '')})"
        if "error" in answer:
            problems.append(f"{label}: {answer['error']}")
            continue
        batches.append(answer["records"])
        notes += [f"{label}: {n}" for n in answer["notes"]]
    return batches, notes, problems, None
