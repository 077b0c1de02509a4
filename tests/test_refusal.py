"""Fail closed: how a refusal behaves in a real process (stops verl's discovery, logged when swallowed, no parse).

A copy of the installed verl is placed first on PYTHONPATH with one target's source mutated; the
distribution metadata (version 0.9.0) still comes from the real install, as it would for a user who
edited their verl in place. That every record refuses a copy with any one fingerprint pattern broken, in-process
and in doctor with the same message, is tests/test_contract.py.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

from subprocesses import last_json, run_python

LOSSES = "trainer/distillation/losses.py"
# The refusal of every record on a copy of the real source with one fingerprint pattern broken, in-process and by
# doctor with the same message, is tests/test_contract.py (generated per pattern). Here: how a refusal behaves.
PID = "distill-fsdp2-topk"
NO_RAISE = ('raise NotImplementedError(f"Unsupported strategy: {config.strategy=}")', "distillation_loss_fn = None")


def mutated_verl(tmp_path: Path, path: str, old: str, new: str) -> Path:
    installed = Path(importlib.util.find_spec("verl").origin).parent
    root = tmp_path / "shadow"
    shutil.copytree(installed, root / "verl", ignore=shutil.ignore_patterns("__pycache__"))
    target = root / "verl" / path
    text = target.read_text()
    assert old in text, f"mutation anchor not found in {target}: {old!r}"
    target.write_text(text.replace(old, new, 1))
    return root


DOCTOR = """
import json
from verl_ascend_ext.tooling.doctor import build_report
report, code = build_report()
print(json.dumps({"code": code, "patches": {p["id"]: p for p in report["patches"]}}))
"""


def test_refusal_at_discovery_stops_the_process(tmp_path: Path) -> None:
    """A target already imported when verl loads the plugin must not be swallowed by verl's DEBUG-level catch."""
    pid = PID
    shadow = mutated_verl(tmp_path, LOSSES, *NO_RAISE)
    # verl imports its plugins at the end of verl/__init__; make the target importable before that point
    init = shadow / "verl" / "__init__.py"
    text = init.read_text()
    anchor = "_plugins_policy = "
    init.write_text(text.replace(anchor, "import verl.trainer.distillation.losses  # noqa\n" + anchor, 1))
    status_dir = tmp_path / "status"
    proc = run_python("import verl\nprint('survived')", {"VERL_ASCEND_EXT_STATUS_DIR": str(status_dir)},
                      pythonpath=str(shadow), check=False)
    assert proc.returncode != 0
    assert "survived" not in proc.stdout
    assert f"refused patch '{pid}'" in proc.stderr
    (record,) = [json.loads(f.read_text()) for f in status_dir.rglob("*.json")]  # recorded under the record's id
    (error,) = record["errors"]
    assert (error["by"], error["type"]) == (pid, "PatchRefusedError"), error
    assert "/verl_ascend_ext/patching/engine.py:" in error["where"], error  # where the engine raised it


def test_unparsable_target_file_is_predicted_refused_not_a_crash(tmp_path: Path) -> None:
    shadow = mutated_verl(tmp_path, LOSSES, "def compute_topk_loss(", "def broken(:\n\ndef compute_topk_loss(")
    predicted = last_json(run_python(DOCTOR, pythonpath=str(shadow)).stdout)
    assert predicted["code"] == 1
    detail = predicted["patches"]["distill-fsdp2-topk"]["detail"]
    assert predicted["patches"]["distill-fsdp2-topk"]["status"] == "refused"
    assert "does not parse" in detail and str(shadow / "verl" / LOSSES) in detail


def test_refusal_is_logged_even_when_the_importer_swallows_it(tmp_path: Path) -> None:
    """Some importers catch exceptions (verl wraps optional imports in try/except); the refusal must still show."""
    pid = PID
    shadow = mutated_verl(tmp_path, LOSSES, *NO_RAISE)
    code = """
    import verl
    try:
        import verl.trainer.distillation.losses
    except Exception as err:  # what a swallowing importer does
        print("swallowed", type(err).__name__)
    """
    status_dir = tmp_path / "status"
    proc = run_python(code, {"VERL_ASCEND_EXT_STATUS_DIR": str(status_dir)}, pythonpath=str(shadow))
    assert "swallowed PatchRefusedError" in proc.stdout
    assert "ERROR" in proc.stderr and f"refused patch '{pid}'" in proc.stderr
    (record,) = [json.loads(f.read_text()) for f in status_dir.rglob("*.json")]  # the refusal, recorded when raised
    (error,) = record["errors"]
    assert (error["by"], error["type"]) == (pid, "PatchRefusedError") and f"refused patch '{pid}'" in error["message"]
    assert "/verl_ascend_ext/patching/engine.py:" in error["where"], error
