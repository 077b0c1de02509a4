"""What the boot needs of the features, without loading them when only this package declares features.

Every process of a job boots, so where no other installed distribution declares features (the usual case) the
boot reads ``boot_manifest``: this package's gates, settings, each patch record's id, target, gate and how its runs
are observed, and its import hooks by import path, generated from the registry by ``verl-ascend boot-manifest``
(``tests/test_boot_manifest.py`` fails when it is stale). Neither pluggy nor a feature module is imported then:
a patch's full record is taken from the registry when its target is imported (``record``), and at that moment
the registry is compared with the manifest the boot used; a difference (a development install whose
declarations were edited) stops that import with an error naming the fix. Where another distribution declares
features, or this package's entry points are not the manifest's, the boot reads the registry itself.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from verl_ascend_ext.patching.gates import Gate, Setting
from verl_ascend_ext.runtime import boot_manifest, discovery

if TYPE_CHECKING:
    from verl_ascend_ext.patching.record import PatchRecord
    from verl_ascend_ext.runtime.registry import Registry

MANIFEST_FILE = "verl_ascend_ext/runtime/boot_manifest.py"


class Planned:
    """One patch as the boot needs it: id, target, target module, gate and how its runs are observed."""

    __slots__ = ("gate", "id", "module", "observed", "target")

    def __init__(self, patch_id: str, target: str, gate: Gate, observed: str) -> None:
        self.id, self.target, self.gate, self.observed = patch_id, target, gate, observed
        self.module = target.partition(":")[0]


class BootPlan:
    """Gates, settings, patches and import hooks to boot with (``booted_from_manifest`` says where they came
    from)."""

    __slots__ = ("gates", "import_hooks", "records", "settings")

    def __init__(self, gates: tuple[Gate, ...], settings: tuple[Setting, ...], records: tuple[Planned, ...],
                 import_hooks: tuple[tuple[str, Callable[[ModuleType], None]], ...]) -> None:
        self.gates, self.settings, self.records, self.import_hooks = gates, settings, records, import_hooks


_used_manifest = False


def booted_from_manifest() -> bool:
    """Whether this process's boot read the manifest (not the registry)."""
    return _used_manifest


def plan() -> BootPlan:
    """The plan from the manifest when this package's own features are the only ones installed, else from the
    registry."""
    global _used_manifest
    found = discovery.scan(discovery.FEATURE_GROUP)
    own = {(ep.name, ep.value) for dist, ep in found if dist == boot_manifest.DISTRIBUTION}
    if len(own) == len(found) and own == set(boot_manifest.FEATURES):
        _used_manifest = True
        return from_manifest()
    from verl_ascend_ext.runtime.registry import registry

    return from_registry(registry())


def from_manifest() -> BootPlan:
    gates = {env: Gate(env, default, "") for env, default in boot_manifest.GATES}
    settings = tuple(Setting(env, default, "", _resolve(parse), unit)
                     for env, default, parse, unit in boot_manifest.SETTINGS)
    records = tuple(Planned(patch_id, target, gates[gate], observed)
                    for patch_id, target, gate, observed in boot_manifest.RECORDS)
    hooks = tuple((module, _deferred(path)) for module, path in boot_manifest.IMPORT_HOOKS)
    return BootPlan(tuple(gates.values()), settings, records, hooks)


def from_registry(reg: Registry) -> BootPlan:
    records = tuple(Planned(r.id, r.target, r.gate, r.observed.value) for r in reg.records)
    return BootPlan(reg.gates, reg.settings, records, reg.import_hooks)


def record(patch_id: str) -> PatchRecord:
    """The registry's record ``patch_id``, once the registry was checked against the manifest the boot used."""
    from verl_ascend_ext.runtime.registry import registry

    reg = registry()
    if _used_manifest:
        _check_once(reg)
    return reg.record(patch_id)


def manifest_data(reg: Registry) -> dict[str, tuple]:
    """What ``boot_manifest`` must hold for ``reg`` (this package's features only, in registration order)."""
    return {
        "FEATURES": tuple(sorted((ep.name, ep.value) for dist, ep in discovery.scan(discovery.FEATURE_GROUP)
                                 if dist == boot_manifest.DISTRIBUTION)),
        "GATES": tuple((g.env, g.default) for g in reg.gates),
        "SETTINGS": tuple((s.env, s.default, import_path(s.parse), s.unit) for s in reg.settings),
        "RECORDS": tuple((r.id, r.target, r.gate.env, r.observed.value) for r in reg.records),
        "IMPORT_HOOKS": tuple((module, import_path(hook)) for module, hook in reg.import_hooks),
    }


def stale(reg: Registry) -> list[str]:
    """The manifest's names that differ from ``manifest_data(reg)``, each with what it holds and what it should."""
    return [f"{name}: holds {getattr(boot_manifest, name)!r}, the declarations give {value!r}"
            for name, value in manifest_data(reg).items() if getattr(boot_manifest, name) != value]


def import_path(function: Callable[..., Any]) -> str:
    """``module:name`` of a module-level function (what the manifest stores), or ValueError naming it."""
    path = f"{function.__module__}:{function.__qualname__}"
    try:
        found = _resolve(path)
    except (ImportError, AttributeError):
        found = None
    if found is not function:
        raise ValueError(f"{function!r} is not reachable as {path}: the boot manifest names a setting's parser and "
                         "an import hook by import path; make it a module-level function")
    return path


_checked = False


def _check_once(reg: Registry) -> None:
    global _checked
    if _checked:
        return
    differences = stale(reg)
    if differences:
        from verl_ascend_ext.runtime.registry import FeatureDeclarationError

        raise FeatureDeclarationError(
            f"{MANIFEST_FILE} (what this process booted with) does not match the features' declarations: "
            + "; ".join(differences) + ". Regenerate it with `verl-ascend boot-manifest --write` (a development "
            "install whose declarations were edited), or reinstall verl-ascend-ext.")
    _checked = True


def _resolve(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _deferred(path: str) -> Callable[[ModuleType], None]:
    """An import hook that imports its function (``module:name``) when it first runs."""

    def hook(module: ModuleType) -> None:
        _resolve(path)(module)

    hook.__qualname__ = f"deferred[{path}]"
    return hook
