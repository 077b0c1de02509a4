"""Which code the selftest runs: the installed vLLM-Ascend (an NPU node), or vLLM-Ascend's released source on the
NPU test double (CPU, CUDA).

``InstalledStack``: the vLLM-Ascend modules are imported and patched in place by ``engine.apply`` with the real
records; kernels, compiler and graphs are the node's own.

``ReleasedStack``: vLLM-Ascend cannot be imported without an NPU, so the method bodies a check needs are read
from a released vLLM-Ascend (an installed distribution's files, or a wheel, sdist or directory the user points
to, opened with ``vet``'s artifact reader) and written, as released, into a module in a temporary directory,
under a short prelude naming the module globals those bodies read (their stand-ins come from the test double,
``npu_test_double``). The records are applied by ``engine.apply`` unchanged but for their target, retargeted to
that module; their cross-definition fingerprints (``Fingerprint.at``) read the released files. Nothing of
vLLM-Ascend is copied into this package: without a released source at hand the checks say "not run".
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import shutil
import sys
import tempfile
import textwrap
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from verl_ascend_ext.patching import engine
from verl_ascend_ext.patching.record import PatchRecord, PatchStatus, split_target
from verl_ascend_ext.patching.source import Lookup, class_bases, definitions, find_module_file, looking_in
from verl_ascend_ext.tooling.selftest import DOUBLE_LABEL
from verl_ascend_ext.tooling.selftest.devices import Device

DISTRIBUTION = "vllm-ascend"
PACKAGE = "vllm_ascend"


class NotRunError(Exception):
    """A check cannot run here for a reason that is not a fault (the message says why)."""


class HarnessError(Exception):
    """The selftest itself could not run on this stack (an import failed, an API is missing)."""


@dataclass(frozen=True)
class SourceTree:
    root: Path  # directory holding the vllm_ascend package
    version: str
    origin: str  # what the user gave, or "installed distribution"


@dataclass
class ModuleSpec:
    """What a check needs of one vLLM-Ascend module: classes with their methods, module-level functions and the
    prelude of module globals those bodies read (ours: stand-ins, never vLLM-Ascend's code)."""

    module: str  # the vLLM-Ascend module, e.g. vllm_ascend.ops.layernorm
    classes: dict[str, list[str]]  # class -> method names, in the released file
    prelude: str
    functions: tuple[tuple[str, str], ...] = ()  # (vLLM-Ascend module, function) defined first, in order
    bases: dict[str, str] | None = None  # class -> base expression; default: the released file's, if generated


def find_source(given: str | None, scratch: Path) -> SourceTree | None:
    """The released vLLM-Ascend to read: ``given`` (wheel, sdist, directory), else an installed distribution's files.

    None when neither is at hand. Raises HarnessError when ``given`` is not a usable vLLM-Ascend.
    """
    from verl_ascend_ext.tooling.vet import ArtifactError, open_artifact

    if given:
        try:
            artifact = open_artifact(given, scratch)
        except ArtifactError as err:
            raise HarnessError(f"--vllm-ascend-source: {err}") from err
        if PACKAGE not in artifact.packages:
            raise HarnessError(f"--vllm-ascend-source {given}: no {PACKAGE} package in this {artifact.kind} "
                               f"(found: {', '.join(artifact.packages) or 'none'}). Pass a vLLM-Ascend wheel, "
                               "sdist or source directory.")
        return SourceTree(artifact.root, artifact.versions.get(DISTRIBUTION, "unknown"), given)
    path = find_module_file(PACKAGE)  # the installed package's __init__.py, found without importing it
    if path is None:
        return None
    return SourceTree(path.parent.parent, engine.installed_version(DISTRIBUTION) or "unknown",
                      "installed distribution")


class ReleasedStack:
    """vLLM-Ascend's released source, run on the NPU test double (see the module docstring)."""

    double = True
    # vLLM modules the checks build with; imported before the double is installed (transformers, which vLLM
    # imports, asks importlib for a torch_npu spec, which the double has not)
    VLLM_MODULES = ("vllm.config", "vllm.model_executor.custom_op", "vllm.model_executor.layers.layernorm",
                    "vllm.model_executor.layers.linear")

    def __init__(self, device: Device, source: SourceTree) -> None:
        from verl_ascend_ext.tooling.selftest import npu_test_double

        self.device = device
        self.source = source
        self.vllm_error = ""
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # vLLM's CUDA build warns at length on a CPU machine
        try:
            for name in self.VLLM_MODULES:
                importlib.import_module(name)
        except Exception as err:  # reported by the checks that need vLLM, as "could not run"
            self.vllm_error = f"{type(err).__name__}: {err}"
        npu_test_double.install()
        self.work = Path(tempfile.mkdtemp(prefix="verl-ascend-selftest-"))
        sys.path.insert(0, str(self.work))
        self._modules: dict[str, types.ModuleType] = {}
        self._lookup = Lookup((source.root,), {DISTRIBUTION: source.version})
        self.description = (f"vLLM-Ascend {source.version} released source ({source.origin}) on the NPU test double "
                            f"({DOUBLE_LABEL})")

    def generated_name(self, module: str) -> str:
        return "verl_ascend_selftest_" + module.replace(".", "_")

    def module(self, spec: ModuleSpec) -> types.ModuleType:
        """The generated module holding the released definitions ``spec`` names (written once)."""
        name = self.generated_name(spec.module)
        if name in self._modules:
            return self._modules[name]
        parts = [f'"""Released {spec.module} definitions ({self.source.origin}), written by the verl-ascend '
                 f'selftest under its prelude ({DOUBLE_LABEL})."""', textwrap.dedent(spec.prelude).strip()]
        for module, function in spec.functions:
            parts.append(self._definition(module, function))
        path = self._file(spec.module)
        bases = class_bases(path)
        for cls, methods in spec.classes.items():
            base = (spec.bases or {}).get(cls) or next((b for b in bases.get(cls, ()) if b in spec.classes), "")
            body = "\n".join(textwrap.indent(self._definition(spec.module, f"{cls}.{m}"), "    ") for m in methods)
            parts.append(f"class {cls}({base}):\n{body or '    pass'}\n")
        target = self.work / f"{name}.py"
        target.write_text("\n\n\n".join(parts) + "\n", encoding="utf-8")
        importlib.invalidate_caches()
        self._modules[name] = importlib.import_module(name)
        return self._modules[name]

    def _file(self, module: str) -> Path:
        with looking_in(self._lookup):
            path = find_module_file(module)
        if path is None:
            raise NotRunError(f"{module} is not in the vLLM-Ascend source at hand ({self.source.origin})")
        return path

    def _definition(self, module: str, qualname: str) -> str:
        found = definitions(self._file(module)).get(qualname)
        if found is None:
            raise NotRunError(f"{module} in the vLLM-Ascend source at hand ({self.source.origin}) defines no "
                              f"{qualname}")
        return found[2]

    def record(self, record: PatchRecord) -> PatchRecord:
        module, qualname = split_target(record.target)
        return record._replace(target=f"{self.generated_name(module)}:{qualname}")

    def apply(self, record: PatchRecord) -> PatchStatus:
        with looking_in(self._lookup):  # Fingerprint.at parts read the released files
            return engine.apply(self.record(record))

    @contextlib.contextmanager
    def vllm_context(self) -> Iterator[Any]:
        """vLLM's config context for building layers: vLLM's default config for this device (no vLLM-Ascend platform
        here; vLLM's own detection may find none on a CPU machine, hence the explicit device)."""
        from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config

        config = VllmConfig(device_config=DeviceConfig(device=self.device.kind))
        with set_current_vllm_config(config):
            yield config

    @contextlib.contextmanager
    def indexer_kernel_probe(self) -> Iterator[None]:
        """The double's lightning indexer already returns the weights it receives: nothing to put in place."""
        yield

    def close(self) -> None:
        for name in self._modules:
            sys.modules.pop(name, None)
        with contextlib.suppress(ValueError):
            sys.path.remove(str(self.work))
        shutil.rmtree(self.work, ignore_errors=True)


class InstalledStack:
    """The node's own vLLM-Ascend, vLLM, torch_npu and CANN (an NPU node)."""

    double = False
    vllm_error = ""

    def __init__(self, device: Device) -> None:
        self.device = device
        versions = ", ".join(f"{d} {engine.installed_version(d) or 'not installed'}"
                             for d in (DISTRIBUTION, "vllm", "torch_npu", "torch"))
        self.description = f"installed stack: {versions}"
        self._config: Any = None
        self._work: str | None = None

    def module(self, spec: ModuleSpec) -> types.ModuleType:
        try:
            return importlib.import_module(spec.module)
        except Exception as err:
            raise HarnessError(f"import {spec.module} failed: {type(err).__name__}: {err}") from err

    def record(self, record: PatchRecord) -> PatchRecord:
        return record

    def apply(self, record: PatchRecord) -> PatchStatus:
        return engine.apply(record)

    def vllm_config(self) -> Any:
        """The recipe's compilation settings (VLLM_COMPILE, FULL_DECODE_ONLY), through vLLM-Ascend's platform."""
        if self._config is None:
            from vllm.config import CompilationConfig, VllmConfig
            from vllm.config.compilation import CompilationMode, CUDAGraphMode

            self._config = VllmConfig(compilation_config=CompilationConfig(
                mode=CompilationMode.VLLM_COMPILE, cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY))
        return self._config

    @contextlib.contextmanager
    def vllm_context(self) -> Iterator[Any]:
        from vllm.config import set_current_vllm_config

        config = self.vllm_config()
        with set_current_vllm_config(config):
            from vllm_ascend.utils import register_ascend_customop

            # what vLLM-Ascend's worker does before building the model; of the config it reads only whether the
            # model is DeepSeek-MLA-like (GLM-5.2's sparse attention is), and the config here has no model
            register_ascend_customop(SimpleNamespace(model_config=SimpleNamespace(is_deepseek_mla=True)))
            yield config

    @contextlib.contextmanager
    def indexer_kernel_probe(self) -> Iterator[None]:
        """torch_npu.npu_lightning_indexer replaced, for the check only, by a probe returning the weights it receives.

        The indexer fix is in Python, before the kernel; the kernel returns top-k indices, which a positive scale
        does not move. The probe (a plain function dynamo traces and the device graph captures as a cast) lets the
        check see what the kernel is handed on the node's own code path, compiler and graphs.
        """
        import torch
        import torch_npu

        real = torch_npu.npu_lightning_indexer

        def probe(*args: Any, weights: Any = None, **kwargs: Any) -> tuple[Any, Any]:
            if weights is None:
                weights = args[2]
            return weights.float() * 1, weights.new_zeros((1,), dtype=torch.float32)

        torch_npu.npu_lightning_indexer = probe
        try:
            yield
        finally:
            torch_npu.npu_lightning_indexer = real

    def ascend_backend(self) -> Any:
        """A torch.compile backend doing what vLLM's VllmBackend does on this platform for the recipe's config.

        The platform's pass manager (``current_platform.get_pass_manager_cls()``, configured with the config), the
        platform's compiler (``current_platform.get_compile_backend()``: vLLM-Ascend's AscendCompiler, hashed with
        the config as vLLM does), called inside vLLM's ``pass_context`` for a compile range covering the case.
        """
        import copy

        import torch
        from vllm.compilation.passes.inductor_pass import pass_context
        from vllm.config.utils import Range
        from vllm.platforms import current_platform
        from vllm.utils.import_utils import resolve_obj_by_qualname

        config = self.vllm_config()
        # vLLM-Ascend's passes read the model's dtype and text config; the selftest builds no model, so the pass
        # manager gets a copy of the config whose model config is a stand-in: bfloat16 (GLM-5.2's), an empty text
        # config (the passes' defaults, e.g. routed_scaling_factor 1.0); the rest of the config is vLLM-Ascend's
        pass_config = copy.copy(config)
        object.__setattr__(pass_config, "model_config", SimpleNamespace(
            dtype=torch.bfloat16, hf_text_config=SimpleNamespace(), is_deepseek_mla=True))
        manager = resolve_obj_by_qualname(current_platform.get_pass_manager_cls())()
        manager.configure(pass_config)
        compiler = resolve_obj_by_qualname(current_platform.get_compile_backend())()
        compiler.compute_hash(config)
        self._work = tempfile.mkdtemp(prefix="verl-ascend-selftest-compile-")
        compiler.initialize_cache(self._work, disable_cache=True)
        counter = [0]

        def backend(graph: Any, example_inputs: Any) -> Any:
            counter[0] += 1
            compile_range = Range(start=1, end=8192)
            with pass_context(compile_range):
                compiled, _ = compiler.compile(graph, list(example_inputs), {current_platform.pass_key: manager},
                                               compile_range, f"selftest_{counter[0]}")
            return compiled

        return backend

    def close(self) -> None:
        if self._work is not None:
            shutil.rmtree(self._work, ignore_errors=True)


def describe_missing_source() -> str:
    return ("no vLLM-Ascend source at hand: install vllm-ascend (its files are read, not imported) or pass "
            "--vllm-ascend-source WHEEL|SDIST|DIR (e.g. the vllm_ascend-0.23.0 wheel from the package index)")


def resolve_qualname(module: types.ModuleType, qualname: str) -> Any:
    owner: Any = module
    for part in qualname.split("."):
        owner = getattr(owner, part)
    return owner


def importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
