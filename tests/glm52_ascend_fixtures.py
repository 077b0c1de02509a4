"""Fixtures of the GLM-5.2 vLLM-Ascend tests: the released 0.23.0 sources (from scripts/fetch_vllm_ascend.sh).

The sources are read, never imported (vLLM-Ascend needs an NPU). Static predictions run in a fresh
interpreter with a source tree first on PYTHONPATH: the engine then finds the vLLM-Ascend modules and
the wheel's own METADATA there exactly as it finds an installed vLLM-Ascend, so the recogniser code
under test is the one doctor runs.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from repo import CACHE, REPO
from subprocesses import last_json, run_python

VERSION = "0.23.0"

SOURCES = CACHE / "vllm-ascend-src" / VERSION
PATCHES = REPO / "patches" / "vllm-ascend"
GATE = "VERL_VLLM_ASCEND_GLM52_PATCH"
KEPT_FILES = (  # keep in sync with scripts/fetch_vllm_ascend.sh
    "vllm_ascend/utils.py",
    "vllm_ascend/ops/layernorm.py",
    "vllm_ascend/attention/sfa_v1.py",
    "vllm_ascend/attention/context_parallel/sfa_cp.py",
    "vllm_ascend/device/device_op.py",
    "vllm_ascend/device_allocator/camem.py",
    "vllm_ascend/patch/worker/__init__.py",
    "vllm_ascend/patch/worker/patch_routed_experts_capture.py",
    "vllm_ascend/ascend_config.py",
    "vllm_ascend/worker/worker.py",
    f"vllm_ascend-{VERSION}.dist-info/METADATA",
)


def released_sources() -> Path:
    """The extracted vLLM-Ascend 0.23.0 tree; fails (never skips) when the fetch script has not run."""
    missing = [f for f in KEPT_FILES if not (SOURCES / f).is_file()]
    assert not missing, (f"vLLM-Ascend {VERSION} sources missing under {SOURCES}: {missing}. "
                         "Run scripts/fetch_vllm_ascend.sh (scripts/test.sh does).")
    return SOURCES


def copy_tree(dest: Path) -> Path:
    shutil.copytree(released_sources(), dest)
    return dest


def mutate(tree: Path, rel: str, old: str, new: str) -> None:
    """Replace the first occurrence of ``old`` in ``tree/rel`` (which must contain it)."""
    path = tree / rel
    text = path.read_text(encoding="utf-8")
    assert old in text, f"mutation anchor not found in {rel}: {old!r}"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def apply_diff(tree: Path, diff: Path) -> None:
    proc = subprocess.run(["patch", "-p1", "--forward", "-d", str(tree), "-i", str(diff)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, f"{diff.name} does not apply to vLLM-Ascend {VERSION}:\n{proc.stdout}{proc.stderr}"


PREDICT = """
import json
from verl_ascend_ext.features.glm52.ascend.declaration import RECORDS
from verl_ascend_ext.patching.engine import installed_version, predict
out = {"version": installed_version("vllm-ascend")}
for record in RECORDS:
    status = predict(record, frozenset(), {"VERL_VLLM_ASCEND_GLM52_PATCH": "1"})
    out[record.id] = {"status": status.status.value, "detail": status.detail, "where": status.where}
print(json.dumps(out))
"""


def predict_on(tree: Path) -> dict:
    """Static predictions of every vLLM-Ascend record, made by a fresh interpreter that finds ``tree``."""
    out = last_json(run_python(PREDICT, pythonpath=str(tree)).stdout)
    assert out.pop("version") == VERSION, "the tree's METADATA was not found"
    return out


LAYERNORM = "vllm_ascend/ops/layernorm.py"
# vLLM-Ascend main's layernorm.py (snapshot 182b75ea84, 2026-08-22; unchanged since #13946) as git names its bytes:
# `git rev-parse main:vllm_ascend/ops/layernorm.py`. main has no release on the package index, so the tests
# rebuild it from the released 0.23.0 file with the edits main made (below) and check the result is that blob.
MAIN_LAYERNORM_BLOB = "1222e53e068ea64a736989026fc735a93f43f65b"
MAIN_LAYERNORM_EDITS = (  # (old, new, count): #11949 (weight prefetch config removed), #13946 (FlashComm v1 removed)
    ("from vllm_ascend.utils import enable_custom_op, get_weight_prefetch_method\n",
     "from vllm_ascend.utils import enable_custom_op\n", 1),
    ("            residual = torch.ops.vllm.maybe_chunk_residual(x, residual)\n", "", 2),
    ("        weight_prefetch_method = get_weight_prefetch_method()\n"
     "        weight_prefetch_method.maybe_prefetch_mlp_weight_postprocess(x)\n", "", 1),
)


def git_blob_id(data: bytes) -> str:
    """The id git gives a file's bytes (``git hash-object``)."""
    import hashlib

    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def main_layernorm(tree: Path) -> Path:
    """Turn ``tree``'s released 0.23.0 layernorm.py into vLLM-Ascend main's, byte for byte (checked by blob id)."""
    path = tree / LAYERNORM
    text = path.read_text(encoding="utf-8")
    for old, new, count in MAIN_LAYERNORM_EDITS:
        assert text.count(old) == count, f"edit anchor found {text.count(old)} times, expected {count}: {old!r}"
        text = text.replace(old, new)
    path.write_bytes(text.encode("utf-8"))
    assert git_blob_id(path.read_bytes()) == MAIN_LAYERNORM_BLOB, "the rebuilt file is not vLLM-Ascend main's"
    return path
