"""Discovery: what verl's and vLLM's entry points run in every process of a training job.

``activate`` runs once per process whatever the number of loads (verl plugin, vLLM plugin, API):
it reads the gates and the kill switch, records each patch's status and registers lazy post-import
hooks. It imports only this package and, where another distribution declares features, pluggy
(``boot_plan``: this package's own features are read from the generated manifest); never vLLM, vLLM-Ascend,
torch_npu, Megatron, Ray or transformers. Because verl logs plugin failures at DEBUG, everything a
user must know is logged here at WARNING or above.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

from verl_ascend_ext.patching.errors import PatchRefusedError
from verl_ascend_ext.patching.gates import DISABLE_ENV, GateValueError, disabled_patch_ids
from verl_ascend_ext.patching.lazy import install, register
from verl_ascend_ext.patching.outcomes import PatchStatus, Status
from verl_ascend_ext.patching.status import (
    escaped,
    on_change,
    on_error,
    raised_at,
    record_status,
    statuses,
    switched_off,
)
from verl_ascend_ext.runtime import boot_plan
from verl_ascend_ext.runtime.records import process_end, recorder

RUNTIME_GATES = (process_end.GATE,)  # the runtime's own gates (features declare theirs)

logger = logging.getLogger("verl_ascend_ext")

_lock = threading.Lock()
_loaded_by: list[str] = []
_hooks_registered = False


def loaded_by() -> tuple[str, ...]:
    """Who asked this process to boot the plugin, in order (first one did the work)."""
    return tuple(_loaded_by)


def _report(source: str):
    def report(module_name: str, results: list[PatchStatus]) -> None:
        refused = [r for r in results if r.status is Status.REFUSED]
        line = "; ".join(f"{r.id}: {r.status}" for r in results)
        if refused:  # the import that met the unrecognised code fails with the refusal (``lazy`` reports it)
            level = logging.ERROR
            line += "".join(f"\n  {r.detail}" for r in refused)
        else:
            level = logging.WARNING if any(r.status is Status.APPLIED for r in results) else logging.INFO
        logger.log(level, "verl-ascend-ext (pid %d, loaded by %s) on import of %s: %s",
                   os.getpid(), source, module_name, line)

    return report


def activate(source: str = "api") -> None:
    """Boot the plugin in this process (idempotent).

    Raises GateValueError on a bad variable, PatchRefusedError for a target already imported whose code is
    not recognised, and feature declaration / import-hook errors as they are.
    """
    with _lock:
        _loaded_by.append(source)
        if len(_loaded_by) > 1:
            recorder.loaded_again(source)
            process_end.rechain()
            return
        try:
            _boot(source)
        except BaseException:
            if not _hooks_registered:
                _loaded_by.clear()  # nothing registered yet: a retry after the user fixes the environment is clean
            raise


def _boot(source: str) -> None:
    reg = boot_plan.plan()
    gates = (*reg.gates, *RUNTIME_GATES)
    for gate in (*gates, *reg.settings):
        gate.read()  # fail on a bad value now, naming the variable, not at first import of a target
    disabled = disabled_patch_ids(r.id for r in reg.records)
    active = []
    for record in reg.records:
        off = switched_off(record, disabled, os.environ)
        if off is not None:
            record_status(off)
            continue
        record_status(PatchStatus(record.id, record.target, Status.PENDING, f"waiting for import of {record.module}"))
        active.append(record)
    recorder.start(source, {g.env: g.read() for g in gates}, os.environ.get(DISABLE_ENV, ""), statuses,
                   {r.id: r.observed for r in reg.records})
    on_error(recorder.failed)  # from here on an error escaping a hook or a replacement is recorded under its id
    global _hooks_registered
    _hooks_registered = True  # from here on a retry would register every hook twice
    before = statuses()
    try:
        install(active, _report(source), boot_plan.record)
        for module_name, callback in reg.import_hooks:
            register(callback, module_name)
    finally:  # statuses set while installing (a target already imported: applied, or refused) are recorded too
        on_change(recorder.changed)
        if statuses() != before:
            recorder.changed()
        process_end.install(process_end.GATE.read())


def activate_or_exit(source: str) -> None:
    """``activate`` for loaders that swallow exceptions (verl logs them at DEBUG): stop the process loudly.

    Any failure to set the plugin up (a bad variable, a refused patch, a broken feature declaration or
    import hook) would otherwise leave training running with nothing patched and nothing said.
    """
    try:
        activate(source)
    except (GateValueError, PatchRefusedError) as err:
        logger.error("%s", err)
        escaped("boot", err, raised_at(err))
        raise SystemExit(f"verl-ascend-ext: {err}") from err
    except Exception as err:
        logger.exception("verl-ascend-ext could not start in this process")
        raise SystemExit(f"verl-ascend-ext could not start: {type(err).__name__}: {err}") from err


def vllm_plugin() -> None:
    """The ``vllm.general_plugins`` entry point: vLLM calls it in every vLLM process."""
    activate("vllm")


RAY_SETUP_HOOK = "verl_ascend_ext.runtime.boot.ray_worker_setup"  # the runtime env's worker_process_setup_hook
PLUGIN_POLICY_ENV = "VERL_USE_EXTERNAL_PLUGINS"  # verl's: auto (default), none, or the entry points to load
VERL_ENTRY_POINT = "ascend_ext"  # our name in verl's ``verl.plugins`` group


def verl_policy_allows(environ: Any = None) -> bool:
    """Whether verl's plugin policy in ``environ`` (default: this process's) lets verl load this plugin, read as
    verl reads it (``verl/__init__.py``: stripped and lower-cased; ``none`` loads nothing, a list only its names)."""
    policy = (os.environ if environ is None else environ).get(PLUGIN_POLICY_ENV, "auto").strip().lower()
    return policy == "auto" or (policy != "none" and VERL_ENTRY_POINT in {p.strip() for p in policy.split(",")})



def ray_worker_setup() -> None:
    """Ray's ``worker_process_setup_hook`` of a PPO job (``ray-runtime-env-gates`` sets it): every Ray worker boots
    the plugin at its start, also one that never imports verl (fully-async's ``MessageQueue``), so each has a
    record; a worker that imports verl later just loads it again. Ray's worker loop sets its own SIGTERM handler
    after this hook: the process-end observer is chained in front of it when it does. Where verl's own plugin policy
    (``VERL_USE_EXTERNAL_PLUGINS``) leaves this plugin out, the worker runs without it, as verl would: said once, at
    WARNING (the cluster check at the job's start names such a node first)."""
    if not verl_policy_allows():
        logger.warning("verl-ascend-ext: %s=%r leaves this plugin out: this Ray worker (pid %d) runs without it",
                       PLUGIN_POLICY_ENV, os.environ.get(PLUGIN_POLICY_ENV), os.getpid())
        return
    activate_or_exit("ray")
    utils = sys.modules.get("ray._private.utils")  # imported: Ray runs this hook
    set_handler = getattr(utils, "set_sigterm_handler", None)
    if callable(set_handler) and not getattr(set_handler, "verl_ascend_ext", False):
        def set_sigterm_handler(handler: Any) -> Any:
            out = set_handler(handler)
            process_end.rechain()
            return out

        set_sigterm_handler.verl_ascend_ext = True  # type: ignore[attr-defined]
        utils.set_sigterm_handler = set_sigterm_handler
