"""Loading through every entry point, many times and in any order, wraps each target exactly once.

Each permutation runs in its own interpreter (as ddtrace does for patch permutations), so import
order, not test order, is what is exercised.
"""

from __future__ import annotations

import itertools

import pytest
from subprocesses import last_json, run_python

LOADERS = {
    "verl": "import verl",
    "verl_ep": "from importlib.metadata import entry_points\n"
               "[ep.load() for ep in entry_points(group='verl.plugins') if ep.name == 'ascend_ext']",
    "vllm_ep": "from importlib.metadata import entry_points\n"
               "[ep.load()() for ep in entry_points(group='vllm.general_plugins') if ep.name == 'verl_ascend_ext']",
    "api": "import verl_ascend_ext; verl_ascend_ext.activate()",
    "target": "import verl.trainer.distillation.losses, verl.trainer.ppo.padding_utils",
}

CHECK = """
import json
import verl.trainer.distillation.losses as L, verl.trainer.ppo.padding_utils as P
from verl_ascend_ext.runtime.boot import loaded_by
from verl_ascend_ext.patching.replacement import MARKER

def ours(obj):
    return getattr(obj, MARKER, None) is not None

def depth(obj):
    n = 0
    while ours(obj):
        n, obj = n + 1, obj.__wrapped__
    return n

reads = []
class Config:  # each replacement layer reads .strategy once; verl's own code reads it too
    @property
    def strategy(self):
        reads.append(1)
        return "unknown-strategy"

def count_reads(fn):
    reads.clear()
    try:
        fn(Config(), None, None, None, "thd")
    except NotImplementedError:
        pass
    return len(reads)

innermost = L.compute_topk_loss
while ours(innermost):
    innermost = innermost.__wrapped__
replacement_calls = count_reads(L.compute_topk_loss) - count_reads(innermost)
print(json.dumps({"topk_depth": depth(L.compute_topk_loss), "pad_depth": depth(P.construct_minimal_padding_template),
                  "replacement_calls": replacement_calls, "loaded_by": list(loaded_by())}))
"""


ORDERS = [p for n in (2, 3) for p in itertools.permutations(["verl", "verl_ep", "vllm_ep", "api", "target"], n)
          if "verl" in p or "target" in p]


@pytest.mark.parametrize("order", ORDERS[:24], ids="-".join)
def test_each_target_wrapped_once_whatever_the_load_order(order: tuple[str, ...]) -> None:
    code = "\n".join(LOADERS[name] for name in (*order, *order)) + CHECK
    out = last_json(run_python(code).stdout)
    assert out["topk_depth"] == 1, out
    assert out["pad_depth"] == 1, out
    assert out["replacement_calls"] == 1, out
    assert out["loaded_by"], "the plugin never booted"


def test_apply_twice_in_process_is_a_no_op() -> None:
    code = """
    import json, verl
    import verl.trainer.distillation.losses as L
    from verl_ascend_ext.runtime.registry import registry
    from verl_ascend_ext.patching import apply, unpatch
    record = registry().record("distill-fsdp2-topk")
    first = L.compute_topk_loss
    for _ in range(5):
        apply(record)
    same = L.compute_topk_loss is first
    restored = unpatch("distill-fsdp2-topk")
    original_back = not hasattr(L.compute_topk_loss, "__wrapped__") and L.compute_topk_loss is first.__wrapped__
    again = apply(record).status.value
    print(json.dumps({"same": same, "restored": restored, "original_back": original_back, "again": again}))
    """
    out = last_json(run_python(code).stdout)
    assert out == {"same": True, "restored": True, "original_back": True, "again": "applied"}
