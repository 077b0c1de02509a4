"""The GLM-5.2 vLLM-Ascend records on the shapes later vLLM-Ascend tags have (table in docs/glm52.md).

The tags themselves are not fixtures (CI reaches only package registries, whose newest vLLM-Ascend is
0.23.0.post1; scripts/survey_vllm_ascend_tags.py regenerates the table from a git checkout). These tests
rebuild each shape from the released 0.23.0 sources (scripts/fetch_vllm_ascend.sh) with the same edit the
tag made, and predict with ``vet`` (doctor's code) on the tree:
- v0.24.0rc1 skips the routed-experts capture on vLLM 0.24.0 instead of 0.23.0: refused, saying so;
- v0.25.1rc1+ replaced AscendSFACPImpl by CP classes that inherit AscendSFAImpl's indexer (the class
  bodies below are written for the test, in that shape): the CP record reports ``covered`` by the base and A5
  device-operator records (upstream did not fix it; they do), ``disabled`` when one of them is switched off;
- main after #13946 dropped maybe_chunk_residual, which the 0.23 RMSNorm replacement calls: main's own
  layernorm.py, rebuilt byte for byte from the released file (its git blob id is checked,
  ``glm52_ascend_fixtures.main_layernorm``), is recognised by the record's variant and gets the replacement
  without that op (applied and compiled in tests/test_glm52_graph_mode.py).
The engine part (a fixed or covered shape recognising a removed target in-process) runs on a plain module.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from glm52_ascend_fixtures import copy_tree, main_layernorm, mutate
from subprocesses import last_json, run_python

from verl_ascend_ext.tooling.vet import vet

CP = "glm52-ascend-indexer-scale-cp"
WORKER = "vllm_ascend/patch/worker/__init__.py"
SFA_CP = "vllm_ascend/attention/context_parallel/sfa_cp.py"
COMMON_CP = "vllm_ascend/attention/context_parallel/common_cp.py"

# The v0.25.1rc1 shape of the CP module: DCP impl = mixin + AscendSFAImpl, no indexer of its own.
DCP_MODULE = '''
from vllm_ascend.attention.context_parallel.common_cp import DCPImplMixin
from vllm_ascend.attention.sfa_v1 import AscendSFAImpl


class AscendSFADCPImpl(DCPImplMixin, AscendSFAImpl):
    def _execute_sparse_flash_attention_process(self, q, kv):
        return q
'''
MIXIN = '''
class DCPImplMixin:
    def _all_gather_dim_async(self, x, dim):
        return x
'''


def statuses(tree: Path) -> dict[str, dict]:
    report, _ = vet([str(tree)])
    return {p["id"]: p for p in report["patches"] if p["id"].startswith("glm52-ascend-")}


def test_capture_skipped_on_a_later_vllm_is_refused_saying_what_changed(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path / "tree")
    mutate(tree, WORKER, 'if vllm_version_is("0.23.0"):\n    _V2_MODEL_RUNNER_SUPPORTED = False\n'
           "else:\n    _V2_MODEL_RUNNER_SUPPORTED = True\n",
           '_V2_MODEL_RUNNER_SUPPORTED = not vllm_version_is("0.24.0")\n')
    got = statuses(tree)["glm52-ascend-routed-experts-capture"]
    assert got["status"] == "refused"
    assert "what changed: the capture is now skipped on the later vLLM this vLLM-Ascend pairs with" in got["detail"]


def test_capture_skipped_on_0_23_is_not_called_a_change(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path / "tree")
    mutate(tree, WORKER, 'if vllm_version_is("0.23.0"):\n    _V2_MODEL_RUNNER_SUPPORTED = False\n'
           "else:\n    _V2_MODEL_RUNNER_SUPPORTED = True\n",
           '_V2_MODEL_RUNNER_SUPPORTED = not vllm_version_is("0.23.0")\n')
    got = statuses(tree)["glm52-ascend-routed-experts-capture"]
    assert got["status"] == "refused" and "what changed" not in got["detail"]


def test_rmsnorm_of_vllm_ascend_main_is_recognised_by_the_variant(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path / "tree")
    main_layernorm(tree)
    got = statuses(tree)
    assert got["glm52-ascend-rmsnorm-add-then-norm"]["status"] == "will-apply", got
    assert "without torch.ops.vllm.maybe_chunk_residual" in got["glm52-ascend-rmsnorm-add-then-norm"]["detail"]
    assert "refused" not in {p["status"] for p in got.values()}


def test_rmsnorm_with_neither_shape_is_refused_naming_both(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path / "tree")
    main_layernorm(tree)
    mutate(tree, "vllm_ascend/ops/layernorm.py", "            return x, residual\n", "            return x\n")
    got = statuses(tree)["glm52-ascend-rmsnorm-add-then-norm"]
    assert got["status"] == "refused"
    assert "original fingerprint: missing" in got["detail"] and "variant 1 fingerprint: missing" in got["detail"]


def test_cp_classes_inheriting_the_sfa_indexer_are_covered_by_the_device_operator_records(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path / "tree")
    (tree / SFA_CP).write_text(DCP_MODULE)
    (tree / COMMON_CP).write_text(MIXIN)
    got = statuses(tree)
    assert got[CP]["status"] == "covered", got[CP]
    assert got[CP]["detail"].startswith("covered by glm52-ascend-indexer-scale-base (will-apply), "
                                        "glm52-ascend-indexer-scale-a5 (will-apply): no CP bypass any more")
    assert got["glm52-ascend-indexer-scale-base"]["status"] == "will-apply"  # the path CP now takes is patched


def test_cp_is_not_covered_when_a_covering_record_is_off(tmp_path: Path) -> None:
    from verl_ascend_ext.features.glm52.ascend.declaration import INDEXER_A5, INDEXER_CP
    from verl_ascend_ext.patching import engine
    from verl_ascend_ext.patching.source import Lookup, looking_in

    tree = copy_tree(tmp_path / "tree")
    (tree / SFA_CP).write_text(DCP_MODULE)
    (tree / COMMON_CP).write_text(MIXIN)
    with looking_in(Lookup((tree,), {"vllm-ascend": "0.25.1rc1"})):
        got = engine.predict(INDEXER_CP, frozenset({INDEXER_A5.id}), {"VERL_VLLM_ASCEND_GLM52_PATCH": "1"})
    assert got.status.value == "disabled", got
    assert "not covered: no CP bypass any more" in got.detail and f"{INDEXER_A5.id} (disabled) will not fix it" \
        in got.detail


@pytest.mark.parametrize(("label", "module", "mixin"), [
    ("DCP class with its own indexer", DCP_MODULE + "\n    def _execute_indexer_select(self, q, key, weights):\n"
     "        return weights\n", MIXIN),
    ("mixin with its own indexer", DCP_MODULE, MIXIN + "\n    def indexer_select_post_process(self, x):\n"
     "        return x\n"),
    ("old CP class still there", DCP_MODULE + "\n\nclass AscendSFACPImpl(AscendSFAImpl):\n    pass\n", MIXIN),
])
def test_cp_shapes_with_an_indexer_of_their_own_are_refused(label: str, module: str, mixin: str,
                                                            tmp_path: Path) -> None:
    tree = copy_tree(tmp_path / "tree")
    (tree / SFA_CP).write_text(module)
    (tree / COMMON_CP).write_text(mixin)
    assert statuses(tree)[CP]["status"] == "refused", label


GONE = '''
class Kept:
    def indexer(self, weights):
        return weights * 2
'''

APPLY_GONE = """
import json
import fake_gone
from verl_ascend_ext.patching import Fingerprint, PatchRefusedError, apply
from verl_ascend_ext.features.glm52.ascend.declaration import INDEXER_CP
fixed = Fingerprint(at="fake_gone:Kept.indexer", contains=(r"weights \\* 2",), description="scaled in Kept")
record = INDEXER_CP._replace(target="fake_gone:Removed.method", fixed=fixed, covered_shapes=(), covered_by=())
status = apply(record)
out = {"status": status.status.value, "detail": status.detail}
try:
    apply(record._replace(fixed=fixed._replace(contains=(r"weights \\* 3",))))
except PatchRefusedError as err:
    out["refused"] = str(err)
print(json.dumps(out))
"""


def test_apply_recognises_a_fix_that_removed_the_target(tmp_path: Path) -> None:
    (tmp_path / "fake_gone.py").write_text(GONE)
    out = last_json(run_python(APPLY_GONE, pythonpath=str(tmp_path)).stdout)
    assert out["status"] == "fixed-upstream" and out["detail"].endswith("scaled in Kept")
    assert "'Removed.method' is not defined there" in out["refused"]


APPLY_COVERED = """
import json
import fake_gone
from verl_ascend_ext.patching import Fingerprint, Status, apply
from verl_ascend_ext.patching.record import PatchStatus
from verl_ascend_ext.patching.status import record_status
from verl_ascend_ext.features.glm52.ascend.declaration import INDEXER_BASE, INDEXER_CP
shape = Fingerprint(at="fake_gone:Kept.indexer", contains=(r"weights \\* 2",), description="Kept has the indexer")
record = INDEXER_CP._replace(target="fake_gone:Removed.method", covered_shapes=(shape,), covered_by=(INDEXER_BASE,))
out = {}
for status in (Status.PENDING, Status.APPLIED, Status.DISABLED):
    record_status(PatchStatus(INDEXER_BASE.id, INDEXER_BASE.target, status, "set by the test"))
    got = apply(record)
    out[status.value] = [got.status.value, got.detail]
print(json.dumps(out))
"""


def test_apply_reports_covered_naming_the_covering_record_in_process(tmp_path: Path) -> None:
    (tmp_path / "fake_gone.py").write_text(GONE)
    out = last_json(run_python(APPLY_COVERED, pythonpath=str(tmp_path)).stdout)
    base = "glm52-ascend-indexer-scale-base"
    assert out["pending"] == ["covered", f"covered by {base} (pending): Kept has the indexer"]
    assert out["applied"] == ["covered", f"covered by {base} (applied): Kept has the indexer"]
    assert out["disabled"] == ["disabled", f"not covered: Kept has the indexer; but {base} (disabled) will not fix "
                                           "it there"]
