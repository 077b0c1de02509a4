"""Feature declaration: the fully-async rollouter's failed generation fails the job (loaded at discovery; no heavy
imports). Its own gate: switching the job watch off (``VERL_ASCEND_EXT_JOB_WATCH=0``) after a false alarm must not
bring verl #6387 back (a failed rollout ending the data, the trainer force-saving, exit 0)."""

from __future__ import annotations

from collections.abc import Mapping

from verl_ascend_ext.features.fully_async_generation.targets import GENERATION_ID
from verl_ascend_ext.patching import Fingerprint, Gate, PatchRecord
from verl_ascend_ext.runtime.findings import Finding
from verl_ascend_ext.runtime.hookspecs import hookimpl

GATE = Gate(
    "VERL_ASCEND_EXT_FULLY_ASYNC_FAIL_CLOSED",
    default=True,
    doc="In fully-async mode a failed rollout generation fails the job (exit 1, the generation's exception named) "
    "instead of ending the data, after which verl's trainer validates, force-saves and exits 0 (verl #6387). "
    "Independent of the job watch's switch.",
)

ROLLOUTER = "verl.experimental.fully_async_policy.fully_async_rollouter"
GENERATION_SWALLOWED = r"await asyncio\.gather\(generation_task, monitor_task, return_exceptions=True\)"
END_SENTINEL = r"finally:(?:\n.*)*?\n\s*await self\.message_queue_client\.put_sample\(sample=None\)"
FAILURE_SIGNAL = r"rollout_failure|RolloutFailure"

GENERATION_FAILS_CLOSED = PatchRecord(
    id=GENERATION_ID,
    feature="fully_async_generation",
    why="In fully-async mode an exception in the rollouter's generation ends the data: the generation's finally sends "
    "the end-of-data sentinel, fit() swallows the exception (gather with return_exceptions=True), and the trainer "
    "takes the sentinel as the end, validates, force-saves and exits 0 over a failed rollout (verl #6387). Here the "
    "sentinel is held back while the generation runs and sent only when it completed, and fit() raises the "
    "generation's exception: the job fails, and nothing claims a completed run.",
    target=f"{ROLLOUTER}:FullyAsyncRollouter.fit",
    gate=GATE,
    distribution="verl",
    versions=">=0.9.0,<0.10",
    original=Fingerprint(
        contains=(GENERATION_SWALLOWED,),
        also=(Fingerprint(at=f"{ROLLOUTER}:FullyAsyncRollouter._streaming_generation_main", contains=(END_SENTINEL,)),),
        description="fit() gathers the generation with return_exceptions=True, and the generation sends the "
        "end-of-data sentinel in its finally, failed or not",
    ),
    fixed=Fingerprint(
        contains=(FAILURE_SIGNAL,),
        description="fit() carries a rollout failure to the trainer and the job (verl PR #6395's rollout_failure)",
        kept=((FAILURE_SIGNAL, "unexercised: verl PR #6395 is not in a release yet; kept so that a verl that "
               "carries it is recognised"),),
    ),
    wrapper="verl_ascend_ext.features.fully_async_generation.patch_code:fit_fails_closed",
    upstream="verl issue #6387, PR #6395 (open)",
    remove_when="the minimum supported verl carries verl PR #6395 or its equal",
    traced=False,
    acts_when="the rollouter's generation raised (the job fails on it instead of ending the data)",
)


@hookimpl
def verl_ascend_ext_gates() -> list[Gate]:
    return [GATE]


@hookimpl
def verl_ascend_ext_patch_records() -> list[PatchRecord]:
    return [GENERATION_FAILS_CLOSED]


@hookimpl
def verl_ascend_ext_doctor_findings(environ: Mapping[str, str]) -> list[Finding]:
    from verl_ascend_ext.features.fully_async_generation.checks import doctor_findings

    return doctor_findings(environ, GATE)
