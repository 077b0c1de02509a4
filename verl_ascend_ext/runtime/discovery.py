"""Which installed distributions declare features: the ``verl_ascend_ext.features`` entry points, read cheaply.

Finding them means reading the ``entry_points.txt`` of every installed distribution (~160 in a training image),
in every process of a job. Each metadata directory on ``sys.path`` is listed once, its ``entry_points.txt`` read
as bytes and parsed (by ``importlib.metadata``, with the distribution's name) only when it names the group (one or
two distributions do). A ``sys.path`` entry that is not a directory (a zip) goes through ``importlib.metadata``
whole. Only the standard library is imported.
"""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import re
import sys
from collections.abc import Iterator

FEATURE_GROUP = "verl_ascend_ext.features"  # the entry-point group features are declared in (``hookspecs``)
Found = list[tuple[str, importlib.metadata.EntryPoint]]  # (distribution name, entry point)
METADATA_SUFFIXES = (".dist-info", ".egg-info")
_NORMALISE = re.compile(r"[-_.]+")


def scan(group: str) -> Found:
    """Every entry point of ``group``, with its distribution's name; one distribution name once (the first on
    ``sys.path`` wins, as ``importlib.metadata.entry_points``)."""
    section = f"[{group}]".encode()
    seen: set[str] = set()
    found: Found = []
    for dist in _naming(section):
        name = dist.metadata["Name"]
        key = _NORMALISE.sub("-", name).lower()
        if key in seen:
            continue
        seen.add(key)
        found += [(name, ep) for ep in dist.entry_points.select(group=group)]
    return found


def _naming(section: bytes) -> Iterator[importlib.metadata.Distribution]:
    """Distributions whose ``entry_points.txt`` holds ``section``, in ``sys.path`` order."""
    for entry in sys.path:
        where = entry or "."
        try:
            with os.scandir(where) as listing:
                names = sorted(e.name for e in listing if e.name.endswith(METADATA_SUFFIXES))
        except NotADirectoryError:  # a zip or egg file: importlib.metadata reads those itself
            for dist in importlib.metadata.distributions(path=[entry]):
                if section.decode() in (dist.read_text("entry_points.txt") or ""):
                    yield dist
            continue
        except OSError:  # a missing or unreadable entry holds no distribution for importlib.metadata either
            continue
        for name in names:
            try:
                with open(os.path.join(where, name, "entry_points.txt"), "rb") as file:
                    text = file.read()
            except OSError:  # no entry points, or an egg-info file (metadata only)
                continue
            if section in text:
                yield importlib.metadata.PathDistribution(pathlib.Path(where, name))
