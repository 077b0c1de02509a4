"""Drive verl's real MegatronCheckpointManager save helpers on CPU and print what happened, as JSON.

Usage: python checkpoint.py WORKDIR. Run in a fresh interpreter so verl's plugin discovery really runs
(or is switched off with VERL_USE_EXTERNAL_PLUGINS=none to show verl's own behaviour).

What is real: verl's megatron_checkpoint_manager module (with megatron-core), its
``_save_model_as_hf_via_bridge`` and ``_save_transformer_config`` methods, safetensors files written
with the ``safetensors`` package, Megatron's ``TransformerConfig`` and transformers' ``Qwen2_5_VLConfig``.
Test doubles: the Megatron-Bridge object (``BridgeDouble``) — the real bridge needs CUDA packages, so
its ``save_hf_weights`` is a stand-in that writes real safetensors files — and the manager instance
(a namespace carrying the attributes those two methods read; the manager's ``__init__`` builds
Megatron models).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import torch
import verl  # noqa: F401  (plugin discovery happens here)
from megatron.core.transformer import TransformerConfig
from safetensors.torch import save_file
from transformers import Qwen2_5_VLConfig
from verl.utils.checkpoint.megatron_checkpoint_manager import MegatronCheckpointManager

import verl_ascend_ext
from verl_ascend_ext.patching.status import was_exercised

NUM_LAYERS = 2
LAYER_PARTS = ("self_attn.q_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight")
MTP_PARTS = ("eh_proj.weight", "enorm.weight", "hnorm.weight", "self_attn.q_proj.weight")


def reference_names() -> list[str]:
    names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    names += [f"model.layers.{i}.{p}" for i in range(NUM_LAYERS) for p in LAYER_PARTS]
    names += [f"model.layers.{NUM_LAYERS}.{p}" for p in MTP_PARTS]  # GLM-5 MTP layer: index == num_hidden_layers
    return names


def write_shards(directory: Path, names: list[str], index: bool,
                 shapes: dict[str, tuple[int, ...]] | None = None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    weight_map = {}
    for file, part in shards.items():
        save_file({n: torch.full((shapes or {}).get(n, (2, 2)), float(i)) for i, n in enumerate(part)},
                  str(directory / file))
        weight_map.update(dict.fromkeys(part, file))
    if index:
        (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def make_reference(directory: Path, index: bool = True) -> Path:
    write_shards(directory, reference_names(), index)
    (directory / "config.json").write_text(json.dumps({
        "model_type": "glm_moe_dsa", "architectures": ["GlmMoeDsaForCausalLM"], "num_hidden_layers": NUM_LAYERS}))
    return directory


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


class BridgeDouble:
    """Stand-in for Megatron-Bridge's AutoBridge: ``save_hf_weights`` writes real safetensors files.

    ``shapes`` overrides the (2, 2) shape of some tensors (a shard saved unmerged); ``cut`` bytes are cut
    from the end of the last shard after writing (a rank killed mid-save).
    """

    def __init__(self, names: list[str], shapes: dict[str, tuple[int, ...]] | None = None, cut: int = 0) -> None:
        self.names = names
        self.shapes = shapes
        self.cut = cut
        self.written: dict[str, str] = {}
        self.strict = None

    def save_hf_weights(self, model: object, path: str, strict: bool = True) -> None:
        self.strict = strict
        write_shards(Path(path), self.names, index=True, shapes=self.shapes)
        if self.cut:
            last = sorted(Path(path).glob("*.safetensors"))[-1]
            os.truncate(last, last.stat().st_size - self.cut)
        self.written = digest(Path(path))

    def save_weights(self, models: object, weights_path: str, memory_efficient: bool = False) -> None:
        """mbridge's export (verl's ``vanilla_mbridge=True``): the same files, no ``strict``."""
        self.save_hf_weights(models, weights_path, strict=None)

    def save_hf_adapter(self, model: object, path: str, peft_cls: object) -> None:
        """Megatron-Bridge's PEFT adapter export: adapter files only."""
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "adapter_config.json").write_text("{}")
        self.written = digest(Path(path))


def manager_double(**attributes: object) -> MegatronCheckpointManager:
    """A real MegatronCheckpointManager instance without its __init__ (which builds Megatron models on a GPU)."""
    manager = MegatronCheckpointManager.__new__(MegatronCheckpointManager)
    manager.__dict__.update(attributes)
    return manager


def export_case(work: Path, name: str, mode: str | None, drop: tuple[str, ...] = (), extra: tuple[str, ...] = (),
                reference_index: bool = True, shapes: dict[str, tuple[int, ...]] | None = None, cut: int = 0,
                vanilla: bool = False, peft: bool = False, rank: int = 0) -> dict:
    """One save through verl's real ``_save_model_as_hf_via_bridge`` (Megatron-Bridge, or mbridge with ``vanilla``,
    or a PEFT adapter with ``peft``) on ``rank``; what it raised and left, and whether the record was exercised
    in this process so far (cases run in order: the ones that must not act come first)."""
    case = work / name
    reference = make_reference(case / "reference", index=reference_index)
    names = [n for n in reference_names() if not n.startswith(f"model.layers.{NUM_LAYERS}.") and n not in drop]
    bridge = BridgeDouble(names + list(extra), shapes=shapes, cut=cut)
    manager = manager_double(vanilla_bridge=vanilla, peft_cls=object() if peft else None, bridge=bridge,
                             model=[object()], rank=rank,
                             checkpoint_config=SimpleNamespace(strict=False), model_path=str(reference),
                             hf_config=SimpleNamespace(name_or_path=str(reference)))
    export = case / "checkpoint" / "model" / "huggingface"
    if mode is None:
        os.environ.pop("VERL_ASCEND_EXT_EXPORT_CHECK", None)
    else:
        os.environ["VERL_ASCEND_EXT_EXPORT_CHECK"] = mode
    out: dict = {"error": None}
    try:
        manager._save_model_as_hf_via_bridge(str(export))
    except Exception as err:  # the outcome under test: recorded, asserted by the pytest side
        out["error"] = f"{type(err).__name__}: {err}"
    out["strict_passed_to_bridge"] = bridge.strict
    out["files_untouched"] = bool(bridge.written) and digest(export) == bridge.written
    report = export.parent / "huggingface.export_check.json"
    out["report"] = json.loads(report.read_text()) if report.is_file() else None
    out["export_files"] = sorted(digest(export)) if export.is_dir() else []
    status = export.parent / "verl_ascend_ext.status.json"
    out["status_file"] = json.loads(status.read_text()) if status.is_file() else None
    out["exercised_after"] = was_exercised("checkpoint-export-check")
    return out


@dataclasses.dataclass
class VLTransformerConfig(TransformerConfig):
    """A Megatron TransformerConfig carrying a vision sub-config, as Megatron-Bridge's VL providers do."""

    vision_config: object = None
    hf_text_config: object = None
    mrope_section: tuple = (16, 24, 24)
    freeze_modules: set = dataclasses.field(default_factory=lambda: {"vision", "projector"})
    unserialisable_handle: object = None


def config_case(work: Path) -> dict:
    vl = Qwen2_5_VLConfig()
    config = VLTransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, vision_config=vl.vision_config,
                                 hf_text_config=vl.text_config, unserialisable_handle=threading.Lock())
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())  # type: ignore[method-assign]
    logging.getLogger("verl_ascend_ext").addHandler(handler)
    target = work / "config_ckpt"
    target.mkdir(parents=True, exist_ok=True)
    manager_double(rank=0, transformer_config=config)._save_transformer_config(str(target))
    saved = json.loads((target / "transformer_config.json").read_text())
    fields = [f.name for f in dataclasses.fields(config)]
    return {
        "fields": fields,
        "saved_keys": sorted(saved),
        "vision_config": saved.get("vision_config"),
        "vision_config_expected": json.loads(json.dumps(vl.vision_config.to_dict())),
        "hf_text_config": saved.get("hf_text_config"),
        "hf_text_config_expected": json.loads(json.dumps(vl.text_config.to_dict())),
        "mrope_section": saved.get("mrope_section"),
        "freeze_modules": saved.get("freeze_modules"),
        "params_dtype": saved.get("params_dtype"),
        "activation_func": saved.get("activation_func"),
        "warnings": [m for m in records if "cannot be written to JSON" in m],
    }


def main() -> None:
    work = Path(sys.argv[1])
    out = {
        "plugin_loaded": "verl_ascend_ext.runtime.boot" in sys.modules,
        "pid": os.getpid(),
        "statuses": {k: v.status.value for k, v in verl_ascend_ext.patch_statuses().items()
                     if k.startswith("checkpoint-")},
        "export_wrapped": hasattr(MegatronCheckpointManager._save_model_as_hf_via_bridge, "__wrapped__"),
        "cases": {  # in this order: the two that must not act first
            "rank_1": export_case(work, "rank_1", None, drop=("model.layers.1.mlp.down_proj.weight",), rank=1),
            "peft_adapter": export_case(work, "peft_adapter", None, peft=True),
            "vanilla_missing": export_case(work, "vanilla_missing", None, vanilla=True,
                                           drop=("model.layers.1.mlp.down_proj.weight",)),
            "vanilla_mtp_only": export_case(work, "vanilla_mtp_only", None, vanilla=True),
            "mtp_only": export_case(work, "mtp_only", None),
            "missing_layer": export_case(work, "missing_layer", None, drop=("model.layers.1.mlp.down_proj.weight",
                                                                           "model.layers.0.self_attn.q_proj.weight")),
            "missing_layer_warn": export_case(work, "missing_layer_warn", "warn",
                                              drop=("model.layers.1.mlp.down_proj.weight",)),
            "missing_layer_off": export_case(work, "missing_layer_off", "off",
                                             drop=("model.layers.1.mlp.down_proj.weight",)),
            "extra": export_case(work, "extra", "error", extra=("model.vision.unexpected.weight",)),
            "no_index": export_case(work, "no_index", "error", reference_index=False),
            "no_index_warn": export_case(work, "no_index_warn", "warn", reference_index=False),
            "unmerged": export_case(work, "unmerged", None, shapes={"model.layers.0.self_attn.q_proj.weight": (1, 2)}),
            "truncated": export_case(work, "truncated", None, cut=4),
        },
        "config": config_case(work),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
