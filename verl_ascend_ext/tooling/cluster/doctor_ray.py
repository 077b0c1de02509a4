"""`verl-ascend doctor --ray`: the static doctor on every alive node of a running Ray cluster, compared.

One small task (``num_cpus=0``, pinned with a hard node affinity) per alive node runs
``probe.node_report`` in that node's own environment (its raylet's variables; no job runtime env is
set). The answers are flattened into facts (plugin installed and loaded, versions, gate values, kill
switch, patch statuses, check statuses) and compared: a fact whose value is not the same on every node
is a difference; the reference value is the one most nodes have (ties: the head node's). Every
difference is behaviour-changing (CANN, NNAL, driver, firmware and duplicate installs included) except
a gate's raw spelling (labelled "same meaning" only when the parsed values agree on every node) and
informational facts (toolkit path, npu-smi, ASCEND_RT_VISIBLE_DEVICES / HCCL_* / PYTORCH_NPU_ALLOC_CONF).

Exit codes: 0 all nodes agree and each node's doctor is fine; 1 a behaviour-changing difference or a
node problem (plugin missing, refused patch, no answer); 2 the cluster could not be reached or used
within ``--timeout`` seconds (a watchdog ends the process, so it never hangs). Ray is imported here
only, i.e. only by this subcommand.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from typing import Any

from verl_ascend_ext.features.device import node_inventory
from verl_ascend_ext.features.device.node_ask import alive_nodes, ask_each
from verl_ascend_ext.features.device.node_differences import (
    CHANGING,
    INFO,
    SPELLING,
    differences,
    inventory_facts,
    is_head,
)
from verl_ascend_ext.tooling.cluster import probe

DEFAULT_TIMEOUT = 120.0
CONNECT_TIMEOUT = 5.0


class ClusterError(RuntimeError):
    """The cluster could not be reached or queried; the message says what to do."""


def _watchdog(timeout: float, address: str, command: str = "doctor --ray") -> threading.Timer:
    def expire() -> None:
        sys.stdout.flush()
        sys.stderr.write(f"verl-ascend {command}: error: no result from the Ray cluster at {address} within "
                         f"{timeout:.0f} s (connecting or waiting for the nodes' answers). Check that the cluster is "
                         "up (`ray status`), that this machine can reach it, or raise --timeout.\n")
        sys.stderr.flush()
        os._exit(2)

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    return timer


def _check_reachable(address: str) -> None:
    """Fail fast, with a clear message, when nothing listens at ``host:port``."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ClusterError(f"--address {address!r} is not HOST:PORT (the head node's GCS address, e.g. "
                           "10.0.0.1:6379), 'auto' or a ray:// URL")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT).close()
    except OSError as err:
        raise ClusterError(f"cannot reach a Ray cluster at {address}: {err}. Pass the head node's GCS address "
                           "(`ray status` on the head prints it; default port 6379) or start the cluster with "
                           "`ray start --head`.") from err


def _connect(address: str) -> Any:
    import ray

    if address != "auto" and not address.startswith("ray://"):
        _check_reachable(address)
    try:
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False,
                 namespace="verl-ascend-doctor")
    except Exception as err:
        raise ClusterError(f"could not connect to the Ray cluster at {address}: {type(err).__name__}: {err}") from err
    return ray


def _driver_paths() -> tuple[str, ...]:
    """What Ray adds to workers' sys.path from this driver (its working and script directories)."""
    return (os.path.abspath(os.curdir), os.path.dirname(os.path.realpath(sys.argv[0])))


def collect(address: str, deadline: float, task: Any = probe.node_report,
            args: tuple[Any, ...] | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(alive nodes, the answers of ``task`` pinned to each, in the same order; an answer with ``error`` when it
    failed). ``args``: the task's arguments (default: the driver paths ``probe.node_report`` takes)."""
    ray = _connect(address)
    try:
        nodes = alive_nodes(ray)
        return nodes, ask_each(ray, nodes, task, args if args is not None else (_driver_paths(),), deadline,
                               by_value=(probe, node_inventory))  # nodes without this package can still answer
    finally:
        ray.shutdown()


RAW = " (raw)"
INFO_CHECKS = frozenset({"ascend sysroot"})  # the tests-only sysroot marker


def _ascend_facts(report: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    """NNAL, driver, firmware and duplicate installs change behaviour (the CANN toolkit is an inventory fact); paths,
    npu-smi and variables such as HCCL_IF_IP legitimately differ per node and are informational."""
    from verl_ascend_ext.tooling.ascend_env import COMPONENTS, LABELS
    from verl_ascend_ext.tooling.ascend_env.duplicates import fact

    out: dict[str, tuple[Any, str]] = {}
    ascend = report.get("ascend")
    if ascend is not None:  # a node with an older verl-ascend-ext reports no Ascend environment
        for key in COMPONENTS:
            if key == "cann":
                continue
            part = ascend[key]
            out[LABELS[key]] = (part["version"] if part else "not installed", CHANGING)
        if ascend["cann"]:
            out["CANN toolkit home"] = (ascend["cann"]["real_home"] or ascend["cann"]["home"], INFO)
        out["npu-smi"] = ("found" if ascend["npu_smi"] else "not found", INFO)
        out.update({f"variable {k}": (v, INFO) for k, v in (ascend["env"] or {}).items()})
    for dup in report.get("duplicates", ()):
        out[f"duplicate install {dup['distribution']}"] = (fact(dup), CHANGING)
    return out


def facts(answer: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    """Comparable facts of one node: the inventory's (``node_differences.inventory_facts``: plugin, versions, gates,
    settings, kill switch, CANN) and the doctor's own (vLLM's loading, gate spellings, patch and check statuses, the
    rest of the Ascend environment). Name -> (value, what a difference means: CHANGING, SPELLING or INFO)."""
    out = inventory_facts(answer)
    report = answer.get("report")
    if not out or report is None:
        if out and not answer["installed"]:
            out["vLLM loads the plugin"] = (False, CHANGING)
        return out
    out["vLLM loads the plugin"] = (report["plugin"]["vllm_will_load"], CHANGING)
    for gate in report["gates"]:
        out[f"gate {gate['env']}{RAW}"] = ("unset" if gate["raw"] is None else gate["raw"], SPELLING)
    out.update({f"patch {p['id']}": (p["status"], CHANGING) for p in report["patches"]})
    out.update({f"check {f['name']}": (f["status"], INFO if f["name"] in INFO_CHECKS else CHANGING)
                for f in report["findings"] if not f["name"].startswith("duplicate install ")})
    out.update(_ascend_facts(report))
    return out


def _note(key: str, kind: str, differing_keys: set[str]) -> str | None:
    """The label of a difference row: ``same meaning`` only for a gate spelled differently whose parsed
    values agree on every node (otherwise the parsed row already reports it)."""
    if kind == INFO:
        return "informational"
    if kind == SPELLING:
        return None if key.removesuffix(RAW) in differing_keys else "same meaning"
    return None


def problems(answer: dict[str, Any]) -> list[str]:
    """What is wrong on one node by itself (whatever the other nodes say)."""
    if "error" in answer:
        return [answer["error"]]
    if not answer["installed"]:
        return [f"verl-ascend-ext is not importable ({answer['import_error']}): install it on this node"]
    from verl_ascend_ext.patching.record import NEEDS_ATTENTION
    from verl_ascend_ext.runtime.findings import ERROR

    report = answer["report"]
    found = list(report["plugin"]["problems"]) + list(report["errors"])
    found += [f"patch {p['id']} {p['status']}: {p['detail']}" for p in report["patches"]
              if p["status"] in NEEDS_ATTENTION]
    found += [f"check {f['name']}: {f['detail']}" for f in report["findings"] if f.get("status") == ERROR]
    return found


def compare(nodes: list[dict[str, Any]], answers: list[dict[str, Any]], address: str) -> dict[str, Any]:
    """The cluster report: per-node summary, differences, problems and the exit code."""
    rows, per_node = [], []
    for node, answer in zip(nodes, answers, strict=True):
        node_facts = facts(answer)
        per_node.append((node["NodeID"], is_head(node), node_facts))
        rows.append({"node_id": node["NodeID"], "address": node.get("NodeManagerAddress", ""), "is_head": is_head(node),
                     "hostname": answer.get("hostname", ""), "answered": "error" not in answer,
                     "exit_code": answer.get("exit_code"), "problems": problems(answer),
                     "facts": {k: v for k, (v, _) in node_facts.items()}})
    found = differences(per_node)
    differing_keys = {d["key"] for d in found}
    for d in found:
        d["note"] = _note(d["key"], d.pop("kind"), differing_keys)
    bad = any(d["behaviour_changing"] for d in found) or any(r["problems"] for r in rows)
    return {"address": address, "nodes": rows, "differences": found, "errors": [], "exit_code": 1 if bad else 0}


def _label(rows: list[dict[str, Any]], node_id: str) -> str:
    row = next(r for r in rows if r["node_id"] == node_id)
    return f"{node_id[:8]} ({row['address']}{', head' if row['is_head'] else ''})"


def _show(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def format_report(report: dict[str, Any]) -> str:
    from verl_ascend_ext.tooling import tables

    rows = report["nodes"]
    out = [f"verl-ascend doctor --ray: {len(rows)} alive node(s) at {report['address']}", ""]
    table = []
    for r in rows:
        f = r["facts"]
        plugin = ("not answering" if not r["answered"] else "NOT INSTALLED" if not f.get("plugin installed")
                  else "loads" if f.get("verl loads the plugin") else "NOT LOADED")
        table.append([r["node_id"][:8], r["address"], "head" if r["is_head"] else "worker", plugin,
                      _show(f.get("version verl")), "ok" if r["answered"] and not r["problems"] else "PROBLEMS"])
    out.append(tables.table(table, ["node", "address", "role", "plugin", "verl", "doctor"]))
    if report["differences"]:
        out += ["", "Differences (reference: the value on most nodes; ties: the head node's)"]
        diff_rows = []
        for d in report["differences"]:
            differing = "; ".join(f"{_label(rows, n)}: {_show(d['values'][n])}" for n in d["differing"])
            diff_rows.append([d["key"] + (f" [{d['note']}]" if d["note"] else ""),
                              _show(d["reference"]), differing])
        out.append(tables.table(diff_rows, ["what", "reference", "differing nodes"]))
    noted = [(r, p) for r in rows for p in r["problems"]]
    if noted:
        out += ["", "Problems"]
        out += [f"  {_label(rows, r['node_id'])}: {p}" for r, p in noted]
    out += ["", "PROBLEMS FOUND (exit 1)" if report["exit_code"] else f"OK: all {len(rows)} node(s) agree"]
    return "\n".join(out)


def main(address: str | None = None, as_json: bool = False, timeout: float = DEFAULT_TIMEOUT) -> int:
    target = address or os.environ.get("RAY_ADDRESS") or "auto"
    deadline = time.monotonic() + timeout
    timer = _watchdog(timeout, target)
    try:
        nodes, answers = collect(target, deadline)
    except ClusterError as err:
        report = {"address": target, "nodes": [], "differences": [], "errors": [str(err)], "exit_code": 2}
        if as_json:
            print(json.dumps(report, indent=2))
        print(f"verl-ascend doctor --ray: error: {err}", file=sys.stderr)
        return 2
    finally:
        timer.cancel()
    report = compare(nodes, answers, target)
    print(json.dumps(report, indent=2) if as_json else format_report(report))
    return report["exit_code"]
