"""Lazy application: post-import hooks (wrapt) that apply a module's patches when it is imported.

Nothing here imports a target module. If the module is already imported when the hook is
registered, wrapt runs the hook at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import ModuleType
from typing import TYPE_CHECKING

import wrapt

from verl_ascend_ext.patching.outcomes import PatchStatus, Status

if TYPE_CHECKING:
    from verl_ascend_ext.patching.record import Patch, PatchRecord


def install(records: Iterable[Patch], report: Callable[[str, list[PatchStatus]], None],
            resolve: Callable[[str], PatchRecord] | None = None) -> None:
    """Register one post-import hook per target module; ``resolve`` (patch id -> record) gives the full records
    when the hook runs (default: ``records`` are the full records)."""
    by_module: dict[str, list[Patch]] = {}
    for record in records:
        by_module.setdefault(record.module, []).append(record)
    for module_name, module_records in by_module.items():
        wrapt.register_post_import_hook(_hook(module_name, tuple(module_records), report, resolve), module_name)


def _hook(
    module_name: str, patches: tuple[Patch, ...], report: Callable[[str, list[PatchStatus]], None],
    resolve: Callable[[str], PatchRecord] | None,
) -> Callable[[ModuleType], None]:
    def on_import(_module: ModuleType) -> None:
        from verl_ascend_ext.patching.engine import (
            apply,  # the engine (source reading, wrapping) loads only when a target is imported
        )
        from verl_ascend_ext.patching.status import current, record_status

        results = []
        try:
            records = patches if resolve is None else tuple(resolve(p.id) for p in patches)
            for record in records:
                results.append(apply(record))
        except Exception as err:
            # Report before raising: the importing code may swallow the error (verl wraps some imports
            # in try/except), and the refusal or failure must still be seen.
            failed = patches[len(results)]
            status = current(failed.id)
            if status is None or status.status is not Status.REFUSED:
                detail = f"could not be applied: {type(err).__name__}: {err}"
                status = record_status(PatchStatus(failed.id, failed.target, Status.REFUSED, detail))
            report(module_name, [*results, status])
            raise
        report(module_name, results)

    return on_import
