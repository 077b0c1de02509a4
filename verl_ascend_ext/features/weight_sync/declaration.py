"""Feature declaration: the weight-sync patch records and their gate (loaded at discovery; no heavy imports).

All targets are verl modules imported inside the Ray worker processes that run
``ActorRolloutRefWorker.update_weights`` (and, for the receiver, inside vLLM's worker processes).
verl imports this plugin in every process (``verl.plugins`` entry point, at ``import verl``), and
the engine applies each record from a post-import hook on its module, so the patches land in those
processes without any Ray-specific code.
"""

from __future__ import annotations

from verl_ascend_ext.patching import Fingerprint, Gate, PatchRecord
from verl_ascend_ext.patching.gates import Setting, positive_seconds
from verl_ascend_ext.patching.record import Variant
from verl_ascend_ext.runtime.hookspecs import hookimpl

GATE = Gate(
    "VERL_ASCEND_EXT_WEIGHT_SYNC_FIXES",
    default=True,
    doc="Weight-sync fixes for verl releases that lack them: cross-rank barrier before the KV cache resumes, "
    "no full gc.collect() on the sync path.",
)

BARRIER_TIMEOUT = Setting(
    "VERL_ASCEND_EXT_WEIGHT_SYNC_BARRIER_TIMEOUT",
    default=600.0,
    doc="Seconds each rank waits at the barrier before the KV-cache resume for the other ranks; then it fails, "
    "naming the ranks that did not arrive (default 600: far above the seconds the ranks' offloads differ by, "
    "well below the 30 min a process group waits by default).",
    parse=positive_seconds,
    unit="s",
)

WORKERS = "verl.workers.engine_workers"
UPDATE_WEIGHTS = f"{WORKERS}:ActorRolloutRefWorker.update_weights"
BUCKETS = "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer"
KV_RESUME = r"await self\.rollout\.resume\(tags=\['kv_cache'\]\)"
UPSTREAM_BARRIER = r"await asyncio\.to_thread\(torch\.distributed\.barrier\)"

KV_BARRIER = PatchRecord(
    id="weight-sync-kv-barrier",
    feature="weight_sync",
    why="The leader rank resumes the rollout KV cache while other ranks still hold training memory (OOM on "
    "non-leader ranks); all ranks must meet at a barrier first, bounded by VERL_ASCEND_EXT_WEIGHT_SYNC_BARRIER_TIMEOUT "
    "(a rank that died or stalls is named instead of hanging every other rank).",
    target=UPDATE_WEIGHTS,
    gate=GATE,
    distribution="verl",
    versions=">=0.9.0,<0.10",
    original=Fingerprint(
        contains=(KV_RESUME,),
        absent=(r"torch\.distributed\.barrier",),
        description="KV cache resumed with no cross-rank barrier before it",
    ),
    # verl 0.9.1 (PR #7851) has a barrier there, but an unbounded one that names no rank: not the fix this record
    # makes, so it is a variant to replace, not fixed-upstream. Fixed means a barrier given a timeout.
    variants=(Variant(
        original=Fingerprint(
            contains=(UPSTREAM_BARRIER + r"\n\s*" + KV_RESUME,),
            absent=(r"timeout",),
            description="unbounded barrier (await asyncio.to_thread(torch.distributed.barrier), verl 0.9.1) before "
            "the KV cache resume: it runs the bounded barrier instead",
        ),
        wrapper="verl_ascend_ext.features.weight_sync.patch_code:bounded_upstream_barrier",
    ),),
    fixed=Fingerprint(
        contains=(r"barrier\b[^\n]*\btimeout\b[^\n]*\n\s*" + KV_RESUME,),
        description="a barrier given a timeout right before the KV cache resume",
        kept=((r"barrier\b[^\n]*\btimeout\b[^\n]*\n\s*" + KV_RESUME, "unexercised: no verl release bounds that "
               "barrier yet (0.9.0 has none, 0.9.1's has no timeout); kept so that one that does is recognised"),),
    ),
    wrapper="verl_ascend_ext.features.weight_sync.patch_code:barrier_before_kv_resume",
    upstream="verl PR #7851 (in verl 0.9.1: a barrier without a bound); bounded: none yet",
    remove_when="verl's barrier before the KV-cache resume is bounded and names the missing ranks",
    traced=False,
    acts_when="update_weights resumes a colocated rollout's KV cache on more than one rank (hybrid mode)",
)

LIGHT_EMPTY_CACHE = PatchRecord(
    id="weight-sync-light-empty-cache",
    feature="weight_sync",
    why="update_weights calls aggressive_empty_cache, whose full gc.collect() sits on the sync critical path "
    "(verl #7848: median sync 5.17 s vs 2.71 s); a device empty_cache (synchronised) is enough there.",
    target="verl.utils.memory_utils:aggressive_empty_cache",
    gate=GATE,
    distribution="verl",
    versions=">=0.9.0,<0.10",
    original=Fingerprint(
        contains=(r"^\s*gc\.collect\(\)$",),
        also=(Fingerprint(at=UPDATE_WEIGHTS, contains=(
            r"set_expandable_segments\(False\)\n\s*aggressive_empty_cache\(force_sync=True\)",
            r"self\.actor\.engine\.to\('cpu'[^\n]*\)\n\s*aggressive_empty_cache\(force_sync=True\)",
        )),),
        description="full-GC cache clean-up, called by ActorRolloutRefWorker.update_weights before resuming "
        "weights and after offloading the model (only those calls are made light)",
    ),
    fixed=Fingerprint(
        at=UPDATE_WEIGHTS,
        contains=(r"set_expandable_segments\(False\)\n\s*get_torch_device\(\)\.empty_cache\(\)",
                  r"get_torch_device\(\)\.synchronize\(\)\n\s*get_torch_device\(\)\.empty_cache\(\)"),
        absent=(r"aggressive_empty_cache\(",),
        description="update_weights uses get_torch_device().empty_cache() (synchronised after offload)",
    ),
    wrapper="verl_ascend_ext.features.weight_sync.patch_code:light_empty_cache_in_update_weights",
    upstream="verl PR #7864 (in verl 0.9.1)",
    remove_when="the minimum supported verl is 0.9.1",
    traced=False,
    acts_when="update_weights empties the device cache on the weight-sync path (hybrid mode)",
    needs=(KV_BARRIER,),  # its update_weights replacement marks the calls to make light
)


def _bucket_record(side: str) -> PatchRecord:
    return PatchRecord(
        id=f"weight-sync-{side.lower()}-no-full-gc",
        feature="weight_sync",
        why=f"BucketedWeight{side}._cleanup runs a full gc.collect() after every weight sync.",
        target=f"{BUCKETS}:BucketedWeight{side}._cleanup",
        gate=GATE,
        distribution="verl",
        versions=">=0.9.0,<0.10",
        original=Fingerprint(
            contains=(r"^\s*gc\.collect\(\)$", r"get_torch_device\(\)\.empty_cache\(\)"),
            description="clean-up with a full gc.collect() before ipc_collect/empty_cache",
        ),
        fixed=Fingerprint(
            contains=(r"get_torch_device\(\)\.empty_cache\(\)",),
            absent=(r"gc\.collect\(",),
            description="clean-up without gc.collect()",
        ),
        wrapper="verl_ascend_ext.features.weight_sync.patch_code:cleanup_without_full_gc",
        upstream="verl PR #7873 (in verl 0.9.1)",
        remove_when="the minimum supported verl is 0.9.1",
        traced=False,
    )


SENDER_NO_GC = _bucket_record("Sender")
RECEIVER_NO_GC = _bucket_record("Receiver")


@hookimpl
def verl_ascend_ext_gates() -> list[Gate]:
    return [GATE]


@hookimpl
def verl_ascend_ext_settings() -> list[Setting]:
    return [BARRIER_TIMEOUT]


@hookimpl
def verl_ascend_ext_patch_records() -> list[PatchRecord]:
    return [KV_BARRIER, LIGHT_EMPTY_CACHE, SENDER_NO_GC, RECEIVER_NO_GC]
