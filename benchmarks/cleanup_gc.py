"""Clean-up step of the weight sync on a heap with >= 1e6 live Python objects: light vs aggressive.

Runs verl's real ``aggressive_empty_cache`` (a full ``gc.collect()`` per attempt, then the device's
``empty_cache``) and this package's ``light_empty_cache`` (synchronise + ``empty_cache``, no GC) side by
side in one process, on the same heap, and prints the median of each and their ratio. The device is a
CPU-backed ``torch.npu`` double (memory queries answer 0, synchronize/empty_cache return at once), so
the numbers isolate the Python-side cost: the full GC over the live heap.

    python benchmarks/cleanup_gc.py [--objects 1500000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import types


def install_npu_double() -> None:
    import torch

    npu = types.ModuleType("torch.npu")
    for name, value in {"is_available": True, "memory_reserved": 0, "memory_allocated": 0}.items():
        setattr(npu, name, lambda *a, _v=value, **k: _v)
    npu.synchronize = npu.empty_cache = lambda *a, **k: None
    memory = types.ModuleType("torch.npu.memory")
    memory._set_allocator_settings = lambda settings: None
    npu.memory = memory
    sys.modules["torch.npu.memory"] = memory
    torch.npu = npu
    sys.modules["torch.npu"] = npu


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1_500_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    import verl  # noqa: F401

    install_npu_double()
    from verl.utils import memory_utils

    from verl_ascend_ext.features.weight_sync.patch_code import light_empty_cache

    aggressive = getattr(memory_utils.aggressive_empty_cache, "__wrapped__", memory_utils.aggressive_empty_cache)
    heap = [{"i": i, "v": [i]} for i in range(args.objects // 3)]  # dict + list + int per entry: ~1 object each
    live = len(gc.get_objects())
    assert live >= 1_000_000, f"only {live} live objects tracked by the GC"
    gc.collect()
    slow = timed(lambda: aggressive(force_sync=True), args.repeat)
    fast = timed(light_empty_cache, args.repeat)
    slow_m, fast_m = statistics.median(slow), statistics.median(fast)
    print(f"live objects tracked by gc: {live:,} (heap entries {len(heap):,})")
    print(f"aggressive_empty_cache (verl 0.9.0): median {slow_m * 1e3:9.3f} ms over {args.repeat} runs")
    print(f"light_empty_cache (this package):    median {fast_m * 1e3:9.3f} ms over {args.repeat} runs")
    print(f"ratio aggressive / light: {slow_m / fast_m:,.0f}x  (saved per call: {(slow_m - fast_m) * 1e3:.1f} ms; "
          "update_weights calls it twice per sync, plus one GC in each bucketed clean-up)")


if __name__ == "__main__":
    main()
