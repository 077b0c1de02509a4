"""A record carries everything its decision needs: a prediction made before the feature registry is built
is the same as one made after (no hidden global filled by the registry)."""

from __future__ import annotations

from subprocesses import last_json, run_python

PREDICT_ALL = """
import importlib.metadata, json, sys
from verl_ascend_ext.runtime.hookspecs import FEATURE_GROUP
from verl_ascend_ext.patching import engine

records = [r for ep in importlib.metadata.entry_points(group=FEATURE_GROUP)
           for r in ep.load().verl_ascend_ext_patch_records()]

def predict_all():
    return {r.id: engine.predict(r, frozenset(), {}).status.value for r in records}

before = predict_all()
registry_built_before = "verl_ascend_ext.runtime.registry" in sys.modules
from verl_ascend_ext.runtime.registry import registry
registry()
print(json.dumps({"before": before, "after": predict_all(), "registry_built_before": registry_built_before,
                  "defaults": {r.id: r.gate.default for r in records}}))
"""


def test_prediction_without_the_registry_equals_prediction_with_it() -> None:
    out = last_json(run_python(PREDICT_ALL).stdout)
    assert not out["registry_built_before"]
    assert out["before"] == out["after"]
    default_on = [pid for pid, on in out["defaults"].items() if on]
    assert default_on, "no default-on record to tell a missing default from a declared one"
    assert all(out["before"][pid] != "gate-off" for pid in default_on), out["before"]
    assert all(out["before"][pid] == "gate-off" for pid, on in out["defaults"].items() if not on)
