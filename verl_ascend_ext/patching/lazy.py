"""Lazy application: post-import hooks (wrapt) that apply a module's patches when it is imported.

Nothing here imports a target module. A hook on a module already imported runs at once (as wrapt runs it). wrapt
itself is imported only when it is needed: a hook on a module imported later waits in ``_Trigger``, a finder first
on ``sys.meta_path`` that, at the first import of a hooked module, imports wrapt, hands it every waiting hook and
lets wrapt's own finder take that import. Importing wrapt (its C extension and a dozen modules) was a third of
the plugin's boot in processes that never import a target.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import TYPE_CHECKING, Any

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
        register(_hook(module_name, tuple(module_records), report, resolve), module_name)


Hook = Callable[[ModuleType], None]


def register(hook: Hook, module_name: str) -> None:
    """``wrapt.register_post_import_hook(hook, module_name)``, importing wrapt only once a hooked module is imported
    (at once when ``module_name`` is imported already: the hook runs now)."""
    module = sys.modules.get(module_name)
    if module is not None:
        hook(module)
        return
    if _trigger.defer(hook, module_name):
        return
    import wrapt

    wrapt.register_post_import_hook(hook, module_name)


class _Trigger:
    """Holds hooks until the first hooked module is imported; then gives them to wrapt (see the module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.waiting: dict[str, list[Hook]] = {}
        self.done = False

    def defer(self, hook: Hook, module_name: str) -> bool:
        """Keep ``hook`` until an import needs it; False once wrapt took over (register with it directly)."""
        with self.lock:
            if self.done:
                return False
            if not self.waiting:
                sys.meta_path.insert(0, self)
            self.waiting.setdefault(module_name, []).append(hook)
            return True

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if fullname not in self.waiting:
            return None
        with self.lock:
            if self.done:
                return None
            self.done = True
            import wrapt

            for name, hooks in self.waiting.items():
                for hook in hooks:
                    wrapt.register_post_import_hook(hook, name)
            self.waiting.clear()
            sys.meta_path.remove(self)
        from wrapt.importer import ImportHookFinder

        finder = next(f for f in sys.meta_path if isinstance(f, ImportHookFinder))
        return finder.find_spec(fullname, path, target)  # this import, with its post-import hooks


_trigger = _Trigger()


def _hook(
    module_name: str, patches: tuple[Patch, ...], report: Callable[[str, list[PatchStatus]], None],
    resolve: Callable[[str], PatchRecord] | None,
) -> Callable[[ModuleType], None]:
    def on_import(_module: ModuleType) -> None:
        from verl_ascend_ext.patching.engine import (
            apply,  # the engine (source reading, wrapping) loads only when a target is imported
        )
        from verl_ascend_ext.patching.status import current, escaped, raised_at, record_status

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
            escaped(failed.id, err, raised_at(err))
            raise
        report(module_name, results)

    return on_import
