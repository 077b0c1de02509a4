"""verl-ascend-ext: Ascend NPU extensions loaded by verl's plugin discovery into an unmodified verl.

Importing this package does nothing; ``activate()`` boots it (verl and vLLM do that through their
entry points), ``patch_statuses()`` tells what happened to each patch in this process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verl_ascend_ext.patching.record import PatchStatus

from verl_ascend_ext._version import __version__ as __version__


def activate() -> None:
    """Boot the plugin in this process, as verl's and vLLM's entry points do (idempotent)."""
    from verl_ascend_ext.runtime.boot import activate as _activate

    _activate("api")


def patch_statuses() -> dict[str, PatchStatus]:
    """Status of every registered patch in this process, by patch id."""
    from verl_ascend_ext.patching.status import statuses

    return statuses()
