"""The cluster check at a PPO job's start: every node asked what it has, before the first worker group is built.

verl's ``run_ppo`` builds the job's runtime env (``get_ppo_ray_runtime_env``, wrapped by ``ray-runtime-env-gates``,
which arms this check) and calls ``ray.init`` with it; Ray then runs its post-init hooks, where the check runs once,
in the driver. Every alive node that can take the job's workers answers ``node_inventory`` in a task of the job: in
the job's runtime env, so gates read as the job's workers will read them and the plugin is booted by the job's setup
hook, as in every worker of the job. The answers are compared as ``verl-ascend doctor --ray`` compares its own
(``node_differences``). A node that differs, or where the plugin does not load, stops the job with
``ClusterCheckError`` naming each such node, what differs (both values) and the fix (``VERL_ASCEND_EXT_CLUSTER_CHECK``
``error``, the default), or is logged at WARNING and the job trains (``warn``).

(The driver's own ``run_ppo`` cannot be patched: ``python -m verl.trainer.main_ppo`` runs it as ``__main__``.)
"""

from __future__ import annotations

import logging
import time
from typing import Any

from verl_ascend_ext.features.device import node_inventory
from verl_ascend_ext.features.device.node_ask import alive_nodes, ask_each
from verl_ascend_ext.features.device.node_differences import (
    PLUGIN_INSTALLED,
    VERL_LOADS,
    differences,
    inventory_facts,
    is_head,
    node_label,
)
from verl_ascend_ext.features.device.targets import CLUSTER_CHECK, CLUSTER_CHECK_TIMEOUT

logger = logging.getLogger("verl_ascend_ext.features.device")

POST_INIT = "ray._private.worker._post_init_hooks"  # Ray's "functions to run as callback after a successful ray init"
MARK = "verl_ascend_ext_cluster_check"
SETUP_HOOK = "verl_ascend_ext.runtime.boot.ray_worker_setup"
FIX = ("Fix: give every node the same image (the same verl-ascend-ext wheel, verl, vLLM, vLLM-Ascend, torch, "
       "torch_npu, CANN), then restart its raylet (`ray stop`, then `ray start ...` again: a raylet keeps the "
       "environment and packages it started with); `verl-ascend doctor --ray` compares the nodes in full. To train "
       f"anyway: {CLUSTER_CHECK.env}=warn (or off) in the driver's environment.")


class ClusterCheckError(RuntimeError):
    """A node of the job's Ray cluster would run the job differently, or without this plugin."""


def arm() -> bool:
    """Run the check once, after this process's next successful ``ray.init`` (verl's, with the job's runtime env);
    False when it is off, or Ray has no post-init hooks (said at WARNING: nothing is checked)."""
    mode = CLUSTER_CHECK.read()
    if mode == "off":
        return False
    import ray._private.worker as worker  # imported already: verl's run_ppo imports ray

    hooks = getattr(worker, "_post_init_hooks", None)
    if not isinstance(hooks, list):
        logger.warning("verl-ascend-ext: the cluster check cannot run: this Ray (%s) has no %s to run it after "
                       "ray.init; run `verl-ascend doctor --ray` before the job instead", _ray_version(), POST_INIT)
        return False
    if any(getattr(hook, MARK, False) for hook in hooks):
        return True

    def after_init() -> None:
        hooks.remove(after_init)
        check(mode, CLUSTER_CHECK_TIMEOUT.read())

    setattr(after_init, MARK, True)
    hooks.append(after_init)
    return True


def _ray_version() -> str:
    import ray

    return getattr(ray, "__version__", "?")


def check(mode: str, timeout: float) -> list[dict[str, Any]]:
    """Ask every node and compare (``ray`` connected); raise ``ClusterCheckError`` in mode ``error`` when a node is
    named, else log it. Returns the nodes named, each with what was found there."""
    import ray

    started = time.monotonic()
    nodes = alive_nodes(ray, workers_only=True)
    answers = ask_each(ray, nodes, node_inventory.node_inventory, (), started + timeout, by_value=(node_inventory,))
    named = judge(nodes, answers)
    took = time.monotonic() - started
    if not named:  # at WARNING, as the boot's "applied" lines: verl's driver shows no INFO of plugins
        logger.warning("verl-ascend-ext: cluster check: the %d node(s) that can take the job's workers agree (%.1f s)",
                    len(nodes), took)
        return named
    text = message(named, len(nodes), took, mode)
    if mode == "error":
        raise ClusterCheckError(text)
    logger.warning("%s", text)
    return named


def judge(nodes: list[dict[str, Any]], answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The nodes to name: each with its label and what was found there (a problem of its own, or a fact whose value
    differs from the one most nodes have, both values said)."""
    per_node = [(node["NodeID"], is_head(node), inventory_facts(answer)) for node, answer in
                zip(nodes, answers, strict=True)]
    found: dict[str, list[str]] = {node["NodeID"]: problems(answer) for node, answer in zip(nodes, answers,
                                                                                          strict=True)}
    for diff in differences(per_node):
        if not diff["behaviour_changing"] or diff["key"] in (PLUGIN_INSTALLED, VERL_LOADS):
            continue  # the node's problem says it, with the cause
        others = sum(1 for v in diff["values"].values() if v == diff["reference"])
        for node_id in diff["differing"]:
            found[node_id].append(f"{diff['key']}: {_show(diff['values'][node_id])} here, "
                                  f"{_show(diff['reference'])} on {others} other node(s)")
    return [{"node_id": node["NodeID"], "label": node_label(node, answer.get("hostname", "")),
             "found": found[node["NodeID"]]} for node, answer in zip(nodes, answers, strict=True)
            if found[node["NodeID"]]]


def problems(answer: dict[str, Any]) -> list[str]:
    """What is wrong on one node by itself, for this job: no answer, the plugin missing, unreadable or not loaded."""
    if "error" in answer:
        return [f"no worker of this job could answer there ({answer['error']}). Ray runs the job's setup hook "
                f"({SETUP_HOOK}) in every worker of the job: it fails where verl-ascend-ext is missing or does not "
                "import (that node's python-core-worker-*.log has the traceback)"]
    if not answer["installed"]:
        return [f"verl-ascend-ext is not importable there ({answer['import_error']})"]
    if "unreadable" in answer:
        return [f"its verl-ascend-ext {answer['plugin_version']} does not answer as this one does "
                f"({answer['unreadable']})"]
    plugin = answer["plugin"]
    if not plugin["booted"] and not plugin["verl_loads"]:  # booted by the job's setup hook, or by verl's discovery
        return ["the plugin does not load in this job's workers there (VERL_USE_EXTERNAL_PLUGINS in its raylet's "
                "environment leaves it out): they would train unpatched"]
    return []


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def message(named: list[dict[str, Any]], total: int, took: float, mode: str) -> str:
    lines = [f"verl-ascend-ext: cluster check ({CLUSTER_CHECK.env}={mode}): {len(named)} of the {total} node(s) that "
             f"can take this job's workers would run it differently or without this plugin (asked in the job's "
             f"runtime env in {took:.1f} s, before the first worker group):"]
    for node in named:
        lines.append(f"  node {node['label']}:")
        lines += [f"    - {item}" for item in node["found"]]
    lines.append(FIX)
    return "\n".join(lines)
