"""Feature declaration: the GLM-5.2 vLLM-Ascend 0.23 patch records and their gate (imported at discovery; light).

Every record's fingerprints were written against the normalised source of the vLLM-Ascend 0.23.0
wheel and are checked in tests on that real source, on mutated copies and with the diffs of
``patches/vllm-ascend/`` applied. Targets are patched when vLLM-Ascend imports them (post-import
hooks); nothing here imports vLLM-Ascend, which needs an NPU.
"""

from __future__ import annotations

from verl_ascend_ext.features.glm52 import GATE, VERL_CAMEM_MARKER, VERL_ENABLED, VERL_MARKER
from verl_ascend_ext.patching import Action, Fingerprint, Gate, PatchRecord
from verl_ascend_ext.patching.record import ForeignCopy, Variant
from verl_ascend_ext.runtime.hookspecs import hookimpl

DISTRIBUTION = "vllm-ascend"
VERSIONS = ">=0.23.0,<0.23.1"  # 0.23.0 wheel and 0.23.0.post1 sdist: identical targets
VERL_MODULE = "verl.utils.vllm.npu_vllm_patch"


def _verl_copy(function: str, *contains: str, what: str) -> ForeignCopy:
    """verl 0.9.1's in-tree copy of one fix; it checks the marker we expose, so whichever loads first wins."""
    return ForeignCopy(name=f"verl's in-tree GLM-5.2 patch ({VERL_MODULE}.{function})",
                       target=f"{VERL_MODULE}:{function}",
                       fingerprint=Fingerprint(contains=contains, description=what), enabled_by=VERL_ENABLED)


UPSTREAM_GLM52 = "vllm-ascend commit ca0420391 (named by verl 0.9.1's in-tree copy); in no vLLM-Ascend release yet"
REMOVE_GLM52 = "the minimum supported vLLM-Ascend contains the fix (doctor then reports fixed-upstream)"

SFA_CALLER = "vllm_ascend.attention.sfa_v1:AscendSFAImpl.indexer_select_post_process"
CP_MODULE = "vllm_ascend.attention.context_parallel.sfa_cp"
CP_COMMON = "vllm_ascend.attention.context_parallel.common_cp"
OWN_INDEXER = r"def \w*indexer_select\w*\("
CP_CALLER = "vllm_ascend.attention.context_parallel.sfa_cp:AscendSFACPImpl.indexer_select_post_process"
# why the later CP shape's patterns are kept although the contract suite cannot mutate a release carrying it
LATER_SHAPE = ("unexercised: the shape of vLLM-Ascend v0.25.1rc1+ (survey, docs/glm52.md), which no cached release "
               "carries (only 0.23.0 is on the package index); tests/test_glm52_ascend_later.py rebuilds it")
# weights * n_head^-0.5 * head_dim^-0.5 as ast.unparse writes it
SCALED = r"weights = (weights|kw\[:, self\.head_dim:\]) \* self\.n_head \*\* \(-0\.5\) \* self\.head_dim \*\* \(-0\.5\)"
ANY_SCALE = r"\*\* \(-0\.5\)"

RMSNORM = PatchRecord(
    id="glm52-ascend-rmsnorm-add-then-norm",
    feature="glm52",
    why="With a residual, AscendRMSNorm uses the fused add-and-norm, which normalises the unrounded sum; training "
    "rounds the sum first. Add explicitly, then RMS-normalise the sum (bias, when the layer has one, still added).",
    target="vllm_ascend.ops.layernorm:AscendRMSNorm.forward_oot",
    gate=GATE,
    distribution=DISTRIBUTION,
    versions=VERSIONS,
    original=Fingerprint(
        contains=(r"if residual is not None:",
                  r"residual = torch\.ops\.vllm\.maybe_chunk_residual\(x, residual\)",  # the replacement calls it too
                  r"npu_add_rms_norm_bias\(x, residual, self\.weight, self\.bias, self\.variance_epsilon\)",
                  r"torch_npu\.npu_add_rms_norm\(x, residual, self\.weight, self\.variance_epsilon\)",
                  r"return \(x, residual\)"),
        absent=(r"residual = x \+ residual",),
        description="residual path through the fused npu_add_rms_norm_bias (custom op) or npu_add_rms_norm "
        "(+ bias after)",
    ),
    fixed=Fingerprint(
        contains=(r"residual = x \+ residual\n\s+x = torch_npu\.npu_rms_norm\(residual, self\.weight, "
                  r"(epsilon=)?self\.variance_epsilon\)\[0\]",
                  r"if self\.bias is not None:\n\s+x(\.add_\(self\.bias\)| = x \+ self\.bias)\n"
                  r"\s+return \(x, residual\)"),
        absent=(r"npu_add_rms_norm",),
        description="residual added explicitly, then npu_rms_norm of the sum, bias added after the norm",
    ),
    variants=(Variant(
        original=Fingerprint(
            contains=(r"if residual is not None:\n\s+if enable_custom_op\(\):",
                      r"npu_add_rms_norm_bias\(x, residual, self\.weight, self\.bias, self\.variance_epsilon\)",
                      r"torch_npu\.npu_add_rms_norm\(x, residual, self\.weight, self\.variance_epsilon\)",
                      r"return \(x, residual\)"),
            absent=(r"residual = x \+ residual", r"maybe_chunk_residual"),
            description="the same fused residual path without torch.ops.vllm.maybe_chunk_residual (FlashComm v1 "
            "removed, vLLM-Ascend #13946, on main after v0.25.1rc1)",
        ),
        wrapper="verl_ascend_ext.features.glm52.ascend.patch_code.rmsnorm:add_then_rms_norm_unchunked",
    ),),
    wrapper="verl_ascend_ext.features.glm52.ascend.patch_code.rmsnorm:add_then_rms_norm",
    upstream=UPSTREAM_GLM52,
    remove_when=REMOVE_GLM52,
    traced=True,
    foreign_markers=(VERL_MARKER,),
    exposes_markers=(VERL_MARKER,),
    foreign_copies=(_verl_copy("patch_vllm_ascend_glm52", r"_patch_glm52_ascend_rms_norm\(layernorm\)",
                               what="patches AscendRMSNorm.forward_oot"),),
)

KV_B_PROJ = PatchRecord(
    id="glm52-ascend-sfa-keep-kv-b-proj",
    feature="glm52",
    why="AscendSFAImpl.process_weights_after_loading disposes kv_b_proj to shape [0]; the next RL weight update "
    "reloads it and fails the shape check. Keep kv_b_proj alive (only that layer; the others are still disposed).",
    target="vllm_ascend.attention.sfa_v1:AscendSFAImpl.process_weights_after_loading",
    gate=GATE,
    distribution=DISTRIBUTION,
    versions=VERSIONS,
    original=Fingerprint(
        contains=(r"kv_b_proj_weight = torch_npu\.npu_format_cast\(self\.kv_b_proj\.weight\.data",
                  r"self\.W_UV\.copy_\(", r"^    dispose_layer\(self\.kv_b_proj\)$"),
        description="W_UV/W_UK_T rebuilt from kv_b_proj on every call, then dispose_layer(self.kv_b_proj)",
    ),
    fixed=Fingerprint(
        contains=(r"kv_b_proj_weight = torch_npu\.npu_format_cast\(self\.kv_b_proj\.weight\.data",
                  r"self\.W_UV\.copy_\("),
        absent=(r"dispose\w*\(self\.kv_b_proj\b",),
        description="W_UV/W_UK_T rebuilt from kv_b_proj, which is never disposed",
    ),
    wrapper="verl_ascend_ext.features.glm52.ascend.patch_code.sfa:keep_kv_b_proj",
    upstream=UPSTREAM_GLM52,
    remove_when=REMOVE_GLM52,
    traced=False,
    acts_when="the attention layer has a kv_b_proj to keep",
    foreign_markers=(VERL_MARKER,),
    exposes_markers=(VERL_MARKER,),
    foreign_copies=(_verl_copy("patch_vllm_ascend_glm52", r"_patch_glm52_sfa_kv_b_proj_disposal\(sfa_v1\)",
                               what="keeps kv_b_proj"),),
)


def _device_operator_record(adaptor: str) -> PatchRecord:
    return PatchRecord(
        id=f"glm52-ascend-indexer-scale-{adaptor.removesuffix('DeviceAdaptor').lower()}",
        feature="glm52",
        why=f"The SFA lightning indexer needs its weights scaled by n_head^-0.5 * head_dim^-0.5; scale them once on "
        f"entry to {adaptor}.indexer_select_post_process (the only place sfa_v1 hands them to the NPU kernels).",
        target=f"vllm_ascend.device.device_op:{adaptor}.indexer_select_post_process",
        gate=GATE,
        distribution=DISTRIBUTION,
        versions=VERSIONS,
        original=Fingerprint(
            contains=(r"^@staticmethod\ndef indexer_select_post_process\(sfa_impl, q_li: [^\n]*?, q_li_scale: "
                      r"[^\n]*?, q_li_shape_ori: [^\n]*?, weights: ", r"weights=weights"),
            # no scaling and no delegation to another adaptor's method (which would then scale a second time)
            absent=(ANY_SCALE, r"\.indexer_select_post_process\("),
            also=(Fingerprint(
                at=SFA_CALLER,
                contains=(r"weights = kw\[:, self\.head_dim:\]\n",
                          r"return DeviceOperator\.indexer_select_post_process\(self, q_li, q_li_scale, "
                          r"q_li_shape_ori, weights, "),
                absent=(ANY_SCALE, r"weights = weights \*"),
                description="sfa_v1 passes the unscaled weights",
            ),),
            description="staticmethod taking weights 5th and passing them to the indexer kernels unscaled, called "
            "by AscendSFAImpl.indexer_select_post_process with unscaled weights",
        ),
        fixed=Fingerprint(
            at=SFA_CALLER,
            contains=(SCALED + r"\n[\s\S]*DeviceOperator\.indexer_select_post_process\(self, q_li, q_li_scale, "
                      r"q_li_shape_ori, weights, ",),
            description="AscendSFAImpl.indexer_select_post_process scales weights before the DeviceOperator call",
        ),
        wrapper="verl_ascend_ext.features.glm52.ascend.patch_code.sfa:scale_device_operator_weights",
        upstream=UPSTREAM_GLM52,
        remove_when=REMOVE_GLM52,
        traced=True,
        foreign_markers=(VERL_MARKER,),
        exposes_markers=(VERL_MARKER,),
        foreign_copies=(_verl_copy("patch_vllm_ascend_glm52", r"_patch_glm52_sfa_indexer_scale\(sfa_v1\)",
                                   what="scales DeviceOperator.indexer_select_post_process"),),
    )


INDEXER_BASE = _device_operator_record("BaseDeviceAdaptor")  # Ascend310PDeviceAdaptor inherits it
INDEXER_A5 = _device_operator_record("A5DeviceAdaptor")

INDEXER_CP = PatchRecord(
    id="glm52-ascend-indexer-scale-cp",
    feature="glm52",
    why="The SFA context-parallel path (AscendSFACPImpl) runs the indexer itself, bypassing DeviceOperator, so "
    "verl's in-tree fix leaves it unscaled. Scale weights by n_head^-0.5 * head_dim^-0.5 on entry to its "
    "_execute_indexer_select.",
    target="vllm_ascend.attention.context_parallel.sfa_cp:AscendSFACPImpl._execute_indexer_select",
    gate=GATE,
    distribution=DISTRIBUTION,
    versions=VERSIONS,
    original=Fingerprint(
        contains=(r"^def _execute_indexer_select\(self, q, key, weights, ", r"weights=weights"),
        # a CP path reaching DeviceOperator would be scaled there too: refused at patch time, not guarded at run time
        absent=(ANY_SCALE, r"DeviceOperator\."),
        also=(Fingerprint(
            at=CP_CALLER,
            contains=(r"weights = kw\[:, self\.head_dim:\]\n", r"self\._execute_indexer_select\("),
            absent=(ANY_SCALE, r"weights = weights \*", r"DeviceOperator\."),
            description="the CP caller passes unscaled weights and never calls DeviceOperator",
        ),),
        description="_execute_indexer_select(self, q, key, weights, ...) passing weights unscaled, called by "
        "AscendSFACPImpl.indexer_select_post_process with unscaled weights and no DeviceOperator call",
    ),
    fixed=Fingerprint(
        at=CP_CALLER,
        contains=(SCALED + r"\n[\s\S]*self\._execute_indexer_select\(",),
        absent=(r"DeviceOperator\.",),
        description="AscendSFACPImpl.indexer_select_post_process scales weights before _execute_indexer_select",
    ),
    covered_shapes=(Fingerprint(
        at=f"{CP_MODULE}:<module>",
        contains=(r"^class \w+\([^)\n]*\bAscendSFAImpl\):",),
        absent=(r"^class AscendSFACPImpl\b", OWN_INDEXER),
        also=(Fingerprint(at=f"{CP_COMMON}:<module>", contains=(r"^class DCPImplMixin\b",), absent=(OWN_INDEXER,),
                          description="the CP mixin defines no indexer either",
                          kept=((r"^class DCPImplMixin\b", LATER_SHAPE), (OWN_INDEXER, LATER_SHAPE))),
              Fingerprint(at=SFA_CALLER, contains=(r"DeviceOperator\.indexer_select_post_process\(self, ",),
                          description="AscendSFAImpl's indexer goes through DeviceOperator",
                          kept=((r"DeviceOperator\.indexer_select_post_process\(self, ", LATER_SHAPE),))),
        kept=((r"^class \w+\([^)\n]*\bAscendSFAImpl\):", LATER_SHAPE), (r"^class AscendSFACPImpl\b", LATER_SHAPE),
              (OWN_INDEXER, LATER_SHAPE)),
        description="no CP bypass any more: AscendSFACPImpl is gone and the SFA context-parallel classes (subclasses "
        "of AscendSFAImpl) define no indexer of their own, so they reach DeviceOperator.indexer_select_post_process, "
        "whose weights the device-operator records scale",
    ),),
    covered_by=(INDEXER_BASE, INDEXER_A5),
    wrapper="verl_ascend_ext.features.glm52.ascend.patch_code.sfa:scale_cp_indexer_weights",
    upstream="none found (verl 0.9.1's in-tree copy does not cover the CP path either)",
    remove_when=REMOVE_GLM52,
    traced=True,
    foreign_markers=(VERL_MARKER,),
)

SYNC = r"torch\.npu\.(current_stream\(\)\.)?synchronize\(\)"

CAMEM_SLEEP = PatchRecord(
    id="glm52-ascend-camem-sync-before-sleep",
    feature="glm52",
    why="CaMemAllocator.sleep unmaps device memory while kernels queued on the device may still use it; "
    "synchronise the device first.",
    target="vllm_ascend.device_allocator.camem:CaMemAllocator.sleep",
    gate=GATE,
    distribution=DISTRIBUTION,
    versions=VERSIONS,
    original=Fingerprint(
        contains=(r"for \w+, \w+ in self\.pointer_to_data\.items\(\):", r"unmap_and_release\(\w+\)"),
        absent=(r"synchronize\(",),
        description="unmap_and_release over pointer_to_data with no device synchronisation",
    ),
    fixed=Fingerprint(
        contains=(SYNC + r"\n[\s\S]*unmap_and_release\(",),
        description="torch.npu.synchronize() (or current_stream().synchronize()) before memory is unmapped",
    ),
    wrapper="verl_ascend_ext.features.glm52.ascend.patch_code.camem:synchronize_before_sleep",
    upstream="none found",
    remove_when="the minimum supported vLLM-Ascend synchronises in CaMemAllocator.sleep (doctor: fixed-upstream)",
    traced=False,
    foreign_markers=(VERL_CAMEM_MARKER,),
    exposes_markers=(VERL_CAMEM_MARKER,),
    foreign_copies=(_verl_copy("patch_camem_sleep", r"camem\.torch\.npu\.synchronize\(\)",
                               r"patched_sleep\._verl_camem_sleep_patched = True", what="synchronises in sleep"),),
)

CAPTURE = "vllm_ascend.patch.worker.patch_routed_experts_capture"

ROUTED_EXPERTS = PatchRecord(
    id="glm52-ascend-routed-experts-capture",
    feature="glm52",
    why="vLLM-Ascend installs its routed-experts capture (Ascend padded DP / all-to-all layouts) only when vLLM is "
    "not 0.23.0; with vLLM 0.23.0 routed-expert replay gets vLLM's CUDA-layout capture. Import it in workers.",
    target="vllm_ascend.patch.worker:<module>",
    gate=GATE,
    distribution=DISTRIBUTION,
    versions=VERSIONS,
    original=Fingerprint(
        contains=(r"^if vllm_version_is\('0\.23\.0'\):\n    _V2_MODEL_RUNNER_SUPPORTED = False$",
                  r"^if _V2_MODEL_RUNNER_SUPPORTED:\n"
                  r"    import vllm_ascend\.patch\.worker\.patch_routed_experts_capture$"),
        description="patch_routed_experts_capture imported only when vLLM is not 0.23.0",
    ),
    fixed=Fingerprint(
        contains=(r"^(import vllm_ascend\.patch\.worker\.patch_routed_experts_capture"
                  r"|from vllm_ascend\.patch\.worker import [^\n]*\bpatch_routed_experts_capture\b)",),
        description="patch_routed_experts_capture imported unconditionally",
    ),
    wrapper=CAPTURE,
    upstream="none found (vLLM-Ascend skips it on vLLM 0.23.0 by design: 'only patch routed experts capture in "
    "main2main')",
    remove_when="the minimum supported vLLM-Ascend imports the capture patch with vLLM 0.23, or vLLM > 0.23.0 is "
    "required (it then reports already-applied)",
    traced=False,
    action=Action.IMPORT,
    changes=(Fingerprint(
        contains=(r"^_V2_MODEL_RUNNER_SUPPORTED = not vllm_version_is\('(?!0\.23\.0')[\w.]+'\)$",
                  r"^if _V2_MODEL_RUNNER_SUPPORTED:\n"
                  r"    import vllm_ascend\.patch\.worker\.patch_routed_experts_capture$"),
        description="the capture is now skipped on the later vLLM this vLLM-Ascend pairs with "
        "(_V2_MODEL_RUNNER_SUPPORTED = not vllm_version_is(<that release>)): the same gap, but importing the "
        "capture with that vLLM was not verified",
    ),),
    foreign_copies=(_verl_copy("apply_npu_vllm_patches", r"if _glm52_patch_enabled\(\):\n\s+import "
                               r"vllm_ascend\.patch\.worker\.patch_routed_experts_capture\n",
                               what="imports the capture module"),),
)

RECORDS = (RMSNORM, KV_B_PROJ, INDEXER_BASE, INDEXER_A5, INDEXER_CP, CAMEM_SLEEP, ROUTED_EXPERTS)


@hookimpl
def verl_ascend_ext_gates() -> list[Gate]:
    return [GATE]


@hookimpl
def verl_ascend_ext_patch_records() -> list[PatchRecord]:
    return list(RECORDS)
