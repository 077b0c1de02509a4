"""The export check on a synthetic GLM-5.2-scale checkpoint: time, tensors/s, peak memory, next to a bare header read.

    python benchmarks/export_check.py [--runs 3] [--keep DIR]

Writes a reference and an export in the GLM-5.2 layout (78 layers: 3 dense + 75 MoE with 256 routed
experts + 1 shared, MLA attention with the DSA indexer, one MTP layer in the reference), every shard a
real safetensors file whose header is written and whose data section is a hole (``truncate``: sparse,
no tensor byte is written; the check never reads them). Shapes are plausible for the family, not
copied from a release. Two cases:

- ``fp8 vs fp8``: both in the block-FP8 layout (FP8 weights + F32 ``weight_scale_inv``), the export
  without the MTP layer (a declared omission): >= 80,000 tensors in >= 150 shards on each side;
- ``bf16 vs fp8``: a BF16 export against the FP8 reference (declared FP8 -> BF16 conversion, scales
  and MTP layer omitted as declared).

Each run is a fresh interpreter that imports the package and calls ``check_export(..., "error")`` (the
in-training and CLI code, report written); it prints the wall time of the call, tensors/s (export +
reference tensors whose headers were read and compared), its CPU time (``process_time``: the machine is
shared, so wall time varies with the load printed) and its peak RSS (``ru_maxrss``, whole process,
imports included). Side by side: the same interpreter only reading every header (8-byte length +
``json.loads``), the least any header check costs. Targets: <= 3 s and <= 300 MB for ``fp8 vs fp8``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

HIDDEN, VOCAB, LAYERS, DENSE, EXPERTS = 6144, 154880, 78, 3, 256
MOE_FF, DENSE_FF, HEADS, Q_LORA, KV_LORA = 2048, 12288, 64, 2048, 512
QK_NOPE, QK_ROPE, V_HEAD, INDEX_HEADS, INDEX_DIM = 192, 64, 256, 32, 128
SHARDS = 160
BITS = {"BF16": 16, "F32": 32, "F8_E4M3": 8}


def layer(i: int) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` of one decoder layer (BF16 shapes; linear weights are (out, in))."""
    p = f"model.layers.{i}."
    out = {
        p + "input_layernorm.weight": (HIDDEN,), p + "post_attention_layernorm.weight": (HIDDEN,),
        p + "self_attn.q_a_proj.weight": (Q_LORA, HIDDEN), p + "self_attn.q_a_layernorm.weight": (Q_LORA,),
        p + "self_attn.q_b_proj.weight": (HEADS * (QK_NOPE + QK_ROPE), Q_LORA),
        p + "self_attn.kv_a_proj_with_mqa.weight": (KV_LORA + QK_ROPE, HIDDEN),
        p + "self_attn.kv_a_layernorm.weight": (KV_LORA,),
        p + "self_attn.kv_b_proj.weight": (HEADS * (QK_NOPE + V_HEAD), KV_LORA),
        p + "self_attn.o_proj.weight": (HIDDEN, HEADS * V_HEAD),
        p + "self_attn.indexer.wq_b.weight": (INDEX_HEADS * INDEX_DIM, Q_LORA),
        p + "self_attn.indexer.wk.weight": (INDEX_DIM, HIDDEN),
        p + "self_attn.indexer.k_norm.weight": (INDEX_DIM,), p + "self_attn.indexer.k_norm.bias": (INDEX_DIM,),
        p + "self_attn.indexer.weights_proj.weight": (INDEX_HEADS, HIDDEN),
    }
    mlps = [(p + "mlp.", DENSE_FF)] if i < DENSE else [(p + "mlp.shared_experts.", MOE_FF)] + [
        (f"{p}mlp.experts.{e}.", MOE_FF) for e in range(EXPERTS)]
    if i >= DENSE:
        out[p + "mlp.gate.weight"] = (EXPERTS, HIDDEN)
        out[p + "mlp.gate.e_score_correction_bias"] = (EXPERTS,)
    for prefix, ff in mlps:
        out.update({prefix + "gate_proj.weight": (ff, HIDDEN), prefix + "up_proj.weight": (ff, HIDDEN),
                    prefix + "down_proj.weight": (HIDDEN, ff)})
    if i == LAYERS:  # the MTP (next-n) layer
        out.update({p + "enorm.weight": (HIDDEN,), p + "hnorm.weight": (HIDDEN,),
                    p + "eh_proj.weight": (HIDDEN, 2 * HIDDEN), p + "shared_head.norm.weight": (HIDDEN,)})
    return out


def quantised(name: str) -> bool:
    return name.endswith(("_proj.weight", "wq_b.weight", "wk.weight")) and not name.endswith("weights_proj.weight")


def tensors(fp8: bool, mtp: bool) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{name: (dtype, shape)}`` of the whole model."""
    shapes = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,),
              "lm_head.weight": (VOCAB, HIDDEN)}
    for i in range(LAYERS + (1 if mtp else 0)):
        shapes.update(layer(i))
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, shape in shapes.items():
        if name.endswith("e_score_correction_bias"):
            out[name] = ("F32", shape)
        elif fp8 and quantised(name):
            out[name] = ("F8_E4M3", shape)
            out[name.replace(".weight", ".weight_scale_inv")] = ("F32", tuple(math.ceil(d / 128) for d in shape))
        else:
            out[name] = ("BF16", shape)
    return out


def write_checkpoint(directory: Path, named: dict[str, tuple[str, tuple[int, ...]]], config: dict) -> None:
    """Sharded safetensors files (header written, data section a hole), their index and config.json."""
    directory.mkdir(parents=True)
    names = list(named)
    per = math.ceil(len(names) / SHARDS)
    weight_map = {}
    for s in range(SHARDS):
        file = f"model-{s + 1:05d}-of-{SHARDS:05d}.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name in names[s * per:(s + 1) * per]:
            dtype, shape = named[name]
            size = math.prod(shape) * BITS[dtype] // 8
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
            offset += size
            weight_map[name] = file
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the library pads headers to 8 bytes too
        with open(directory / file, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            f.truncate(8 + len(raw) + offset)
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (directory / "config.json").write_text(json.dumps(config))


CHILD = """
import json, resource, sys, time
from pathlib import Path
what, export, reference = sys.argv[1:4]
t0, c0 = time.perf_counter(), time.process_time()
if what == "check":
    from verl_ascend_ext.features.checkpoint.export_check import check_export
    report = check_export(export, reference, "error")
    result = {"ok": report.ok, "tensors": report.tensors, "shards": report.shards, "omitted": len(report.omitted),
              "converted": sum(report.converted.values())}
else:
    import struct
    count = 0
    for directory in (export, reference):
        for path in sorted(Path(directory).glob("*.safetensors")):
            with open(path, "rb") as f:
                count += len(json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))) - 1
    result = {"tensors": count}
result["seconds"], result["cpu_seconds"] = time.perf_counter() - t0, time.process_time() - c0
result["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(result))
"""


def run(what: str, export: Path, reference: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, what, str(export), str(reference)], capture_output=True,
                          text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="write the checkpoints here (kept) instead of a temporary dir")
    args = parser.parse_args()
    config = {"model_type": "glm_moe_dsa", "architectures": ["GlmMoeDsaForCausalLM"], "num_hidden_layers": LAYERS,
              "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}}
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        reference = root / "reference"
        write_checkpoint(reference, tensors(fp8=True, mtp=True), config)
        cases = {"fp8 vs fp8": root / "export-fp8", "bf16 vs fp8": root / "export-bf16"}
        write_checkpoint(cases["fp8 vs fp8"], tensors(fp8=True, mtp=False), {})
        write_checkpoint(cases["bf16 vs fp8"], tensors(fp8=False, mtp=False), {})
        apparent = sum(p.stat().st_size for p in root.rglob("*.safetensors")) / 2**40
        on_disk = sum(p.stat().st_blocks * 512 for p in root.rglob("*.safetensors")) / 2**20
        print(f"synthetic GLM-5.2 checkpoints: {apparent:.2f} TiB apparent, {on_disk:.0f} MiB on disk (sparse)")
        print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
        print(f"{'case':<12} {'export':>17} {'reference':>17} {'check s':>8} {'cpu s':>6} {'tensors/s':>10} "
              f"{'peak MB':>8} {'headers-only s':>15} {'cpu s':>6} {'ratio':>6}")
        for name, export in cases.items():
            checks = [run("check", export, reference) for _ in range(args.runs)]
            bare = [run("headers", export, reference) for _ in range(args.runs)]
            assert all(c["ok"] for c in checks), checks[0]
            first = checks[0]
            seconds = statistics.median(c["seconds"] for c in checks)
            bare_s = statistics.median(b["seconds"] for b in bare)
            cpu = statistics.median(c["cpu_seconds"] for c in checks)
            bare_cpu = statistics.median(b["cpu_seconds"] for b in bare)
            total = first["tensors"]["export"] + first["tensors"]["reference"]
            assert total == bare[0]["tensors"], (total, bare[0])
            print(f"{name:<12} {first['tensors']['export']:>7} in {first['shards']['export']:>3} sh "
                  f"{first['tensors']['reference']:>7} in {first['shards']['reference']:>3} sh "
                  f"{seconds:>8.2f} {cpu:>6.2f} {total / seconds:>10.0f} {max(c['peak_mb'] for c in checks):>8.0f} "
                  f"{bare_s:>15.2f} {bare_cpu:>6.2f} {seconds / bare_s:>5.1f}x")
            runs = ", ".join(f"{c['seconds']:.2f}" for c in checks)
            print(f"{'':<12} load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
            print(f"{'':<12} runs: {runs} s; omitted as declared "
                  f"{first['omitted']}, converted as declared {first['converted']}")


if __name__ == "__main__":
    main()
