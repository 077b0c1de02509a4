"""Feature declaration: the GLM-5.2 vLLM-core patch records (``vllm.v1.engine.core``) and their gate.

Imported at discovery in every process: declarations only, nothing from vLLM. The fingerprints were
written against the normalised source of vLLM 0.23.0 (the code to fix) and of every vLLM release from
0.24.0 to 0.33.0 (the fix in place, in three shapes); tests run them on those real released files, on
mutated copies and with the diffs of ``patches/vllm/`` applied.
"""

from __future__ import annotations

from verl_ascend_ext.features.glm52 import GATE, VERL_ENABLED, VERL_MARKER
from verl_ascend_ext.patching import Action, Fingerprint, Gate, PatchRecord
from verl_ascend_ext.patching.record import ForeignCopy
from verl_ascend_ext.runtime.hookspecs import hookimpl

DISTRIBUTION = "vllm"
VERSIONS = ">=0.23.0,<=0.33.0"  # 0.23.0: the code to fix; 0.24.0 ... 0.33.0: the fix, recognised
UPSTREAM = "vLLM commits 6f1ada0f91 + 11d60545e2 (named by verl 0.9.1), released in vLLM 0.24.0"
REMOVE_WHEN = "the minimum supported vLLM is 0.24.0 (doctor then reports fixed-upstream)"

VERL_COPY = ForeignCopy(
    name="verl's in-tree GLM-5.2 patch (verl.utils.vllm.npu_vllm_patch)",
    target="verl.utils.vllm.npu_vllm_patch:patch_vllm_glm52_partial_wake_up",
    fingerprint=Fingerprint(
        contains=(r"getattr\(original_wake_up, _GLM52_PATCH_MARKER, False\)",
                  r"engine_core\.wake_up = patched_wake_up",
                  r"dp_engine_core\.execute_dummy_batch = patched_dummy_batch"),
        description="patches EngineCore.wake_up and DPEngineCoreProc.execute_dummy_batch, marker-checked",
    ),
    enabled_by=VERL_ENABLED,
)

# The resume call guarded by "the executor is fully awake", directly (0.24-0.30) or through a
# variable (0.31+: ``fully_awake = not self.model_executor.is_sleeping`` ... ``if fully_awake:``).
_GUARDED_RESUME = (r"(if not self\.model_executor\.is_sleeping:\n\s+self\.resume_scheduler\(\)"
                   r"|(\w+) = not self\.model_executor\.is_sleeping\n(?:.*\n)*?\s*if \2:\n"
                   r"\s+self\.resume_scheduler\(\))")

WAKE_UP = PatchRecord(
    id="glm52-vllm-wake-up-resume-when-awake",
    feature="glm52",
    why="EngineCore.wake_up resumes scheduling after any wake-up, also a weights-only one while the KV cache "
    "still sleeps, so requests are scheduled onto unmapped memory. Resume only once the executor is fully awake.",
    target="vllm.v1.engine.core:EngineCore.wake_up",
    gate=GATE,
    distribution=DISTRIBUTION,
    versions=VERSIONS,
    original=Fingerprint(
        # The whole body: the replacement re-implements it, so it must be exactly this code.
        contains=(r"\Adef wake_up\(self, tags(: [^=\n]+)?=None\)( -> None)?:\n"
                  r"    if tags is not None and 'scheduling' in tags:\n"
                  r"        tags = \[t for t in tags if t != 'scheduling'\]\n"
                  r"    if tags is None or tags:\n"
                  r"        self\.model_executor\.wake_up\(tags\)\n"
                  r"    self\.resume_scheduler\(\)\Z",),
        description="drops the 'scheduling' tag, wakes the executor, then resumes the scheduler unconditionally",
    ),
    fixed=Fingerprint(
        contains=(r"self\.model_executor\.wake_up\(tags\)", _GUARDED_RESUME),
        absent=(r"^    self\.resume_scheduler\(\)$",),
        description="the scheduler is resumed only under 'not self.model_executor.is_sleeping' (directly or via "
        "a variable), never unconditionally",
    ),
    wrapper="verl_ascend_ext.features.glm52.vllm.patch_code:resume_only_when_awake",
    upstream=UPSTREAM,
    remove_when=REMOVE_WHEN,
    traced=False,
    acts_when="a wake-up leaves part of the engine asleep (verl wakes the weights before the KV cache): scheduling "
              "stays paused",
    foreign_markers=(VERL_MARKER,),
    exposes_markers=(VERL_MARKER,),
    foreign_copies=(VERL_COPY,),
)

DUMMY_BATCH = PatchRecord(
    id="glm52-vllm-dp-no-dummy-forward-asleep",
    feature="glm52",
    why="The data-parallel busy loop runs a dummy forward whenever a wave is running and this rank had no work, "
    "also while the executor sleeps (its weights or KV cache unmapped). Skip the dummy forward while asleep.",
    # The bug is in the caller (run_busy_loop, an endless loop that cannot be wrapped); the patch goes on the
    # callee it runs, which DPEngineCoreProc inherits from EngineCore: the wrapper is set on DPEngineCoreProc.
    target="vllm.v1.engine.core:DPEngineCoreProc.execute_dummy_batch",
    gate=GATE,
    distribution=DISTRIBUTION,
    versions=VERSIONS,
    original=Fingerprint(
        at="DPEngineCoreProc.run_busy_loop",
        contains=(r"if not executed:\n(\s+)if not local_unfinished_reqs and \(not self\.engines_running\):\n"
                  r"\s+continue\n\1with self\.log_iteration_details\(None\):\n\1    self\.execute_dummy_batch\(\)\n",),
        absent=(r"is_sleeping",),
        also=(Fingerprint(contains=(r"\Adef execute_dummy_batch\(self\)( -> None)?:\n"
                                    r"    self\.model_executor\.execute_dummy_batch\(\)\Z",),
                          description="execute_dummy_batch only runs the executor's dummy batch"),),
        description="run_busy_loop runs execute_dummy_batch() for every idle step of a running wave, with no "
        "sleep check (and execute_dummy_batch only calls the executor's)",
    ),
    fixed=Fingerprint(
        at="DPEngineCoreProc.run_busy_loop",
        contains=(r"(el)?if not self\.model_executor\.is_sleeping:\n(\s+)(with self\.\w+\(None\)( as \w+)?:\n\2    )?"
                  r"self\.execute_dummy_batch\(\)",),
        description="run_busy_loop runs the dummy forward only under 'not self.model_executor.is_sleeping'",
    ),
    wrapper="verl_ascend_ext.features.glm52.vllm.patch_code:skip_dummy_batch_while_asleep",
    upstream=UPSTREAM,
    remove_when=REMOVE_WHEN,
    traced=False,
    acts_when="a sleeping data-parallel engine is asked for a dummy forward",
    foreign_markers=(VERL_MARKER,),
    exposes_markers=(VERL_MARKER,),
    foreign_copies=(VERL_COPY,),
)

ENGINE_CORE_ENTRY = PatchRecord(
    id="glm52-vllm-engine-core-entry",
    feature="glm52",
    why="Second inheritance path into the spawned engine-core process (the first is the vllm.general_plugins "
    "entry point, which EngineCore.__init__ loads): vLLM starts that process with target="
    "EngineCoreProc.run_engine_core, pickled by reference; ours boots the plugin in the child, then runs vLLM's.",
    target="vllm.v1.engine.core:EngineCoreProc.run_engine_core",
    gate=GATE,
    distribution=DISTRIBUTION,
    versions=VERSIONS,
    original=Fingerprint(
        contains=(r"\A@staticmethod\ndef run_engine_core\(\*args, [^\n]*\*\*kwargs\):",
                  r"engine_core = DPEngineCoreProc\(\*args, \*\*kwargs\)",
                  r"engine_core\.run_busy_loop\(\)"),
        description="static entry point that builds DPEngineCoreProc/EngineCoreProc from (*args, **kwargs) and "
        "runs its busy loop",
    ),
    fixed=Fingerprint.never_matching("(no upstream form: stands down when the fixes it carries need no carrying)"),
    wrapper="verl_ascend_ext.features.glm52.vllm.patch_code:run_engine_core",
    upstream="not an upstream fix: carries " + UPSTREAM,
    remove_when=REMOVE_WHEN,
    traced=False,
    action=Action.STATICMETHOD,
    serves=(WAKE_UP, DUMMY_BATCH),
)

RECORDS = (WAKE_UP, DUMMY_BATCH, ENGINE_CORE_ENTRY)  # entry last: it serves the two before it


@hookimpl
def verl_ascend_ext_gates() -> list[Gate]:
    return [GATE]


@hookimpl
def verl_ascend_ext_patch_records() -> list[PatchRecord]:
    return list(RECORDS)
