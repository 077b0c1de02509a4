"""Distributions installed more than once on ``sys.path`` (an editable checkout over a wheel, two site-packages).

``importlib.metadata`` (and so pip and the doctor's version column) reports the first ``*.dist-info``
found along ``sys.path``; ``import`` uses whatever the import system finds first, which for an editable
install is the checkout its finder or ``.pth`` points at. With two copies the version shown and the
code run can differ. For each distribution with more than one metadata directory this reports every
copy (path, version, editable source) in ``sys.path`` order, the module Python imports (located with
``importlib.util.find_spec``, which does not import a top-level module) and which copy owns it.
"""

from __future__ import annotations

import csv
import importlib.metadata
import importlib.util
import json
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import unquote, urlparse


def _meta_path(dist: importlib.metadata.Distribution) -> str:
    # PathDistribution keeps its metadata directory in ``_path`` (pip reads it the same way); other
    # distribution kinds fall back to the location their files are relative to.
    path = getattr(dist, "_path", None)
    return os.path.realpath(str(path if path is not None else dist.locate_file("")))


def _source(dist: importlib.metadata.Distribution) -> tuple[bool, str | None]:
    """(editable, local directory or URL it was installed from) per PEP 610 ``direct_url.json``."""
    raw = dist.read_text("direct_url.json")
    if not raw:
        return False, None
    try:
        direct = json.loads(raw)
    except json.JSONDecodeError:
        return False, None
    url = direct.get("url")
    editable = bool(direct.get("dir_info", {}).get("editable"))
    parsed = urlparse(url or "")
    return editable, unquote(parsed.path) if parsed.scheme == "file" else url


def _top_level(dist: importlib.metadata.Distribution, name: str) -> str:
    text = dist.read_text("top_level.txt")
    names = [line.strip() for line in (text or "").splitlines() if line.strip() and not line.startswith("_")]
    return names[0] if names else name.replace("-", "_").lower()


def _owner(copies: list[dict[str, Any]], dists: list[importlib.metadata.Distribution], origin: str) -> str | None:
    real = os.path.realpath(origin)
    for copy, dist in zip(copies, dists, strict=True):
        if copy["editable"] and copy["source"] and real.startswith(os.path.realpath(copy["source"]) + os.sep):
            return copy["path"]
        try:
            files = dist.files or ()
        except (OSError, ValueError, csv.Error):  # an unreadable or malformed RECORD owns nothing
            files = ()
        for file in files:
            if os.path.realpath(str(dist.locate_file(file))) == real:
                return copy["path"]
    return None


def find_duplicates(name: str, path: Sequence[str] | None = None) -> dict[str, Any] | None:
    """Every copy of distribution ``name`` on ``path`` (default ``sys.path``), or None when there is at most one."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    for dist in importlib.metadata.distributions(name=name, path=list(sys.path if path is None else path)):
        seen.setdefault(_meta_path(dist), dist)
    if len(seen) < 2:
        return None
    found = []
    for meta, dist in seen.items():
        editable, source = _source(dist)
        found.append(({"path": meta, "version": dist.version, "editable": editable, "source": source}, dist))
    # ``pip install -e DIR`` (setuptools) leaves DIR/<name>.egg-info behind: the editable install's own build
    # metadata, seen when Python runs from DIR, not a second install.
    sources = {os.path.realpath(c["source"]) for c, _ in found if c["editable"] and c["source"]}
    found = [(c, d) for c, d in found
             if not (c["path"].endswith(".egg-info") and os.path.dirname(c["path"]) in sources)]
    if len(found) < 2:
        return None
    copies = [c for c, _ in found]
    dists = [d for _, d in found]
    module = _top_level(dists[0], name)
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    origin = None
    if spec is not None:
        origin = spec.origin if spec.origin not in (None, "namespace") else next(
            iter(spec.submodule_search_locations or ()), None)
    return {"distribution": name, "copies": copies, "module": module, "origin": origin,
            "imported_copy": _owner(copies, dists, origin) if origin else None}


def duplicate_installs(names: Iterable[str]) -> list[dict[str, Any]]:
    return [found for name in names if (found := find_duplicates(name)) is not None]


def describe(dup: dict[str, Any]) -> str:
    """One line for the doctor: both paths, which one Python imports, which one pip reports, the fix."""
    def copy_text(copy: dict[str, Any]) -> str:
        how = f", editable from {copy['source']}" if copy["editable"] else (
            f", from {copy['source']}" if copy["source"] else "")
        return f"{copy['path']} ({copy['version']}{how})"

    copies = dup["copies"]
    if dup["origin"] is None:
        imports = f"Python finds no module {dup['module']!r}"
    elif dup["imported_copy"]:
        imports = f"Python imports {dup['module']} from {dup['origin']}, the copy of {dup['imported_copy']}"
    else:
        imports = f"Python imports {dup['module']} from {dup['origin']}, which no copy's RECORD lists"
    return (f"{len(copies)} installs on sys.path: " + "; ".join(copy_text(c) for c in copies)
            + f". {imports}; pip and the version column report {copies[0]['version']} from {copies[0]['path']}. "
            f"Uninstall until one remains (`pip uninstall {dup['distribution']}` removes the first) or delete the "
            "stale directory.")


def fact(dup: dict[str, Any]) -> str:
    """The comparable summary doctor --ray uses: versions and kinds in sys.path order (no machine paths)."""
    return ", ".join(f"{c['version']}{' (editable)' if c['editable'] else ''}" for c in dup["copies"])
