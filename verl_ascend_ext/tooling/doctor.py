"""`verl-ascend doctor`: what will happen on this install, predicted without importing torch or verl.

Reads package metadata, entry points, environment variables and installed source files only, so it
runs in well under a second on a CPU login node and predicts what the NPU nodes will do.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from collections.abc import Mapping
from typing import Any

from verl_ascend_ext.features.device.node_inventory import DISTRIBUTIONS, has_entry_point, versions
from verl_ascend_ext.patching.engine import installed_version
from verl_ascend_ext.patching.gates import DISABLE_ENV, Gate, GateValueError, Setting, is_default
from verl_ascend_ext.patching.prediction import predict_all
from verl_ascend_ext.patching.record import NEEDS_ATTENTION, Status
from verl_ascend_ext.patching.source import find_module_file
from verl_ascend_ext.runtime.boot import PLUGIN_POLICY_ENV, VERL_ENTRY_POINT, verl_policy_allows
from verl_ascend_ext.runtime.findings import Finding
from verl_ascend_ext.runtime.hookspecs import FEATURE_GROUP
from verl_ascend_ext.runtime.registry import FeatureDeclarationError, plugin_manager, registry
from verl_ascend_ext.tooling.ascend_env import ascend_findings, ascend_report, duplicate_findings, format_section
from verl_ascend_ext.tooling.selftest import store as selftest_store
from verl_ascend_ext.tooling.tables import table

VLLM_ENTRY_POINT = "verl_ascend_ext"
VLLM_PLUGINS_ENV = "VLLM_PLUGINS"


def unregistered_features() -> list[str]:
    """Problems for feature declarations of this package's source tree that no entry point names (stale install).

    A feature added to the checkout reaches the registry only once the package is reinstalled (the entry point
    is package metadata); until then discovery, doctor and the catalogue silently leave it out. A stale
    ``*.egg-info`` in the current directory shadows the installed metadata the same way for ``python -m``.
    """
    from pathlib import Path

    import verl_ascend_ext.features as features

    root = Path(features.__file__).parent
    named = {ep.value.partition(":")[0] for ep in importlib.metadata.entry_points(group=FEATURE_GROUP)}
    try:
        meta = importlib.metadata.distribution("verl-ascend-ext")
        source = str(getattr(meta, "_path", "")) or "the installed metadata"
    except importlib.metadata.PackageNotFoundError:
        source = "the installed metadata"
    problems = []
    for declaration in sorted(root.rglob("declaration.py")):
        module = ".".join(("verl_ascend_ext", "features", *declaration.relative_to(root).with_suffix("").parts))
        if module not in named:
            problems.append(f"feature {module} ({declaration}) is in the source tree but no '{FEATURE_GROUP}' entry "
                            f"point names it ({source} is older than the checkout): add it to pyproject.toml and "
                            "reinstall (pip install -e .); a stale *.egg-info in the directory you run from hides "
                            "new entry points too: delete it")
    return problems


def plugin_report(environ: Mapping[str, str]) -> dict[str, Any]:
    """Whether verl and vLLM will load this plugin in a process started with ``environ``."""
    problems: list[str] = []
    verl_init = find_module_file("verl") if installed_version("verl") else None
    discovery = bool(verl_init) and '"verl.plugins"' in verl_init.read_text(encoding="utf-8")
    if not verl_init:
        problems.append("verl is not installed")
    elif not discovery:
        problems.append(f"this verl ({installed_version('verl')}) has no 'verl.plugins' entry-point discovery; "
                        "use verl >= 0.9.0")
    registered = has_entry_point("verl.plugins", VERL_ENTRY_POINT)
    if not registered:
        problems.append("entry point verl.plugins:ascend_ext is not registered: reinstall verl-ascend-ext")
    policy = environ.get(PLUGIN_POLICY_ENV, "auto").strip().lower()
    allowed = verl_policy_allows(environ)
    if not allowed:
        problems.append(f"{PLUGIN_POLICY_ENV}={environ.get(PLUGIN_POLICY_ENV)!r} excludes this plugin; "
                        f"unset it or add '{VERL_ENTRY_POINT}'")
    verl_loads = discovery and registered and allowed
    problems += unregistered_features()
    problems += invalid_version_ranges()
    problems += stale_boot_manifest()

    vllm_installed = installed_version("vllm") is not None
    vllm_registered = has_entry_point("vllm.general_plugins", VLLM_ENTRY_POINT)
    vllm_allow_raw = environ.get(VLLM_PLUGINS_ENV)
    vllm_allowed = vllm_allow_raw is None or VLLM_ENTRY_POINT in {p.strip() for p in vllm_allow_raw.split(",")}
    if vllm_installed and not vllm_allowed:
        problems.append(f"{VLLM_PLUGINS_ENV}={vllm_allow_raw!r} excludes this plugin; add '{VLLM_ENTRY_POINT}' "
                        "(and 'ascend') to it")
    if vllm_installed and not vllm_registered:
        problems.append("entry point vllm.general_plugins:verl_ascend_ext is not registered: reinstall verl-ascend-ext")
    return {
        "verl_discovery": discovery,
        "verl_entry_point": registered,
        "verl_policy": policy,
        "verl_will_load": verl_loads,
        "vllm_installed": vllm_installed,
        "vllm_entry_point": vllm_registered,
        "vllm_will_load": vllm_installed and vllm_registered and vllm_allowed,
        "features": sorted(name for name, _ in plugin_manager().list_name_plugin() if not name.startswith("_")),
        "feature_distributions": dict(sorted(plugin_manager().distributions.items())),
        "problems": problems,
    }


def invalid_version_ranges() -> list[str]:
    """Every record's version specifier parsed (boot parses only other distributions' records: ``registry``)."""
    from verl_ascend_ext.runtime.registry import check_versions

    out = []
    try:
        records = registry().records
    except FeatureDeclarationError:
        return out  # reported by the feature checks above
    for record in records:
        try:
            check_versions(record, f"patch '{record.id}' (feature {record.feature})")
        except FeatureDeclarationError as err:
            out.append(str(err))
    return out


def stale_boot_manifest() -> list[str]:
    """A problem when the installed boot manifest differs from the declarations (every process booting from it would
    stop at the first import of a target)."""
    from verl_ascend_ext.runtime import boot_plan

    try:
        differences = boot_plan.stale(registry())
    except FeatureDeclarationError:
        return []  # reported by the feature checks above
    if not differences:
        return []
    return [f"{boot_plan.MANIFEST_FILE} is stale ({'; '.join(differences)}): processes booting from it stop at the "
            "first import of a target; regenerate it with `verl-ascend boot-manifest --write` or reinstall "
            "verl-ascend-ext"]


def _value_row(gate: Gate | Setting, environ: Mapping[str, str]) -> dict[str, Any]:
    """One variable's row: its raw value, parsed value, default, and whether the default was used and why."""
    raw = environ.get(gate.env)
    row: dict[str, Any] = {"env": gate.env, "raw": raw, "default": gate.default, "value": gate.default,
                           "error": None,
                           "default_used": None if not is_default(raw) else ("unset" if raw is None else "empty")}
    if not is_default(raw):
        try:
            row["value"] = gate.read(environ)
        except GateValueError as err:
            row["value"], row["error"] = None, str(err)
    return row


def gate_report(environ: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every declared gate with its raw and parsed value and the distribution that declared it; ``default_used`` is
    "unset" or "empty" when the default applies (a set-but-empty value means the default, as ``${VAR:-default}``),
    else None."""
    from verl_ascend_ext.runtime.boot import RUNTIME_GATES

    declared_by = registry().declared_by
    return [{**_value_row(gate, environ), "declared_by": declared_by.get(gate.env, "verl-ascend-ext (runtime)")}
            for gate in (*registry().gates, *RUNTIME_GATES)]


def setting_report(environ: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every declared setting (non-boolean variable), as ``gate_report`` gives the gates, plus its unit."""
    declared_by = registry().declared_by
    return [{**_value_row(setting, environ), "unit": setting.unit, "declared_by": declared_by.get(setting.env)}
            for setting in registry().settings]


def _with_unit(value: Any, unit: str) -> str:
    shown = f"{value:g}" if isinstance(value, float) else str(value)
    return f"{shown} {unit}".rstrip()


def _raw_cell(row: dict[str, Any]) -> str:
    if row["default_used"] == "unset":
        return "unset"
    if row["default_used"] == "empty":
        return f"{row['raw']!r} (empty: default used)"
    return repr(row["raw"])


def feature_findings(environ: Mapping[str, str]) -> list[Finding]:
    """The features' ``verl_ascend_ext_doctor_findings`` for ``environ`` (each must be a ``Finding``)."""
    found = []
    for batch in plugin_manager().hook.verl_ascend_ext_doctor_findings(environ=environ):
        for finding in batch:
            if not isinstance(finding, Finding):
                raise TypeError(f"a verl_ascend_ext_doctor_findings implementation returned {finding!r}; return "
                                "verl_ascend_ext.runtime.findings.Finding objects, "
                                "e.g. Finding.check(name, status, detail)")
            found.append(finding)
    return found


def build_report(environ: Mapping[str, str] | None = None) -> tuple[dict[str, Any], int]:
    """The doctor report and its exit code (0 fine, 1 plugin will not load or a patch is refused, 2 bad input)."""
    from verl_ascend_ext.runtime import discovery
    from verl_ascend_ext.runtime.boot import RUNTIME_GATES

    env = dict(os.environ if environ is None else environ)
    discovery.scan(discovery.FEATURE_GROUP, fresh=True)  # what is installed now (and the boot's cache, rewritten)
    reg = registry()

    predictions = predict_all(reg.records, env, gates=(*reg.gates, *RUNTIME_GATES, *reg.settings))
    errors = predictions.errors
    gates = gate_report(env)
    settings = setting_report(env)
    patches = [{**status.as_dict(), "declared_by": reg.declared_by.get(status.id)} for status in predictions.statuses]
    findings = feature_findings(env)
    ascend = ascend_report(env)
    findings += ascend_findings(ascend, installed_version("torch_npu"), env)
    duplicates, duplicate_checks = duplicate_findings((*DISTRIBUTIONS, "verl-ascend-ext"))
    findings += duplicate_checks
    blocking = any(f.blocking for f in findings)
    plugin = plugin_report(env)
    report = {
        "versions": versions(),
        "ascend": ascend,
        "duplicates": duplicates,
        "plugin": plugin,
        "gates": gates,
        "settings": settings,
        "disable": env.get(DISABLE_ENV, ""),
        "disable_raw": env.get(DISABLE_ENV),
        "patches": patches,
        "findings": [f.as_check() for f in findings],
        "errors": errors,
        "selftest": selftest_store.report_section(env),  # shown, never changes the exit code
    }
    if errors:
        code = 2
    elif (not plugin["verl_will_load"] or plugin["problems"]
          or any(s.status is Status.REFUSED for s in predictions.statuses) or blocking):
        code = 1
    else:
        code = 0
    report["exit_code"] = code
    return report, code


def format_report(report: dict[str, Any]) -> str:
    out = ["verl-ascend doctor", "", "Versions"]
    out.append(table([[k, v] for k, v in report["versions"].items()], ["package", "version"]))
    plugin = report["plugin"]
    out += ["", "Plugin",
            f"  verl will load it:  {'yes' if plugin['verl_will_load'] else 'NO'} "
            f"(discovery {'yes' if plugin['verl_discovery'] else 'no'}, entry point "
            f"{'registered' if plugin['verl_entry_point'] else 'missing'}, "
            f"{PLUGIN_POLICY_ENV}={plugin['verl_policy']})",
            f"  vLLM will load it:  {'yes' if plugin['vllm_will_load'] else 'no'}"
            + ("" if plugin["vllm_installed"] else " (vLLM not installed)"),
            f"  features:           {', '.join(plugin['features'])}"]
    out += [f"  problem: {p}" for p in plugin["problems"]]
    out += format_section(report["ascend"])
    out += ["", "Gates"]
    out.append(table([[g["env"], "INVALID" if g["error"] else ("on" if g["value"] else "off"),
                        _raw_cell(g), "on" if g["default"] else "off"]
                       for g in report["gates"]], ["variable", "value", "raw", "default"]))
    disable = report["disable_raw"]
    out.append(f"kill switch {DISABLE_ENV}: " + ("unset (nothing disabled)" if disable is None else
               f"{disable!r} (empty: default used, nothing disabled)" if is_default(disable) else repr(disable)))
    if report["settings"]:
        out += ["", "Settings"]
        out.append(table([[s["env"], "INVALID" if s["error"] else _with_unit(s["value"], s["unit"]), _raw_cell(s),
                           _with_unit(s["default"], s["unit"])] for s in report["settings"]],
                         ["variable", "value", "raw", "default"]))
    out += ["", "Patches (predicted for a process started with this environment)"]
    out.append(table([[p["id"], p["status"], p["target"], p["declared_by"]] for p in report["patches"]],
                     ["id", "status", "target", "declared by"]))
    for p in report["patches"]:
        if p["status"] in NEEDS_ATTENTION:
            out.append(f"  {p['id']}: {p['detail']}")
    if report["findings"]:
        out += ["", "Checks"]
        out.append(table([[f["name"], f["status"], f["detail"]] for f in report["findings"]],
                          ["check", "status", "detail"]))
    out += selftest_store.format_section(report["selftest"])
    for err in report["errors"]:
        out += ["", f"error: {err}"]
    out += ["", {0: "OK", 1: "PROBLEMS FOUND (exit 1)", 2: "INVALID ENVIRONMENT (exit 2)"}[report["exit_code"]]]
    return "\n".join(out)


def main(as_json: bool = False) -> int:
    try:
        report, code = build_report()
    except FeatureDeclarationError as err:  # a feature package declares something contradictory: it is named
        report = {"errors": [f"feature declaration: {err}"], "exit_code": 2}
        print(json.dumps(report, indent=2) if as_json else f"verl-ascend doctor\n\nerror: {report['errors'][0]}\n\n"
              "INVALID FEATURE DECLARATION (exit 2)")
        return 2
    print(json.dumps(report, indent=2) if as_json else format_report(report))
    return code
