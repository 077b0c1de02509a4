"""Fail closed: a target whose source changed is refused, in-process and in doctor's prediction, with one message.

A copy of the installed verl is placed first on PYTHONPATH with one target's source mutated; the
distribution metadata (version 0.9.0) still comes from the real install, as it would for a user who
edited their verl in place.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
from subprocesses import last_json, run_python

LOSSES = "trainer/distillation/losses.py"
PADDING = "trainer/ppo/padding_utils.py"

MUTATIONS = {
    "topk-no-raise": ("distill-fsdp2-topk", LOSSES,
                      'raise NotImplementedError(f"Unsupported strategy: {config.strategy=}")',
                      "distillation_loss_fn = None"),
    "topk-fsdp-elsewhere": ("distill-fsdp2-topk", LOSSES,
                            "import verl.trainer.distillation.fsdp.losses as fsdp_losses",
                            "import verl.trainer.distillation.megatron.losses as fsdp_losses"),
    "topk-renamed": ("distill-fsdp2-topk", LOSSES, "def compute_topk_loss(", "def compute_topk_loss_v2("),
    "padding-swapped-return": ("padding-teacher-fields", PADDING,
                               "    return template_sample, template_tag\n",
                               "    return template_tag, template_sample\n"),
    "padding-partial-teacher": ("padding-teacher-fields", PADDING,
                                "    # Update the fields and remove redundant parts\n",
                                "    template_sample.pop('teacher_ids', None)\n"),
}


def mutated_verl(tmp_path: Path, path: str, old: str, new: str) -> Path:
    installed = Path(importlib.util.find_spec("verl").origin).parent
    root = tmp_path / "shadow"
    shutil.copytree(installed, root / "verl", ignore=shutil.ignore_patterns("__pycache__"))
    target = root / "verl" / path
    text = target.read_text()
    assert old in text, f"mutation anchor not found in {target}: {old!r}"
    target.write_text(text.replace(old, new, 1))
    return root


IN_PROCESS = """
import json, verl_ascend_ext
from verl_ascend_ext.patching import PatchRefusedError
import verl
try:
    import {module}
    print(json.dumps({{"raised": None}}))
except PatchRefusedError as err:
    print(json.dumps({{"raised": str(err), "status": verl_ascend_ext.patch_statuses()["{pid}"].status.value}}))
"""

DOCTOR = """
import json
from verl_ascend_ext.tooling.doctor import build_report
report, code = build_report()
print(json.dumps({"code": code, "patches": {p["id"]: p for p in report["patches"]}}))
"""


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_mutated_target_refused_in_process_and_by_doctor_alike(tmp_path: Path, name: str) -> None:
    pid, path, old, new = MUTATIONS[name]
    shadow = mutated_verl(tmp_path, path, old, new)
    module = "verl." + path[:-3].replace("/", ".")
    live = last_json(run_python(IN_PROCESS.format(module=module, pid=pid), pythonpath=str(shadow)).stdout)
    predicted = last_json(run_python(DOCTOR, pythonpath=str(shadow)).stdout)

    message = live["raised"]
    assert message is not None, "the mutated target was patched instead of refused"
    assert live["status"] == "refused"
    target_file = shadow / "verl" / path
    for needle in (f"'{pid}'", "verl 0.9.0", ">=0.9.0,<0.10", str(target_file), "VERL_ASCEND_EXT_DISABLE"):
        assert needle in message, (needle, message)
    if name != "topk-renamed":
        assert f"{target_file}:" in message  # file:line of the definition
    assert predicted["code"] == 1
    assert predicted["patches"][pid]["status"] == "refused"
    assert predicted["patches"][pid]["detail"] == message


def test_refusal_at_discovery_stops_the_process(tmp_path: Path) -> None:
    """A target already imported when verl loads the plugin must not be swallowed by verl's DEBUG-level catch."""
    pid, path, old, new = MUTATIONS["topk-no-raise"]
    shadow = mutated_verl(tmp_path, path, old, new)
    # verl imports its plugins at the end of verl/__init__; make the target importable before that point
    init = shadow / "verl" / "__init__.py"
    text = init.read_text()
    anchor = "_plugins_policy = "
    init.write_text(text.replace(anchor, "import verl.trainer.distillation.losses  # noqa\n" + anchor, 1))
    proc = run_python("import verl\nprint('survived')", pythonpath=str(shadow), check=False)
    assert proc.returncode != 0
    assert "survived" not in proc.stdout
    assert f"refused patch '{pid}'" in proc.stderr


def test_unparsable_target_file_is_predicted_refused_not_a_crash(tmp_path: Path) -> None:
    shadow = mutated_verl(tmp_path, LOSSES, "def compute_topk_loss(", "def broken(:\n\ndef compute_topk_loss(")
    predicted = last_json(run_python(DOCTOR, pythonpath=str(shadow)).stdout)
    assert predicted["code"] == 1
    detail = predicted["patches"]["distill-fsdp2-topk"]["detail"]
    assert predicted["patches"]["distill-fsdp2-topk"]["status"] == "refused"
    assert "does not parse" in detail and str(shadow / "verl" / LOSSES) in detail


def test_refusal_is_logged_even_when_the_importer_swallows_it(tmp_path: Path) -> None:
    """Some importers catch exceptions (verl wraps optional imports in try/except); the refusal must still show."""
    pid, path, old, new = MUTATIONS["topk-no-raise"]
    shadow = mutated_verl(tmp_path, path, old, new)
    code = """
    import verl
    try:
        import verl.trainer.distillation.losses
    except Exception as err:  # what a swallowing importer does
        print("swallowed", type(err).__name__)
    """
    proc = run_python(code, pythonpath=str(shadow))
    assert "swallowed PatchRefusedError" in proc.stdout
    assert "ERROR" in proc.stderr and f"refused patch '{pid}'" in proc.stderr
