"""Which installed distributions declare features: the ``verl_ascend_ext.features`` entry points, read cheaply.

Finding them means reading the ``entry_points.txt`` of every installed distribution (~160 in a training image),
in every process of a job. Each file is read once and parsed only when it names the group (one or two
distributions do); the distribution's name is read only for those. Only the standard library is imported.
"""

from __future__ import annotations

import importlib.metadata

Found = list[tuple[str, importlib.metadata.EntryPoint]]  # (distribution name, entry point)


def scan(group: str) -> Found:
    """Every entry point of ``group``, with its distribution's name; one distribution name once (the first on
    ``sys.path`` wins, as ``importlib.metadata.entry_points``)."""
    section = f"[{group}]"
    seen: set[str] = set()
    found: Found = []
    for dist in importlib.metadata.distributions():
        text = dist.read_text("entry_points.txt")
        if not text or section not in text:
            continue
        name = dist.metadata["Name"]
        if name in seen:
            continue
        seen.add(name)
        found += [(name, ep) for ep in dist.entry_points.select(group=group)]
    return found
