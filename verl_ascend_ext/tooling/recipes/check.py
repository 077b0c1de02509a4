"""`verl-ascend recipe check`: everything that can be checked before a cluster is spent.

Config (composed against the installed verl), the node layout of fully-async recipes, manifest
(installed versions and git commits; CANN and NNAL on NPU nodes), R2 router replay support, vLLM-Ascend's extra
clean-up after sleep, gates, the
plugin's discovery and, unless ``--no-device``, the device and, on an NPU node, ``verl-ascend selftest`` of the
patches the recipe turns on (``--skip-selftest`` skips it and the report says so).
Any ``error`` finding makes the exit code 1.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verl_ascend_ext.patching.engine import installed_version
from verl_ascend_ext.patching.source import definition_in_file, find_module_file
from verl_ascend_ext.runtime.findings import ERROR, NOT_CHECKED, OK, WARN, Finding, Severity
from verl_ascend_ext.tooling.recipes import get_recipe
from verl_ascend_ext.tooling.recipes.cann import cann_findings
from verl_ascend_ext.tooling.recipes.manifest import Manifest, check_manifest, load_manifest
from verl_ascend_ext.tooling.recipes.sleep_cleanup import sleep_cleanup_findings

R2_MODULE = "verl.utils.megatron.router_replay_utils"
R2_FUNCTION = "merge_router_topk_indices"
DEVICE_PROBES = {
    "npu": "import torch, torch_npu; print(torch.npu.device_count())",
    "gpu": "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)",
}


def model_scoped_r2() -> tuple[bool, str]:
    """Whether the installed verl has model-scoped, opt-in R2 router replay (verl #7805), by its code.

    Recognised by the RECORD path collecting routes from the forwarded model: ``merge_router_topk_indices``
    takes ``model`` and walks ``iter_model_routers(model)``. Without it, R2 reads routers from a
    process-global registry and records routes of the wrong model chunks (what #7805 fixed).
    """
    path = find_module_file(R2_MODULE)
    if path is None:
        return False, f"{R2_MODULE} is not in this verl ({installed_version('verl')})"
    definition = definition_in_file(path, R2_FUNCTION)
    if definition is None:
        return False, f"{path} has no {R2_FUNCTION}"
    signature = definition.text.split(":", 1)[0]
    if re.search(r"\bmodel=None\b", signature) and "iter_model_routers(model)" in definition.text:
        return True, f"{definition.where}: routes recorded from the forwarded model (verl #7805)"
    return False, (f"{definition.where}: {R2_FUNCTION} records routes from the process-global router registry, "
                   "not from the forwarded model (no verl #7805)")


def _router_replay_modes(node: Any, prefix: str = "") -> dict[str, Any]:
    found: dict[str, Any] = {}
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if key == "router_replay" and isinstance(value, dict) and "mode" in value:
                found[f"{path}.mode"] = value["mode"]
            else:
                found.update(_router_replay_modes(value, path))
    return found


def router_replay_findings(config: Any, setters: Mapping[str, Any]) -> list[Finding]:
    from omegaconf import OmegaConf

    modes = _router_replay_modes(OmegaConf.to_container(config, resolve=False))
    r2 = [key for key, mode in modes.items() if mode == "R2"]
    if not r2:
        used = sorted({str(m) for m in modes.values()} - {"disabled"})
        return [Finding("router_replay", "mode", OK, f"R2 not requested (modes in use: {', '.join(used) or 'none'})")]
    supported, evidence = model_scoped_r2()
    findings = []
    for key in r2:
        setter = setters.get(key)
        if supported:
            findings.append(Finding("router_replay", key, OK, f"R2 supported: {evidence}",
                                    getattr(setter, "text", None), getattr(setter, "source", None)))
        else:
            findings.append(Finding(
                "router_replay", key, ERROR,
                f"refusing R2 router replay: this verl ({installed_version('verl')}) lacks the model-scoped, "
                f"opt-in R2 of verl #7805 ({evidence}). Use mode=R3 with "
                "actor_rollout_ref.rollout.enable_rollout_routing_replay=True, or a verl that has #7805.",
                getattr(setter, "text", None), getattr(setter, "source", None)))
    return findings


def gate_findings(manifest: Manifest, script: Path, environ: Mapping[str, str]) -> list[Finding]:
    from verl_ascend_ext.runtime.registry import registry
    from verl_ascend_ext.tooling.doctor import gate_report, setting_report

    findings = []
    declared = {g.env for g in registry().gates}
    text = script.read_text(encoding="utf-8")
    for gate in manifest.gates:
        exported = re.search(rf"^\s*export {re.escape(gate)}=(1|true|yes|on)\s*$", text, re.M | re.I)
        if not exported:
            findings.append(Finding("gates", gate, ERROR, f"the recipe needs {gate} on but {script.name} does not "
                                    f"export it (add 'export {gate}=1')"))
        elif gate in declared:
            findings.append(Finding("gates", gate, OK, f"exported by {script.name}; declared by an installed feature"))
        else:
            findings.append(Finding("gates", gate, WARN, f"exported by {script.name}, but no installed "
                                    "verl-ascend-ext feature declares it (verl reads it itself only where its "
                                    "in-tree patch exists)"))
    rows = {row["env"]: row for row in gate_report(environ)}
    for gate in manifest.expects:
        row = rows.get(gate)
        if row is None:
            findings.append(Finding("gates", gate, WARN, "the recipe relies on this gate, but no installed "
                                    "verl-ascend-ext feature declares it"))
        elif row["error"] is None and not row["value"]:
            findings.append(Finding("gates", gate, ERROR, f"the recipe relies on {gate}, which is off in this "
                                    f"environment ({gate}={row['raw']!r}); unset it or set it to 1"))
        elif row["error"] is None:
            findings.append(Finding("gates", gate, OK, "on (the recipe relies on it)"))
    for row in (*rows.values(), *setting_report(environ)):
        if row["error"]:
            findings.append(Finding("gates", row["env"], ERROR, row["error"]))
    findings += expected_patch_findings(manifest, environ)
    for var, values in manifest.forbids:
        raw = environ.get(var)
        if raw is not None and raw.strip().lower() in values:
            findings.append(Finding("gates", var, ERROR, f"{var}={raw!r} switches off what this recipe relies on "
                                    f"(see {manifest.path.name}); unset it or use error/warn"))
    return findings


def expected_patch_findings(manifest: Manifest, environ: Mapping[str, str]) -> list[Finding]:
    """Patches the recipe relies on must be predicted on (not off by kill switch or gate, refused or undecided)."""
    if not manifest.expects_patches:
        return []
    from verl_ascend_ext.patching.gates import DISABLE_ENV
    from verl_ascend_ext.patching.prediction import predict_all
    from verl_ascend_ext.patching.record import NEEDS_ATTENTION, OFF
    from verl_ascend_ext.runtime.registry import registry

    reg = registry()
    predictions = predict_all(reg.records, environ)
    if predictions.disable_error:
        return [Finding("gates", DISABLE_ENV, ERROR, predictions.disable_error)]
    findings = []
    known = {r.id for r in reg.records}
    for patch_id in manifest.expects_patches:
        if patch_id not in known:
            findings.append(Finding("gates", patch_id, WARN, "the recipe relies on this patch, but no installed "
                                    "verl-ascend-ext feature declares it"))
            continue
        status = predictions.of(patch_id)
        if status.status in OFF | NEEDS_ATTENTION:
            findings.append(Finding("gates", patch_id, ERROR, f"the recipe relies on patch {patch_id}, predicted "
                                    f"{status.status}: {status.detail}"))
        else:
            findings.append(Finding("gates", patch_id, OK, f"predicted {status.status} (the recipe relies on it)"))
    return findings


def plugin_findings(environ: Mapping[str, str]) -> list[Finding]:
    from verl_ascend_ext.tooling.doctor import plugin_report

    report = plugin_report(environ)
    if report["problems"]:
        return [Finding("plugin", "discovery", ERROR, problem) for problem in report["problems"]]
    return [Finding("plugin", "discovery", OK, f"verl will load verl-ascend-ext (features: "
                    f"{', '.join(report['features']) or 'none'})")]


def device_finding(device: str, no_device: bool) -> Finding:
    if no_device:
        return Finding("device", device, NOT_CHECKED, "--no-device: this is not a training node")
    try:
        proc = subprocess.run([sys.executable, "-c", DEVICE_PROBES[device]], capture_output=True, text=True,
                              timeout=300)
    except subprocess.TimeoutExpired:
        return Finding("device", device, ERROR, f"probing for {device} devices timed out")
    count = proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout.strip() else "0"
    if proc.returncode != 0 or not count.isdigit() or int(count) == 0:
        why = (proc.stderr.strip().splitlines() or ["no device"])[-1] if proc.returncode else f"{count} devices"
        return Finding("device", device, ERROR,
                       f"no {device.upper()} available here ({why}). Run on a training node, or pass --no-device "
                       "to check only what a login node can check")
    return Finding("device", device, OK, f"{count} {device.upper()} device(s) visible")


SELFTEST_TIMEOUT = 600.0  # seconds; the selftest takes under a minute on one NPU (docs/selftest.md)


def selftest_findings(manifest: Manifest, device: str, no_device: bool, skip: bool, device_ok: bool,
                      environ: Mapping[str, str]) -> list[Finding]:
    """``verl-ascend selftest`` on this NPU for the patches this recipe's process will apply, as findings.

    A fix that FAILS blocks the launch (error); a selftest that could not run warns (it proves nothing either way).
    """
    subject = "numeric fixes"
    if skip:
        return [Finding("selftest", subject, NOT_CHECKED, "skipped (--skip-selftest): the fixes were not checked on "
                        "this node's stack")]
    if no_device:
        return [Finding("selftest", subject, NOT_CHECKED, "not run: --no-device (not a training node); run "
                        "`verl-ascend selftest` on one NPU node before the job")]
    if device != "npu":
        return [Finding("selftest", subject, NOT_CHECKED, f"not run: the selftest checks the vLLM-Ascend fixes on an "
                        f"NPU, and this check is for {device}")]
    if not device_ok:
        return [Finding("selftest", subject, NOT_CHECKED, "not run: no NPU found here (see [device])")]
    from verl_ascend_ext.patching.prediction import predict_all
    from verl_ascend_ext.patching.record import Status
    from verl_ascend_ext.runtime.registry import registry
    from verl_ascend_ext.tooling.selftest.checks import check_for

    env = {**environ, **{gate: "1" for gate in manifest.gates}}  # the run script exports them
    predictions = predict_all(registry().records, env)
    ids = [r.id for r in registry().records
           if check_for(r) is not None and predictions.of(r.id).status is Status.WILL_APPLY]
    if not ids:
        return [Finding("selftest", subject, NOT_CHECKED, "not run: this recipe applies no patch the selftest checks "
                        "on this install")]
    command = [sys.executable, "-m", "verl_ascend_ext.tooling.selftest", "--json", "--device", "npu", "--only",
               ",".join(ids)]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=SELFTEST_TIMEOUT, env=dict(environ))
    except subprocess.TimeoutExpired:
        return [Finding("selftest", subject, WARN, f"could not run: `{' '.join(command[2:])}` did not finish in "
                        f"{SELFTEST_TIMEOUT:.0f} s")]
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return [Finding("selftest", subject, WARN, f"could not run: the selftest process exited {proc.returncode} "
                        f"without a report ({tail})")]
    severity = {"holds": OK, "FAILS": ERROR, "not run": NOT_CHECKED, "could not run": WARN}
    findings = [Finding("selftest", f"{line['record']} {line['mode']}", severity.get(line["status"], WARN),
                        f"{line['status']}: {line['detail']}") for line in report.get("lines", [])]
    findings += [Finding("selftest", subject, WARN, err) for err in report.get("errors", [])]
    if report.get("exit_code") == 2 and not findings:
        findings.append(Finding("selftest", subject, WARN, "could not run: nothing was checked"))
    return findings


def run_check(name: str, *, user_overrides: list[str] | None = None, no_device: bool = False,
              device: str | None = None, script: Path | None = None, validate: bool = True,
              environ: Mapping[str, str] | None = None, skip_selftest: bool = False) -> tuple[dict[str, Any], int]:
    """The check report and its exit code (0: launchable as far as checked here, 1: blocking findings)."""
    from verl_ascend_ext.tooling.recipes.compose import (
        FULLY_ASYNC_ENTRY,
        RecipeScriptError,
        Tagged,
        check_config,
        script_overrides,
        split_config_name,
    )

    env = dict(os.environ if environ is None else environ)
    recipe = get_recipe(name)
    script = Path(script) if script else recipe.script
    manifest = load_manifest(script.parent / "manifest.toml" if (script.parent / "manifest.toml").is_file()
                             else recipe.manifest)
    if device is None:  # as the run scripts decide: DEVICE, else NPU when torch_npu is importable
        npu_here = importlib.util.find_spec("torch_npu") is not None
        device = env.get("DEVICE") or ("npu" if npu_here or "gpu" not in manifest.devices else "gpu")
    env.setdefault("DEVICE", device)
    verl = installed_version("verl") or "not installed"
    findings: list[Finding] = []
    config_name = entry = None
    count = 0
    try:
        qualified, recipe_overrides = script_overrides(script, env)
    except RecipeScriptError as err:
        findings.append(Finding("config", str(script), ERROR, str(err)))
    else:
        entry, config_name = split_config_name(qualified)
        tagged = [Tagged(o, "recipe") for o in recipe_overrides] + [Tagged(o, "user") for o in user_overrides or []]
        count = len(tagged)
        result = check_config(config_name, tagged, verl_version=f"verl {verl}", validate=validate, entry=entry)
        findings += result.findings
        if result.config is not None:
            if entry == FULLY_ASYNC_ENTRY:
                from verl_ascend_ext.tooling.recipes.fully_async import layout_findings

                findings += layout_findings(result.config, result.setters)
            findings += router_replay_findings(result.config, result.setters)
            findings += sleep_cleanup_findings(result.config, result.setters, manifest)
    findings += check_manifest(manifest, device, no_device)
    findings += cann_findings(manifest.path, device, no_device, env)
    findings += gate_findings(manifest, script, env)
    findings += plugin_findings(env)
    device_check = device_finding(device, no_device)
    findings.append(device_check)
    findings += selftest_findings(manifest, device, no_device, skip_selftest, device_check.status is OK, env)
    code = 1 if any(f.blocking for f in findings) else 0
    report = {"recipe": name, "script": str(script), "manifest": str(manifest.path), "verl": verl,
              "device": device, "no_device": no_device, "entry": entry, "config_name": config_name, "overrides": count,
              "findings": [f.as_dict() for f in findings], "exit_code": code}
    return report, code


def format_report(report: dict[str, Any]) -> str:
    out = [f"verl-ascend recipe check {report['recipe']}",
           f"  script:   {report['script']}", f"  manifest: {report['manifest']}",
           f"  verl {report['verl']}, device {report['device']}" + (" (--no-device)" if report["no_device"] else ""),
           f"  {report['overrides']} overrides against {report['config_name']} (for {report['entry']})", ""]
    section = None
    for f in report["findings"]:
        if f["section"] != section:
            section = f["section"]
            out.append(f"[{section}]")
        out.append(f"  {f['status'].upper():<16} {f['subject']}: {f['detail']}")
        if f["override"]:
            out.append(f"  {'':<16} caused by {f['source']} override: {f['override']}")
    blocking = sum(1 for f in report["findings"] if Severity(f["status"]) is ERROR)
    warned = sum(1 for f in report["findings"] if Severity(f["status"]) is WARN)
    out += ["", f"{blocking} blocking problem(s), {warned} warning(s): "
            + ("DO NOT LAUNCH (exit 1)" if report["exit_code"] else "OK")]
    return "\n".join(out)
