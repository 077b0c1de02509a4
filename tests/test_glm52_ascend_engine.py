"""The engine on the shapes the vLLM-Ascend records need, on plain Python modules written to a temp dir.

Real: the engine (apply / unpatch / lazy post-import hooks / predict / doctor), our replacements,
fresh interpreters. The modules are small stand-ins with the same shapes as vLLM-Ascend's (a
staticmethod on a base class with an overriding and an inheriting subclass; a package whose
``__init__`` skips an import), because vLLM-Ascend itself cannot be imported without an NPU.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from glm52_ascend_fixtures import GATE, released_sources
from subprocesses import last_json, run_python

DEVICE_OP = '''
class Base:
    @staticmethod
    def indexer_select_post_process(sfa_impl, q_li: object, q_li_scale: object, q_li_shape_ori: object,
                                    weights: object, kv_cache: tuple) -> object:
        return KERNEL(weights=weights)

class A5(Base):
    @staticmethod
    def indexer_select_post_process(sfa_impl, q_li: object, q_li_scale: object, q_li_shape_ori: object,
                                    weights: object, kv_cache: tuple) -> object:
        return KERNEL(weights=weights)

class P310(Base):
    pass

def KERNEL(weights):
    return weights
'''

STATICMETHOD = """
import json, types
import fake_device_op as m
from verl_ascend_ext.patching.replacement import MARKER
from verl_ascend_ext.features.glm52.ascend.declaration import INDEXER_BASE
from verl_ascend_ext.patching import Fingerprint, apply, unpatch
record = INDEXER_BASE._replace(target="fake_device_op:Base.indexer_select_post_process",
    original=INDEXER_BASE.original._replace(also=()), fixed=Fingerprint(contains=("never",)))
sfa = types.SimpleNamespace(n_head=4, head_dim=16)  # scale = 1/2 * 1/4 = 1/8
out = {"status": apply(record).status.value, "again": apply(record).status.value,
       "raw_is_wrapper": type(vars(m.Base)["indexer_select_post_process"]) is staticmethod
                         and getattr(vars(m.Base)["indexer_select_post_process"].__func__, MARKER) == record.id,
       "base": m.Base.indexer_select_post_process(sfa, 0, 0, 0, 8.0, ()),
       "instance": m.Base().indexer_select_post_process(sfa, 0, 0, 0, 8.0, ()),
       "keyword": m.Base.indexer_select_post_process(sfa, 0, 0, 0, weights=8.0, kv_cache=()),
       "inherited_310p": m.P310.indexer_select_post_process(sfa, 0, 0, 0, 8.0, ()),
       "a5_not_this_record": m.A5.indexer_select_post_process(sfa, 0, 0, 0, 8.0, ())}
# ours first: verl's in-tree copy reads its marker through the class (as `DeviceOperator` aliases it) and stands down
out["marker_seen_by_verl"] = [getattr(c.indexer_select_post_process, "_verl_vllm_ascend_glm52_patched", False)
                              for c in (m.Base, m.P310)]
out["unpatched"] = unpatch(record.id)
out["original_untouched"] = not hasattr(m.Base.indexer_select_post_process, "_verl_vllm_ascend_glm52_patched")
out["restored_staticmethod"] = type(vars(m.Base)["indexer_select_post_process"]).__name__
out["after_unpatch"] = m.Base.indexer_select_post_process(sfa, 0, 0, 0, 8.0, ())
# verl 0.9.1's in-tree copy first: staticmethod(patched) with its marker on the function -> we stand down
original = vars(m.Base)["indexer_select_post_process"].__func__
def verl_patched(sfa_impl, q_li, q_li_scale, q_li_shape_ori, weights, *args, **kwargs):
    weights = weights * (sfa_impl.n_head ** -0.5) * (sfa_impl.head_dim ** -0.5)
    return original(sfa_impl, q_li, q_li_scale, q_li_shape_ori, weights, *args, **kwargs)
verl_patched._verl_vllm_ascend_glm52_patched = True
m.Base.indexer_select_post_process = staticmethod(verl_patched)
out["verl_first_status"] = apply(record).status.value
out["verl_first"] = m.Base.indexer_select_post_process(sfa, 0, 0, 0, 8.0, ())
print(json.dumps(out))
"""


def test_staticmethod_wrapped_on_its_class_scaled_once_and_restored(tmp_path: Path) -> None:
    (tmp_path / "fake_device_op.py").write_text(DEVICE_OP)
    out = last_json(run_python(STATICMETHOD, pythonpath=str(tmp_path)).stdout)
    assert out == {"status": "applied", "again": "applied", "raw_is_wrapper": True, "base": 1.0, "instance": 1.0,
                   "keyword": 1.0, "inherited_310p": 1.0, "a5_not_this_record": 8.0,
                   "marker_seen_by_verl": [True, True], "unpatched": True,
                   "original_untouched": True,
                   "restored_staticmethod": "staticmethod", "after_unpatch": 8.0,
                   "verl_first_status": "already-applied", "verl_first": 1.0}


WORKER_INIT = '''
def vllm_version_is(version):
    return version == "0.23.0"

if vllm_version_is("0.23.0"):
    _V2_MODEL_RUNNER_SUPPORTED = False
else:
    _V2_MODEL_RUNNER_SUPPORTED = True

if _V2_MODEL_RUNNER_SUPPORTED:
    import vllm_ascend.patch.worker.patch_routed_experts_capture  # noqa
'''

IMPORT_ACTION = """
import json, sys
from verl_ascend_ext.features.glm52.ascend.declaration import ROUTED_EXPERTS
from verl_ascend_ext.patching import apply, predict
from verl_ascend_ext.patching.lazy import install
record = ROUTED_EXPERTS._replace(target="fakeworker:<module>", wrapper="fakeworker.capture",
                             distribution="pluggy")  # any installed distribution: predict needs one
out = {"predicted": predict(record, frozenset(), {"VERL_VLLM_ASCEND_GLM52_PATCH": "1"}).status.value}
if PRELOAD:
    import fakeworker.capture
reports = []
install([record], lambda module, results: reports.append([module, [r.status.value for r in results]]))
out["before_import"] = "fakeworker.capture" in sys.modules
import fakeworker
out["reports"] = reports
out["capture_loaded"] = sys.modules.get("fakeworker.capture") is not None and fakeworker.capture.LOADED
out["again"] = apply(record).status.value
print(json.dumps(out))
"""


def test_import_action_loads_the_skipped_module_once(tmp_path: Path) -> None:
    pkg = tmp_path / "fakeworker"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(WORKER_INIT)
    (pkg / "capture.py").write_text("LOADED = True\n")
    for preload, status in ((False, "applied"), (True, "already-applied")):
        out = last_json(run_python(IMPORT_ACTION.replace("PRELOAD", str(preload)), pythonpath=str(tmp_path)).stdout)
        assert out == {"predicted": "will-apply", "before_import": preload,
                       "reports": [["fakeworker", [status]]], "capture_loaded": True, "again": status}


DOCTOR = """
import json
from verl_ascend_ext.tooling.doctor import build_report
report, _ = build_report()
print(json.dumps({p["id"]: p["status"] for p in report["patches"] if p["id"].startswith("glm52-ascend-")}))
"""


def test_doctor_lists_every_item_with_its_predicted_status() -> None:
    tree = str(released_sources())
    ids = ["glm52-ascend-rmsnorm-add-then-norm", "glm52-ascend-sfa-keep-kv-b-proj", "glm52-ascend-indexer-scale-base",
           "glm52-ascend-indexer-scale-a5", "glm52-ascend-indexer-scale-cp", "glm52-ascend-camem-sync-before-sleep",
           "glm52-ascend-routed-experts-capture"]
    cases = [({GATE: "1"}, tree, "will-apply"), ({}, tree, "gate-off"), ({GATE: "1"}, None, "not-installed"),
             ({GATE: "1", "VERL_ASCEND_EXT_DISABLE": ids[2]}, tree, None)]
    for env, path, status in cases:
        out = last_json(run_python(DOCTOR, env, pythonpath=path).stdout)
        expected = dict.fromkeys(ids, status) if status else {**dict.fromkeys(ids, "will-apply"), ids[2]: "disabled"}
        assert out == expected, (env, path, json.dumps(out))


def test_feature_module_imports_nothing_heavy() -> None:
    code = textwrap.dedent("""
        import json, sys
        import verl_ascend_ext.features.glm52.ascend.declaration
        heavy = [m for m in ("torch", "vllm", "vllm_ascend", "torch_npu", "verl", "ray", "transformers", "megatron")
                 if m in sys.modules]
        print(json.dumps(heavy))
    """)
    assert last_json(run_python(code).stdout) == []


@pytest.mark.verl091
def test_doctor_predicts_already_applied_where_verl_091_carries_the_fix() -> None:
    out = last_json(run_python(DOCTOR, {GATE: "1"}, pythonpath=str(released_sources())).stdout)
    assert out.pop("glm52-ascend-indexer-scale-cp") == "will-apply"  # verl's copy does not cover the CP path
    assert set(out.values()) == {"already-applied"}, out
    out = last_json(run_python(DOCTOR, {GATE: "on"}, pythonpath=str(released_sources())).stdout)
    assert set(out.values()) == {"will-apply"}, out  # verl reads only 1/true/yes: its copy stays off
