"""Feature declaration: the distillation patch records and their gate (loaded at discovery; no heavy imports)."""

from __future__ import annotations

from verl_ascend_ext.patching import Fingerprint, Gate, PatchRecord
from verl_ascend_ext.runtime.hookspecs import hookimpl

GATE = Gate(
    "VERL_ASCEND_EXT_DISTILLATION_FIXES",
    default=True,
    doc="Distillation crash fixes for verl releases that lack them (fsdp2 top-k loss, teacher-field padding, "
    "an all-padding micro-batch).",
)

FSDP_BRANCH = r"case 'fsdp'( \| '\w+')*:\n\s+import verl\.trainer\.distillation\.fsdp\.losses as \w+"

FSDP2_TOPK = PatchRecord(
    id="distill-fsdp2-topk",
    feature="distillation",
    why="strategy=fsdp2 raises NotImplementedError in the top-k distillation loss; it must use the FSDP loss code.",
    target="verl.trainer.distillation.losses:compute_topk_loss",
    gate=GATE,
    distribution="verl",
    versions=">=0.9.0,<0.10",
    original=Fingerprint(
        contains=(r"match config\.strategy:", FSDP_BRANCH, r"raise NotImplementedError"),
        absent=(r"'fsdp2'",),
        description="dispatch on config.strategy with an 'fsdp' branch to the FSDP loss and no 'fsdp2' branch",
    ),
    fixed=Fingerprint(
        contains=(r"case [^\n]*'fsdp2'[^\n]*:\n\s+import verl\.trainer\.distillation\.fsdp\.losses as \w+",),
        description="'fsdp2' dispatched to verl.trainer.distillation.fsdp.losses",
    ),
    wrapper="verl_ascend_ext.features.distillation.patch_code:topk_loss_fsdp2_as_fsdp",
    upstream="verl PR #7837 (in verl 0.9.1)",
    remove_when="the minimum supported verl is 0.9.1",
    traced=False,
    acts_when="the top-k distillation loss runs with strategy fsdp2",
)

TEACHER_PADDING = PatchRecord(
    id="padding-teacher-fields",
    feature="distillation",
    why="Synthetic padding samples keep teacher_ids/teacher_logprobs at the source sample's length, "
    "so they no longer match the template's input_ids and the padded batch cannot be concatenated.",
    target="verl.trainer.ppo.padding_utils:construct_minimal_padding_template",
    gate=GATE,
    distribution="verl",
    versions=">=0.9.0,<0.10",
    original=Fingerprint(
        contains=(r"template_sample\.update\([^\n]*input_ids=input_ids", r"return \(template_sample, template_tag\)"),
        absent=(r"teacher_ids", r"teacher_logprobs"),
        description="template built from input_ids and returned as (sample, tag), teacher fields left as copied",
    ),
    fixed=Fingerprint(
        contains=(
            r"template_sample\['teacher_ids'\] = \w+\.new_full\(\(\w+, \*\w+\.shape\[1:\]\), eos_token_id\)",
            r"template_sample\['teacher_logprobs'\] = \w+\.new_zeros\(\(\w+, \*\w+\.shape\[1:\]\)\)",
        ),
        description="teacher_ids rebuilt with EOS and teacher_logprobs with zeros at the template length",
    ),
    wrapper="verl_ascend_ext.features.distillation.patch_code:rebuild_teacher_fields",
    upstream="verl PR #7858 (in verl 0.9.1)",
    remove_when="the minimum supported verl is 0.9.1",
    traced=False,
    acts_when="a padding template carries teacher fields (on-policy distillation)",
)


# The guard of patches/verl/0001-distill-empty-micro-batch.diff: return before the loss function runs when the
# micro-batch holds no response token.
EMPTY_GUARD = r"if not [^\n]*response_mask[^\n]*\.any\(\):"

EMPTY_MICRO_BATCH = PatchRecord(
    id="distill-empty-micro-batch",
    feature="distillation",
    why="A micro-batch made only of padding samples (response mask all zero) crashes the distillation loss: "
    "min()/max() over no valid token (the loss range and top-k mass metrics) raise; it must add zero instead.",
    target="verl.trainer.distillation.losses:distillation_loss",
    gate=GATE,
    distribution="verl",
    versions=">=0.9.0,<0.10",
    original=Fingerprint(
        contains=(
            r"distillation_losses, distillation_metrics = distillation_loss_fn\(",
            r"response_mask = data\['response_mask'\]",
            r"compute_distillation_loss_range\(distillation_losses=distillation_losses, response_mask=response_mask\)",
            r"return \(distillation_loss, distillation_metrics\)",
        ),
        absent=(EMPTY_GUARD,),
        description="the registered loss function, then the loss range over the response mask, with no guard for a "
        "mask without a token; returns (loss, metrics)",
    ),
    fixed=Fingerprint(
        contains=(EMPTY_GUARD,),
        description="returns early when the micro-batch's response mask holds no token",
    ),
    wrapper="verl_ascend_ext.features.distillation.patch_code:empty_micro_batch_adds_zero",
    upstream="not fixed in verl up to 0.9.1 (patches/verl/0001-distill-empty-micro-batch.diff is ours)",
    remove_when="verl guards an all-padding micro-batch in distillation_loss (doctor then reports fixed-upstream)",
    traced=False,
    acts_when="a micro-batch holds no response token (padding samples only)",
)


@hookimpl
def verl_ascend_ext_gates() -> list[Gate]:
    return [GATE]


@hookimpl
def verl_ascend_ext_patch_records() -> list[PatchRecord]:
    return [FSDP2_TOPK, TEACHER_PADDING, EMPTY_MICRO_BATCH]
