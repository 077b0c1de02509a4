"""Replacement code of the checkpoint patches (imported only when a patch is applied)."""

from __future__ import annotations

import logging
import os
from typing import Any

from verl_ascend_ext.features.checkpoint.config_json import config_to_json_safe
from verl_ascend_ext.features.checkpoint.conversions import FSDP_MASTER_WEIGHTS, Conversion
from verl_ascend_ext.features.checkpoint.declaration import EXPORT_CHECK, EXPORT_CHECK_FSDP
from verl_ascend_ext.features.checkpoint.export_check import (
    ExportCheckError,
    check_export,
    export_check_mode,
)
from verl_ascend_ext.features.checkpoint.provenance import write_beside
from verl_ascend_ext.patching.status import acted

logger = logging.getLogger("verl_ascend_ext")


def _model_config(manager: Any) -> Any:
    """The transformers config of the model an FSDP manager saves (FSDP1 wraps the module; FSDP2 keeps it)."""
    model = getattr(manager, "model", None)
    return getattr(getattr(model, "_fsdp_wrapped_module", model), "config", None)


def _reference_dir(manager: Any) -> str | None:
    """The Hugging Face checkpoint the run started from (verl's ``config.model.path``, local)."""
    for candidate in (getattr(manager, "model_path", None),
                      getattr(getattr(manager, "hf_config", None), "name_or_path", None),
                      getattr(_model_config(manager), "name_or_path", None)):
        if candidate and os.path.isdir(candidate):
            return candidate
    return None


def _check_saved(record_id: str, manager: Any, hf_ckpt_path: str, mode: str,
                 conversions: tuple[Conversion, ...] = ()) -> None:
    """Record the job's status beside the export, then check the export against the reference (per ``mode``).

    The record counts as exercised once the status is beside the export (with the check's mode off, that is all
    it does); before the comparison, so that a failing check is still counted as having acted."""
    acted(record_id)
    status = write_beside(hf_ckpt_path)  # which fixes were active when this checkpoint was produced
    if mode == "off":
        return
    reference = _reference_dir(manager)
    if reference is None:
        model_path = getattr(manager, "model_path", None) or getattr(_model_config(manager), "name_or_path", None)
        message = (f"verl-ascend-ext export check: no local reference checkpoint to compare {hf_ckpt_path} with "
                   f"(model path {model_path!r} is not a directory)")
        if mode == "error":
            from verl_ascend_ext.features.checkpoint.export_check import MODE_ENV

            raise ExportCheckError(f"{message}. Fix: use a local model path, or set {MODE_ENV}=warn or off.")
        logger.warning("%s", message)
        return
    check_export(hf_ckpt_path, reference, mode, plugin_status=status, conversions=conversions)


def check_hf_export(original: Any, instance: Any, *args: Any, **kwargs: Any) -> Any:
    """Run verl's bridge export, then compare what it wrote with the reference checkpoint (rank 0 only, which
    writes it).

    Both of verl's bridges write whole Hugging Face weights there: Megatron-Bridge (``save_hf_weights``) and
    vanilla mbridge (``save_weights``, the path mbridge users report missing weights on: verl#6064). A PEFT run
    writes an adapter only, which has no reference to compare with: not checked, not counted as exercised."""
    mode = export_check_mode()
    result = original(instance, *args, **kwargs)
    if getattr(instance, "peft_cls", None) is not None or getattr(instance, "rank", 0) != 0:
        return result
    hf_ckpt_path = kwargs["hf_ckpt_path"] if "hf_ckpt_path" in kwargs else args[0]
    _check_saved(EXPORT_CHECK.id, instance, hf_ckpt_path, mode)
    return result


def check_fsdp_hf_export(original: Any, instance: Any, *args: Any, **kwargs: Any) -> Any:
    """Run verl's FSDP save, then check the Hugging Face export it wrote (rank 0, when it wrote one)."""
    mode = export_check_mode()
    result = original(instance, *args, **kwargs)
    local_path = kwargs["local_path"] if "local_path" in kwargs else (args[0] if args else None)
    if local_path is None or not getattr(instance, "should_save_hf_model", False) or getattr(instance, "rank", 0) != 0:
        return result
    _check_saved(EXPORT_CHECK_FSDP.id, instance, os.path.join(local_path, "huggingface"), mode,
                 (FSDP_MASTER_WEIGHTS,))
    return result


def save_config_whole(original: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """``_to_json_safe_config_dict`` that serialises nested configs instead of dropping them."""
    config_dict = kwargs["config_dict"] if "config_dict" in kwargs else args[0]
    return config_to_json_safe(config_dict)
