"""Export check on real safetensors files: per-shard integrity, shapes and dtypes, diagnoses, the CLI.

Good files are written by the ``safetensors`` package itself (``safetensors.torch.save_file``); broken
ones are those files with bytes cut or overwritten, or headers written by hand (``write_raw``) where a
layout the library would never write is needed (overlaps, gaps, wrong sizes). The CLI runs as the
installed ``verl-ascend`` console script in a subprocess. Every test that reads a checkpoint also
checks that no file of either directory changed (size, mtime, SHA-256).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from subprocesses import run_command

from verl_ascend_ext.features.checkpoint.conversions import FSDP_MASTER_WEIGHTS
from verl_ascend_ext.features.checkpoint.export_check import (
    ExportCheckError,
    ExportInputError,
    check_export,
    report_path_for,
)

CLI = str(Path(sys.executable).with_name("verl-ascend"))
GLM = {"model_type": "glm_moe_dsa", "architectures": ["GlmMoeDsaForCausalLM"], "num_hidden_layers": 4}
FP8_GLM = {**GLM, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}}
PARTS = {"self_attn.q_proj.weight": (16, 8), "mlp.down_proj.weight": (8, 12), "input_layernorm.weight": (8,)}


def tensors(layers: int = 4, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    out = {"model.embed_tokens.weight": torch.zeros(32, 8, dtype=dtype),
           "model.norm.weight": torch.ones(8, dtype=dtype)}
    for i in range(layers):
        out.update({f"model.layers.{i}.{p}": torch.full(s, float(i), dtype=dtype) for p, s in PARTS.items()})
    return out


def write_checkpoint(directory: Path, named: dict[str, torch.Tensor], shards: int = 3, index: bool = True,
                     config: dict | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    names = sorted(named)
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = names[s::shards]
        save_file({n: named[n].contiguous() for n in part}, str(directory / file))
        weight_map.update(dict.fromkeys(part, file))
    if index:
        (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config))
    return directory


def write_raw(path: Path, header: dict, data_size: int) -> None:
    """A safetensors file written by hand: the header, then ``data_size`` bytes (sparse, never written)."""
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + data_size)


def state(*directories: Path) -> dict[str, tuple[int, int, str]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for d in directories for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    reference = write_checkpoint(tmp_path / "reference", tensors(), config=GLM)
    export = write_checkpoint(tmp_path / "export", tensors(), shards=2)
    return export, reference


def check(export: Path, reference: Path, mode: str = "error", conversions: tuple = ()):
    """check_export, asserting it modified nothing in either directory."""
    before = state(export, reference)
    try:
        return check_export(export, reference, mode, conversions=conversions)
    finally:
        assert state(export, reference) == before


def failure(export: Path, reference: Path, conversions: tuple = ()) -> ExportCheckError:
    with pytest.raises(ExportCheckError) as caught:
        check(export, reference, conversions=conversions)
    return caught.value


def shard(directory: Path, n: int = 1) -> Path:
    return sorted(directory.glob("*.safetensors"))[n - 1]


def test_identical_export_passes_and_counts(pair: tuple[Path, Path]) -> None:
    export, reference = pair
    report = check(export, reference)
    assert report.ok and report.integrity == [] and report.mismatched == [] and report.missing == []
    assert report.tensors == {"export": 14, "reference": 14} and report.shards == {"export": 2, "reference": 3}
    written = json.loads(report_path_for(export).read_text())
    assert written == report.as_dict()


def test_truncated_shard_names_file_and_bytes(pair: tuple[Path, Path]) -> None:
    export, reference = pair
    victim = shard(export, 2)
    os.truncate(victim, victim.stat().st_size - 10)
    err = failure(export, reference)
    assert f"{victim} is not a valid safetensors file: it is truncated" in str(err)
    assert "a writer killed mid-save?" in str(err)
    assert err.report is not None and err.report.integrity and not err.report.ok
    # the tensors of the refused shard are not counted as present; they are reported apart from the missing ones
    weight_map = json.loads((export / "model.safetensors.index.json").read_text())["weight_map"]
    assert err.report.unreadable == sorted(n for n, f in weight_map.items() if f == victim.name)
    assert err.report.missing == [] and "indexed in shard(s) that are absent or unreadable" in str(err)


def test_corrupt_header_json(pair: tuple[Path, Path]) -> None:
    export, reference = pair
    victim = shard(export)
    data = bytearray(victim.read_bytes())
    data[8] = ord("[")  # the header's opening brace
    data[9:12] = b"!!!"
    victim.write_bytes(bytes(data))
    message = str(failure(export, reference))
    assert f"{victim} is not a valid safetensors file: its header (" in message and "is not valid JSON" in message


def test_header_length_beyond_the_file(pair: tuple[Path, Path]) -> None:
    export, reference = pair
    victim = shard(export)
    data = bytearray(victim.read_bytes())
    data[:8] = struct.pack("<Q", 10 * len(data))
    victim.write_bytes(bytes(data))
    message = str(failure(export, reference))
    assert f"{victim} is not a complete safetensors file: its header length {10 * len(data)} exceeds" in message


def test_unreadable_shard_without_index(tmp_path: Path) -> None:
    reference = write_checkpoint(tmp_path / "reference", tensors(), config=GLM)
    export = write_checkpoint(tmp_path / "export", tensors(), shards=1, index=False)
    (export / "model-00002-of-00002.safetensors").symlink_to(tmp_path / "nowhere")
    (export / "model-00003-of-00003.safetensors").mkdir()
    err = failure(export, reference)
    assert f"{export / 'model-00002-of-00002.safetensors'} cannot be read: " in str(err)
    assert f"{export / 'model-00003-of-00003.safetensors'} cannot be read: " in str(err)


def test_file_shorter_than_the_length_field(pair: tuple[Path, Path]) -> None:
    export, reference = pair
    victim = shard(export)
    victim.write_bytes(b"\x01\x02")
    assert f"{victim} is not a valid safetensors file: it has 2 byte(s)" in str(failure(export, reference))


@pytest.mark.parametrize(("layout", "data_size", "expected"), [
    ({"a": ("F32", [4], [0, 12]), "b": ("F32", [4], [12, 28])}, 28, "tensor 'model.a' is F32[4], which needs 16 bytes"),
    ({"a": ("F32", [4], [0, 16]), "b": ("F32", [4], [8, 24])}, 24, "tensors 'model.a' and 'model.b' overlap"),
    ({"a": ("F32", [4], [0, 16]), "b": ("F32", [4], [20, 36])}, 36, "bytes 16..20 of the data section belong to no"),
    ({"a": ("F32", [4], [0, 16])}, 20, "it has 4 byte(s) after the last tensor's data"),
    ({"a": ("F32", [4], [0, 16]), "b": ("BF16", [4], [16, 24])}, 20, "it is truncated: its header describes 24 bytes"),
])
def test_byte_ranges_checked_per_tensor(tmp_path: Path, layout: dict, data_size: int, expected: str) -> None:
    names = {f"model.{n}": v for n, v in layout.items()}
    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16}
    reference = write_checkpoint(tmp_path / "reference", {n: torch.zeros(*s, dtype=dtypes[d])
                                                          for n, (d, s, _) in names.items()}, shards=1, config=GLM)
    export = tmp_path / "export"
    export.mkdir()
    write_raw(export / "model.safetensors", {n: {"dtype": d, "shape": s, "data_offsets": o}
                                             for n, (d, s, o) in names.items()}, data_size)
    message = str(failure(export, reference))
    assert f"{export / 'model.safetensors'} is not a valid safetensors file: {expected}" in message


def test_index_must_agree_with_the_shards(pair: tuple[Path, Path]) -> None:
    export, reference = pair
    index_file = export / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    first, second = sorted(set(index["weight_map"].values()))
    moved = "model.layers.0.mlp.down_proj.weight"
    wrong = second if index["weight_map"][moved] == first else first
    index["weight_map"][moved] = wrong  # indexed in a shard that does not hold it
    index["weight_map"]["model.layers.9.extra.weight"] = "model-00009-of-00009.safetensors"  # named, never written
    index_file.write_text(json.dumps(index))
    save_file({"stale": torch.zeros(1)}, str(export / "model-00001-of-00005.safetensors"))  # stray, from a past save
    err = failure(export, reference)
    message = str(err)
    assert f"{export / 'model-00009-of-00009.safetensors'} is named by {index_file} (for 1 tensor(s)) but does " \
           "not exist" in message
    assert f"{index_file} names 1 tensor(s) in {export / wrong} that it does not hold: {moved} (found in " in message
    assert err.report.stray_shards == ["model-00001-of-00005.safetensors"]
    assert not any("model-00001-of-00005" in p for p in err.report.integrity)  # reported, never counted


def test_unindexed_tensor_and_tensor_in_two_shards(pair: tuple[Path, Path]) -> None:
    export, reference = pair
    index_file = export / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    dropped = "model.norm.weight"
    del index["weight_map"][dropped]
    save_file({"model.embed_tokens.weight": torch.zeros(32, 8, dtype=torch.bfloat16)},
              str(export / "model-00003-of-00003.safetensors"))
    index["weight_map"]["model.layers.7.x.weight"] = "model-00003-of-00003.safetensors"
    index_file.write_text(json.dumps(index))
    err = failure(export, reference)
    held_by = index["weight_map"]["model.embed_tokens.weight"]
    assert (f"{export / 'model-00003-of-00003.safetensors'} holds 1 tensor(s) already in another shard: "
            f"model.embed_tokens.weight (also in {held_by})") in str(err)
    assert f"1 tensor(s) in the shards are not in {index_file}" in str(err) and dropped in err.report.missing


def test_shard_saved_unmerged_is_diagnosed(tmp_path: Path) -> None:
    reference = write_checkpoint(tmp_path / "reference", tensors(), config=GLM)
    exported = tensors()
    for i in range(4):
        exported[f"model.layers.{i}.self_attn.q_proj.weight"] = torch.zeros(4, 8, dtype=torch.bfloat16)  # 16 / 4
    export = write_checkpoint(tmp_path / "export", exported)
    err = failure(export, reference)
    assert err.report.mismatched[0] == {
        "name": "model.layers.0.self_attn.q_proj.weight", "reference": "BF16[16, 8]", "export": "BF16[4, 8]",
        "why": "dimension 0 is 1/4 of the reference's: looks like a tensor- or expert-parallel shard saved unmerged, "
               "N=4"}
    assert err.report.diagnoses == [
        "4 tensor(s) have one dimension exactly 1/4 of the reference's (e.g. model.layers.0.self_attn.q_proj.weight: "
        "BF16[16, 8] in the reference, BF16[4, 8] exported): looks like a tensor- or expert-parallel shard saved "
        "unmerged, N=4"]
    assert "diagnosis: 4 tensor(s) have one dimension exactly 1/4" in str(err)


def test_missing_pipeline_stage_is_diagnosed(tmp_path: Path) -> None:
    reference = write_checkpoint(tmp_path / "reference", tensors(layers=6), config={**GLM, "num_hidden_layers": 6})
    exported = {n: t for n, t in tensors(layers=6).items() if not n.startswith(("model.layers.2.", "model.layers.3."))}
    del exported["model.layers.5.mlp.down_proj.weight"]
    err = failure(write_checkpoint(tmp_path / "export", exported), reference)
    assert err.report.diagnoses == ["layers 2..3 missing entirely (6 tensors): one pipeline stage's weights?"]
    assert len(err.report.missing) == 7 and "model.layers.5.mlp.down_proj.weight" in err.report.missing


def test_dtype_change_is_an_error(tmp_path: Path) -> None:
    reference = write_checkpoint(tmp_path / "reference", tensors(), config=GLM)
    exported = tensors()
    exported["model.norm.weight"] = exported["model.norm.weight"].float()
    err = failure(write_checkpoint(tmp_path / "export", exported), reference)
    assert err.report.mismatched == [{"name": "model.norm.weight", "reference": "BF16[8]", "export": "F32[8]",
                                      "why": "dtype changed from BF16 to F32"}]
    assert err.report.diagnoses[0].startswith("1 tensor(s) changed dtype from BF16 to F32")


def test_fsdp_master_weights_are_allowed_only_from_the_fsdp_save_and_only_widening(tmp_path: Path) -> None:
    """verl's FSDP save exports the FP32 master weights of a BF16 model: accepted when the caller says so."""
    reference = write_checkpoint(tmp_path / "reference", tensors(), config=GLM)
    widened = write_checkpoint(tmp_path / "widened", {n: t.float() for n, t in tensors().items()})
    report = check(widened, reference, conversions=(FSDP_MASTER_WEIGHTS,))
    assert report.ok and report.mismatched == []
    assert report.converted == {f"verl FSDP save: {FSDP_MASTER_WEIGHTS.description}": len(tensors())}
    assert failure(widened, reference).report.mismatched  # without it: every tensor is a dtype change
    narrowed_reference = write_checkpoint(tmp_path / "f32-reference", {n: t.float() for n, t in tensors().items()},
                                          config=GLM)
    err = failure(write_checkpoint(tmp_path / "narrowed", tensors()), narrowed_reference,
                  conversions=(FSDP_MASTER_WEIGHTS,))
    assert err.report.diagnoses[0].startswith(f"{len(tensors())} tensor(s) changed dtype from F32 to BF16")


def fp8_reference(directory: Path, config: dict) -> Path:
    named = {}
    for name, tensor in tensors().items():
        if name.endswith("proj.weight"):
            named[name] = tensor.to(torch.float8_e4m3fn)
            named[name.replace(".weight", ".weight_scale_inv")] = torch.ones(1, 1)
        else:
            named[name] = tensor
    return write_checkpoint(directory, named, config=config)


def test_declared_fp8_to_bf16_conversion(tmp_path: Path) -> None:
    reference = fp8_reference(tmp_path / "reference", FP8_GLM)
    report = check(write_checkpoint(tmp_path / "export", tensors()), reference)
    assert report.ok and report.mismatched == []
    assert list(report.converted.values()) == [8] and "FP8 -> BF16" in next(iter(report.converted))
    assert len(report.omitted) == 8 and all(n.endswith(".weight_scale_inv") for n in report.omitted)


def test_undeclared_conversion_fails(tmp_path: Path) -> None:
    reference = fp8_reference(tmp_path / "reference", {**FP8_GLM, "model_type": "llama", "architectures": []})
    err = failure(write_checkpoint(tmp_path / "export", tensors()), reference)
    assert len(err.report.mismatched) == 8 and len(err.report.missing) == 8
    assert err.report.diagnoses[0].startswith("8 tensor(s) changed dtype from F8_E4M3 to BF16")


def test_reference_layouts(tmp_path: Path) -> None:
    export = write_checkpoint(tmp_path / "export", tensors())
    single = write_checkpoint(tmp_path / "single", tensors(), shards=1, index=False, config=GLM)
    (single / "model-00001-of-00001.safetensors").rename(single / "model.safetensors")
    assert check(export, single).ok  # Hugging Face's single-file layout has no index by convention
    lone = write_checkpoint(tmp_path / "lone", tensors(), shards=1, index=False, config=GLM)
    with pytest.raises(ExportInputError, match=rf"{lone / 'model-00001-of-00001.safetensors'} is its only file"):
        check(export, lone)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ExportInputError, match=rf"the export {empty} holds no \*\.safetensors file"):
        check(empty, single)
    with pytest.raises(ExportInputError, match=rf"the reference checkpoint {empty} holds no \*\.safetensors"):
        check(export, empty)
    broken = write_checkpoint(tmp_path / "broken", tensors(), config=GLM)
    os.truncate(shard(broken), 100)
    with pytest.raises(ExportInputError, match=rf"reference checkpoint {broken} is not a usable baseline: "
                                               rf"{shard(broken)} is not a complete safetensors file"):
        check(export, broken)


def test_warn_and_off_never_raise(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    reference = write_checkpoint(tmp_path / "reference", tensors(), config=GLM)
    export = write_checkpoint(tmp_path / "export", tensors(layers=3))
    assert check(export, reference, "warn").ok is False and "layer 3 missing entirely" in caplog.text
    assert check(export, reference, "off").error == "not checked: VERL_ASCEND_EXT_EXPORT_CHECK=off"
    assert check(tmp_path / "nowhere", reference, "warn").error.startswith("cannot check the export")


def cli(*args: str, mode: str | None = None) -> subprocess.CompletedProcess:
    env = {} if mode is None else {"VERL_ASCEND_EXT_EXPORT_CHECK": mode}
    return run_command([CLI, "export-check", *args], env, check=False, timeout=120)


def test_cli_exit_codes_and_report(tmp_path: Path) -> None:
    reference = write_checkpoint(tmp_path / "reference", tensors(), config=GLM)
    good = write_checkpoint(tmp_path / "good", tensors())
    bad = write_checkpoint(tmp_path / "bad", tensors(layers=2))
    before = state(reference, good, bad)
    ok = cli(str(good), "--reference", str(reference))
    assert ok.returncode == 0 and "OK" in ok.stdout.splitlines()[0], ok.stderr
    failed = cli(str(bad), "--reference", str(reference), "--json")
    assert failed.returncode == 1, failed.stderr
    out = json.loads(failed.stdout)
    assert out["exit_code"] == 1 and out["diagnoses"] == [
        "layers 2..3 missing entirely (6 tensors): one pipeline stage's weights?"]
    assert json.loads(Path(out["report_path"]).read_text()) == {
        k: v for k, v in out.items() if k not in ("report_path", "exit_code")}  # the in-training report
    text = cli(str(bad), "--reference", str(reference))
    assert text.returncode == 1 and "diagnosis: layers 2..3 missing entirely" in text.stdout
    warned = cli(str(bad), "--reference", str(reference), mode="warn")
    assert warned.returncode == 0 and "FAILED (warn mode: not an error)" in warned.stdout
    assert cli(str(bad), "--reference", str(reference), mode="off").returncode == 0
    unusable = cli(str(tmp_path / "nowhere"), "--reference", str(reference))
    assert unusable.returncode == 2 and f"the export {tmp_path / 'nowhere'} is not a directory" in unusable.stderr
    assert cli(str(tmp_path / "nowhere"), "--reference", str(reference), mode="warn").returncode == 2
    invalid = cli(str(good), "--reference", str(reference), mode="strict")
    assert invalid.returncode == 2 and "VERL_ASCEND_EXT_EXPORT_CHECK='strict'" in invalid.stderr
    assert state(reference, good, bad) == before


def test_cli_imports_no_torch(tmp_path: Path) -> None:
    reference = write_checkpoint(tmp_path / "reference", tensors(), config=GLM)
    code = ("import sys; from verl_ascend_ext.tooling.cli import main; rc = main(['export-check', sys.argv[1], "
            "'--reference', sys.argv[1]]); print(rc, sorted(m for m in ('torch', 'verl') if m in sys.modules))")
    proc = run_command([sys.executable, "-c", code, reference], check=False, timeout=120)
    assert proc.stdout.splitlines()[-1] == "0 []", proc.stderr



def test_tensor_data_is_never_read(tmp_path: Path) -> None:
    """4 GiB of tensor data per side (sparse): reading it, even through the library's mmap, would fault in
    about a million pages; the whole check must stay far below that."""
    import resource

    gib4 = 4 * 2**30
    header = {"model.embed_tokens.weight": {"dtype": "BF16", "shape": [2**16, 2**15], "data_offsets": [0, gib4]}}
    directories = []
    for name in ("reference", "export"):
        directory = tmp_path / name
        directory.mkdir()
        write_raw(directory / "model.safetensors", header, gib4)
        directories.append(directory)
    files = {p: (p.stat().st_size, p.stat().st_mtime_ns) for d in directories for p in d.iterdir()}
    before = resource.getrusage(resource.RUSAGE_SELF)
    report = check_export(directories[1], directories[0], "error")  # not check(): its hashing reads the data
    after = resource.getrusage(resource.RUSAGE_SELF)
    assert {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in files} == files
    assert report.ok and report.tensors == {"export": 1, "reference": 1}
    faults = after.ru_minflt - before.ru_minflt + after.ru_majflt - before.ru_majflt
    assert faults < 20_000, faults  # 2 x 4 GiB read would be >= 2 x 2**20 page faults
