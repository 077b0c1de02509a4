"""The nodes' answers compared: each node's facts, and every fact whose value is not the same on every node.

Used alike by the cluster check at a job's start (``cluster_check``) and ``verl-ascend doctor --ray`` (which adds the
doctor's own facts: patch statuses, checks, the rest of the Ascend environment). A fact's kind says what a difference
in it means: it changes what runs (``CHANGING``); it is the spelling of a gate whose parsed value is a fact of its own
(``SPELLING``); or it is shown for information only (``INFO``: node-specific by nature).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

CHANGING, SPELLING, INFO = "behaviour-changing", "spelling", "informational"
HEAD_RESOURCE = "node:__internal_head__"
PLUGIN_INSTALLED = "plugin installed"
VERL_LOADS = "verl loads the plugin"

Facts = dict[str, tuple[Any, str]]


def inventory_facts(answer: dict[str, Any]) -> Facts:
    """The facts of one node's ``node_inventory`` answer: name -> (value, kind); none for a node that did not answer.

    A node where this package does not import has no gates or features to compare: its raw variables of this package
    stand in for the gates."""
    if "error" in answer:
        return {}
    out: Facts = {
        PLUGIN_INSTALLED: (answer["installed"], CHANGING),
        "version verl-ascend-ext": (answer["plugin_version"], CHANGING),
    }
    out.update({f"version {k}": (v, CHANGING) for k, v in answer["versions"].items()})
    plugin = answer.get("plugin")
    if plugin is None:  # not installed, or another release that could not say
        out[VERL_LOADS] = (False if not answer["installed"] else "unreadable", CHANGING)
        out.update({f"gate {k} (raw)": (v, CHANGING) for k, v in answer["environ"].items()})
        return out
    out[VERL_LOADS] = (plugin["verl_loads"], CHANGING)
    out["features"] = (",".join(plugin["features"]), CHANGING)
    out.update({f"gate {k}": (v, CHANGING) for k, v in plugin["gates"].items()})
    out.update({f"setting {k}": (v, CHANGING) for k, v in plugin["settings"].items()})
    out["VERL_ASCEND_EXT_DISABLE"] = (plugin["disable"], CHANGING)
    out["CANN toolkit"] = (plugin["cann"], CHANGING)
    return out


def is_head(node: dict[str, Any]) -> bool:
    return HEAD_RESOURCE in node.get("Resources", {})


def node_label(node: dict[str, Any], hostname: str = "") -> str:
    """How an error names a node: its address, its host name, the start of its Ray node id, and whether it is the
    head (two raylets on one machine share address and host)."""
    host = f", host {hostname}" if hostname else ""
    return f"{node.get('NodeManagerAddress', '?')} (node {node['NodeID'][:8]}{host}{', head' if is_head(node) else ''})"


def differences(per_node: list[tuple[str, bool, Facts]]) -> list[dict[str, Any]]:
    """Every fact whose value differs between the nodes that answered (``(node id, is head, facts)`` each): its key,
    kind, reference value (the one most nodes have; ties: the head node's), every node's value and the differing
    nodes. A node where this package does not import is compared on the facts it has (its ``plugin installed``
    difference says the rest once, instead of one "-" per missing fact)."""
    answered = [entry for entry in per_node if entry[2]]
    keys = sorted({k for _, _, f in answered for k in f})
    found = []
    for key in keys:
        values = {node_id: f.get(key, (None, CHANGING))[0] for node_id, _, f in answered
                  if key in f or f.get(PLUGIN_INSTALLED, (True,))[0]}
        if len({json.dumps(v) for v in values.values()}) <= 1:
            continue
        kinds = {f[key][1] for _, _, f in answered if key in f}
        kind = CHANGING if CHANGING in kinds else kinds.pop()
        counts = Counter(json.dumps(v) for v in values.values())
        top = max(counts.values())
        head_value = next((json.dumps(values[n]) for n, head, _ in answered if head and n in values), None)
        reference = head_value if head_value is not None and counts[head_value] == top else \
            next(v for v, c in counts.items() if c == top)
        found.append({"key": key, "kind": kind, "behaviour_changing": kind == CHANGING,
                      "reference": json.loads(reference), "values": values,
                      "differing": [n for n, v in values.items() if json.dumps(v) != reference]})
    return found
