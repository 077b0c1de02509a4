"""Upstream fixes announced to other copies of a patch: the record's markers set on the upstream function itself.

Another package may carry its own copy of one of our fixes and stand down when the target carries its
marker (verl 0.9.1's in-tree GLM-5.2 copy checks ``_verl_vllm_ascend_glm52_patched``). Such a copy
recognises the fixed upstream code by string checks of its own, which know fewer shapes than our
recognisers do, and raises on the others. When our recogniser finds the fix in place (``fixed-upstream``),
the engine sets the record's ``exposes_markers`` on the upstream function: an attribute, the code is
untouched, and the other copy stands down as it would behind our wrapper. Where the code is unknown we
refuse and set nothing, so the other copy decides by itself.

The marks are remembered, so that our own foreign-marker check does not mistake them for another copy,
and ``withdraw`` (``engine.unpatch``) can take them back.
"""

from __future__ import annotations

import threading
from typing import Any

from verl_ascend_ext.patching.record import PatchRecord

_lock = threading.Lock()
_marks: dict[str, list[tuple[Any, str]]] = {}  # patch id -> (function, marker) set by us


def _function(live: Any) -> Any:
    """The function another copy reads through the class: a staticmethod's or classmethod's ``__func__``."""
    return getattr(live, "__func__", live)


def expose_on_upstream(record: PatchRecord, live: Any) -> str:
    """Set ``record.exposes_markers`` on the upstream function ``live``; the sentence saying so ('' if none)."""
    func = _function(live)
    done: list[str] = []
    with _lock:
        for marker in record.exposes_markers:
            if getattr(func, marker, False):
                continue
            try:
                setattr(func, marker, True)
            except (AttributeError, TypeError):  # e.g. a builtin: nothing to mark, the other copy decides itself
                continue
            _marks.setdefault(record.id, []).append((func, marker))
            done.append(marker)
    if not done:
        return ""
    return f"; marked the upstream function with {', '.join(done)} so other copies of this fix stand down"


def set_by_us(obj: Any, marker: str) -> bool:
    """Whether ``marker`` on ``obj`` is one of our own upstream marks (not another copy's)."""
    with _lock:
        return any(func is obj and name == marker for marks in _marks.values() for func, name in marks)


def withdraw(patch_id: str) -> bool:
    """Remove the marks set for ``patch_id``; True when there were any."""
    with _lock:
        marks = _marks.pop(patch_id, [])
        for func, marker in marks:
            if marker in getattr(func, "__dict__", {}):
                delattr(func, marker)
    return bool(marks)
