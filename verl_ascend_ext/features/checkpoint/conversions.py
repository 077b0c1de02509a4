"""Declared dtype conversions: a model family whose export may store a tensor in another dtype than its reference.

Declared like the omissions (``omissions.py``): keyed by model family (``model_type`` or architecture),
decided from the reference's own ``config.json``, never by a list of tensor names. Shapes must always
match; only the dtype may differ, and only as declared. One conversion belongs to a save path instead of a
model family (``FSDP_MASTER_WEIGHTS``): the caller that knows the export came from verl's FSDP save passes it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from verl_ascend_ext.features.checkpoint.omissions import GLM5, Family, fp8_block_quantised

FP8 = frozenset({"F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ"})


@dataclass(frozen=True)
class Conversion:
    """One family's declared conversion: ``allows(name, reference_dtype, export_dtype, config)``."""

    family: Family
    description: str
    allows: Callable[[str, str, str, Mapping[str, Any]], bool]


def fp8_to_bf16(name: str, reference_dtype: str, export_dtype: str, config: Mapping[str, Any]) -> bool:
    """An FP8 weight of a block-FP8 reference exported dequantised, in BF16."""
    return reference_dtype in FP8 and export_dtype == "BF16" and fp8_block_quantised(config)


CONVERSIONS: tuple[Conversion, ...] = (
    Conversion(
        family=GLM5,
        description="FP8 -> BF16: a block-FP8 reference (quantization_config.quant_method 'fp8') exported "
        "dequantised in BF16 (training runs in BF16)",
        allows=fp8_to_bf16,
    ),
)


def fp32_master_weights(name: str, reference_dtype: str, export_dtype: str, config: Mapping[str, Any]) -> bool:
    """A BF16 or F16 weight exported in F32: the lossless widening verl's FSDP save makes."""
    return reference_dtype in ("BF16", "F16") and export_dtype == "F32"


# verl's FSDPCheckpointManager exports the gathered state dict of the actor's FP32 master weights as they are
# (save_pretrained(state_dict=...)); not a model family: ``check_export(..., conversions=...)`` passes it.
FSDP_MASTER_WEIGHTS = Conversion(
    family=Family("verl FSDP save", model_types=(), architectures=()),
    description="BF16/F16 -> F32: verl's FSDP save writes the actor's FP32 master weights (lossless widening)",
    allows=fp32_master_weights,
)


def conversions_for(config: Mapping[str, Any]) -> list[Conversion]:
    """The dtype conversions declared for the model described by a Hugging Face ``config.json``."""
    return [c for c in CONVERSIONS if c.family.describes(config)]
