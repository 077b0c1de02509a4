"""Ask every alive node of a connected Ray cluster one question: a task pinned to each node, answers by a deadline.

One small task (``num_cpus=0``, no retry) per node, pinned with a hard node affinity; it runs in the runtime env of
the connected driver's job (the job's, for the cluster check at its start; none, for ``doctor --ray``). A node that
does not answer in time, or whose task fails, gets an answer with ``error`` saying so. The caller's ``ray`` module
is passed in: nothing here imports Ray.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

from verl_ascend_ext.features.device.node_differences import HEAD_RESOURCE

WORKER_RESOURCES = ("CPU", "GPU", "NPU")  # what a node offers the job's workers (verl's pools ask for these)


def alive_nodes(ray: ModuleType, workers_only: bool = False) -> list[dict[str, Any]]:
    """The alive nodes, the head first, then by node id; ``workers_only``: those offering CPUs or accelerators."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if workers_only:
        nodes = [n for n in nodes if any(n.get("Resources", {}).get(r, 0) > 0 for r in WORKER_RESOURCES)]
    return sorted(nodes, key=lambda n: (HEAD_RESOURCE not in n.get("Resources", {}), n["NodeID"]))


def ask_each(ray: ModuleType, nodes: list[dict[str, Any]], task: Any, args: tuple[Any, ...], deadline: float,
             by_value: tuple[ModuleType, ...] = ()) -> list[dict[str, Any]]:
    """``task(*args)`` on each of ``nodes``, in the same order; an answer with ``error`` where it failed or did not
    come before ``deadline`` (``time.monotonic()``). ``by_value``: modules shipped by value (the task's own, so that a
    node without this package, or with another release of it, still runs it)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    for module in by_value:
        ray.cloudpickle.register_pickle_by_value(module)
    remote = ray.remote(num_cpus=0, max_retries=0)(task)
    refs = [remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False))
            .remote(*args) for n in nodes]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=max(1.0, deadline - time.monotonic()))
    answers: list[dict[str, Any]] = []
    name = getattr(task, "__name__", "probe")
    for ref in refs:
        if ref not in ready:
            answers.append({"error": "no answer before the deadline (node busy or unreachable?)"})
            continue
        try:
            answers.append(ray.get(ref))
        except Exception as err:
            answers.append({"error": f"the {name} task failed there: {type(err).__name__}: {err}",
                            "error_type": type(err).__name__})
    return answers
