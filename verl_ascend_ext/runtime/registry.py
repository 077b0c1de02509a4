"""The feature registry: loads every feature through pluggy and validates what they declare.

Built once per process and cached. Validation turns declaration mistakes (duplicate patch ids or
targets, a record whose gate nobody declared) into errors that name the feature at fault.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from types import ModuleType
from typing import NamedTuple

import pluggy
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from verl_ascend_ext.patching.gates import Gate, Setting
from verl_ascend_ext.patching.record import Action, Fingerprint, PatchRecord, split_target
from verl_ascend_ext.runtime import hookspecs


class FeatureDeclarationError(RuntimeError):
    """A feature declared records or gates that contradict each other."""


class Registry(NamedTuple):
    gates: tuple[Gate, ...]
    records: tuple[PatchRecord, ...]
    import_hooks: tuple[tuple[str, Callable[[ModuleType], None]], ...]
    settings: tuple[Setting, ...] = ()

    def record(self, patch_id: str) -> PatchRecord:
        for record in self.records:
            if record.id == patch_id:
                return record
        raise KeyError(patch_id)


def build_plugin_manager(extra_plugins: tuple[object, ...] = ()) -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.load_setuptools_entrypoints(hookspecs.FEATURE_GROUP)
    for plugin in extra_plugins:
        pm.register(plugin)
    pm.check_pending()
    return pm


def collect(pm: pluggy.PluginManager) -> Registry:
    gates: dict[str, Gate] = {}
    for batch in pm.hook.verl_ascend_ext_gates():
        for gate in batch:
            known = gates.get(gate.env)
            if known is not None and known.default != gate.default:
                raise FeatureDeclarationError(
                    f"gate {gate.env} is declared twice with different defaults ({known.default} and {gate.default})"
                )
            gates[gate.env] = gate
    records: dict[str, PatchRecord] = {}
    targets: dict[str, str] = {}
    for batch in pm.hook.verl_ascend_ext_patch_records():
        for record in batch:
            split_target(record.target)
            if record.id in records:
                raise FeatureDeclarationError(f"patch id '{record.id}' is declared twice")
            if record.target in targets:
                raise FeatureDeclarationError(
                    f"patches '{targets[record.target]}' and '{record.id}' both target {record.target}; "
                    "a target gets one patch"
                )
            declared = gates.get(record.gate.env)
            if declared is None:
                raise FeatureDeclarationError(
                    f"patch '{record.id}' (feature {record.feature}) uses gate {record.gate.env}, which no feature "
                    "declares"
                )
            if declared.default != record.gate.default:
                raise FeatureDeclarationError(
                    f"patch '{record.id}' (feature {record.feature}) carries gate {record.gate.env} with default "
                    f"{record.gate.default}, but it is declared with default {declared.default}; give the record "
                    "the declared Gate object"
                )
            _check_record(record)
            records[record.id] = record
            targets[record.target] = record.id
    for record in records.values():
        if bool(record.covered_shapes) != bool(record.covered_by):
            raise FeatureDeclarationError(
                f"patch '{record.id}' (feature {record.feature}) declares covered_shapes without covered_by or the "
                "reverse; give both: the shapes, and the records that fix the path in them")
        for field in ("serves", "needs", "covered_by"):
            for other in getattr(record, field):
                if records.get(other.id) != other:
                    raise FeatureDeclarationError(
                        f"patch '{record.id}' (feature {record.feature}) {field} patch '{other.id}', which is not "
                        "registered as given; reference the declared record object")
    hooks = tuple(pair for batch in pm.hook.verl_ascend_ext_import_hooks() for pair in batch)
    settings: dict[str, Setting] = {}
    for batch in pm.hook.verl_ascend_ext_settings():
        for setting in batch:
            if setting.env in gates or settings.get(setting.env, setting) != setting:
                raise FeatureDeclarationError(f"setting {setting.env} is declared twice (as a gate or another setting)")
            settings[setting.env] = setting
    return Registry(tuple(gates.values()), tuple(records.values()), hooks, tuple(settings.values()))


def _check_record(record: PatchRecord) -> None:
    """Field values a record cannot be applied with: an unknown action, a bad specifier, a pattern-less fingerprint."""
    where = f"patch '{record.id}' (feature {record.feature})"
    try:
        Action(record.action)
    except ValueError:
        raise FeatureDeclarationError(
            f"{where} has action {record.action!r}; use one of {', '.join(repr(a.value) for a in Action)} "
            "(verl_ascend_ext.patching.Action)") from None
    try:
        SpecifierSet(record.versions)
    except InvalidSpecifier as err:
        raise FeatureDeclarationError(
            f"{where} has versions {record.versions!r}, not a PEP 440 specifier set ({err}); "
            "write e.g. '>=0.9.0,<0.10'") from None
    shapes = [("original", record.original), ("fixed", record.fixed),
              *(("variant", v.original) for v in record.variants), *(("covered", c) for c in record.covered_shapes)]
    for field, shape in shapes:
        for fingerprint in _parts(shape):
            if not fingerprint.contains and not fingerprint.absent and not fingerprint.never:
                raise FeatureDeclarationError(
                    f"{where}: its {field} fingerprint has no patterns, so it recognises nothing; write patterns, "
                    "or Fingerprint.never_matching('why') for a fix no upstream release carries")


def _parts(fingerprint: Fingerprint) -> list[Fingerprint]:
    return [fingerprint, *(p for part in fingerprint.also for p in _parts(part))]


@lru_cache(maxsize=1)
def registry() -> Registry:
    """The validated registry of this process (features loaded from entry points)."""
    return collect(plugin_manager())


@lru_cache(maxsize=1)
def plugin_manager() -> pluggy.PluginManager:
    return build_plugin_manager()
