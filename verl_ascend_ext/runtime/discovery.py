"""Which installed distributions declare features: the ``verl_ascend_ext.features`` entry points, read cheaply.

Finding them means reading the ``entry_points.txt`` of every installed distribution (~160 in a training image),
in every process of a job. Each metadata directory on ``sys.path`` is listed once, its ``entry_points.txt`` read
as bytes and parsed (by ``importlib.metadata``, with the distribution's name from its metadata's headers) only when
it names the group (one or two distributions do). A ``sys.path`` entry that is not a directory (a zip) goes
through ``importlib.metadata`` whole. Only the standard library is imported.

The result is read from a cache (``scan``; ``scan_installed`` reads the files), one file per Python version, group
and ``sys.path``, holding each entry's modification time when it was written: installing, upgrading or removing a
distribution adds or removes a metadata directory in its site directory, which changes that directory's time, so a
site directory whose time changed means a new scan (reading ~160 files cost the boot ~3 ms a process). An entry
that held no metadata then (a script's folder, the working directory) may change freely: it is listed again, and
only a metadata directory appearing there means a new scan. Metadata edited in place, without an installer, is not
seen until its site directory changes or ``verl-ascend doctor`` (which always scans) runs. The cache lives under
``$VERL_ASCEND_EXT_CACHE/feature-scan``; an unreadable or unwritable cache only costs a scan.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import pathlib
import re
import sys
import threading
import time
from collections.abc import Iterator

from verl_ascend_ext.patching.cachedir import cache_dir

FEATURE_GROUP = "verl_ascend_ext.features"  # the entry-point group features are declared in (``hookspecs``)
Found = list[tuple[str, importlib.metadata.EntryPoint]]  # (distribution name, entry point)
METADATA_SUFFIXES = (".dist-info", ".egg-info")
_NORMALISE = re.compile(r"[-_.]+")
CACHE_FORMAT = 2  # bump when what a cache file holds changes
CACHE_DAYS = 30
logger = logging.getLogger("verl_ascend_ext")


def scan(group: str, fresh: bool = False) -> Found:
    """Every entry point of ``group``, with its distribution's name (``scan_installed``), read from the cache while
    it holds for this ``sys.path`` (see the module docstring); ``fresh``: scan and rewrite it."""
    path = cache_dir() / "feature-scan" / f"{_cache_key(group)}.json"
    if not fresh:
        try:
            cached = json.loads(path.read_bytes())
            if _holds(cached["entries"]):
                return [(dist, importlib.metadata.EntryPoint(name, value, group))
                        for dist, name, value in cached["found"]]
        except (OSError, ValueError, TypeError, KeyError) as err:  # no cache for this key yet, or not one we wrote
            logger.debug("verl-ascend-ext: feature scan not cached (%s): scanning", err)
    entries = [[entry, _mtime(entry), _holds_metadata(entry)] for entry in sys.path]  # before the scan it describes
    found = scan_installed(group)
    _write(path, {"entries": entries, "found": [[dist, ep.name, ep.value] for dist, ep in found]})
    return found


def _cache_key(group: str) -> str:
    text = "\n".join([f"format {CACHE_FORMAT}", sys.version, group, *sys.path])
    return hashlib.blake2b(text.encode(errors="surrogatepass"), digest_size=16).hexdigest()


def _mtime(entry: str) -> int | None:
    try:
        return os.stat(entry or ".").st_mtime_ns
    except OSError:
        return None


def _holds_metadata(entry: str) -> bool:
    """Whether ``entry`` holds distribution metadata (a file entry, a zip, counts as holding some)."""
    try:
        with os.scandir(entry or ".") as listing:
            return any(e.name.endswith(METADATA_SUFFIXES) for e in listing)
    except NotADirectoryError:
        return True
    except OSError:
        return False


def _holds(entries: list[list]) -> bool:
    """Whether a cache written with ``entries`` still describes ``sys.path``: every entry that held metadata has the
    same time, and one that held none holds none still."""
    if [entry for entry, _, _ in entries] != sys.path:
        return False
    for entry, mtime, had_metadata in entries:
        now = _mtime(entry)
        if now == mtime:
            continue
        if had_metadata or _holds_metadata(entry):
            return False
    return True


def _write(path: pathlib.Path, content: dict[str, list]) -> None:
    """Atomically, or not at all (a read-only home only costs the next process a scan); files of keys unused for
    ``CACHE_DAYS`` go (a key per distinct ``sys.path``: Ray's per-job directories make new ones)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(content))
        os.replace(tmp, path)
        old = time.time() - CACHE_DAYS * 86400
        for other in path.parent.glob("*.json"):
            if other.stat().st_mtime < old:
                other.unlink()
    except OSError as err:
        logger.debug("verl-ascend-ext: feature scan cache not written at %s: %s", path, err)
        with contextlib.suppress(OSError):  # it may never have been created
            tmp.unlink()


def scan_installed(group: str) -> Found:
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
