"""Cases of the acts contract (``verl_ascend_ext.testing.acts``) for this package's ``acts_when`` records: one call
per path each replacement takes, with small stand-ins for the target's arguments (the verl, vLLM and vLLM-Ascend
objects they touch), and whether the fix acts there.

What each stand-in holds is what the patch code reads of the real object (named in each case); the replacements run
as the engine builds them. Paths that need more than one distributed rank (the KV barrier acting) are exercised
with real gloo ranks in ``tests/scenarios/weight_sync*.py`` and in the engine tier's real jobs.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import torch

from verl_ascend_ext.testing import ActsCase

BARRIER, LIGHT = "weight-sync-kv-barrier", "weight-sync-light-empty-cache"
WAKE_UP = "glm52-vllm-wake-up-resume-when-awake"
DUMMY, KV_B_PROJ = "glm52-vllm-dp-no-dummy-forward-asleep", "glm52-ascend-sfa-keep-kv-b-proj"
FSDP2, PADDING, EMPTY = "distill-fsdp2-topk", "padding-teacher-fields", "distill-empty-micro-batch"
RAY_ENV, EXPORT, EXPORT_FSDP = "ray-runtime-env-gates", "checkpoint-export-check", "checkpoint-export-check-fsdp"
UPSTREAM_BARRIER = "verl_ascend_ext.features.weight_sync.patch_code:bounded_upstream_barrier"  # verl 0.9.1's shape
ROUTE_CHECK, ROUTE_AGREEMENT, ROUTE_METRIC = "r3-route-check", "r3-route-agreement", "r3-route-agreement-metric"
WATCH, WATCH_ASYNC, GENERATION = "job-watch", "job-watch-fully-async", "fully-async-generation-fails-closed"
SLEEP_ASCEND, SLEEP_CUDA, SLEEP_CPU = "sleep-memory-ascend", "sleep-memory-cuda", "sleep-memory-cpu"
SLEEP_METRIC = "sleep-memory-metric"
WAKE_ASCEND, WAKE_CUDA, WAKE_CPU = "wake-up-time-ascend", "wake-up-time-cuda", "wake-up-time-cpu"


async def _update_weights(self: Any) -> None:
    """verl's ``update_weights`` on a checkpoint-engine sync: it returns without touching a rollout."""


def _engine(sleeping_after_wake: bool) -> SimpleNamespace:
    """vLLM's ``EngineCore`` as ``wake_up`` reads it: the executor's ``wake_up`` and ``is_sleeping``, and
    ``resume_scheduler``."""
    executor = SimpleNamespace(is_sleeping=True)

    def wake_up(tags: list[str] | None) -> None:
        executor.is_sleeping = sleeping_after_wake

    executor.wake_up = wake_up
    return SimpleNamespace(model_executor=executor, resume_scheduler=lambda: None)


@contextmanager
def _package_env(**values: str) -> Iterator[None]:
    """The process's environment with none of this package's variables but ``values``, restored afterwards."""
    saved = dict(os.environ)
    for key in [k for k in os.environ if k.startswith(("VERL_ASCEND_EXT_", "VERL_VLLM_ASCEND_"))]:
        del os.environ[key]
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _with_env(call: Callable[[Callable[..., Any]], Any], **values: str) -> Callable[[Callable[..., Any]], Any]:
    def run(replacement: Callable[..., Any]) -> Any:
        with _package_env(**values):
            return call(replacement)

    return run


def _inside_update_weights(replacement: Callable[..., Any]) -> Any:
    """Call ``replacement`` from inside the weight sync (the KV barrier's patch code marks the call)."""
    from verl_ascend_ext.features.weight_sync.patch_code import barrier_before_kv_resume

    async def update_weights(self: Any) -> None:
        replacement()

    return barrier_before_kv_resume(update_weights, SimpleNamespace())


def _saving(manager: SimpleNamespace, **env: str) -> Callable[[Callable[..., Any]], Any]:
    """Call a save replacement as verl does (``hf_ckpt_path`` / ``local_path`` in a fresh directory, so that the
    status file the check writes beside the export lands there)."""
    def run(replacement: Callable[..., Any]) -> Any:
        with tempfile.TemporaryDirectory() as tmp, _package_env(VERL_ASCEND_EXT_STATUS_DIR=f"{tmp}/status", **env):
            return replacement(manager, os.path.join(tmp, "ckpt"))

    return run


def _template(teacher: bool) -> Callable[..., Any]:
    """verl's ``construct_minimal_padding_template``: a padding sample, with teacher fields in a distilling job."""
    def construct(*args: Any, **kwargs: Any) -> tuple[dict[str, torch.Tensor], str]:
        sample = {"input_ids": torch.zeros(6, dtype=torch.long)}
        if teacher:
            sample.update(teacher_ids=torch.zeros(4, 2, dtype=torch.long), teacher_logprobs=torch.zeros(4, 2))
        return sample, "padding"

    return construct


def _loss(config: Any, distillation_config: Any, model_output: dict, data: dict) -> tuple[torch.Tensor, dict]:
    """verl's ``distillation_loss``: a loss and no metric (what the patch reads of its result)."""
    return torch.tensor(1.0), {}


def _micro_batch(valid: bool) -> dict[str, torch.Tensor]:
    return {"response_mask": torch.tensor([[1, 1, 0]] if valid else [[0, 0, 0]])}


def _save(*args: Any, **kwargs: Any) -> None:
    """verl's save (the export itself): done."""


def _r3_engine(mode: str = "R3", replaying: bool = True, module: list | None = None) -> SimpleNamespace:
    """verl's MegatronEngine as the route records read it: the router-replay mode, Megatron's MoE config, the model."""
    config = SimpleNamespace(num_moe_experts=4, moe_router_topk=2, num_layers=1, moe_layer_freq=1)
    return SimpleNamespace(engine_config=SimpleNamespace(router_replay=SimpleNamespace(mode=mode)), tf_config=config,
                           enable_routing_replay=replaying, module=module or [])


def _micro_batch_r3(replaying: bool = True, masks: bool = True) -> Any:
    """One micro-batch as verl's R3 forward gets it: 2 packed samples, their routes, dense masks, the replay flag."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    def jagged(rows: list[torch.Tensor]) -> torch.Tensor:
        return torch.nested.nested_tensor(rows, layout=torch.jagged)

    tensors = {"input_ids": jagged([torch.zeros(4, dtype=torch.long), torch.zeros(3, dtype=torch.long)]),
               "routed_experts": jagged([torch.tensor([[[0, 1]], [[2, 3]], [[1, 2]], [[0, 3]]]),
                                         torch.tensor([[[3, 1]], [[2, 0]], [[0, 0]]])])}
    if masks:
        tensors.update(attention_mask=torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]]),
                       response_mask=torch.tensor([[1, 1], [1, 1]]))
    data = TensorDict(tensors, batch_size=[2])
    tu.assign_non_tensor(data, enable_routing_replay=replaying)
    return data


def _model_inputs(engine: Any, batch: Any) -> dict:
    """verl's ``prepare_model_inputs``: the micro-batch's input_ids and routes."""
    return {"input_ids": batch["input_ids"], "routed_experts": batch.get("routed_experts", None)}


def _replay(action: str, counted: bool = False) -> SimpleNamespace:
    """verl's ``RouterReplay`` of one layer: its action and, replaying, the targets with their mask."""
    from verl_ascend_ext.features.routing.agreement import COUNTS

    replay = SimpleNamespace(router_replay_action=SimpleNamespace(value=action),
                             target_topk_idx=torch.tensor([[0, 1], [2, 3]]), target_replay_mask=torch.tensor([1, 0]))
    if counted:  # this step already counted in this layer
        setattr(replay, COUNTS, torch.tensor([1, 1]))
    return replay


def _topk(scores: torch.Tensor, topk: int, num_groups: Any = None, group_topk: Any = None) -> Any:
    return torch.topk(scores, k=topk, dim=1)


def _get_replay_topk(replay: Any, scores: torch.Tensor, topk: int, num_groups: Any = None, group_topk: Any = None,
                     default_compute_topk: Any = None) -> Any:
    """verl's ``get_replay_topk``: replaying under a mask it calls the router's own top-k once."""
    if replay.router_replay_action.value == "replay_forward":
        default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
        return scores.gather(1, replay.target_topk_idx), replay.target_topk_idx
    return default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)


def _replaying(action: str, counted: bool = False) -> Callable[[Callable[..., Any]], Any]:
    """A router call of verl's routing on a fresh ``RouterReplay`` (its counters start empty on every call)."""
    return lambda r: r(_replay(action, counted), torch.rand(2, 4), 2, default_compute_topk=_topk)


def _routers(counted: bool) -> list:
    """A model chunk holding one Megatron TopKRouter (layer 1) whose RouterReplay counted this step or not (verl's
    replay module imported, as in every rank of a Megatron R3 actor)."""
    import verl.utils.megatron.router_replay_patch  # noqa: F401
    from megatron.core.transformer.moe.router import TopKRouter

    from verl_ascend_ext.features.routing.agreement import COUNTS

    router = TopKRouter.__new__(TopKRouter)  # only what verl's iter_model_routers reads: the type, the replay
    torch.nn.Module.__init__(router)
    router.layer_number = 1
    router.router_replay = SimpleNamespace(**({COUNTS: torch.tensor([3, 4])} if counted else {}))
    chunk = torch.nn.Module()
    chunk.decoder = torch.nn.ModuleList([router])
    return [chunk]


def _update(engine: SimpleNamespace) -> Callable[[Callable[..., Any]], Any]:
    """``train_mini_batch`` on the worker (verl returns the metrics on a rank with outputs)."""
    return lambda r: r(SimpleNamespace(engine=engine), None)


def _metrics_output(worker: Any, data: Any) -> Any:
    from verl.utils import tensordict_utils as tu

    return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": {"loss": [0.5]}})


def _watching(lost: bool | None) -> Callable[[Callable[..., Any]], Any]:
    """The trainer's ``fit`` (``original``: given an event the driver's end sets, it waits for it, at most 2.5 s: two
    looks of the watch) called in a job whose status directory holds one EngineCore record of this host: a pid that
    no longer runs (``lost``) or this process's parent (alive); ``lost`` None: no job id set (a process of no job).
    This process's end (``process_end.exit_now``) is replaced by setting the event."""

    def call(replacement: Callable[..., Any]) -> Any:
        import json
        import socket
        import uuid

        from verl_ascend_ext.features.job_watch import patch_code
        from verl_ascend_ext.runtime.records.schema import new_record
        from verl_ascend_ext.runtime.records.store import record_name

        job = f"case-{uuid.uuid4().hex[:8]}"
        with tempfile.TemporaryDirectory() as base:
            os.chmod(base, 0o700)
            os.makedirs(os.path.join(base, "local"), mode=0o700)
            pid = 2**22 + 7 if lost else os.getppid()
            rec = new_record(host=socket.gethostname(), pid=pid, role="engine-core", job=job, started=1.0,
                             updated=1.0)
            with open(os.path.join(base, "local", record_name(rec["host"], pid, None)), "w") as f:
                f.write(json.dumps(rec))
            ended = threading.Event()
            saved = patch_code.process_end.exit_now
            patch_code.process_end.exit_now = lambda code, error: ended.set()
            env = {"VERL_ASCEND_EXT_STATUS_DIR": base, **({} if lost is None else {"VERL_ASCEND_EXT_JOB": job})}
            try:
                with _package_env(**env):
                    result = replacement(ended)
                    if asyncio.iscoroutine(result):
                        asyncio.run(result)
            finally:
                patch_code.process_end.exit_now = saved

    return call


async def _fit_async(ended: threading.Event) -> None:
    """The fully-async trainer's ``fit`` (async): waits for the event, at most 2.5 s."""
    for _ in range(25):
        if ended.is_set():
            return
        await asyncio.sleep(0.1)


class _Rollouter:
    """verl's ``FullyAsyncRollouter`` as ``fit_fails_closed`` touches it: ``message_queue_client`` (its
    ``put_sample``) and ``_streaming_generation_main``, which sends the end-of-data sentinel in its ``finally``."""

    def __init__(self, fails: bool, client: bool = True) -> None:
        self.sent: list[Any] = []
        self.fails = fails
        self.message_queue_client = SimpleNamespace(put_sample=self._put) if client else None

    async def _put(self, sample: Any) -> bool:
        self.sent.append(sample)
        return True

    async def _streaming_generation_main(self) -> None:
        try:
            await self.message_queue_client.put_sample(sample="a sample")
            if self.fails:
                raise RuntimeError("engine dead")
        finally:
            await self.message_queue_client.put_sample(sample=None)


async def _fit(rollouter: _Rollouter) -> None:
    """verl's ``fit``: the generation gathered with ``return_exceptions=True`` (its exception swallowed)."""
    await asyncio.gather(rollouter._streaming_generation_main(), return_exceptions=True)


def _fitting(fails: bool, client: bool = True) -> Callable[[Callable[..., Any]], Any]:
    async def call(replacement: Callable[..., Any]) -> None:
        from verl_ascend_ext.features.fully_async_generation.patch_code import RolloutGenerationFailed

        rollouter = _Rollouter(fails, client)
        try:
            await replacement(rollouter)
        except RolloutGenerationFailed:
            assert fails and rollouter.sent == ["a sample"], rollouter.sent  # the sentinel held back
        else:
            assert not fails and rollouter.sent == (["a sample", None] if client else []), rollouter.sent

    return call


@contextmanager
def _meter(name: str, readable: bool) -> Iterator[None]:
    """The sleep-memory record's meter ``name`` (``meters.npu`` / ``cuda`` / ``host``) answering a reading, or failing
    as a device query does where there is no such device."""
    from verl_ascend_ext.features.sleep_memory import meters

    def unreadable() -> Any:
        raise RuntimeError("no such device here")

    saved = getattr(meters, name)
    setattr(meters, name, (lambda: meters.Reading(1 << 30, 64 << 30, "acts case")) if readable else unreadable)
    try:
        yield
    finally:
        setattr(meters, name, saved)


def _sleeping(meter: str, readable: bool) -> Callable[[Callable[..., Any]], Any]:
    """vLLM's worker ``sleep(level=1)`` (the worker's ``rank`` and ``local_rank`` are what the record reads)."""
    def run(replacement: Callable[..., Any]) -> Any:
        with _meter(meter, readable), _package_env():
            return replacement(SimpleNamespace(rank=0, local_rank=0), level=1)

    return run


def _waking(raises: bool) -> Callable[[Callable[..., Any]], Any]:
    """vLLM's worker ``wake_up(tags=["weights"])`` (the worker's ``rank`` is what the record reads); the original
    (``_wake_up``) raises when the worker's ``fails`` says so: a wake-up that failed is not timed."""
    def run(replacement: Callable[..., Any]) -> Any:
        try:
            return replacement(SimpleNamespace(rank=0, local_rank=0, fails=raises), tags=["weights"])
        except RuntimeError as err:
            assert raises and "wake-up failed" in str(err), err
            return None

    return run


def _wake_up(self: Any, tags: list[str] | None = None) -> None:
    if self.fails:
        raise RuntimeError("wake-up failed (acts case)")


def _logging(slept: bool, data: dict[str, Any]) -> Callable[[Callable[..., Any]], Any]:
    """verl's ``Tracking.log(data=..., step=1)`` in a job whose status directory holds a rollout worker's record
    with one sleep, or none."""
    def run(replacement: Callable[..., Any]) -> Any:
        import json
        import socket
        import time

        from verl_ascend_ext.runtime.records import store
        from verl_ascend_ext.runtime.records.schema import new_record

        with tempfile.TemporaryDirectory() as tmp, _package_env(VERL_ASCEND_EXT_STATUS_DIR=tmp,
                                                                VERL_ASCEND_EXT_JOB="acts-job"):
            if slept:
                os.makedirs(os.path.join(tmp, "local"))
                now, host = time.time(), socket.gethostname()
                sleep = {"n": 1, "at": now, "level": 1, "in_use": 1 << 30, "freed": 1 << 33, "total": 1 << 36,
                         "meter": "acts case", "cleanup": None}
                record = new_record(host=host, pid=4_000_000, proc_start=1, role="vllm-worker", job="acts-job",
                                    started=now, updated=now, sleeps=[sleep])
                with open(os.path.join(tmp, "local", store.record_name(host, 4_000_000, 1)), "w") as f:
                    json.dump(record, f)
            return replacement(SimpleNamespace(), data=data, step=1)

    return run


CASES = [
    # weight-sync-kv-barrier: a worker with no colocated rollout (fully-async's trainer) calls the original only
    ActsCase(BARRIER, "no colocated rollout", _update_weights, lambda r: r(SimpleNamespace()), acts=False),
    ActsCase(BARRIER, "no colocated rollout (verl 0.9.1)", _update_weights, lambda r: r(SimpleNamespace()),
             acts=False, wrapper=UPSTREAM_BARRIER),
    # weight-sync-light-empty-cache: outside update_weights verl's full clean-up runs; inside it the light one acts
    ActsCase(LIGHT, "outside update_weights", lambda: None, lambda r: r(), acts=False),
    ActsCase(LIGHT, "inside update_weights", lambda: None, _inside_update_weights, acts=True),
    # glm52 wake-up: a weights-only wake-up leaves the KV cache asleep (the fix keeps scheduling paused); a full one
    # does not
    ActsCase(WAKE_UP, "weights only, KV cache still asleep", lambda self, tags=None: None,
             lambda r: r(_engine(sleeping_after_wake=True), ["weights"]), acts=True),
    ActsCase(WAKE_UP, "fully awake", lambda self, tags=None: None,
             lambda r: r(_engine(sleeping_after_wake=False), None), acts=False),
    ActsCase(DUMMY, "asleep", lambda self: "dummy", lambda r: r(SimpleNamespace(
        model_executor=SimpleNamespace(is_sleeping=True))), acts=True),
    ActsCase(DUMMY, "awake", lambda self: "dummy", lambda r: r(SimpleNamespace(
        model_executor=SimpleNamespace(is_sleeping=False))), acts=False),
    ActsCase(KV_B_PROJ, "a layer with kv_b_proj", lambda self: None, lambda r: r(SimpleNamespace(
        kv_b_proj=SimpleNamespace(weight=torch.ones(2, 2)))), acts=True),
    ActsCase(KV_B_PROJ, "no kv_b_proj", lambda self: None, lambda r: r(SimpleNamespace()), acts=False),
    ActsCase(FSDP2, "strategy fsdp2", lambda config, *a: config.strategy,
             lambda r: r(SimpleNamespace(strategy="fsdp2")), acts=True),
    ActsCase(FSDP2, "strategy fsdp", lambda config, *a: config.strategy,
             lambda r: r(SimpleNamespace(strategy="fsdp")), acts=False),
    ActsCase(PADDING, "teacher fields", _template(teacher=True), lambda r: r(None, None, 2), acts=True),
    ActsCase(PADDING, "no teacher", _template(teacher=False), lambda r: r(None, None, 2), acts=False),
    ActsCase(EMPTY, "padding only", _loss, lambda r: r(None, None, {}, _micro_batch(valid=False)), acts=True),
    ActsCase(EMPTY, "a response token", _loss, lambda r: r(None, None, {}, _micro_batch(valid=True)), acts=False),
    ActsCase(RAY_ENV, "a package variable set", lambda *a, **k: {},
             _with_env(lambda r: r(), VERL_ASCEND_EXT_DISTILLATION_FIXES="1"), acts=True),
    ActsCase(RAY_ENV, "nothing to carry", lambda *a, **k: {}, _with_env(lambda r: r()), acts=False),
    # the export checks: rank 0 writes (and checks) the export; other ranks and a PEFT adapter are not checked.
    # Mode off: the check records where the export came from and stops there (no reference needed).
    ActsCase(EXPORT, "rank 0, mode off", _save, _saving(SimpleNamespace(rank=0, peft_cls=None),
                                                        VERL_ASCEND_EXT_EXPORT_CHECK="off"), acts=True),
    ActsCase(EXPORT, "rank 1", _save, _saving(SimpleNamespace(rank=1, peft_cls=None)), acts=False),
    ActsCase(EXPORT, "a PEFT adapter", _save, _saving(SimpleNamespace(rank=0, peft_cls=object)), acts=False),
    ActsCase(EXPORT_FSDP, "rank 0 writing hf_model, mode off", _save,
             _saving(SimpleNamespace(rank=0, should_save_hf_model=True), VERL_ASCEND_EXT_EXPORT_CHECK="off"),
             acts=True),
    ActsCase(EXPORT_FSDP, "no hf_model", _save, _saving(SimpleNamespace(rank=0, should_save_hf_model=False)),
             acts=False),
    # the route check: an R3 micro-batch the actor replays is checked; the reference's forward (no replay flag), a job
    # without R3, and a micro-batch without the masks that tell which tokens feed the response are not
    ActsCase(ROUTE_CHECK, "R3 micro-batch, replay on", _model_inputs, lambda r: r(_r3_engine(), _micro_batch_r3()),
             acts=True),
    ActsCase(ROUTE_CHECK, "replay off (the reference)", _model_inputs,
             lambda r: r(_r3_engine(), _micro_batch_r3(replaying=False)), acts=False),
    ActsCase(ROUTE_CHECK, "R2, not R3", _model_inputs, lambda r: r(_r3_engine("R2"), _micro_batch_r3()), acts=False),
    ActsCase(ROUTE_CHECK, "no attention / response mask", _model_inputs,
             lambda r: r(_r3_engine(), _micro_batch_r3(masks=False)), acts=False),
    # the agreement count: a forward replaying rollout routes counts (reported once per layer and step); recording
    # (R2's log-prob forward), the backward recompute and a layer already counted this step report nothing
    ActsCase(ROUTE_AGREEMENT, "replaying rollout routes", _get_replay_topk, _replaying("replay_forward"),
             acts=True),
    ActsCase(ROUTE_AGREEMENT, "recording", _get_replay_topk, _replaying("record"), acts=False),
    ActsCase(ROUTE_AGREEMENT, "backward recompute", _get_replay_topk, _replaying("replay_backward"),
             acts=False),
    ActsCase(ROUTE_AGREEMENT, "layer counted already this step", _get_replay_topk,
             _replaying("replay_forward", counted=True), acts=False),
    # the metric: an R3 update whose routers counted reports; a non-R3 worker (the critic) and an update with nothing
    # counted do not
    ActsCase(ROUTE_METRIC, "R3 update, tokens counted", _metrics_output,
             lambda r: _update(_r3_engine(module=_routers(counted=True)))(r), acts=True),
    ActsCase(ROUTE_METRIC, "not R3", _metrics_output, lambda r: _update(_r3_engine("disabled"))(r), acts=False),
    ActsCase(ROUTE_METRIC, "nothing counted", _metrics_output,
             lambda r: _update(_r3_engine(module=_routers(counted=False)))(r), acts=False),
    # the job watch: a process of the job lost ends the job; alive processes, or no job, do not
    ActsCase(WATCH, "an EngineCore of the job lost", lambda ended: ended.wait(2.5), _watching(lost=True), acts=True),
    ActsCase(WATCH, "the job's processes alive", lambda ended: ended.wait(2.5), _watching(lost=False), acts=False),
    ActsCase(WATCH, "a process of no job", lambda ended: ended.wait(2.5), _watching(lost=None), acts=False),
    ActsCase(WATCH_ASYNC, "an EngineCore of the job lost", _fit_async, _watching(lost=True), acts=True),
    ActsCase(WATCH_ASYNC, "the job's processes alive", _fit_async, _watching(lost=False), acts=False),
    ActsCase(WATCH_ASYNC, "a process of no job", _fit_async, _watching(lost=None), acts=False),
    # the rollouter's fit: a failed generation fails fit (the sentinel held back); a completed one sends it
    ActsCase(GENERATION, "the generation raised", _fit, _fitting(fails=True), acts=True),
    ActsCase(GENERATION, "the generation completed", _fit, _fitting(fails=False), acts=False),
    ActsCase(GENERATION, "no message queue client", _fit, _fitting(fails=False, client=False), acts=False),
    # the sleep records: a sleep whose device memory was read is recorded; where it cannot be read it is not
    ActsCase(SLEEP_ASCEND, "NPU memory read", lambda self, level=1: None, _sleeping("npu", True), acts=True),
    ActsCase(SLEEP_ASCEND, "NPU memory unreadable", lambda self, level=1: None, _sleeping("npu", False), acts=False),
    ActsCase(SLEEP_CUDA, "GPU memory read", lambda self, level=1: None, _sleeping("cuda", True), acts=True),
    ActsCase(SLEEP_CUDA, "GPU memory unreadable", lambda self, level=1: None, _sleeping("cuda", False), acts=False),
    ActsCase(SLEEP_CPU, "host memory read", lambda self, level=1: None, _sleeping("host", True), acts=True),
    ActsCase(SLEEP_CPU, "host memory unreadable", lambda self, level=1: None, _sleeping("host", False), acts=False),
    # the wake-up records: a wake-up that returned is timed; one that raised is not
    ActsCase(WAKE_ASCEND, "woke", _wake_up, _waking(raises=False), acts=True),
    ActsCase(WAKE_ASCEND, "the wake-up raised", _wake_up, _waking(raises=True), acts=False),
    ActsCase(WAKE_CUDA, "woke", _wake_up, _waking(raises=False), acts=True),
    ActsCase(WAKE_CUDA, "the wake-up raised", _wake_up, _waking(raises=True), acts=False),
    ActsCase(WAKE_CPU, "woke", _wake_up, _waking(raises=False), acts=True),
    ActsCase(WAKE_CPU, "the wake-up raised", _wake_up, _waking(raises=True), acts=False),
    # the metric: a step's metrics once a worker of the job slept; before any sleep, or validation alone, as they are
    ActsCase(SLEEP_METRIC, "a worker slept", lambda self, data, step, backend=None: data,
             _logging(True, {"training/global_step": 1}), acts=True),
    ActsCase(SLEEP_METRIC, "no worker slept yet", lambda self, data, step, backend=None: data,
             _logging(False, {"training/global_step": 1}), acts=False),
    ActsCase(SLEEP_METRIC, "validation alone", lambda self, data, step, backend=None: data,
             _logging(True, {"val-core/acc": 0.5}), acts=False),
]
