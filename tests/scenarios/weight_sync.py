"""Two CPU ranks in a real gloo process group run verl's real ``ActorRolloutRefWorker.update_weights``.

Usage: python weight_sync.py OUTDIR [DELAY_S]. Prints one JSON line: per rank, the timeline of the
sync, the number of full GC passes (``gc.callbacks``, generation 2) and the plugin's patch statuses.

What is real: verl's ``update_weights`` (naive mode, the colocated sync path), ``set_expandable_segments``
and the memory helpers it calls, verl's NPU platform, the gloo process group and its barrier, and verl's
``BucketedWeightSender``/``BucketedWeightReceiver`` moving the weights over ZMQ + shared memory (the
receiver in a thread, as vLLM's worker extension would in its own process).
Test doubles (NPU-only or GPU-only): ``torch.npu`` is a CPU-backed device module (memory queries answer
0, synchronize/empty_cache do nothing), the ``vllm_rollout`` package is registered without running its
``__init__`` (which imports vLLM's GPU server stack; the bucketed-transfer module itself is loaded from its
real file), ``PlatformNPU.is_ipc_supported`` answers False instead of running
``npu-smi`` (shared-memory path), the rollout (``RolloutDouble``: resume records a timestamp, update_weights
runs the real bucketed transfer) and the training engine (``EngineDouble``: yields CPU tensors; its
offload is where rank 0 is made slow, so it reaches the barrier ``DELAY_S`` later than rank 1).
"""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path


def install_npu_double() -> None:
    """A CPU-backed ``torch.npu`` so verl's platform detection picks its NPU platform."""
    import torch

    npu = types.ModuleType("torch.npu")
    answers = {"is_available": True, "device_count": 1, "current_device": 0, "memory_reserved": 0,
               "memory_allocated": 0, "max_memory_allocated": 0, "max_memory_reserved": 0,
               "mem_get_info": (64 << 30, 64 << 30), "get_device_name": "NpuDouble"}
    for name in ("is_available", "device_count", "current_device", "memory_reserved", "memory_allocated",
                 "max_memory_allocated", "max_memory_reserved", "mem_get_info", "get_device_name", "set_device",
                 "synchronize", "empty_cache", "manual_seed", "manual_seed_all", "reset_peak_memory_stats"):
        value = answers.get(name)
        setattr(npu, name, lambda *a, _v=value, **k: _v)
    memory = types.ModuleType("torch.npu.memory")
    memory._set_allocator_settings = lambda settings: None
    npu.memory = memory
    sys.modules["torch.npu.memory"] = memory
    # Set as a plain attribute: renaming torch's PrivateUse1 backend to "npu" would make gloo's barrier
    # look for accelerator hooks that only torch_npu registers.
    torch.npu = npu
    sys.modules["torch.npu"] = npu


def rendezvous(rank: int, world: int, outdir: str) -> None:
    """The gloo process group, its TCP store in rank 0's process on a port the OS gave rank 0 there (a port picked
    first and bound later can be taken meanwhile by another test's connection: EADDRINUSE). Rank 0 writes the
    port to ``outdir/store.port`` (removed by ``main`` before the ranks start); the others wait for it."""
    import time
    from datetime import timedelta

    import torch.distributed as dist

    port_file, timeout = Path(outdir, "store.port"), timedelta(minutes=30)  # torch's default for gloo groups
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, timeout=timeout, wait_for_workers=False)
        written = port_file.with_suffix(".tmp")  # then renamed: the others never read a half-written number
        written.write_text(str(store.port))
        written.replace(port_file)
    else:
        deadline = time.monotonic() + 300  # rank 0's imports and set-up
        while not port_file.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {rank}: rank 0 wrote no store port to {port_file} within 300 s")
            time.sleep(0.05)
        store = dist.TCPStore("127.0.0.1", int(port_file.read_text()), world, is_master=False, timeout=timeout)
    os.environ["MASTER_PORT"] = str(store.port)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)


def rank_main(rank: int, world: int, outdir: str, delay: float) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), WORLD_SIZE=str(world))
    import asyncio
    import gc
    import inspect
    import threading
    import time
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist
    import verl  # noqa: F401  (plugin discovery)

    # After ``import verl``: verl.utils.device.is_npu_available stays False (so verl does not import
    # torch_npu's profiler), while verl's lazily detected platform is the NPU one.
    install_npu_double()
    from omegaconf import OmegaConf
    from verl.plugin.platform.platform_npu import PlatformNPU
    from verl.single_controller.base.decorator import MAGIC_ATTR

    PlatformNPU.is_ipc_supported = lambda self: False  # instead of npu-smi: the shared-memory path
    from verl.plugin.platform import get_platform

    assert isinstance(get_platform(), PlatformNPU), type(get_platform())  # verl's, or the device feature's subclass
    rendezvous(rank, world, outdir)
    import verl.workers.rollout as rollout_pkg
    from verl.workers.engine_workers import ActorRolloutRefWorker

    # The vllm_rollout package's __init__ imports vLLM's server stack (GPU packages); its
    # bucketed_weight_transfer module needs only torch, zmq and verl. Register the package without
    # running that __init__, then import the real module from its real file.
    vllm_rollout = types.ModuleType("verl.workers.rollout.vllm_rollout")
    vllm_rollout.__path__ = [str(Path(rollout_pkg.__file__).parent / "vllm_rollout")]
    sys.modules.setdefault("verl.workers.rollout.vllm_rollout", vllm_rollout)
    from verl.workers.rollout.vllm_rollout import bucketed_weight_transfer as bwt

    import verl_ascend_ext

    events: list[tuple[str, float]] = []
    received: list[str] = []

    class RolloutDouble:
        async def resume(self, tags: list[str]) -> None:
            events.append((f"resume:{','.join(tags)}", time.time()))

        async def update_weights(self, weights, **kwargs) -> None:
            handle = f"ipc:///tmp/verl-ascend-ext-ws-{os.getpid()}.sock"
            receiver = bwt.BucketedWeightReceiver(handle, torch.device("cpu"), use_shm=True)
            thread = threading.Thread(target=receiver.receive_weights,
                                      args=(lambda ws, last: received.extend(n for n, _ in ws),))
            thread.start()
            await bwt.BucketedWeightSender(handle, bucket_size_mb=1, use_shm=True).async_send_weights(weights)
            thread.join()
            events.append(("weights-updated", time.time()))

    class EngineDouble:
        is_param_offload_enabled = True

        def get_per_tensor_param(self, layered_summon: bool, base_sync_done: bool):
            return ((f"layer.{i}.weight", torch.full((256, 256), float(i))) for i in range(12)), None

        def to(self, device: str, **kwargs) -> None:
            if rank == 0:
                time.sleep(delay)
            events.append(("offloaded", time.time()))

    worker = ActorRolloutRefWorker.__new__(ActorRolloutRefWorker)
    worker.__dict__.update(
        config=OmegaConf.create({"rollout": {"name": "vllm", "free_cache_engine": True,
                                             "checkpoint_engine": {"backend": "naive"}}}),
        rollout=RolloutDouble(), actor=SimpleNamespace(engine=EngineDouble()), layered_summon=False,
        peft_merge=False, base_sync_done=False,
    )
    full_gc: list[int] = []
    gc.disable()  # count only explicit collections: automatic ones are not part of the code under test
    gc.callbacks.append(lambda phase, info: full_gc.append(1) if phase == "start" and info["generation"] == 2 else None)
    dist.barrier()
    asyncio.run(worker.update_weights(global_steps=1))
    gc.callbacks.clear()
    gc.enable()
    method = ActorRolloutRefWorker.update_weights
    out = {
        "rank": rank,
        "events": events,
        "full_gc": len(full_gc),
        "received": len(received),
        "rollout_resume_restored": "resume" not in vars(worker.rollout),
        "statuses": {k: v.status.value for k, v in verl_ascend_ext.patch_statuses().items()
                     if k.startswith("weight-sync-")},
        "wrapped": {
            "update_weights": hasattr(vars(ActorRolloutRefWorker)["update_weights"], "_verl_ascend_ext_patch"),
            "cleanup": hasattr(bwt.BucketedWeightSender._cleanup, "_verl_ascend_ext_patch"),
        },
        "still_coroutine_function": inspect.iscoroutinefunction(method),
        "dispatch_attrs_kept": getattr(method, MAGIC_ATTR, None) is not None,
    }
    Path(outdir, f"rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    outdir, delay = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
    Path(outdir, "store.port").unlink(missing_ok=True)
    mp.spawn(rank_main, args=(2, outdir, delay), nprocs=2, join=True)
    print(json.dumps({"delay": delay, "ranks": [json.loads(Path(outdir, f"rank{r}.json").read_text())
                                                for r in range(2)]}))


if __name__ == "__main__":
    main()
