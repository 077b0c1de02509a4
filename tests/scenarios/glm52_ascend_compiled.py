"""Scenario: the traced GLM-5.2 vLLM-Ascend patches applied by the engine, run eagerly and under torch.compile.

Real: vLLM-Ascend 0.23.0's own method bodies and callers (``AscendRMSNorm.forward_oot``, the device
adaptors' ``indexer_select_post_process``, ``AscendSFAImpl.indexer_select_post_process`` (the caller),
``AscendSFACPImpl.indexer_select_post_process`` and ``_execute_indexer_select``), read from the released
wheel's files into a module written to a temporary directory; vLLM 0.23.0's real ``CustomOp.forward``; the
engine's ``apply`` with the real records (only their target retargeted to that module; their fingerprints
run unchanged, the cross-definition ones on the released files found on PYTHONPATH); torch.compile with
``fullgraph=True`` and the ``eager`` and ``inductor`` backends on CPU.
Simulated: the NPU kernels (verl_ascend_ext/tooling/selftest/npu_test_double.py: custom ops with fake
implementations), the layers around the indexer (small linear maps) and the few module globals those bodies read
(below).
vLLM-Ascend main's ``AscendRMSNorm.forward_oot`` (no ``maybe_chunk_residual``: the record's variant) is read from
the third argument, main's layernorm.py as the test rebuilt it (glm52_ascend_fixtures.main_layernorm), into class
``AscendRMSNormMain``, and goes through the same cases (``rmsnorm_main``).
Usage: glm52_ascend_compiled.py <vllm-ascend source tree> <work dir> <main's layernorm.py>; prints one JSON object.
"""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import torch
import torch._dynamo
import torch._inductor.config
from vllm.model_executor.custom_op import CustomOp  # vLLM 0.23.0, imported on CPU before the double exists

from verl_ascend_ext.tooling.selftest import npu_test_double as npu

npu.install()

from verl_ascend_ext.features.glm52.ascend import declaration as glm52_ascend  # noqa: E402
from verl_ascend_ext.patching import engine  # noqa: E402
from verl_ascend_ext.patching.source import definitions  # noqa: E402

TREE, WORK, MAIN_LAYERNORM = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
MODULE = "glm52_traced_targets"
torch._inductor.config.emulate_precision_casts = True  # inductor keeps bf16 roundings where eager has them

SOURCES = {  # class in the generated module -> (released file, qualified names of its methods)
    "AscendRMSNorm": ("vllm_ascend/ops/layernorm.py", ["AscendRMSNorm.forward_oot"]),
    "AscendRMSNormMain": (MAIN_LAYERNORM, ["AscendRMSNorm.forward_oot"]),
    "BaseDeviceAdaptor": ("vllm_ascend/device/device_op.py", ["BaseDeviceAdaptor.indexer_select_post_process"]),
    "A5DeviceAdaptor": ("vllm_ascend/device/device_op.py", ["A5DeviceAdaptor.indexer_select_post_process"]),
    "AscendSFAImpl": ("vllm_ascend/attention/sfa_v1.py", ["AscendSFAImpl.indexer_select_post_process"]),
    "AscendSFACPImpl": ("vllm_ascend/attention/context_parallel/sfa_cp.py",
                        ["AscendSFACPImpl.indexer_select_post_process", "AscendSFACPImpl._execute_indexer_select"]),
}
BASES = {"A5DeviceAdaptor": "BaseDeviceAdaptor"}

PRELUDE = '''
"""Released vLLM-Ascend 0.23.0 method bodies (written by tests/scenarios/glm52_ascend_compiled.py)."""
from typing import Any
import torch
import torch_npu
M = Any
HAS_TRITON = False
FLOAT8_E8M0FNU_DTYPE = None
CUSTOM_OP = [False]
DeviceOperator = None  # set per case, as vLLM-Ascend binds it to the adaptor of the device


def enable_custom_op():
    return CUSTOM_OP[0]


class _Prefetch:
    def maybe_prefetch_mlp_weight_postprocess(self, x):
        return None


_PREFETCH = _Prefetch()


def get_weight_prefetch_method():
    return _PREFETCH


def record_attention_compute_start():
    return None


class Ascend310PDeviceAdaptor:  # replaced below: it inherits BaseDeviceAdaptor's method, as in vLLM-Ascend
    pass
'''


def write_module() -> types.ModuleType:
    parts = [PRELUDE]
    for cls, (rel, qualnames) in SOURCES.items():
        base = BASES.get(cls, "")
        body = "\n".join(textwrap.indent(definitions(TREE / rel)[q][2], "    ") for q in qualnames)
        parts.append(f"class {cls}({base}):\n{body}\n")
    parts.append("class Ascend310PDeviceAdaptor(BaseDeviceAdaptor):\n    pass\n")
    (WORK / f"{MODULE}.py").write_text("\n\n".join(parts), encoding="utf-8")
    sys.path.insert(0, str(WORK))
    return importlib.import_module(MODULE)


mod = write_module()


def retarget(record: Any) -> Any:
    _, qualname = record.target.split(":")
    return record._replace(target=f"{MODULE}:{qualname}")


RECORDS = {r.id: retarget(r) for r in (glm52_ascend.RMSNORM, glm52_ascend.INDEXER_BASE,
                                       glm52_ascend.INDEXER_A5, glm52_ascend.INDEXER_CP)}
MAIN_ID = f"{glm52_ascend.RMSNORM.id}-main"  # the same record on main's method (an id of its own for unpatch)
RECORDS[MAIN_ID] = glm52_ascend.RMSNORM._replace(id=MAIN_ID, target=f"{MODULE}:AscendRMSNormMain.forward_oot")


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise: compiled and eager run the same kernels on the same CPU. The norm is the double's opaque op (eager
    inside the graph), the adds and scalings single correctly rounded bf16 ops (inductor: no fp contraction, the
    casts emulated), and inductor's default lowers the indexer's bf16 matmul to the same aten call eager makes
    (max-autotune or freezing would pick another GEMM: then this would need a bound)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def flat(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, tuple) else [out]


def compiled(fn: Any, backend: str) -> Any:
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend=backend, dynamic=False)


def verdict(released: Any, eager: Any, compiled_out: Any) -> dict[str, Any]:
    """Compiled equals eager bitwise, and differs from the released bug's output exactly where eager does."""
    r, e, c = flat(released), flat(eager), flat(compiled_out)
    return {
        "compiled_equals_eager": len(e) == len(c) and all(same(a, b) for a, b in zip(e, c, strict=True)),
        "fix_visible_eagerly": any(not same(a, b) for a, b in zip(r, e, strict=True)),
        "same_changes_as_eager": len(r) == len(c) and all(
            torch.equal(a != b, a != d) for a, b, d in zip(r, e, c, strict=True)),
    }


def run_cases(cases: dict[str, Any], released: dict[str, Any]) -> dict[str, Any]:
    """Each case (a zero-argument callable building its inputs) eagerly and compiled with both backends."""
    result = {}
    for name, (fn, args) in cases.items():
        eager = fn(*args)
        result[name] = {backend: verdict(released[name], eager, compiled(fn, backend)(*args))
                        for backend in ("eager", "inductor")}
    return result


# ---------------------------------------------------------------- RMSNorm, called as vLLM calls it
g = torch.Generator().manual_seed(0)
HIDDEN = 256


def norm_class(released: type) -> type:
    class Norm(released, torch.nn.Module):
        """The attributes AscendRMSNorm.__init__ sets; ``_forward_method`` bound at construction, as CustomOp does."""

        forward = CustomOp.forward  # vLLM's: ``return self._forward_method(*args, **kwargs)``

        def __init__(self, bias: torch.Tensor | None) -> None:
            torch.nn.Module.__init__(self)
            gen = torch.Generator().manual_seed(1)
            self.weight = torch.nn.Parameter((1 + 0.1 * torch.randn(HIDDEN, generator=gen)).to(torch.bfloat16),
                                             requires_grad=False)
            self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)
            self.bias_loaded, self.variance_epsilon = bias is not None, 1e-6
            self._forward_method = self.forward_oot  # CustomOp.dispatch_forward on an out-of-tree platform

    return Norm


Norm, NormMain = norm_class(mod.AscendRMSNorm), norm_class(mod.AscendRMSNormMain)


x = (3 * torch.randn(64, HIDDEN, generator=g)).to(torch.bfloat16)
res = (3 * torch.randn(64, HIDDEN, generator=g)).to(torch.bfloat16)
bias = (0.5 * torch.randn(HIDDEN, generator=g)).to(torch.bfloat16)


def module_call(layer: Any, *args: torch.Tensor) -> Any:
    return layer(*[a.clone() for a in args])


def direct_call(layer: Any, *args: torch.Tensor) -> Any:
    return layer.forward_oot(*[a.clone() for a in args])


def rms_cases(norm: type = Norm) -> dict[str, Any]:
    cases = {}
    for with_bias in (False, True):
        for residual in (False, True):
            for how, call in (("module", module_call), ("direct", direct_call)):
                layer = norm(bias if with_bias else None)
                args = (x, res) if residual else (x,)
                name = f"{'bias' if with_bias else 'no_bias'}/{'residual' if residual else 'no_residual'}/{how}"
                cases[name] = (call, (layer, *args))
    return cases


# ---------------------------------------------------------------- indexer: the released callers
N_HEAD, HEAD_DIM, ROPE = 8, 64, 16


class Linear(torch.nn.Module):
    def __init__(self, inp: int, out: int, seed: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.weight = torch.nn.Parameter(torch.randn(out, inp, generator=gen).to(torch.bfloat16), requires_grad=False)

    def forward(self, t: torch.Tensor) -> tuple[torch.Tensor, None]:
        return t @ self.weight.T, None


class SFA(mod.AscendSFAImpl):
    """The attributes AscendSFAImpl.indexer_select_post_process reads."""

    def __init__(self) -> None:
        self.has_indexer, self.layer_name, self.enable_sparse_li_c8 = True, "layers.0.attn", False
        self.use_torch_npu_lightning_indexer = True
        self.n_head, self.head_dim, self.qk_rope_head_dim, self.is_rope_neox_style = N_HEAD, HEAD_DIM, ROPE, True
        self.wk_weights_proj = Linear(32, HEAD_DIM + N_HEAD, 2)  # kw = [key | per-head weights]
        self.wq_b = Linear(32, N_HEAD * HEAD_DIM, 3)


class SFACP(mod.AscendSFACPImpl):
    """The attributes and cross-rank gathers (identity on one rank) of the context-parallel implementation."""

    def __init__(self) -> None:
        SFA.__init__(self)
        self.pcp_size = 1

    def gather_kv_cross_cp(self, key, block_table):
        return key, block_table.shape[-1]

    def gather_block_table(self, block_num, block_table, block_arange):
        return block_table

    def gather_kv_cross_cp_compact(self, key, valid_block_ids):
        return key


T = 12
hidden = torch.randn(T, 32, generator=g).to(torch.bfloat16)
q_c = torch.randn(T, 32, generator=g).to(torch.bfloat16)
kv_cache = (None, None, torch.randn(4, 16, 1, HEAD_DIM, generator=g).to(torch.bfloat16))
cos = torch.randn(T, 1, 1, ROPE, generator=g).to(torch.bfloat16)
sin = torch.randn(T, 1, 1, ROPE, generator=g).to(torch.bfloat16)
lens = torch.tensor([T], dtype=torch.int32)
class Meta:
    """Attention metadata: only the fields the released callers read."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


meta = Meta(block_table=torch.zeros(1, 4, dtype=torch.int32))
cp_meta = Meta(block_table=torch.zeros(3, 4, dtype=torch.int32), num_decodes=2, num_decode_tokens=2, num_prefills=1,
               sfa_cp_metadata=Meta(block_arange=None, valid_block_ids=torch.arange(4),
                                    block_table_cp=torch.zeros(1, 4, dtype=torch.int32),
                                    prefill_q_cum_seqlens=torch.tensor([T - 2], dtype=torch.int32)))
cp_lens_q = torch.tensor([1, 2, T], dtype=torch.int32)


def sfa_call(impl: Any, adaptor: type) -> Any:
    mod.DeviceOperator = adaptor

    def call(h: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return impl.indexer_select_post_process(h, q, kv_cache, meta, cos, sin, lens, lens)

    return call


def cp_call(impl: Any) -> Any:
    def call(h: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return impl.indexer_select_post_process(h, q, kv_cache, cp_meta, cos, sin, cp_lens_q, cp_lens_q)

    return call


def indexer_cases() -> dict[str, Any]:
    cases = {}
    for name, adaptor in (("base", mod.BaseDeviceAdaptor), ("a5", mod.A5DeviceAdaptor),
                          ("310p", mod.Ascend310PDeviceAdaptor)):
        cases[f"indexer/{name}"] = (sfa_call(SFA(), adaptor), (hidden, q_c))
    cases["indexer/cp"] = (cp_call(SFACP()), (hidden, q_c))
    return cases


def run_indexer(cases: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, (fn, args) in cases.items():
        if name != "indexer/cp":
            mod.DeviceOperator = {"indexer/base": mod.BaseDeviceAdaptor, "indexer/a5": mod.A5DeviceAdaptor,
                                  "indexer/310p": mod.Ascend310PDeviceAdaptor}[name]
        out[name] = fn(*args)
    return out


def expected_scale(released_out: torch.Tensor) -> torch.Tensor:
    """What vLLM-Ascend's own fix hands the kernel: the released weights times n_head^-0.5 * head_dim^-0.5."""
    return (released_out.to(torch.bfloat16) * (N_HEAD**-0.5) * (HEAD_DIM**-0.5)).float()


out: dict[str, Any] = {}
rms, idx = rms_cases(), indexer_cases()
released = {name: fn(*args) for name, (fn, args) in rms.items()}
released_main = {name: fn(*args) for name, (fn, args) in rms_cases(NormMain).items()}
released_idx = run_indexer(idx)

# A deliberate proxy (what the engine installed before): the check below must see the fix vanish under compile.
import wrapt  # noqa: E402

from verl_ascend_ext.features.glm52.ascend.patch_code import rmsnorm  # noqa: E402

raw_released = vars(mod.AscendRMSNorm)["forward_oot"]


def _proxy_wrapper(wrapped, instance, args, kwargs):
    return rmsnorm.add_then_rms_norm(raw_released, instance, *args, **kwargs)


mod.AscendRMSNorm.forward_oot = wrapt.FunctionWrapper(raw_released, _proxy_wrapper)
proxy_name = "bias/residual/direct"
proxy_fn, proxy_args = rms_cases()[proxy_name]
proxy_eager = proxy_fn(*proxy_args)
try:
    proxy_compiled: Any = verdict(released[proxy_name], proxy_eager, compiled(proxy_fn, "eager")(*proxy_args))
except Exception as err:  # dynamo may also refuse the proxy outright; either way the fix does not run compiled
    proxy_compiled = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"}
out["proxy"] = {"eager_fix_visible": verdict(released[proxy_name], proxy_eager, proxy_eager)["fix_visible_eagerly"],
                "compiled": proxy_compiled}
mod.AscendRMSNorm.forward_oot = raw_released

statuses = {rid: engine.apply(record).status.value for rid, record in RECORDS.items()}
out["statuses"] = statuses
out["details"] = {rid: engine.statuses()[rid].detail for rid in RECORDS}
out["applied_twice"] = {rid: engine.apply(record).status.value for rid, record in RECORDS.items()}
out["plain_functions"] = {
    "rmsnorm": type(vars(mod.AscendRMSNorm)["forward_oot"]) is types.FunctionType,
    "base": type(vars(mod.BaseDeviceAdaptor)["indexer_select_post_process"]).__name__ == "staticmethod"
    and type(vars(mod.BaseDeviceAdaptor)["indexer_select_post_process"].__func__) is types.FunctionType,
}
out["verl_marker_seen"] = {
    "rmsnorm": getattr(mod.AscendRMSNorm.forward_oot, glm52_ascend.VERL_MARKER, False),
    "310p_through_base": getattr(mod.Ascend310PDeviceAdaptor.indexer_select_post_process, glm52_ascend.VERL_MARKER,
                                 False),
    "original_untouched": not hasattr(raw_released, glm52_ascend.VERL_MARKER),
}
chunked = len(npu.EVENTS)
out["rmsnorm"] = run_cases(rms_cases(), released)
out["chunk_calls"] = {"0.23": npu.EVENTS[chunked:].count("maybe_chunk_residual")}
del npu.EVENTS[chunked:]
out["rmsnorm_main"] = run_cases(rms_cases(NormMain), released_main)
out["chunk_calls"]["main"] = npu.EVENTS[chunked:].count("maybe_chunk_residual")
idx_cases = indexer_cases()
out["indexer"] = {}
for name, (fn, args) in idx_cases.items():
    if name != "indexer/cp":
        mod.DeviceOperator = {"indexer/base": mod.BaseDeviceAdaptor, "indexer/a5": mod.A5DeviceAdaptor,
                              "indexer/310p": mod.Ascend310PDeviceAdaptor}[name]
    eager = fn(*args)
    case = {backend: verdict(released_idx[name], eager, compiled(fn, backend)(*args))
            for backend in ("eager", "inductor")}
    case["eager_equals_upstream_fix"] = same(eager, expected_scale(released_idx[name]))
    out["indexer"][name] = case
out["unpatched"] = {rid: engine.unpatch(rid) for rid in RECORDS}
out["restored"] = vars(mod.AscendRMSNorm)["forward_oot"] is raw_released
print(json.dumps(out))
