"""TEST-ONLY: the CPU counterpart of verl's HCCL checkpoint engine, for verl's fully-async trainer (never shipped).

verl's fully-async trainer keeps the trainer and the rollout in disjoint Ray pools and sends the weights through a
checkpoint engine (``verl/checkpoint_engine/base.py``: ``CheckpointEngineManager.update_weights``, :497-556 in
verl 0.9.1). The shipped recipe asks for ``checkpoint_engine.backend=nccl``; on Ascend that name is verl's HCCL
engine (``hccl_checkpoint_engine.py:103``, ``@CheckpointEngineRegistry.register("nccl")``, imported only where
``torch.npu`` is). On this CPU venv only ``naive`` registers (nccl / nixl / delta need cupy, hccl needs torch.npu),
and ``naive`` cannot reach a separate pool (``base.py:262``: ``prepare`` / ``init_process_group`` raise
``NotImplementedError``; ``update_weights`` returns after the actor's own in-process path, ``base.py:518-520``).

This module is the HCCL engine with the NPU collectives replaced by gloo, registered under the same name ``nccl``
(only where no other engine took it) and as ``hccl-cpu``. verl imports it through its own hook,
``actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=cpu_checkpoint_engine``, in the three places it
builds an engine: the trainer ranks (``workers/engine_workers.py:685``), the rollout pool's
``CheckpointEngineWorker`` (``base.py:336``) and the manager in the trainer actor (``base.py:417``).

Same as the HCCL engine (``hccl_checkpoint_engine.py``, verl 0.9.0 / 0.9.1: the file is the same in both):
- topology (``build_topology``): trainer rank 0 is rank 0 of the transfer group, the other trainer ranks are -1
  (they run their side of the weight export, which is collective across pipeline stages, and send nothing), the
  rollout pool's workers are ranks 1..N;
- two ``bucket_size`` buffers per process (``prepare``), a bucket filled from ``split_weight_chunks`` and
  broadcast from rank 0 with its metadata ``{"bucket_meta": ..., "is_last": ...}``; the receivers hand
  ``merge_weight_chunks`` the chunks, which yields ``(name, tensor)`` to the rollout's ``ServerAdapter``;
- the group is built once (``rebuild_group=False``, the default) and kept across syncs; ``finalize`` frees the
  buffers.
What differs, and why:
- the bucket goes over a gloo process group of its own (``torch.distributed.ProcessGroupGloo`` on a ``TCPStore``
  the master serves: stateless, beside the trainer's default group), where HCCL uses vLLM-Ascend's
  ``PyHcclCommunicator`` on vLLM's ``StatelessProcessGroup``;
- the bucket's metadata goes over the same gloo group (pickled, length first), where HCCL publishes it on a ZMQ
  PUB socket: over one ordered channel the receivers cannot miss the first message (a ZMQ subscriber that joins
  late drops what was published before its subscription reached the publisher);
- no device synchronisation (the CPU's copies are done when the call returns).

``check_target()`` (run at import) refuses the module when verl's code it mirrors changed: the abstract interface
of ``CheckpointEngine``, the HCCL engine's topology and entry points (read from its source, which cannot be
imported here) and the manager's sequence around the transfer.
"""

from __future__ import annotations

import datetime
import importlib.util
import inspect
import logging
import os
import pickle
import re
import time
from collections.abc import AsyncGenerator, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import torch
import torch.distributed as dist
from verl.checkpoint_engine import base as ce_base
from verl.checkpoint_engine.base import (
    CheckpointEngine,
    CheckpointEngineRegistry,
    TensorMeta,
    merge_weight_chunks,
    split_weight_chunks,
)
from verl.utils.net_utils import get_free_port
from verl.workers.rollout.utils import ensure_async_iterator

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))

NAME = "nccl"  # the name the HCCL engine registers under on Ascend (hccl_checkpoint_engine.py:103)
ALIAS = "hccl-cpu"
TIMEOUT = datetime.timedelta(seconds=float(os.environ.get("CPU_CKPT_ENGINE_TIMEOUT", "600")))
STATS = os.environ.get("CPU_CKPT_ENGINE_STATS")  # a directory: each send / receive appends a JSON line there


class TargetChanged(ImportError):
    """verl's checkpoint-engine code is not the code this stand-in mirrors."""


# What this stand-in mirrors, read from verl's source (verl 0.9.0 and 0.9.1 hold the same text).
_ABSTRACT = {"prepare", "build_topology", "init_process_group", "finalize", "send_weights", "receive_weights"}
_HCCL_FINGERPRINT = (
    r'@CheckpointEngineRegistry\.register\("nccl"\)\nclass HCCLCheckpointEngine\(CheckpointEngine\):',
    r'"rank": \[0\] \+ \[-1\] \* \(actor_wg_world_size - 1\),',
    r'"rank": list\(range\(1, rollout_world_size \+ 1\)\),',
    r"def init_process_group\(self, rank: int, world_size: int, master_metadata: MasterMetadata\):",
    r"# For actor rank other than 0, consume weights without sending\.\n\s+if self\.rank < 0:\n"
    r"\s+for name, weight in weights:\n\s+pass",
    r'metadata=\{"bucket_meta": bucket_meta, "is_last": (False|True)\}',
)
_MANAGER_ORDER = ("await self.abort_replicas()", "await self.release_kv_cache_replicas()",
                  "self.build_process_group(rollout)", "rollout.update_weights(global_steps=global_steps)",
                  '["finalize"]', "await self.resume_kv_cache_replicas()", "await self.resume_generation_replicas()")


def check_target() -> None:
    """Raise ``TargetChanged`` when verl's interface, HCCL engine or manager is not what this module mirrors."""
    abstract = set(getattr(CheckpointEngine, "__abstractmethods__", ()))
    if abstract != _ABSTRACT:
        raise TargetChanged(f"CheckpointEngine's abstract methods are {sorted(abstract)}, this stand-in implements "
                            f"{sorted(_ABSTRACT)}")
    spec = importlib.util.find_spec("verl.checkpoint_engine.hccl_checkpoint_engine")
    if spec is None or spec.origin is None:
        raise TargetChanged("verl.checkpoint_engine.hccl_checkpoint_engine is gone: nothing to stand in for")
    source = Path(spec.origin).read_text()
    missing = [p for p in _HCCL_FINGERPRINT if not re.search(p, source)]
    if missing:
        raise TargetChanged(f"{spec.origin} changed: not found {missing}")
    update = inspect.getsource(ce_base.CheckpointEngineManager.update_weights)
    positions = [update.find(s) for s in _MANAGER_ORDER]
    if -1 in positions or positions != sorted(positions):
        order = dict(zip(_MANAGER_ORDER, positions, strict=True))
        raise TargetChanged(f"CheckpointEngineManager.update_weights ({ce_base.__file__}) no longer runs "
                            f"{list(_MANAGER_ORDER)} in this order: {order}")


@dataclass
class MasterMetadata:
    dist_ip: str
    dist_port: int


def _record(event: str, **fields: Any) -> None:
    if not STATS:
        return
    import json

    line = json.dumps({"t": time.time(), "pid": os.getpid(), "event": event, **fields})
    with open(os.path.join(STATS, f"{os.getpid()}.jsonl"), "a") as f:
        f.write(line + "\n")


class CPUHCCLCheckpointEngine(CheckpointEngine):
    """verl's ``HCCLCheckpointEngine`` over gloo (see the module docstring). Same constructor arguments."""

    def __init__(
        self,
        bucket_size: int,
        group_name: str = "default",
        rebuild_group: bool = False,
        is_master: bool = False,
        rollout_dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        self.bucket_size = bucket_size
        self.group_name = group_name
        self.rebuild_group = rebuild_group
        self.rollout_dtype = rollout_dtype
        self.is_master = is_master
        self.pg: dist.ProcessGroupGloo | None = None
        self.store: dist.TCPStore | None = None
        self.rank: int | None = None
        self.world_size: int | None = None
        self.syncs = 0
        if self.is_master:
            self.ip = ray.util.get_node_ip_address().strip("[]")
            self.dist_port, _ = get_free_port(self.ip)

    # ---- set-up, as HCCLCheckpointEngine ----------------------------------------------------------------------

    def prepare(self) -> MasterMetadata | None:
        self.send_buf = torch.zeros(self.bucket_size, dtype=torch.uint8)
        self.recv_buf = torch.zeros(self.bucket_size, dtype=torch.uint8)
        return MasterMetadata(dist_ip=self.ip, dist_port=self.dist_port) if self.is_master else None

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]):
        actor_wg_kwargs = {
            "rank": [0] + [-1] * (actor_wg_world_size - 1),
            "world_size": [rollout_world_size + 1] * actor_wg_world_size,
            "master_metadata": [metadata[0]] * actor_wg_world_size,
        }
        rollout_kwargs = {
            "rank": list(range(1, rollout_world_size + 1)),
            "world_size": [rollout_world_size + 1] * rollout_world_size,
            "master_metadata": [metadata[0]] * rollout_world_size,
        }
        return actor_wg_kwargs, rollout_kwargs

    def init_process_group(self, rank: int, world_size: int, master_metadata: MasterMetadata):
        if rank < 0:  # trainer ranks other than 0: no part in the transfer group
            self.rank = rank
            self.world_size = world_size
            return
        created = self.rebuild_group or self.pg is None
        if created:
            self.store = dist.TCPStore(master_metadata.dist_ip, master_metadata.dist_port, world_size,
                                       is_master=(rank == 0), timeout=TIMEOUT, wait_for_workers=False)
            prefix = dist.PrefixStore(f"verl-cpu-ckpt-engine/{self.group_name}", self.store)
            self.pg = dist.ProcessGroupGloo(prefix, rank, world_size, TIMEOUT)
            self.rank = rank
            self.world_size = world_size
        else:
            assert self.rank == rank, f"rank {rank} is not equal to self.rank {self.rank}"
            assert self.world_size == world_size, f"world_size {world_size} != self.world_size {self.world_size}"
        signal = torch.tensor([1], dtype=torch.int8)  # barrier, as HCCL's all_reduce of a signal
        self.pg.allreduce([signal]).wait()
        _record("init_process_group", rank=rank, world_size=world_size, created=created,
                barrier_sum=int(signal.item()))
        logger.info(f"init_process_group rank: {self.rank}, world_size: {self.world_size}")

    def finalize(self):
        if self.rebuild_group:
            self.pg = None
            self.store = None
            self.rank = None
            self.world_size = None
        self.send_buf = None
        self.recv_buf = None

    # ---- transfer ---------------------------------------------------------------------------------------------

    def _broadcast(self, bucket: torch.Tensor, metadata: dict | None) -> dict:
        """Broadcast ``metadata`` (pickled) then ``bucket`` from rank 0; return the metadata on every rank."""
        if self.rank == 0:
            payload = torch.frombuffer(bytearray(pickle.dumps(metadata)), dtype=torch.uint8)
            length = torch.tensor([payload.numel()], dtype=torch.int64)
        else:
            length = torch.zeros(1, dtype=torch.int64)
        self.pg.broadcast(length, 0).wait()
        if self.rank != 0:
            payload = torch.empty(int(length.item()), dtype=torch.uint8)
        self.pg.broadcast(payload, 0).wait()
        self.pg.broadcast(bucket, 0).wait()
        return metadata if self.rank == 0 else pickle.loads(payload.numpy().tobytes())

    @torch.no_grad()
    async def send_weights(self, weights: Generator[tuple[str, torch.Tensor], None, None],
                           global_steps: int | None = None):
        assert self.rank is not None and self.rank <= 0, "Trainer workers other than rank 0 should not send weights."
        start = time.time()
        if self.rank < 0:  # consume the export (collective across pipeline stages) without sending
            count = 0
            async for _name, _weight in ensure_async_iterator(weights):
                count += 1
            self.syncs += 1
            _record("send", rank=self.rank, sent=False, tensors=count, global_steps=global_steps,
                    seconds=time.time() - start)
            return
        send_buf, recv_buf = self.send_buf, self.recv_buf
        bucket_meta: dict[str, TensorMeta] = {}
        offset = buckets = total = 0
        async for tensor_meta, chunk in split_weight_chunks(weights, self.bucket_size):
            if offset + tensor_meta.chunk_size > self.bucket_size:
                self._broadcast(send_buf, {"bucket_meta": bucket_meta, "is_last": False})
                buckets += 1
                send_buf, recv_buf = recv_buf, send_buf
                bucket_meta = {}
                offset = 0
            assert offset + tensor_meta.chunk_size <= self.bucket_size
            assert tensor_meta.name not in bucket_meta
            tensor_meta.offset = offset
            bucket_meta[tensor_meta.name] = tensor_meta
            send_buf[offset: offset + tensor_meta.chunk_size] = chunk
            offset += tensor_meta.chunk_size
            total += tensor_meta.chunk_size
        self._broadcast(send_buf, {"bucket_meta": bucket_meta, "is_last": True})
        buckets += 1
        self.syncs += 1
        _record("send", rank=self.rank, sent=True, buckets=buckets, bytes=total, global_steps=global_steps,
                seconds=time.time() - start)
        logger.info(f"Rank {self.rank} send weights done, time cost: {time.time() - start:.2f}s")

    @torch.no_grad()
    async def receive_weights(self, global_steps: int | None = None) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        count = 0
        async for name, weight in merge_weight_chunks(self._receive_weight_chunks(global_steps), self.bucket_size):
            count += 1
            yield name, weight
        _record("received", rank=self.rank, tensors=count, global_steps=global_steps)

    async def _receive_weight_chunks(
            self, global_steps: int | None) -> AsyncGenerator[tuple[TensorMeta, torch.Tensor], None]:
        assert self.rank is not None and self.rank > 0, "Rank 0 should not receive weights."
        start = time.time()
        send_buf, recv_buf = self.send_buf, self.recv_buf
        metadata = self._broadcast(recv_buf, None)
        buckets = 1
        send_buf, recv_buf = recv_buf, send_buf
        while not metadata["is_last"]:
            # receive the next bucket before handing out this one's chunks (as HCCL's double buffering): the chunks
            # are views of send_buf and are consumed by the server adapter before the following swap
            chunks = [(m, send_buf[m.offset: m.offset + m.chunk_size]) for m in metadata["bucket_meta"].values()]
            metadata = self._broadcast(recv_buf, None)
            buckets += 1
            for item in chunks:
                yield item
            send_buf, recv_buf = recv_buf, send_buf
        for m in metadata["bucket_meta"].values():
            yield m, send_buf[m.offset: m.offset + m.chunk_size]
        self.syncs += 1
        _record("receive", rank=self.rank, buckets=buckets, global_steps=global_steps, seconds=time.time() - start)


check_target()
if NAME not in CheckpointEngineRegistry._registry:  # where verl's own nccl (CUDA) or hccl (Ascend) engine is: keep it
    CheckpointEngineRegistry.register(NAME)(CPUHCCLCheckpointEngine)
CheckpointEngineRegistry.register(ALIAS)(CPUHCCLCheckpointEngine)
