"""What only a fully-async recipe needs checked: its node layout and the fully-async main's own checks.

verl's fully-async main (``verl.experimental.fully_async_policy.fully_async_main``) trains on one
Ray resource pool (``trainer.nnodes`` x ``trainer.n_gpus_per_node``) and generates on a disjoint
one (``rollout.nnodes`` x ``rollout.n_gpus_per_node``), copied into ``actor_rollout_ref.rollout``
at start. It does not run verl's ``validate_config`` (which would reject its
``data.train_batch_size=0``); what it, its trainer, its rollouter and its workers check before any
device work is reproduced by ``fully_async_validate``. ``layout_findings`` does the arithmetic a
launch would otherwise discover after the nodes are allocated: each pool's world size against the
parallel sizes (as upstream's GLM-5.2 script checks in bash), that the pools are disjoint, and
that the two sets of device counts agree. The layout check is pure config arithmetic (no verl import).
"""

from __future__ import annotations

import contextlib
import copy
import io
import warnings
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl_ascend_ext.runtime.findings import ERROR, OK, WARN, Finding

SECTION = "layout"
COPIED = ("nnodes", "n_gpus_per_node")  # rollout.<k> -> actor_rollout_ref.rollout.<k>, by the main


def _get(cfg: DictConfig, key: str, default: Any = None) -> Any:
    return OmegaConf.select(cfg, key, default=default, throw_on_resolution_failure=False)


def _blame(setters: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[str | None, str | None]:
    """The override behind a finding: a user's override of one of ``keys`` first, else the recipe's."""
    found = [setters[k] for k in keys if k in setters]
    chosen = next((t for t in found if t.source == "user"), found[0] if found else None)
    return (chosen.text, chosen.source) if chosen is not None else (None, None)


def _finding(status: str, subject: str, detail: str, setters: Mapping[str, Any], *keys: str) -> Finding:
    text, source = _blame(setters, keys)
    return Finding(SECTION, subject, status, detail, text, source)


def _positive_int(cfg: DictConfig, key: str) -> int | None:
    value = _get(cfg, key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _pool(cfg: DictConfig, setters: Mapping[str, Any], prefix: str, what: str) -> tuple[int | None, list[Finding]]:
    nodes_key, per_node_key = f"{prefix}.nnodes", f"{prefix}.n_gpus_per_node"
    nodes, per_node = _positive_int(cfg, nodes_key), _positive_int(cfg, per_node_key)
    if nodes is None or per_node is None:
        return None, [_finding(ERROR, f"{what} pool",
                               f"{nodes_key}={_get(cfg, nodes_key)!r} and {per_node_key}={_get(cfg, per_node_key)!r} "
                               "must both be positive integers (verl asserts it when creating the pool)",
                               setters, nodes_key, per_node_key)]
    return nodes * per_node, []


def _training_findings(cfg: DictConfig, setters: Mapping[str, Any], world: int, role: str) -> list[Finding]:
    base = f"actor_rollout_ref.{role}.megatron"
    sizes = {name: _get(cfg, f"{base}.{key}") for name, key in (
        ("TP", "tensor_model_parallel_size"), ("PP", "pipeline_model_parallel_size"),
        ("CP", "context_parallel_size"), ("EP", "expert_model_parallel_size"),
        ("ETP", "expert_tensor_parallel_size"))}
    if sizes["ETP"] is None:  # verl: null expert TP means "same as TP"
        sizes["ETP"] = sizes["TP"]
    keys = {"TP": "tensor_model_parallel_size", "PP": "pipeline_model_parallel_size", "CP": "context_parallel_size",
            "EP": "expert_model_parallel_size", "ETP": "expert_tensor_parallel_size"}
    bad = [n for n, v in sizes.items() if not isinstance(v, int) or isinstance(v, bool) or v <= 0]
    if bad:
        return [_finding(ERROR, f"training {role}", "parallel sizes must be positive integers: "
                         + ", ".join(f"{base}.{keys[n]}={sizes[n]!r}" for n in bad), setters,
                         *(f"{base}.{keys[n]}" for n in bad))]
    pool = (f"training world size {world} (trainer.nnodes={_get(cfg, 'trainer.nnodes')} x "
            f"trainer.n_gpus_per_node={_get(cfg, 'trainer.n_gpus_per_node')})")
    involved = ("trainer.nnodes", "trainer.n_gpus_per_node")
    findings = []
    dense = sizes["TP"] * sizes["PP"] * sizes["CP"]
    experts = sizes["ETP"] * sizes["EP"] * sizes["PP"]
    if world % dense:
        findings.append(_finding(
            ERROR, f"training {role}", f"{pool} is not divisible by TP*PP*CP = "
            f"{sizes['TP']}*{sizes['PP']}*{sizes['CP']} = {dense} (Megatron's data parallel size would be "
            f"{world / dense:g}); change the node count or the parallel sizes",
            setters, *involved, *(f"{base}.{keys[n]}" for n in ("TP", "PP", "CP"))))
    if world % experts:
        findings.append(_finding(
            ERROR, f"training {role}", f"{pool} is not divisible by ETP*EP*PP = {sizes['ETP']}*{sizes['EP']}*"
            f"{sizes['PP']} = {experts} (Megatron's expert data parallel size would be {world / experts:g}); change "
            "the node count or the parallel sizes", setters, *involved, *(f"{base}.{keys[n]}" for n in ("ETP", "EP"))))
    if not findings:
        findings.append(Finding(SECTION, f"training {role}", OK,
                                f"{pool}: TP{sizes['TP']} x PP{sizes['PP']} x CP{sizes['CP']} = {dense}, data parallel "
                                f"{world // dense}; experts ETP{sizes['ETP']} x EP{sizes['EP']} x PP{sizes['PP']} = "
                                f"{experts}, expert data parallel {world // experts}"))
    return findings


def _rollout_findings(cfg: DictConfig, setters: Mapping[str, Any], world: int) -> list[Finding]:
    base = "actor_rollout_ref.rollout"
    tp, dp, pp, ep = (_get(cfg, f"{base}.{k}") for k in (
        "tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size", "expert_parallel_size"))
    per_node = _get(cfg, "rollout.n_gpus_per_node")
    pool = (f"rollout world size {world} (rollout.nnodes={_get(cfg, 'rollout.nnodes')} x "
            f"rollout.n_gpus_per_node={per_node})")
    involved = ("rollout.nnodes", "rollout.n_gpus_per_node")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (tp, dp, pp)):
        return [_finding(ERROR, "rollout", f"{base} tensor/data/pipeline parallel sizes must be positive integers, got "
                         f"TP={tp!r} DP={dp!r} PP={pp!r}", setters, f"{base}.tensor_model_parallel_size",
                         f"{base}.data_parallel_size", f"{base}.pipeline_model_parallel_size")]
    replica = tp * dp * pp
    findings = []
    if world % tp:
        findings.append(_finding(ERROR, "rollout", f"{pool} is not divisible by the rollout TP = {tp}", setters,
                                 *involved, f"{base}.tensor_model_parallel_size"))
    if world < replica or world % replica:
        findings.append(_finding(
            ERROR, "rollout", f"{pool} is not a multiple of one vLLM replica, TP*DP*PP = {tp}*{dp}*{pp} = {replica}: "
            f"verl would start {world // replica} replica(s) and leave {world % replica} device(s) idle",
            setters, *involved, f"{base}.tensor_model_parallel_size", f"{base}.data_parallel_size"))
    if replica % min(per_node, replica):
        findings.append(_finding(
            ERROR, "rollout", f"one vLLM replica ({replica} devices) does not fill whole nodes of {per_node} devices "
            "(verl asserts it)", setters, *involved))
    if isinstance(ep, int) and ep > 1 and ep != tp * dp:
        findings.append(_finding(
            ERROR, "rollout", f"{base}.expert_parallel_size={ep} must equal TP*DP = {tp}*{dp} = {tp * dp} "
            "(verl's rollout config asserts it)", setters, f"{base}.expert_parallel_size"))
    if not findings:
        findings.append(Finding(SECTION, "rollout", OK,
                                f"{pool}: {world // replica} vLLM replica(s) of TP{tp} x DP{dp} x PP{pp} = {replica}"
                                + (f", EP{ep}" if isinstance(ep, int) and ep > 1 else "")))
    return findings


def layout_findings(cfg: DictConfig, setters: Mapping[str, Any]) -> list[Finding]:
    """The fully-async layout of a composed config; ``setters`` maps config keys to the overrides that set them."""
    findings: list[Finding] = []
    train_world, problems = _pool(cfg, setters, "trainer", "training")
    findings += problems
    rollout_world, problems = _pool(cfg, setters, "rollout", "rollout")
    findings += problems
    if train_world is not None:
        findings += _training_findings(cfg, setters, train_world, "actor")
        if _get(cfg, "actor_rollout_ref.actor.use_kl_loss") or _get(cfg, "algorithm.use_kl_in_reward"):
            findings += _training_findings(cfg, setters, train_world, "ref")
    if rollout_world is not None:
        findings += _rollout_findings(cfg, setters, rollout_world)

    if _get(cfg, "actor_rollout_ref.hybrid_engine") is not False:
        findings.append(_finding(ERROR, "pools", "actor_rollout_ref.hybrid_engine must be False: the fully-async "
                                 "trainer asserts it (training and rollout run on disjoint pools)", setters,
                                 "actor_rollout_ref.hybrid_engine"))
    shared = [k for k in ("use_trainer_do_validate", "use_dynamic_resource_scheduling")
              if _get(cfg, f"async_training.{k}")]
    if shared:
        findings.append(_finding(WARN, "pools", "rollout replicas will also run on the training pool ("
                                 + ", ".join(f"async_training.{k}=True" for k in shared)
                                 + "): the pools are not disjoint, training nodes also hold vLLM memory",
                                 setters, *(f"async_training.{k}" for k in shared)))
    elif train_world is not None and rollout_world is not None:
        findings.append(Finding(SECTION, "pools", OK,
                                f"disjoint: {train_world} training + {rollout_world} rollout devices = "
                                f"{train_world + rollout_world} in the Ray cluster"))

    for key in COPIED:
        inner, outer = f"actor_rollout_ref.rollout.{key}", f"rollout.{key}"
        if inner in setters and _get(cfg, inner) != _get(cfg, outer):
            findings.append(_finding(ERROR, inner, f"{inner}={_get(cfg, inner)!r} is ignored: the fully-async main "
                                     f"overwrites it with {outer}={_get(cfg, outer)!r}; set {outer} instead",
                                     setters, inner))
    train_per_node, rollout_per_node = _get(cfg, "trainer.n_gpus_per_node"), _get(cfg, "rollout.n_gpus_per_node")
    if train_world is not None and rollout_world is not None and train_per_node != rollout_per_node:
        findings.append(_finding(WARN, "devices per node", f"trainer.n_gpus_per_node={train_per_node} but "
                                 f"rollout.n_gpus_per_node={rollout_per_node}: each pool takes whole nodes, so this "
                                 "is right only if the two kinds of node differ", setters,
                                 "trainer.n_gpus_per_node", "rollout.n_gpus_per_node"))
    return findings


def fully_async_validate(cfg: DictConfig) -> list[Finding]:
    """What the fully-async main does to the config and checks before Ray, on a copy (imports verl).

    The main requires ``async_training``, copies ``rollout.nnodes`` / ``n_gpus_per_node`` into
    ``actor_rollout_ref.rollout`` and migrates the legacy reward settings; its trainer asserts
    ``hybrid_engine`` is off, its rollouter that the rollout computes log-probs; its workers build
    the actor and rollout dataclasses (whose ``__post_init__`` checks run here).
    """
    captured = io.StringIO()
    config = copy.deepcopy(cfg)
    step = "the fully-async main's checks"
    try:
        with contextlib.redirect_stdout(captured), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from verl.experimental.reward_loop import migrate_legacy_reward_impl
            from verl.utils.config import omega_conf_to_dataclass

            if "async_training" not in config:
                raise ValueError("must set async_training config (the fully-async main raises without it)")
            for key in COPIED:
                config.actor_rollout_ref.rollout[key] = config.rollout[key]
            step = "migrate_legacy_reward_impl"
            config = migrate_legacy_reward_impl(config)
            if config.actor_rollout_ref.hybrid_engine:
                raise ValueError("actor_rollout_ref.hybrid_engine must be False (the fully-async trainer asserts it)")
            if not config.actor_rollout_ref.rollout.calculate_log_probs:
                raise ValueError("actor_rollout_ref.rollout.calculate_log_probs must be True "
                                 "(the rollouter asserts it)")
            for section in ("actor", "rollout"):
                step = f"building actor_rollout_ref.{section} as verl's dataclass"
                omega_conf_to_dataclass(config.actor_rollout_ref[section])
    except Exception as err:
        root = err
        while root.__cause__ is not None or root.__context__ is not None:
            root = root.__cause__ or root.__context__  # type: ignore[assignment]
        text = " ".join(str(root).split()) or type(root).__name__
        return [Finding("config", "fully_async_validate", ERROR,
                        f"verl's fully-async main would reject the config ({step}): {type(root).__name__}: {text}")]
    notes = sorted({" ".join(str(w.message).split()) for w in caught if "verl" in str(w.filename)})
    return [Finding("config", "fully_async_validate", OK,
                    "the fully-async main's own checks pass (async_training, hybrid_engine off, rollout log-probs, "
                    "actor and rollout dataclasses; it runs no validate_config)"
                    + (f" (warnings: {'; '.join(notes)})" if notes else ""))]
