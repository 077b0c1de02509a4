"""The GLM-5.2 vLLM-Ascend recognisers on the real released 0.23.0 source, on mutated copies and with our diffs.

Real: the vLLM-Ascend 0.23.0 wheel's own files (scripts/fetch_vllm_ascend.sh), the engine's static
prediction (what doctor runs), GNU patch applying patches/vllm-ascend/*.diff. Nothing is imported
from vLLM-Ascend.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from glm52_ascend_fixtures import PATCHES, apply_diff, copy_tree, mutate, predict_on, released_sources

RMSNORM = "glm52-ascend-rmsnorm-add-then-norm"
KV_B_PROJ = "glm52-ascend-sfa-keep-kv-b-proj"
BASE = "glm52-ascend-indexer-scale-base"
A5 = "glm52-ascend-indexer-scale-a5"
CP = "glm52-ascend-indexer-scale-cp"
CAMEM = "glm52-ascend-camem-sync-before-sleep"
CAPTURE = "glm52-ascend-routed-experts-capture"
ALL = (RMSNORM, KV_B_PROJ, BASE, A5, CP, CAMEM, CAPTURE)

DIFFS = {  # diff -> the records it fixes
    "0001-rmsnorm-add-then-norm.diff": {RMSNORM},
    "0002-sfa-keep-kv-b-proj.diff": {KV_B_PROJ},
    "0003-sfa-indexer-weight-scale.diff": {BASE, A5, CP},
    "0004-camem-sync-before-sleep.diff": {CAMEM},
    "0005-load-routed-experts-capture.diff": {CAPTURE},
}

LAYERNORM = "vllm_ascend/ops/layernorm.py"
SFA = "vllm_ascend/attention/sfa_v1.py"
SFA_CP = "vllm_ascend/attention/context_parallel/sfa_cp.py"
CAMEM_PY = "vllm_ascend/device_allocator/camem.py"
WORKER = "vllm_ascend/patch/worker/__init__.py"
WEIGHTS = "        weights = kw[:, self.head_dim :]\n"

# (name, refused records, file, old, new): plausible upstream edits the patch must refuse that the generic contract
# suite (tests/test_contract.py: per pattern, one token renamed or one matching statement inserted, one record on at
# a time) does not represent. Edits that amount to one pattern broken that way are its business, not listed here.
MUTATIONS = [
    # order swapped, every token kept: only the order the pattern spells tells it apart
    ("rmsnorm-returns-swapped", {RMSNORM}, LAYERNORM, "            return x, residual",
     "            return residual, x"),
    # the call nested under a condition, every token kept: only the pattern's anchored indentation tells it apart
    ("kvb-dispose-conditional", {KV_B_PROJ}, SFA, "        dispose_layer(self.kv_b_proj)",
     "        if not self.keep_kv_b_proj:\n            dispose_layer(self.kv_b_proj)"),
    # upstream scaling in the caller both device adaptors share: one edit refuses both records (double scaling)
    ("indexer-caller-other-scale", {BASE, A5}, SFA, WEIGHTS,
     WEIGHTS + "        weights = weights * self.softmax_scale\n"),
    # arguments reordered in that shared caller: both records refused, every token kept
    ("indexer-caller-argument-order", {BASE, A5}, SFA, "            q_li_shape_ori,\n            weights,\n",
     "            weights,\n            q_li_shape_ori,\n"),
    # parameters reordered, every token kept: our replacement would pass q and key the wrong way round
    ("cp-execute-signature", {CP}, SFA_CP, "def _execute_indexer_select(self, q, key, weights,",
     "def _execute_indexer_select(self, key, q, weights,"),
    # a scaling appended to the CP caller's line, every token of the match kept: only its end-of-line anchor
    # catches it (double scaling)
    ("cp-caller-other-scale", {CP}, SFA_CP, WEIGHTS, "        weights = kw[:, self.head_dim :] * self.scale\n"),
    # a synchronize after the unmap (the wrong place) is refused, one before it is the fix (next test): placement,
    # which an inserted statement at the top or bottom of the body does not tell apart
    ("camem-sync-after-unmap", {CAMEM}, CAMEM_PY, "        gc.collect()\n        torch.npu.empty_cache()",
     "        torch.npu.synchronize()\n        gc.collect()\n        torch.npu.empty_cache()"),
]


def statuses(out: dict) -> dict[str, str]:
    return {rid: out[rid]["status"] for rid in ALL}


def test_released_source_is_recognised_as_applicable() -> None:
    tree = released_sources()
    out = predict_on(tree)
    assert statuses(out) == dict.fromkeys(ALL, "will-apply"), out
    assert out[RMSNORM]["where"] == f"{tree / LAYERNORM}:63"
    assert out[CAPTURE]["where"] == f"{tree / WORKER}:1"


@pytest.mark.parametrize("diff", sorted(DIFFS))
def test_each_diff_applies_and_is_recognised_as_fixed_upstream(diff: str, tmp_path: Path) -> None:
    tree = copy_tree(tmp_path / "tree")
    apply_diff(tree, PATCHES / diff)
    expected = {rid: "fixed-upstream" if rid in DIFFS[diff] else "will-apply" for rid in ALL}
    assert statuses(predict_on(tree)) == expected


def test_all_diffs_together_fix_everything(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path / "tree")
    for diff in sorted(DIFFS):
        apply_diff(tree, PATCHES / diff)
    assert statuses(predict_on(tree)) == dict.fromkeys(ALL, "fixed-upstream")


def test_every_diff_has_a_readme() -> None:
    assert sorted(p.name for p in PATCHES.glob("*.diff")) == sorted(DIFFS)
    for diff in DIFFS:
        note = PATCHES / diff.replace(".diff", ".md")
        assert note.is_file(), f"{diff} has no note {note.name}"
        text = note.read_text(encoding="utf-8")
        for word in ("Why", "Upstream", "Remove when", "Recognised by"):
            assert f"**{word}**" in text, f"{note.name} lacks {word}"
        for rid in DIFFS[diff]:
            assert rid in text, f"{note.name} does not name {rid}"


@pytest.mark.parametrize(("refused", "rel", "old", "new"), [m[1:] for m in MUTATIONS], ids=[m[0] for m in MUTATIONS])
def test_mutated_code_is_refused(refused: set[str], rel: str, old: str, new: str, tmp_path: Path) -> None:
    tree = copy_tree(tmp_path / "tree")
    mutate(tree, rel, old, new)
    out = predict_on(tree)
    assert statuses(out) == {rid: "refused" if rid in refused else "will-apply" for rid in ALL}
    for rid in refused:
        detail = out[rid]["detail"]
        assert f"refused patch '{rid}'" in detail and "vllm-ascend 0.23.0" in detail, detail
        assert str(tree / rel) in detail or str(tree) in out[rid]["where"], detail
        assert ("missing" in detail or "unexpected" in detail), detail


def test_stream_synchronisation_before_unmap_counts_as_fixed(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path / "tree")
    mutate(tree, CAMEM_PY, "        for ptr, data in self.pointer_to_data.items():",
           "        torch.npu.current_stream().synchronize()\n        for ptr, data in self.pointer_to_data.items():")
    assert statuses(predict_on(tree))[CAMEM] == "fixed-upstream"
