"""Graph mode: every GLM-5.2 patch that runs inside the model forward holds under torch.compile(fullgraph=True).

Scenario tests/scenarios/glm52_ascend_compiled.py (fresh interpreter): vLLM-Ascend 0.23.0's released method
bodies and callers, patched by the engine's ``apply`` with the real records, called as vLLM calls them
(CustomOp ``_forward_method`` bound at construction, and directly), eagerly and compiled with the ``eager``
and ``inductor`` backends on CPU; NPU kernels from the test double (custom ops with fake implementations).
The guard tests show the engine refusing a replacement dynamo would bypass.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from glm52_ascend_fixtures import copy_tree, main_layernorm, released_sources
from repo import REPO
from subprocesses import last_json, run_command, run_python

pytestmark = pytest.mark.long_module  # its fixture compiles the traced replacements (~30 s)
SCENARIO = REPO / "tests" / "scenarios" / "glm52_ascend_compiled.py"
TRACED = {"glm52-ascend-rmsnorm-add-then-norm", "glm52-ascend-indexer-scale-base", "glm52-ascend-indexer-scale-a5",
          "glm52-ascend-indexer-scale-cp", "glm52-ascend-rmsnorm-add-then-norm-main"}
BACKENDS = ("eager", "inductor")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tree = released_sources()
    work = tmp_path_factory.mktemp("compiled")
    main = main_layernorm(copy_tree(work / "main-tree"))  # vLLM-Ascend main's layernorm.py, checked byte for byte
    proc = run_command([sys.executable, str(SCENARIO), str(tree), str(work), str(main)],
                       {"TORCHINDUCTOR_CACHE_DIR": str(work / "inductor")}, check=False, timeout=1200,
                       pythonpath=str(tree))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return last_json(proc.stdout)


def test_engine_applies_plain_functions_once_and_restores(compiled: dict) -> None:
    assert compiled["statuses"] == dict.fromkeys(TRACED, "applied")
    # a second apply finds our own replacement (on the function, also behind a staticmethod): no second layer
    assert compiled["applied_twice"] == dict.fromkeys(TRACED, "applied")
    assert compiled["plain_functions"] == {"rmsnorm": True, "base": True}
    # verl 0.9.1's in-tree copy reads its marker on what it would replace: ours carries it, the original does not
    assert compiled["verl_marker_seen"] == {"rmsnorm": True, "310p_through_base": True, "original_untouched": True}
    assert compiled["unpatched"] == dict.fromkeys(TRACED, True) and compiled["restored"] is True


SHAPES = ("rmsnorm", "rmsnorm_main")  # vLLM-Ascend 0.23's forward_oot, and main's (the record's variant)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bias", ["no_bias", "bias"])
@pytest.mark.parametrize("how", ["module", "direct"])
def test_rmsnorm_with_residual_carries_the_fix_when_compiled(compiled: dict, shape: str, backend: str, bias: str,
                                                             how: str) -> None:
    case = compiled[shape][f"{bias}/residual/{how}"][backend]
    assert case == {"compiled_equals_eager": True, "fix_visible_eagerly": True, "same_changes_as_eager": True}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bias", ["no_bias", "bias"])
@pytest.mark.parametrize("how", ["module", "direct"])
def test_rmsnorm_without_residual_is_the_original_when_compiled(compiled: dict, shape: str, backend: str, bias: str,
                                                                how: str) -> None:
    case = compiled[shape][f"{bias}/no_residual/{how}"][backend]
    assert case == {"compiled_equals_eager": True, "fix_visible_eagerly": False, "same_changes_as_eager": True}


def test_main_rmsnorm_gets_the_replacement_without_maybe_chunk_residual(compiled: dict) -> None:
    main = compiled["details"]["glm52-ascend-rmsnorm-add-then-norm-main"]
    assert "without torch.ops.vllm.maybe_chunk_residual" in main
    assert "maybe_chunk_residual" not in compiled["details"]["glm52-ascend-rmsnorm-add-then-norm"].split(":", 1)[0]
    assert compiled["chunk_calls"]["0.23"] > 0 and compiled["chunk_calls"]["main"] == 0  # main has no such op


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", ["base", "a5", "310p", "cp"])
def test_indexer_weights_reach_the_kernel_scaled_once_when_compiled(compiled: dict, backend: str, path: str) -> None:
    case = compiled["indexer"][f"indexer/{path}"]
    assert case["eager_equals_upstream_fix"] is True  # bitwise vLLM-Ascend's own fix (patches/.../0003)
    assert case[backend] == {"compiled_equals_eager": True, "fix_visible_eagerly": True, "same_changes_as_eager": True}


def test_the_check_sees_a_proxy_drop_the_fix(compiled: dict) -> None:
    """The same comparison on a wrapt proxy (what the engine installed before): the fix runs eagerly only."""
    proxy = compiled["proxy"]
    assert proxy["eager_fix_visible"] is True
    compiled_run = proxy["compiled"]
    assert "error" in compiled_run or compiled_run["compiled_equals_eager"] is False, proxy


GUARD = """
import json
import fake_target as m
from verl_ascend_ext.features.glm52.ascend.declaration import RMSNORM
from verl_ascend_ext.patching import Fingerprint
from verl_ascend_ext.patching import engine
from verl_ascend_ext.patching.errors import PatchRefusedError
out = {}
for name, impl, traced in (("plain", "fake_impl:plus_1000", True), ("proxy", "fake_impl:proxied", True),
                           ("contextvar", "fake_impl:reads_contextvar", True),
                           ("contextvar_eager", "fake_impl:reads_contextvar", False),
                           ("frame", "fake_impl:reads_frame", True),
                           ("helper_contextvar", "fake_impl:calls_helper", True)):
    record = RMSNORM._replace(id=f"fake-{name}", target="fake_target:Layer.forward", wrapper=impl, traced=traced,
                              original=Fingerprint(contains=(r"return x \\* 2",)),
                              fixed=Fingerprint(contains=("never",)), foreign_markers=(), exposes_markers=())
    original = vars(m.Layer)["forward"]
    try:
        status = engine.apply(record).status.value
        out[name] = {"status": status, "result": m.Layer().forward(1)}
        engine.unpatch(record.id)
    except PatchRefusedError as err:
        out[name] = {"refused": str(err), "untouched": vars(m.Layer)["forward"] is original,
                     "status": engine.statuses()[record.id].status.value}
print(json.dumps(out))
"""

IMPL = '''
import contextvars, sys
import wrapt

_flag = contextvars.ContextVar("flag", default=False)


def plus_1000(original, self, x):
    return original(self, x) + 1000


@wrapt.decorator
def _passthrough(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)


proxied = _passthrough(plus_1000)


def reads_contextvar(original, self, x):
    return original(self, x) + (1000 if not _flag.get() else 0)


def reads_frame(original, self, x):
    return original(self, x) + (1000 if sys._getframe(1) else 0)


def _helper():
    return _flag.get()


def calls_helper(original, self, x):
    return original(self, x) + (0 if _helper() else 1000)
'''


def test_engine_refuses_replacements_dynamo_would_bypass(tmp_path: Path) -> None:
    (tmp_path / "fake_impl.py").write_text(IMPL)
    (tmp_path / "fake_target.py").write_text("class Layer:\n    def forward(self, x):\n        return x * 2\n")
    out = last_json(run_python(GUARD, pythonpath=str(tmp_path)).stdout)
    assert out["plain"] == {"status": "applied", "result": 1002}
    assert out["contextvar_eager"] == {"status": "applied", "result": 1002}  # eager-only targets may read context
    for name, words in (("proxy", "not a plain function"), ("contextvar", "reads the ContextVar _flag"),
                        ("frame", "reads the call stack"), ("helper_contextvar", "reads the ContextVar _flag")):
        case = out[name]
        assert case["untouched"] is True and case["status"] == "refused", (name, case)
        assert f"refused patch 'fake-{name}'" in case["refused"] and words in case["refused"], (name, case)
        assert "VERL_ASCEND_EXT_DISABLE=fake-" in case["refused"], case


def test_every_record_states_where_it_runs() -> None:
    code = """
    import json
    from verl_ascend_ext.runtime.registry import registry
    print(json.dumps({r.id: r.traced for r in registry().records}))
    """
    out = last_json(run_python(code).stdout)
    assert {rid for rid, traced in out.items() if traced} == TRACED - {"glm52-ascend-rmsnorm-add-then-norm-main"}
    assert all(isinstance(v, bool) for v in out.values())
