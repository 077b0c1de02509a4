"""TEST DOUBLE: a CPU-only stand-in for ``torch.npu`` (torch_npu's device module) so verl's NPU code paths run.

What it simulates, exactly:
- the device type: ``torch.utils.rename_privateuse1_backend("npu")`` makes ``torch.device("npu")`` legal
  (torch's PrivateUse1 mechanism, the one torch_npu itself uses); no kernels are registered, so a
  tensor on "npu" still fails (``NotImplementedError``) — nothing here computes;
- the device module: ``torch._register_device_module("npu", module)`` installs ``torch.npu`` (and
  ``sys.modules["torch.npu"]``) with the functions verl's platform calls: ``is_available`` (True),
  ``device_count`` (1), ``current_device``, ``set_device``, ``synchronize``, ``empty_cache``,
  ``manual_seed(_all)``, ``get_device_capability`` (None), ``get_device_name``, memory statistics
  (all 0) and ``memory._set_allocator_settings``. Every call is recorded in ``CALLS`` as
  ``(name, args)``;
- allocator behaviour by ``NPU_DOUBLE`` mode: ``1`` accepts settings; ``fail`` raises ``RuntimeError`` like a
  torch_npu whose allocator rejects the call; ``missing`` has no ``_set_allocator_settings``, like
  torch_npu before 2.9.

It does not simulate torch_npu itself (no ``torch_npu`` module or distribution: its version reads
"not installed"), HCCL, NPU memory or ops. Install it before ``import verl`` (verl reads
``hasattr(torch, "npu")`` at import): put ``tests/npu_double`` on ``PYTHONPATH`` with ``NPU_DOUBLE`` set
and its ``sitecustomize`` calls :func:`install` at interpreter start-up.
"""

from __future__ import annotations

import sys
import types

import torch

MODES = ("1", "fail", "missing")
CALLS: list[tuple[str, tuple]] = []


def _recorder(name: str, result: object = None):
    def call(*args: object, **kwargs: object) -> object:
        CALLS.append((name, args))
        return result

    call.__name__ = name.rsplit(".", 1)[-1]
    return call


def _rejecting_allocator(settings: str) -> None:
    CALLS.append(("memory._set_allocator_settings", (settings,)))
    raise RuntimeError("NPU double: allocator rejected the setting (simulated torch_npu failure)")


def make_module(mode: str) -> types.ModuleType:
    if mode not in MODES:
        raise ValueError(f"NPU_DOUBLE={mode!r}: use one of {', '.join(MODES)}")
    npu = types.ModuleType("torch.npu")
    npu.__doc__ = "TEST DOUBLE of torch_npu's torch.npu (tests/npu_double/npu_double.py)"
    for name, result in (("is_available", True), ("device_count", 1), ("current_device", 0), ("set_device", None),
                         ("synchronize", None), ("empty_cache", None), ("manual_seed", None),
                         ("manual_seed_all", None), ("get_device_capability", None),
                         ("get_device_name", "NPU test double"), ("memory_reserved", 0), ("memory_allocated", 0),
                         ("max_memory_allocated", 0), ("max_memory_reserved", 0),
                         ("reset_peak_memory_stats", None)):
        setattr(npu, name, _recorder(name, result))
    npu.mem_get_info = _recorder("mem_get_info", (64 << 30, 64 << 30))
    memory = types.ModuleType("torch.npu.memory")
    memory.memory_reserved = npu.memory_reserved
    memory.memory_allocated = npu.memory_allocated
    if mode == "1":
        memory._set_allocator_settings = _recorder("memory._set_allocator_settings")
    elif mode == "fail":
        memory._set_allocator_settings = _rejecting_allocator
    npu.memory = memory
    npu.CALLS = CALLS
    return npu


def install(mode: str = "1") -> types.ModuleType:
    """Install the double as ``torch.npu``; must run before ``import verl``."""
    if "verl" in sys.modules:
        raise RuntimeError("npu_double.install() must run before verl is imported")
    if hasattr(torch, "npu"):
        raise RuntimeError("torch.npu already exists (real torch_npu?); the NPU double refuses to shadow it")
    torch.utils.rename_privateuse1_backend("npu")
    module = make_module(mode)
    torch._register_device_module("npu", module)
    sys.modules["torch.npu.memory"] = module.memory
    return module
