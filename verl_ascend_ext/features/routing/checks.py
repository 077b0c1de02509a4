"""The routing feature's doctor checks: the route check's gate, and whether the installed verl has the R3 replay it
checks, read statically (no imports of verl, torch or Megatron)."""

from __future__ import annotations

from collections.abc import Mapping

from verl_ascend_ext.patching.gates import Gate
from verl_ascend_ext.patching.source import definition_in_file, find_module_file
from verl_ascend_ext.runtime.findings import INFO, OK, Finding, gate_check

REPLAY_UTILS = "verl.utils.megatron.router_replay_utils"
R3 = ("actor_rollout_ref.actor.megatron.router_replay.mode=R3 with "
      "actor_rollout_ref.rollout.enable_rollout_routing_replay=True")


def doctor_findings(environ: Mapping[str, str], gate: Gate) -> list[Finding]:
    """The feature's ``gate`` as ``environ`` sets it, and verl's R3 replay as installed."""
    return [gate_finding(environ, gate), r3_finding()]


def gate_finding(environ: Mapping[str, str], gate: Gate) -> Finding:
    return gate_check("R3 route check", environ, gate, f"in jobs with {R3}, each micro-batch's routes are checked "
                      "before the actor replays them, and actor/rollout_actor_route_agreement is logged every step",
                      "R3 routes are replayed unchecked and their agreement with the actor's router is not logged")


def r3_finding() -> Finding:
    path = find_module_file(REPLAY_UTILS)
    definition = definition_in_file(path, "build_r3_replay_mask") if path else None
    if definition is None:
        return Finding.check("R3 replay in verl", INFO, f"{REPLAY_UTILS}:build_r3_replay_mask not found: this verl "
                             "has no R3 replay for the route check to check")
    return Finding.check("R3 replay in verl", OK, f"{definition.where}: R3 replays the rollout's routes in the "
                         f"Megatron actor; the route check acts only where a job turns it on ({R3})")
