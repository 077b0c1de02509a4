"""Hook specifications: the contract between the plugin core and its features.

A feature is a module (or object) registered in the ``verl_ascend_ext.features`` entry-point group.
The built-in features are registered there exactly like third-party ones::

    [project.entry-points."verl_ascend_ext.features"]
    my_feature = "my_package.my_feature"

and implement any of the hooks below, marked with :data:`hookimpl`::

    from verl_ascend_ext.runtime.hookspecs import hookimpl

    @hookimpl
    def verl_ascend_ext_patch_records():
        return [PatchRecord(...)]

This package's own import hooks (``verl_ascend_ext_import_hooks``) and setting parsers are module-level functions:
its boot manifest names them by import path.

Feature modules are imported in most processes of a training job (at the first import of a target, or at
discovery when a third-party feature package is installed), so they must be cheap: declare records, gates and
import hooks; keep replacement code in another module that the record names by import path. Never import torch,
vLLM, vLLM-Ascend, torch_npu, Megatron, Ray or transformers at feature-module import time.

Every hook below is called with keyword arguments only and every result list is concatenated in
registration order. A ``@hookimpl``-marked function whose name is not a hook below, or whose
arguments are not the hook's, is rejected when the plugin manager is built
(``PluginValidationError``); an unmarked function is not a hook implementation at all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING

import pluggy

from verl_ascend_ext.runtime.discovery import FEATURE_GROUP as FEATURE_GROUP  # declared where it is scanned

if TYPE_CHECKING:
    from verl_ascend_ext.patching.gates import Gate, Setting
    from verl_ascend_ext.patching.record import PatchRecord
    from verl_ascend_ext.runtime.findings import Finding

PROJECT = "verl_ascend_ext"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def verl_ascend_ext_gates() -> Sequence[Gate]:
    """Declare the boolean environment gates of this feature.

    Each gate's env var is parsed by the one gate parser (1/true/yes/on, 0/false/no/off; unset or
    empty: the gate's default), shown by ``verl-ascend doctor``, and carried into Ray workers and vLLM
    processes by the device feature. A patch record carries its ``Gate`` object, which a
    feature must declare here.
    """


@hookspec
def verl_ascend_ext_settings() -> Sequence[Setting]:
    """Declare the non-boolean environment variables of this feature (``patching.gates.Setting``, e.g. a timeout).

    Like a gate: unset or empty means its default; any other value goes through the setting's own parser, and
    a value it rejects stops every process at boot and makes ``verl-ascend doctor`` exit 2, naming the variable.
    Doctor shows each one with its parsed value; the device feature carries it into Ray workers; the table of
    switches (docs/switches.md) is generated from these and the gates (``verl-ascend switches``).
    """


@hookspec
def verl_ascend_ext_patch_records() -> Sequence[PatchRecord]:
    """Declare the runtime patches of this feature.

    The engine applies each one lazily when its target module is imported, at most once per
    process, only when its gate is on and ``VERL_ASCEND_EXT_DISABLE`` does not name it; doctor
    predicts its status from the installed source; the docs catalogue is generated from it.
    Patch ids and targets must be unique across all features.
    """


@hookspec
def verl_ascend_ext_import_hooks() -> Sequence[tuple[str, Callable[[ModuleType], None]]]:
    """Declare ``(module name, callback)`` pairs run when that module is imported.

    For work that is not a function patch (e.g. registering a platform class with verl). Runs in
    every process where the plugin boots, after the module finished importing; if the module is
    already imported at boot, the callback runs at once. Callbacks must be idempotent.
    """


@hookspec
def verl_ascend_ext_doctor_findings(environ: Mapping[str, str]) -> Sequence[Finding]:
    """Return extra findings for ``verl-ascend doctor``, computed without importing torch or verl.

    Each finding is a :class:`verl_ascend_ext.runtime.findings.Finding`, built with
    ``Finding.check(name, status, detail)`` where ``status`` is a ``Severity`` (``OK``, ``INFO``,
    ``WARN`` or ``ERROR``); doctor reports it as ``{"name", "status", "detail"}``. An ``ERROR``
    makes doctor exit non-zero; anything that is not a ``Finding`` is rejected with a TypeError.
    """
