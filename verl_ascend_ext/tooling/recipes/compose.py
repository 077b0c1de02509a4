"""Check a recipe's Hydra overrides against the installed verl's own trainer config, on CPU.

Steps, each naming the override at fault:
1. parse every override on its own (a grammar error names no override when parsed together);
2. compose them with Hydra against the config directory of the recipe's entry point in the installed
   verl (``verl/trainer/config`` for ``verl.trainer.main_ppo``, ``verl/experimental/fully_async_policy/
   config`` for the fully-async main; Hydra stops at the first bad override: it is reported, dropped,
   and composition retried, so several mistakes show at once);
3. type check: verl's YAML is untyped and its dataclasses do not check types, so each override's
   value is compared with the default it replaces (bool, int, float, str; int may widen to float;
   a null default is checked against the dataclass field's annotation when verl is imported);
4. values still ``???`` (skipping sub-trees switched off with ``enable: false``) and unresolvable
   interpolations;
5. optionally the validation the entry point runs before Ray: verl's own ``validate_config``
   (CPU-safe; it imports verl, ~10 s); for the fully-async main also what it and its trainer and
   rollouter assert before any device work (see ``fully_async_validate``).
Hydra and OmegaConf are imported here only; the CLI imports this module for ``recipe check`` only.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import importlib.util
import io
import re
import subprocess
import sys
import types
import typing
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import OverrideParseException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from verl_ascend_ext.runtime.findings import ERROR, OK, WARN, Finding

EMIT_ENV = "VERL_ASCEND_RECIPE_EMIT"
DEFAULT_ENTRY = "verl.trainer.main_ppo"
FULLY_ASYNC_ENTRY = "verl.experimental.fully_async_policy.fully_async_main"
MAX_COMPOSE_ATTEMPTS = 8
_ABSENT = object()


class RecipeScriptError(RuntimeError):
    """The run script could not list its overrides."""


@dataclass(frozen=True)
class Tagged:
    text: str
    source: str  # "recipe" or "user"


@dataclass
class ConfigResult:
    findings: list[Finding] = field(default_factory=list)
    config: DictConfig | None = None
    config_dir: str = ""
    setters: dict[str, Tagged] = field(default_factory=dict)  # config key -> last override that set it


def split_config_name(qualified: str) -> tuple[str, str]:
    """``"<entry module>:<config name>"`` (or a bare config name, entry ``verl.trainer.main_ppo``)."""
    entry, _, name = qualified.rpartition(":")
    return entry or DEFAULT_ENTRY, name


def script_overrides(script: Path, environ: Mapping[str, str]) -> tuple[str, list[str]]:
    """Run ``script`` in emit mode: it prints its config name and overrides (NUL-separated) and exits.

    The config name may be qualified with the entry module the script launches, ``module:name``
    (see ``split_config_name``)."""
    env = dict(environ)
    env[EMIT_ENV] = "overrides"
    env.setdefault("PYTHON", sys.executable)
    try:
        proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RecipeScriptError(f"could not run {script} to list its overrides: {err}") from err
    if proc.returncode != 0:
        raise RecipeScriptError(f"{script} exited {proc.returncode} while listing its overrides "
                                f"({EMIT_ENV}=overrides): {proc.stderr.decode(errors='replace').strip()}")
    parts = proc.stdout.decode().split("\0")
    if len(parts) < 2 or parts[-1] != "":
        raise RecipeScriptError(f"{script} did not print its config name and overrides NUL-separated "
                                f"when {EMIT_ENV}=overrides; got {proc.stdout[:200]!r}")
    return parts[0], parts[1:-1]


def verl_config_dir(entry: str = DEFAULT_ENTRY) -> Path:
    """The ``config`` folder beside ``entry`` (a module of verl, whose ``hydra.main`` reads
    ``config_path="config"``) in the verl that ``import verl`` would load (found without importing it)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise RecipeScriptError("verl is not installed in this Python environment")
    package, *inner = entry.split(".")
    if package != "verl" or not inner:
        raise RecipeScriptError(f"entry point {entry!r} is not a module of verl")
    return Path(next(iter(spec.submodule_search_locations))).joinpath(*inner[:-1]) / "config"


def _compose(config_dir: Path, config_name: str, overrides: list[str]) -> DictConfig:
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            return compose(config_name=config_name, overrides=overrides)
    finally:
        GlobalHydra.instance().clear()


def _key(override: Override) -> str:
    return override.key_or_group


_KEY_PATTERNS = (
    (re.compile(r"Could not override '([^']+)'"), "unknown"),
    (re.compile(r"An item is already at '([^']+)'"), "exists"),
    (re.compile(r"Could not find '([^'/]+)/"), "group"),
    (re.compile(r"Could not delete from config\. '?([\w.]+)"), "delete"),
)


def _exception_chain(exc: BaseException) -> list[BaseException]:
    chain, seen = [], set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        chain.append(current)
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return chain


def _blame(exc: BaseException, active: list[tuple[Tagged, Override]]) -> tuple[int | None, str, str]:
    """(index into ``active`` of the override at fault, config key, kind) for a composition error."""
    message = str(exc)
    keys: list[tuple[str, str]] = [(m.group(1), kind) for rx, kind in _KEY_PATTERNS if (m := rx.search(message))]
    for err in _exception_chain(exc):
        full_key = getattr(err, "full_key", None) if isinstance(err, OmegaConfBaseException) else None
        if full_key:
            keys.append((str(full_key), "unknown"))
    wanted_type = {"exists": OverrideType.ADD, "unknown": OverrideType.CHANGE}
    for key, kind in keys:
        matches = [i for i, (_, ov) in enumerate(active)
                   if _key(ov) == key or _key(ov).startswith(key + ".") or key.startswith(_key(ov) + ".")]
        typed = [i for i in matches if active[i][1].type == wanted_type.get(kind, active[i][1].type)]
        if typed or matches:
            return (typed or matches)[0], key, kind
    return None, keys[0][0] if keys else "", keys[0][1] if keys else "other"


def _suggest(base: DictConfig | None, key: str) -> str:
    if base is None or "." not in key:
        return ""
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(base, parent_key, default=None, throw_on_missing=False,
                              throw_on_resolution_failure=False)
    if not isinstance(parent, DictConfig):
        return ""
    close = difflib.get_close_matches(leaf, [str(k) for k in parent], n=3)
    return f"; did you mean {', '.join(f'{parent_key}.{c}' for c in close)}?" if close else ""


def _composition_detail(kind: str, key: str, exc: BaseException, base: DictConfig | None, verl: str) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if kind == "unknown":
        return (f"'{key}' is not a key of this verl's config ({verl}){_suggest(base, key)} "
                f"To add a new key on purpose use '+{key}=...'. Hydra: {first}")
    if kind == "exists":
        return f"'{key}' already exists, so '+' cannot add it: drop the '+' (or use '++'). Hydra: {first}"
    if kind == "group":
        return f"config group option not found in this verl ({verl}): {' '.join(str(exc).split())}"
    return f"{type(exc).__name__}: {first}"


def _is_group_override(override: Override) -> bool:
    return "." not in _key(override) and override.type == OverrideType.CHANGE


def _shapes_composition(override: Override) -> bool:
    """Config-group choices and ``hydra.*`` settings (the search path): needed for the defaults too."""
    return _is_group_override(override) or _key(override).startswith("hydra.")


def _type_name(value: Any) -> str:
    return type(value).__name__ if value is not None else "null"


def _fits(default: Any, value: Any) -> bool:
    if value is None or (isinstance(value, str) and value.startswith("${")):
        return True
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, str):
        return not isinstance(value, (list, dict))
    if isinstance(default, (list, ListConfig)):
        return isinstance(value, list)
    if isinstance(default, (dict, DictConfig)):
        return isinstance(value, dict)
    return True


_SIMPLE = (bool, int, float, str)


def _annotation_types(base: DictConfig, key: str) -> tuple[type, ...] | None:
    """Simple types allowed by the dataclass field behind ``key`` (parent node has ``_target_``), if known."""
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(base, parent_key, default=None, throw_on_resolution_failure=False) if parent_key \
        else base
    target = parent.get("_target_") if isinstance(parent, DictConfig) else None
    if not isinstance(target, str):
        return None
    try:
        from hydra.utils import get_class

        hints = typing.get_type_hints(get_class(target))
    except Exception:
        return None
    hint = hints.get(leaf)
    union = typing.get_origin(hint) in (typing.Union, getattr(types, "UnionType", typing.Union))
    args = typing.get_args(hint) if union else (hint,)
    args = tuple(a for a in args if a is not type(None))
    return args if args and all(a in _SIMPLE for a in args) else None


def _type_findings(base: DictConfig, active: list[tuple[Tagged, Override]], use_annotations: bool) -> list[Finding]:
    findings = []
    for tagged, ov in active:
        if ov.type not in (OverrideType.CHANGE, OverrideType.FORCE_ADD) or ov.is_delete():
            continue
        key = _key(ov)
        if "." not in key and _is_group_override(ov):
            continue
        default = OmegaConf.select(base, key, default=_ABSENT, throw_on_missing=False,
                                   throw_on_resolution_failure=False)
        if default is _ABSENT:
            continue
        try:
            value = ov.value()
        except Exception:
            continue
        if (isinstance(value, str) and isinstance(default, str)) or value is None:
            continue
        if default is None or default == "???":
            allowed = _annotation_types(base, key) if use_annotations else None
            if allowed is None:
                continue
            widened = (float,) if float in allowed else ()
            ok = isinstance(value, allowed + widened) and not (isinstance(value, bool) and bool not in allowed)
            if not ok:
                findings.append(Finding(
                    "config", key, ERROR,
                    f"wrong type: {key} is declared {' | '.join(a.__name__ for a in allowed)}, the override gives "
                    f"{value!r} ({_type_name(value)})", tagged.text, tagged.source))
            continue
        if isinstance(default, int) and not isinstance(default, bool) and isinstance(value, float):
            # verl's YAML writes float fields with integral defaults as ints (top_p: 1): ask the dataclass.
            allowed = _annotation_types(base, key) if use_annotations else None
            if allowed is not None and float in allowed:
                continue
            findings.append(Finding(
                "config", key, ERROR if allowed is not None else WARN,
                f"{key} defaults to the int {default!r} and the override gives the float {value!r}"
                + (f"; the field is declared {' | '.join(a.__name__ for a in allowed)}" if allowed is not None
                   else " (field type unknown without importing verl; drop --skip-verl-validate to decide)"),
                tagged.text, tagged.source))
            continue
        if not _fits(default, value):
            findings.append(Finding(
                "config", key, ERROR,
                f"wrong type: {key} defaults to {default!r} ({_type_name(default)}), the override gives "
                f"{value!r} ({_type_name(value)})", tagged.text, tagged.source))
    return findings


def missing_keys(cfg: DictConfig | ListConfig, prefix: str = "") -> list[str]:
    """Keys whose value is ``???``, skipping sub-trees switched off by ``enable: false``."""
    if isinstance(cfg, DictConfig) and "enable" in cfg and not OmegaConf.is_missing(cfg, "enable"):
        node = cfg._get_node("enable")
        if node is not None and not node._is_interpolation() and node._value() is False:
            return []
    found = []
    keys = list(cfg.keys()) if isinstance(cfg, DictConfig) else list(range(len(cfg)))
    for k in keys:
        full = f"{prefix}.{k}" if prefix else str(k)
        if OmegaConf.is_missing(cfg, k):
            found.append(full)
            continue
        child = cfg._get_node(k)
        if isinstance(child, (DictConfig, ListConfig)) and not child._is_interpolation() and not child._is_none():
            found.extend(missing_keys(child, full))
    return found


def check_config(config_name: str, overrides: list[Tagged], *, verl_version: str, validate: bool,
                 entry: str = DEFAULT_ENTRY) -> ConfigResult:
    """Compose ``overrides`` against the installed verl's ``config_name`` (in the config folder of the
    ``entry`` module) and report every problem found."""
    result = ConfigResult()
    try:
        config_dir = verl_config_dir(entry)
    except RecipeScriptError as err:
        result.findings.append(Finding("config", entry, ERROR, str(err)))
        return result
    result.config_dir = str(config_dir)
    parser = OverridesParser.create()
    active: list[tuple[Tagged, Override]] = []
    for tagged in overrides:
        try:
            (parsed,) = parser.parse_overrides([tagged.text])
        except OverrideParseException as err:
            result.findings.append(Finding("config", tagged.text, ERROR,
                                           f"not a valid Hydra override: {str(err).strip().splitlines()[0]}",
                                           tagged.text, tagged.source))
            continue
        active.append((tagged, parsed))

    groups = [t.text for t, ov in active if _shapes_composition(ov)]
    try:
        base = _compose(config_dir, config_name, groups)
    except Exception:
        try:
            base = _compose(config_dir, config_name, [])
        except Exception as err:
            hint = ""
            if not any(_key(ov).startswith("hydra.searchpath") for _, ov in active) and "Could not load" in str(err):
                hint = (f" ({config_name} may look for its defaults on a search path relative to the working "
                        f"directory: add the override 'hydra.searchpath=[file://{verl_config_dir()}]')")
            result.findings.append(Finding("config", config_name, ERROR,
                                           f"cannot compose {config_name} from {config_dir}: "
                                           f"{' '.join(str(err).split())}{hint}"))
            return result

    cfg = None
    for _ in range(MAX_COMPOSE_ATTEMPTS):
        try:
            cfg = _compose(config_dir, config_name, [t.text for t, _ in active])
            break
        except Exception as err:
            index, key, kind = _blame(err, active)
            detail = _composition_detail(kind, key, err, base, verl_version)
            if index is None:
                result.findings.append(Finding("config", key or config_name, ERROR, detail))
                return result
            tagged, _ = active.pop(index)
            result.findings.append(Finding("config", key, ERROR, detail, tagged.text, tagged.source))
    if cfg is None:
        result.findings.append(Finding("config", config_name, ERROR,
                                       f"stopped after {MAX_COMPOSE_ATTEMPTS} composition errors"))
        return result
    result.config = cfg
    result.setters = {_key(ov): t for t, ov in active}

    result.findings += _type_findings(base, active, use_annotations=validate)
    for key in missing_keys(cfg):
        setter = result.setters.get(key)
        result.findings.append(Finding(
            "config", key, ERROR, f"required value {key} is missing (???): add the override '{key}=...'",
            setter.text if setter else None, setter.source if setter else None))
    try:
        OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:
        key = str(getattr(err, "full_key", "") or "")
        setter = result.setters.get(key)
        result.findings.append(Finding("config", key or config_name, ERROR,
                                       f"cannot resolve: {str(err).strip().splitlines()[0]}",
                                       setter.text if setter else None, setter.source if setter else None))
    if not any(f.blocking for f in result.findings):
        result.findings.append(Finding("config", config_name, OK,
                                       f"{len(overrides)} overrides compose against {config_dir} ({verl_version})"))
    if validate and not any(f.blocking for f in result.findings):
        if entry == FULLY_ASYNC_ENTRY:
            from verl_ascend_ext.tooling.recipes.fully_async import fully_async_validate

            result.findings += fully_async_validate(cfg)
        else:
            result.findings.append(verl_validate(cfg))
    return result


def verl_validate(cfg: DictConfig) -> Finding:
    """verl's own ``validate_config`` (what ``main_ppo`` runs before Ray), on a copy, stdout captured."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from verl.trainer.ppo.utils import need_critic, need_reference_policy
            from verl.utils.config import validate_config

            config = copy.deepcopy(cfg)
            validate_config(config, use_reference_policy=need_reference_policy(config),
                            use_critic=need_critic(config))
    except Exception as err:
        root = _exception_chain(err)[-1]
        text = " ".join(str(root).split()) or type(root).__name__
        return Finding("config", "validate_config", ERROR,
                       f"verl's validate_config rejects the config: {type(root).__name__}: {text}")
    notes = sorted({" ".join(str(w.message).split()) for w in caught})
    return Finding("config", "validate_config", OK, "verl's validate_config accepts the config"
                   + (f" (its warnings: {'; '.join(notes)})" if notes else ""))
