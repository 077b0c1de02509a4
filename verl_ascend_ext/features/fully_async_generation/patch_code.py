"""Replacement code of ``fully-async-generation-fails-closed`` (imported only when the patch is applied: in the
fully-async rollouter's Ray actor).

``fit_fails_closed`` runs verl's ``FullyAsyncRollouter.fit`` with two things changed for the call: the rollouter's
message-queue client holds back the end-of-data sentinel (``put_sample(sample=None)``) instead of sending it, and the
generation coroutine is watched for an exception. When fit returns: a generation that raised makes fit raise
``RolloutGenerationFailed`` from it (the sentinel never sent: the trainer cannot take the failure as the end of the
data and save over it; the fit's failure ends the job in the TaskRunner's wait); a generation that completed has its
held sentinel sent, as verl would have.
"""

from __future__ import annotations

from typing import Any

from verl_ascend_ext.features.fully_async_generation.targets import GENERATION_ID
from verl_ascend_ext.patching.status import acted, stood_down

GENERATION = "_streaming_generation_main"


class RolloutGenerationFailed(RuntimeError):
    """The fully-async rollouter's generation raised: the job fails on it."""


class SentinelHeldClient:
    """A message-queue client whose end-of-data sentinel is held back (every other call goes through)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.held = False

    async def put_sample(self, *args: Any, **kwargs: Any) -> Any:
        if not args and set(kwargs) == {"sample"} and kwargs["sample"] is None:
            self.held = True
            return True
        return await self._client.put_sample(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


async def fit_fails_closed(original: Any, rollouter: Any, *args: Any, **kwargs: Any) -> Any:
    """verl's ``fit`` that fails when its generation failed (see the module's docstring)."""
    client = rollouter.message_queue_client
    if client is None:  # verl's own fit raises its error for that
        stood_down(GENERATION_ID, "no message queue client set: verl's fit raises its own error")
        return await original(rollouter, *args, **kwargs)
    generation = getattr(rollouter, GENERATION)
    failures: list[BaseException] = []

    async def watched_generation(*g_args: Any, **g_kwargs: Any) -> Any:
        try:
            return await generation(*g_args, **g_kwargs)
        except Exception as err:
            failures.append(err)
            raise

    held = SentinelHeldClient(client)
    setattr(rollouter, GENERATION, watched_generation)
    rollouter.message_queue_client = held
    try:
        result = await original(rollouter, *args, **kwargs)
    finally:
        delattr(rollouter, GENERATION)
        rollouter.message_queue_client = client
    if failures:
        acted(GENERATION_ID)
        err = failures[0]
        raise RolloutGenerationFailed(
            f"the fully-async rollouter's generation failed: {type(err).__name__}: {err}. The end-of-data signal was "
            "not sent, so the trainer did not take the failure as the end of training. Fix: the cause above; the "
            "last whole checkpoint resumes") from err
    if held.held:
        await client.put_sample(sample=None)
    return result
