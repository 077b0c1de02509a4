"""The feature registry: loads every feature through pluggy and validates what they declare.

Built once per process and cached. Validation turns declaration mistakes (duplicate patch ids or
targets, a record whose gate nobody declared) into errors that name the feature at fault and the
distribution that declared it (``declared_by``: a third-party package registers features through the
same ``verl_ascend_ext.features`` entry-point group as this package's own).

Built in every process of a job, so it costs little: the entry points of the group are found by reading each
distribution's ``entry_points.txt`` once and parsing only those naming the group (``discovery``: a process has
~160 distributions; one or two declare features), pluggy is handed
only the ``@hookimpl`` functions of each feature module, and a record's version specifier is parsed with
``packaging`` only for records of other distributions: this package's own are constants, checked by its tests
(``tests/test_hookspecs.py``) and by ``verl-ascend doctor``, not again in each process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from functools import lru_cache
from types import MappingProxyType, ModuleType, SimpleNamespace
from typing import Any, NamedTuple

import pluggy

from verl_ascend_ext.patching.gates import Gate, Setting
from verl_ascend_ext.patching.record import Action, Fingerprint, PatchRecord, split_target
from verl_ascend_ext.runtime import discovery, hookspecs


class FeatureDeclarationError(RuntimeError):
    """A feature declared records or gates that contradict each other."""


class Registry(NamedTuple):
    gates: tuple[Gate, ...]
    records: tuple[PatchRecord, ...]
    import_hooks: tuple[tuple[str, Callable[[ModuleType], None]], ...]
    settings: tuple[Setting, ...] = ()
    # patch id, gate and setting variable -> the name of the distribution whose entry point declared it
    declared_by: Mapping[str, str] = MappingProxyType({})

    def record(self, patch_id: str) -> PatchRecord:
        for record in self.records:
            if record.id == patch_id:
                return record
        raise KeyError(patch_id)


UNPACKAGED = "(not installed: registered in-process)"  # a plugin registered by code, not from an entry point
OWN_DISTRIBUTION = "verl-ascend-ext"


class FeatureManager(pluggy.PluginManager):
    """pluggy's plugin manager for the feature hooks, which knows the distribution each feature came from."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT)
        self.add_hookspecs(hookspecs)
        self.distributions: dict[str, str] = {}  # plugin name -> name of the distribution whose entry point it is

    def load_features(self, group: str = hookspecs.FEATURE_GROUP) -> None:
        """Register every entry point of ``group`` (``discovery``: once per distribution name, the first on
        ``sys.path`` wins, as ``importlib.metadata.entry_points``)."""
        for dist, ep in discovery.scan(group):
            if self.get_plugin(ep.name) is None and not self.is_blocked(ep.name):
                self.register(hook_functions(ep.load()), name=ep.name)
                self.distributions[ep.name] = dist


def hook_functions(feature: ModuleType | object) -> object:
    """What pluggy registers for a feature module: its ``@hookimpl``-marked attributes only (pluggy reads every
    attribute of what it registers, statically: a declaration module holds dozens of names)."""
    if not isinstance(feature, ModuleType):
        return feature
    marker = f"{hookspecs.PROJECT}_impl"  # the attribute pluggy's HookimplMarker sets on a function
    marked = {name: value for name, value in vars(feature).items() if hasattr(value, marker)}
    return SimpleNamespace(__name__=feature.__name__, __file__=getattr(feature, "__file__", None), **marked)


def build_plugin_manager(extra_plugins: tuple[object, ...] = ()) -> FeatureManager:
    pm = FeatureManager()
    pm.load_features()
    for plugin in extra_plugins:
        pm.register(plugin)
    pm.check_pending()
    return pm


def declarer(pm: pluggy.PluginManager, plugin: object) -> str:
    """The name of the distribution whose entry point loaded feature ``plugin``, else ``UNPACKAGED``."""
    known = getattr(pm, "distributions", {})
    return known.get(pm.get_name(plugin) or "", UNPACKAGED)


def _results(pm: pluggy.PluginManager, hook: str, **kwargs: Any) -> Iterator[tuple[str, Any]]:
    """(declarer, item) for every item each implementation of ``hook`` returns: this package's features first,
    then other distributions' by name (the order never depends on ``sys.path``), each in pluggy's call order."""
    impls = [(declarer(pm, impl.plugin), impl) for impl in reversed(getattr(pm.hook, hook).get_hookimpls())]
    for who, impl in sorted(impls, key=lambda pair: (pair[0] != OWN_DISTRIBUTION, pair[0])):
        for item in impl.function(**kwargs) or ():
            yield who, item


def _by(who: str) -> str:
    return f"declared by distribution {who}" if who != UNPACKAGED else f"declared {who}"


def collect(pm: pluggy.PluginManager) -> Registry:
    gates: dict[str, Gate] = {}
    declared_by: dict[str, str] = {}
    for who, gate in _results(pm, "verl_ascend_ext_gates"):
        known = gates.get(gate.env)
        if known is not None and known.default != gate.default:
            raise FeatureDeclarationError(
                f"gate {gate.env} is declared twice with different defaults ({known.default}, "
                f"{_by(declared_by[gate.env])}; and {gate.default}, {_by(who)})"
            )
        gates[gate.env] = gate
        declared_by.setdefault(gate.env, who)
    records: dict[str, PatchRecord] = {}
    targets: dict[str, str] = {}
    for who, record in _results(pm, "verl_ascend_ext_patch_records"):
        where = f"patch '{record.id}' (feature {record.feature}, {_by(who)})"
        try:
            split_target(record.target)
        except ValueError as err:
            raise FeatureDeclarationError(f"{where}: {err}") from None
        if record.id in records:
            raise FeatureDeclarationError(
                f"patch id '{record.id}' is declared twice: {_by(declared_by[record.id])} and {_by(who)}; "
                "patch ids are unique across every installed feature package: rename one")
        if record.target in targets:
            other = targets[record.target]
            raise FeatureDeclarationError(
                f"patches '{other}' ({_by(declared_by[other])}) and '{record.id}' ({_by(who)}) both target "
                f"{record.target}; a target gets one patch"
            )
        declared = gates.get(record.gate.env)
        if declared is None:
            raise FeatureDeclarationError(
                f"{where} uses gate {record.gate.env}, which no feature declares; return it from the feature's "
                "verl_ascend_ext_gates hook"
            )
        if declared.default != record.gate.default:
            raise FeatureDeclarationError(
                f"{where} carries gate {record.gate.env} with default {record.gate.default}, but it is declared "
                f"with default {declared.default} ({_by(declared_by[record.gate.env])}); give the record the "
                "declared Gate object"
            )
        _check_record(record, who)
        records[record.id] = record
        targets[record.target] = record.id
        declared_by[record.id] = who
    for record in records.values():
        if bool(record.covered_shapes) != bool(record.covered_by):
            raise FeatureDeclarationError(
                f"patch '{record.id}' (feature {record.feature}) declares covered_shapes without covered_by or the "
                "reverse; give both: the shapes, and the records that fix the path in them")
        for field in ("serves", "needs", "covered_by"):
            for other in getattr(record, field):
                if records.get(other.id) != other:
                    raise FeatureDeclarationError(
                        f"patch '{record.id}' (feature {record.feature}, {_by(declared_by[record.id])}) {field} "
                        f"patch '{other.id}', which is not registered as given; reference the declared record object")
    hooks = tuple(pair for batch in pm.hook.verl_ascend_ext_import_hooks() for pair in batch)
    settings: dict[str, Setting] = {}
    for who, setting in _results(pm, "verl_ascend_ext_settings"):
        if setting.env in gates or settings.get(setting.env, setting) != setting:
            raise FeatureDeclarationError(f"setting {setting.env} ({_by(who)}) is declared twice (as a gate or "
                                          "another setting)")
        settings[setting.env] = setting
        declared_by.setdefault(setting.env, who)
    return Registry(tuple(gates.values()), tuple(records.values()), hooks, tuple(settings.values()),
                    MappingProxyType(declared_by))


def _check_record(record: PatchRecord, who: str) -> None:
    """Field values a record cannot be applied with: an unknown action, a bad specifier, a pattern-less fingerprint,
    a ``kept`` reason for a pattern the fingerprint does not hold."""
    where = f"patch '{record.id}' (feature {record.feature}, {_by(who)})"
    try:
        Action(record.action)
    except ValueError:
        raise FeatureDeclarationError(
            f"{where} has action {record.action!r}; use one of {', '.join(repr(a.value) for a in Action)} "
            "(verl_ascend_ext.patching.Action)") from None
    if who != OWN_DISTRIBUTION:  # this package's own: see the module's docstring
        check_versions(record, where)
    shapes = [("original", record.original), ("fixed", record.fixed),
              *(("variant", v.original) for v in record.variants), *(("covered", c) for c in record.covered_shapes)]
    for field, shape in shapes:
        for fingerprint in _parts(shape):
            if not fingerprint.contains and not fingerprint.absent and not fingerprint.never:
                raise FeatureDeclarationError(
                    f"{where}: its {field} fingerprint has no patterns, so it recognises nothing; write patterns, "
                    "or Fingerprint.never_matching('why') for a fix no upstream release carries")
    for shape in (record.original, record.fixed, *record.fixed_shapes):
        for fingerprint in _parts(shape):
            for pattern, reason in fingerprint.kept:
                if pattern not in fingerprint.patterns() or not reason.strip():
                    raise FeatureDeclarationError(
                        f"{where}: kept=({pattern!r}, {reason!r}) names no pattern of that fingerprint, or gives no "
                        "reason; list (pattern, why it is kept) for patterns of the same fingerprint")


def check_versions(record: PatchRecord, where: str) -> None:
    """``record.versions`` is a PEP 440 specifier set, or FeatureDeclarationError naming the record."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        SpecifierSet(record.versions)
    except InvalidSpecifier as err:
        raise FeatureDeclarationError(
            f"{where} has versions {record.versions!r}, not a PEP 440 specifier set ({err}); "
            "write e.g. '>=0.9.0,<0.10'") from None


def _parts(fingerprint: Fingerprint) -> list[Fingerprint]:
    return [fingerprint, *(p for part in fingerprint.also for p in _parts(part))]


@lru_cache(maxsize=1)
def registry() -> Registry:
    """The validated registry of this process (features loaded from entry points)."""
    return collect(plugin_manager())


@lru_cache(maxsize=1)
def plugin_manager() -> FeatureManager:
    return build_plugin_manager()
