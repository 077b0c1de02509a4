"""Declared omissions: tensors a model family is known to leave out of its Hugging Face export.

Keyed by model family (``Family``: Hugging Face ``model_type`` and architecture names, either
matches). Each entry says what makes a tensor omissible from the model's own ``config.json``, never
by a fixed list of names, so the same rule covers every size of the family.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


@dataclass(frozen=True)
class Family:
    """A model family, recognised in a Hugging Face ``config.json`` by its ``model_type`` or an architecture."""

    name: str
    model_types: tuple[str, ...]
    architectures: tuple[str, ...]

    def __str__(self) -> str:
        return self.name

    def describes(self, config: Mapping[str, Any]) -> bool:
        """The model ``config`` describes has one of this family's model types or architectures."""
        return (config.get("model_type") in self.model_types
                or bool(set(config.get("architectures") or ()) & set(self.architectures)))


GLM5 = Family("GLM-5.x", model_types=("glm_moe_dsa",), architectures=("GlmMoeDsaForCausalLM",))


@dataclass(frozen=True)
class Omission:
    """One family's declared omission: ``matches(name, config)`` is True for a tensor it may lack."""

    family: Family
    description: str
    matches: Callable[[str, Mapping[str, Any]], bool]


def mtp_layer(name: str, config: Mapping[str, Any]) -> bool:
    """``model.layers.<i>.*`` with ``i >= num_hidden_layers``: the multi-token-prediction (next-n) layers."""
    found = _LAYER.match(name)
    layers = config.get("num_hidden_layers")
    return bool(found) and isinstance(layers, int) and int(found.group(1)) >= layers


def fp8_block_quantised(config: Mapping[str, Any]) -> bool:
    """The checkpoint is stored in block-FP8 (``quantization_config.quant_method == "fp8"``, DeepSeek-style)."""
    quantization = config.get("quantization_config")
    return isinstance(quantization, Mapping) and quantization.get("quant_method") == "fp8"


def fp8_scale(name: str, config: Mapping[str, Any]) -> bool:
    """``*.weight_scale_inv`` of a block-FP8 reference: the scales an unquantised (bf16) export has no use for."""
    return name.endswith(".weight_scale_inv") and fp8_block_quantised(config)


OMISSIONS: tuple[Omission, ...] = (
    Omission(
        family=GLM5,
        description="MTP layers: model.layers.<i>.* with i >= num_hidden_layers (unused in RL training; "
        "transformers itself ignores them on load)",
        matches=mtp_layer,
    ),
    Omission(
        family=GLM5,
        description="FP8 scales: *.weight_scale_inv of a block-FP8 reference (quantization_config.quant_method "
        "'fp8'), which an unquantised export does not carry",
        matches=fp8_scale,
    ),
)


def omissions_for(config: Mapping[str, Any]) -> list[Omission]:
    """The omissions declared for the model described by a Hugging Face ``config.json``."""
    return [o for o in OMISSIONS if o.family.describes(config)]
