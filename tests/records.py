"""Process records for tests, built through the schema's one factory (``runtime.records.schema.new_record``), and
written where ``verl-ascend status`` reads them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from verl_ascend_ext.runtime.records.schema import new_patch, new_record

GATE = "VERL_ASCEND_EXT_DISTILLATION_FIXES"


def record(pid: int = 4242, host: str = "node-a", role: str = "ray-worker", **fields: Any) -> dict[str, Any]:
    """A schema-conforming record of a live process with two patches (``vllm-fix`` applied and imported, ``distill``
    pending), ``fields`` over it; ``alive`` is what a reader would have set."""
    defaults: dict[str, Any] = {
        "proc_start": 1, "started": 100.0, "updated": 100.0, "loaded_by": ["verl"], "namespace": "session_x",
        "versions": {"verl-ascend-ext": "0.1.0", "verl": "0.9.0"},
        "gates": {GATE: True, "VERL_VLLM_ASCEND_GLM52_PATCH": True},
        "plugin_env": {"VERL_USE_EXTERNAL_PLUGINS": None, "VLLM_PLUGINS": None},
        "patches": {"vllm-fix": new_patch(status="applied", target="vllm.v1.engine.core:X.f", imported=True),
                    "distill": new_patch(status="pending", target="verl.trainer.d:f")},
        "alive": True,
    }
    return new_record(host=host, pid=pid, role=role, **{**defaults, **fields})


def write_record(base: Path, rec: dict[str, Any], ns: str = "session_x") -> Path:
    """``rec`` as its process would have written it under ``base`` (namespace ``ns``), private as the store makes it."""
    (base / ns).mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(base, 0o700)
    path = base / ns / f"{rec['host']}-{rec['pid']}-{rec['proc_start']}.json"
    path.write_text(json.dumps({k: v for k, v in rec.items() if k not in ("alive", "file")}))
    return path
