"""Startup is sacred: what the plugin adds to `import verl` is only its own code and its small dependencies."""

from __future__ import annotations

from subprocesses import last_json, run_python

SNAPSHOT = "import json, sys, verl\nprint(json.dumps(sorted(sys.modules)))"
ALLOWED_PREFIXES = ("verl_ascend_ext", "pluggy", "wrapt", "packaging")
FORBIDDEN = ("vllm", "vllm_ascend", "torch_npu", "megatron", "ray", "transformers")


def top(name: str) -> str:
    return name.split(".", 1)[0]


def test_modules_added_by_the_plugin_are_only_its_own_and_small_deps() -> None:
    with_plugin = set(last_json(run_python(SNAPSHOT).stdout))
    without = set(last_json(run_python(SNAPSHOT, {"VERL_USE_EXTERNAL_PLUGINS": "none"}).stdout))
    added = with_plugin - without
    assert "verl_ascend_ext.runtime.boot" in added
    foreign = sorted(m for m in added if top(m) not in ALLOWED_PREFIXES)
    # stdlib modules pulled in by pluggy/wrapt/importlib.metadata are fine; packages of the stack are not
    assert not [m for m in foreign if top(m) in FORBIDDEN or top(m) == "verl" or top(m) == "torch"], foreign


def test_plugin_imports_none_of_the_heavy_stacks_by_itself() -> None:
    code = """
    import json, sys
    import verl_ascend_ext
    verl_ascend_ext.activate()
    print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))
    """
    loaded = set(last_json(run_python(code).stdout))
    assert not loaded & {*FORBIDDEN, "torch", "verl"}, loaded & {*FORBIDDEN, "torch", "verl"}
