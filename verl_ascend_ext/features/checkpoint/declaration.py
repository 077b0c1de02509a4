"""Feature declaration: checkpoint export check and whole transformer config (loaded at discovery; no heavy imports)."""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING

from verl_ascend_ext.patching import Fingerprint, Gate, PatchRecord
from verl_ascend_ext.runtime.hookspecs import hookimpl

if TYPE_CHECKING:
    from verl_ascend_ext.runtime.findings import Finding

GATE = Gate(
    "VERL_ASCEND_EXT_CHECKPOINT_FIXES",
    default=True,
    doc="Checkpoint safety: check Hugging Face exports against the reference (mode: VERL_ASCEND_EXT_EXPORT_CHECK) "
    "and save the transformer config whole.",
)

MANAGER = "verl.utils.checkpoint.megatron_checkpoint_manager"
FSDP_MANAGER = "verl.utils.checkpoint.fsdp_checkpoint_manager"

EXPORT_CHECK = PatchRecord(
    id="checkpoint-export-check",
    feature="checkpoint",
    why="checkpoint.strict=False (needed for GLM-5.x MTP layers) switches export validation off entirely; check every "
    "exported shard's integrity and the tensor names, shapes and dtypes against the reference, tolerating only the "
    "model family's declared omissions and conversions.",
    target=f"{MANAGER}:MegatronCheckpointManager._save_model_as_hf_via_bridge",
    gate=GATE,
    distribution="verl",
    versions=">=0.9.0,<0.10",
    original=Fingerprint(
        contains=(r"self\.bridge\.save_hf_weights\(self\.model, \w+, strict=self\.checkpoint_config\.strict\)",),
        description="Megatron-Bridge export via bridge.save_hf_weights(..., strict=checkpoint.strict)",
    ),
    fixed=Fingerprint.never_matching("never: no verl release checks exported names against declared omissions"),
    wrapper="verl_ascend_ext.features.checkpoint.patch_code:check_hf_export",
    upstream="none (this package's addition)",
    remove_when="verl or Megatron-Bridge validate exports with per-model declared omissions",
    traced=False,
    acts_when="rank 0 has written full Hugging Face weights (Megatron-Bridge or vanilla mbridge; not a PEFT adapter)",
)

EXPORT_CHECK_FSDP = PatchRecord(
    id="checkpoint-export-check-fsdp",
    feature="checkpoint",
    why="An FSDP run writes its Hugging Face export with save_pretrained (checkpoint.save_contents holding hf_model) "
    "and nothing checks what was written; check it as the Megatron export is checked.",
    target=f"{FSDP_MANAGER}:FSDPCheckpointManager.save_checkpoint",
    gate=GATE,
    distribution="verl",
    versions=">=0.9.0,<0.10",
    original=Fingerprint(
        contains=(r"if self\.should_save_hf_model:",
                  r"hf_local_path = os\.path\.join\(local_path, 'huggingface'\)",
                  r"save_model\.save_pretrained\(hf_local_path, state_dict=state_dict\)"),
        description="rank 0 writes the gathered state dict to local_path/huggingface with save_pretrained when "
        "should_save_hf_model",
    ),
    fixed=Fingerprint.never_matching("never: no verl release checks exported names against declared omissions"),
    wrapper="verl_ascend_ext.features.checkpoint.patch_code:check_fsdp_hf_export",
    upstream="none (this package's addition)",
    remove_when="verl validates FSDP Hugging Face exports against the model it started from",
    traced=False,
    acts_when="rank 0 has written the Hugging Face export (checkpoint.save_contents holds hf_model)",
)

CONFIG_WHOLE = PatchRecord(
    id="checkpoint-config-whole",
    feature="checkpoint",
    why="verl's JSON-safe helper silently drops nested configs (to_dict objects, dataclasses), sets and paths "
    "from transformer_config.json; serialise them recursively and name what truly cannot be written.",
    target=f"{MANAGER}:_to_json_safe_config_dict",
    gate=GATE,
    distribution="verl",
    versions=">=0.9.0,<0.10",
    original=Fingerprint(
        contains=(r"_to_json_safe_config_value\(value, set\(\)\)",),
        also=(
            Fingerprint(at=f"{MANAGER}:_to_json_safe_config_value", contains=(r"return _SKIP_CONFIG_VALUE\Z",),
                        absent=(r"to_dict", r"is_dataclass")),
            Fingerprint(at=f"{MANAGER}:MegatronCheckpointManager._save_transformer_config",
                        contains=(r"_to_json_safe_config_dict\(_config_to_shallow_dict\(self\.transformer_config\)\)",)),
        ),
        description="per-value helper that returns a skip marker for every object it does not know "
        "(nested configs, dataclasses, sets), used by _save_transformer_config",
    ),
    fixed=Fingerprint(
        at=f"{MANAGER}:_to_json_safe_config_value",
        contains=(r"to_dict", r"is_dataclass"),
        description="the per-value helper serialises to_dict objects and dataclasses",
        kept=tuple((p, "unexercised: no verl release serialises nested configs yet (0.9.0 and 0.9.1 drop them); kept "
                       "so that one that does is recognised") for p in (r"to_dict", r"is_dataclass")),
    ),
    wrapper="verl_ascend_ext.features.checkpoint.patch_code:save_config_whole",
    upstream="none yet (verl 0.9.0 and 0.9.1 both drop nested configs)",
    remove_when="verl's _to_json_safe_config_value serialises to_dict objects and dataclasses",
    traced=False,
)


def _validate_mode(_module: ModuleType) -> None:
    from verl_ascend_ext.features.checkpoint.mode import export_check_mode
    from verl_ascend_ext.patching.record import OFF
    from verl_ascend_ext.patching.status import current

    decided = current(EXPORT_CHECK.id)
    if decided is not None and decided.status in OFF:
        return  # the check is off in this process: its mode does not matter
    export_check_mode()  # a bad value stops the worker at start-up, not after hours of training at the first save


@hookimpl
def verl_ascend_ext_gates() -> list[Gate]:
    return [GATE]


@hookimpl
def verl_ascend_ext_patch_records() -> list[PatchRecord]:
    return [EXPORT_CHECK, EXPORT_CHECK_FSDP, CONFIG_WHOLE]


@hookimpl
def verl_ascend_ext_import_hooks() -> list[tuple[str, object]]:
    return [(MANAGER, _validate_mode), (FSDP_MANAGER, _validate_mode)]


@hookimpl
def verl_ascend_ext_doctor_findings(environ: Mapping[str, str]) -> list[Finding]:
    from verl_ascend_ext.features.checkpoint.checks import doctor_findings

    return doctor_findings(environ)
