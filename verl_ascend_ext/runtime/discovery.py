"""Which installed distributions declare features: the ``verl_ascend_ext.features`` entry points, read cheaply.

Finding them means reading the ``entry_points.txt`` of every installed distribution (~160 in a training image),
in every process of a job. Each metadata directory on ``sys.path`` is listed once, its ``entry_points.txt`` read
as bytes and parsed (by ``importlib.metadata``, with the distribution's name from its metadata's headers) only when
it names the group (one or two distributions do). A ``sys.path`` entry that is not a directory (a zip) goes
through ``importlib.metadata`` whole. Only the standard library is imported.
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
    """Every entry point of ``group``, with its distribution's name; of distributions sharing a name, the first on
    ``sys.path`` counts, whether or not it names the group (as ``importlib.metadata.entry_points``, which also
    tells them by their metadata directory's name)."""
    section = f"[{group}]".encode()
    found: Found = []
    for name, dist in _naming(section):
        found += [(name, ep) for ep in dist.entry_points.select(group=group)]
    return found


def _naming(section: bytes) -> Iterator[tuple[str, importlib.metadata.Distribution]]:
    """The first distribution of each name on ``sys.path``, where its ``entry_points.txt`` holds ``section``, with
    its name."""
    seen: set[str] = set()
    for entry in sys.path:
        where = entry or "."
        try:
            with os.scandir(where) as listing:
                names = sorted(e.name for e in listing if e.name.endswith(METADATA_SUFFIXES))
        except NotADirectoryError:  # a zip or egg file: importlib.metadata reads those itself
            for dist in importlib.metadata.distributions(path=[entry]):
                key = _key(dist.metadata["Name"])
                if key not in seen:
                    seen.add(key)
                    if section.decode() in (dist.read_text("entry_points.txt") or ""):
                        yield dist.metadata["Name"], dist
            continue
        except OSError:  # a missing or unreadable entry holds no distribution for importlib.metadata either
            continue
        for name in names:
            key = _key(name.rpartition(".")[0].partition("-")[0])
            if key in seen:
                continue
            seen.add(key)
            try:
                with open(os.path.join(where, name, "entry_points.txt"), "rb") as file:
                    text = file.read()
            except OSError:  # no entry points, or an egg-info file (metadata only)
                continue
            if section in text:
                dist = importlib.metadata.PathDistribution(pathlib.Path(where, name))
                yield _name(os.path.join(where, name)) or dist.metadata["Name"], dist


def _name(directory: str) -> str | None:
    """The ``Name`` header of a metadata directory's ``METADATA`` (``PKG-INFO`` in an egg-info), read from the
    headers only: parsing the whole file, long description included, costs the boot ~3 ms for this package."""
    file = "PKG-INFO" if directory.endswith(".egg-info") else "METADATA"
    try:
        with open(os.path.join(directory, file), "rb") as metadata:
            for line in metadata:
                if not line.strip():  # the end of the headers
                    break
                key, colon, value = line.partition(b":")
                if colon and key.strip().lower() == b"name":
                    return value.strip().decode()
    except (OSError, UnicodeDecodeError):
        return None  # importlib.metadata reads it (and says what is wrong)
    return None


def _key(name: str) -> str:
    """A distribution name as importlib.metadata compares them (PEP 503 normalised)."""
    return _NORMALISE.sub("-", name).lower()
