"""Where the selftest runs and how each mode runs a function there: eager, compiled, captured as a device graph.

Devices: ``npu`` (torch_npu importable and an NPU visible), ``cuda`` (a CUDA GPU), ``cpu``; ``auto`` takes them in
that order. Modes:
- eager: the function called as is;
- compiled[B]: ``torch.compile(fn, fullgraph=True, dynamic=False, backend=B)``. On an NPU, B is what the GLM-5.2
  recipe's configuration compiles with (vLLM's VLLM_COMPILE with FULL_DECODE_ONLY: no graph splitting, the
  platform's compiler, vLLM-Ascend's AscendCompiler, with the platform's pass manager), built as vLLM's
  ``VllmBackend`` builds it (see ``ascend_backend``). Elsewhere (the test double): ``aot_eager`` (dynamo's full
  graph through AOT autograd with no code generation, which is what AscendCompiler does around its NPU graph
  passes) and ``inductor`` (``emulate_precision_casts`` on, so it keeps the roundings eager has);
- graph[B]: the compiled[B] function captured once as a device graph (``torch.cuda.CUDAGraph`` /
  ``torch.npu.NPUGraph``, on a side stream after a warm-up, as vLLM's CUDA-graph and vLLM-Ascend's ACL-graph
  wrappers capture) and replayed after new inputs are copied into its static input buffers; what is judged
  is the output of the replay on the new inputs, so a graph that froze its capture-time values fails.
  Not run on CPU (no device graphs there).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from verl_ascend_ext.tooling.selftest import DEVICES

EAGER, COMPILED, GRAPH = "eager", "compiled", "graph"


class DeviceUnavailable(RuntimeError):
    """The device asked for is not usable here (the message says why and what to pass instead)."""


@dataclass(frozen=True)
class Mode:
    kind: str  # eager | compiled | graph
    backend: str = ""  # name shown, e.g. "inductor", "AscendCompiler"

    @property
    def name(self) -> str:
        return self.kind if self.kind == EAGER else f"{self.kind}[{self.backend}]"


@dataclass
class Device:
    kind: str  # npu | cuda | cpu
    torch_device: torch.device
    description: str
    double: bool  # True: the NPU test double stands in for torch_npu and vLLM-Ascend's kernels
    backends: dict[str, Any] = field(default_factory=dict)  # name -> torch.compile backend
    graph_api: Any = None  # torch.cuda / torch.npu, or None (no device graphs)
    graph_class: Any = None

    def modes(self) -> list[Mode]:
        modes = [Mode(EAGER)]
        for name in self.backends:
            modes.append(Mode(COMPILED, name))
            modes.append(Mode(GRAPH, name))
        return modes

    @property
    def no_graph_reason(self) -> str | None:
        return None if self.graph_api is not None else f"no device graphs on {self.kind.upper()}"

    def synchronize(self) -> None:
        if self.graph_api is not None:
            self.graph_api.synchronize()


def npu_available() -> tuple[bool, str]:
    if importlib.util.find_spec("torch_npu") is None:
        return False, "torch_npu is not installed"
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)
    except Exception as err:  # torch_npu fails to import without CANN: say why
        return False, f"torch_npu does not import ({type(err).__name__}: {err})"
    count = torch.npu.device_count()  # type: ignore[attr-defined]
    return (count > 0, f"{count} NPU(s) visible")


def pick(requested: str) -> Device:
    """The device for ``requested`` (one of ``DEVICES``); raises DeviceUnavailable naming why."""
    if requested not in DEVICES:
        raise DeviceUnavailable(f"--device {requested}: use one of {', '.join(DEVICES)}")
    if requested in ("auto", "npu"):
        ok, why = npu_available()
        if ok:
            return _npu()
        if requested == "npu":
            raise DeviceUnavailable(f"--device npu: no usable NPU here ({why}); run on an Ascend node, or use "
                                    "--device cuda|cpu to run the checks on the NPU test double")
    if requested in ("auto", "cuda"):
        if torch.cuda.is_available():
            return _cuda()
        if requested == "cuda":
            raise DeviceUnavailable("--device cuda: torch.cuda.is_available() is False here; use --device cpu")
    return Device("cpu", torch.device("cpu"), "cpu", double=True,
                  backends={"aot_eager": "aot_eager", "inductor": "inductor"})


def _cuda() -> Device:
    index = torch.cuda.current_device()
    name = torch.cuda.get_device_name(index)
    return Device("cuda", torch.device("cuda", index), f"cuda:{index} ({name}, CUDA {torch.version.cuda})",
                  double=True, backends={"aot_eager": "aot_eager", "inductor": "inductor"},
                  graph_api=torch.cuda, graph_class=torch.cuda.CUDAGraph)


def _npu() -> Device:
    npu = torch.npu  # type: ignore[attr-defined]
    index = npu.current_device()
    name = npu.get_device_name(index)
    # backends are built by the installed stack (vLLM-Ascend's compiler), see stacks.InstalledStack
    return Device("npu", torch.device("npu", index), f"npu:{index} ({name})", double=False,
                  graph_api=npu, graph_class=npu.NPUGraph)


def compile_fn(fn: Callable[..., Any], backend: Any) -> Callable[..., Any]:
    """``fn`` compiled as the recipe compiles the model forward: one full graph, static shapes."""
    import torch._dynamo
    import torch._inductor.config

    torch._dynamo.reset()
    torch._inductor.config.emulate_precision_casts = True  # inductor keeps the bf16 roundings eager has
    return torch.compile(fn, fullgraph=True, dynamic=False, backend=backend)


def capture_and_replay(device: Device, fn: Callable[..., Any], inputs: Sequence[torch.Tensor],
                       replay_inputs: Sequence[torch.Tensor]) -> Any:
    """Capture ``fn(*inputs)`` once as a device graph, copy ``replay_inputs`` into its static inputs, replay it.

    Returns the outputs of the replay (clones, read after the device synchronised).
    """
    api = device.graph_api
    static = [t.clone() for t in inputs]
    side = api.Stream()
    side.wait_stream(api.current_stream())
    with api.stream(side):  # warm-up outside capture: compilation, allocator, lazy initialisation
        for _ in range(2):
            fn(*static)
    api.current_stream().wait_stream(side)
    api.synchronize()
    graph = device.graph_class()
    with api.graph(graph):
        out = fn(*static)
    for buffer, value in zip(static, replay_inputs, strict=True):
        buffer.copy_(value)
    graph.replay()
    api.synchronize()
    return _clone(out)


def _clone(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, (tuple, list)):
        return type(out)(_clone(o) for o in out)
    return out
