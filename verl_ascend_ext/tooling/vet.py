"""`verl-ascend vet ARTIFACT...`: every patch's status against a release before it is installed.

An ARTIFACT is a wheel, an sdist or a source directory (a checkout, an unpacked sdist, or the package
folder itself) of verl, vLLM or vLLM-Ascend. Archives are unpacked (Python files and metadata only) into a
temporary directory; nothing is installed or imported. The artifacts together stand for the environment:
doctor's own prediction (``prediction.predict_all``) runs with module files and versions looked up in them only
(``source.looking_in``) and with every gate on, as the GLM-5.2 recipe sets them. Exit 1 when a gated patch
would be refused, 2 on unusable input.

An artifact's version comes from its metadata (PKG-INFO, METADATA), a version file (verl), or, for a git checkout
with neither, ``git describe --tags`` (the nearest tag: assumed, and said so), else it is unknown. A status never
depends on it (records recognise code, not versions); what it tells is whether the vetted release lies in the
releases each record's code was read on (``ranges``): outside them, the status stands on the fingerprint alone.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
import tempfile
import zipfile
from email.parser import HeaderParser
from pathlib import Path
from typing import Any, NamedTuple

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from verl_ascend_ext.patching.engine import source_definition
from verl_ascend_ext.patching.prediction import predict_all
from verl_ascend_ext.patching.record import NEEDS_ATTENTION, PatchRecord, Status
from verl_ascend_ext.patching.source import Lookup, canonical_name, find_module_file, looking_in
from verl_ascend_ext.runtime.registry import registry

FOREIGN_PACKAGES = {"verl": "verl"}  # top-level packages of other copies' owners (ForeignCopy targets)
VERSION_FILES = ("verl/version/version",)  # a verl checkout keeps its version here
UNKNOWN = "unknown"
GIT_DESCRIBE = re.compile(r"^v?(?P<tag>.+?)(?:-(?P<ahead>\d+)-g[0-9a-f]+)?$")  # v0.25.1rc1-12-g1a2b3c4


class ArtifactError(ValueError):
    """An ARTIFACT argument that cannot be vetted (the message names it and says what to pass instead)."""


class Artifact(NamedTuple):
    path: str  # as given
    kind: str  # wheel | sdist | directory
    root: Path  # directory holding its top-level package(s)
    shown: str  # how paths under ``root`` are shown (archives: "ARTIFACT!"; a package folder: its parent)
    packages: tuple[str, ...]  # top-level packages found
    distribution: str  # the main one (the first whose version is known)
    version: str
    versions: dict[str, str]  # every distribution found -> version
    sources: dict[str, str]  # every distribution found -> where its version came from (or why it is unknown)


def top_packages() -> dict[str, str]:
    """Top-level package -> distribution, for every package a record or a foreign copy reads."""
    tops = dict(FOREIGN_PACKAGES)
    for record in registry().records:
        tops[record.module.split(".")[0]] = record.distribution
    return tops


def _metadata(path: Path) -> tuple[str, str] | None:
    headers = HeaderParser().parsestr(path.read_text(encoding="utf-8", errors="replace"))
    name, version = headers.get("Name"), headers.get("Version")
    return (name, version) if name and version else None


def _metadata_in(dirs: list[Path], wanted: set[str]) -> tuple[str, str] | None:
    """(name, version) from the first metadata file in ``dirs`` naming one of the ``wanted`` distributions."""
    for d in dirs:
        for pattern in ("PKG-INFO", "*.dist-info/METADATA", "*.egg-info/PKG-INFO"):
            for found in sorted(d.glob(pattern)):
                meta = _metadata(found)
                if meta is not None and canonical_name(meta[0]) in wanted:
                    return meta
    return None


def _packages_in(d: Path, tops: dict[str, str]) -> tuple[str, ...]:
    return tuple(sorted(t for t in tops if (d / t).is_dir()))


def _tree(given: str, kind: str, d: Path, scratch: Path) -> Artifact:
    """The artifact in directory ``d``: a package folder, or a tree holding one (directly, in src/, one level down)."""
    tops = top_packages()
    if d.name in tops and not _packages_in(d, tops) and not _packages_in(d / "src", tops):
        scratch.mkdir(parents=True, exist_ok=True)
        (scratch / d.name).symlink_to(d.resolve(), target_is_directory=True)  # only this package, not its siblings
        root, packages, meta_dirs = scratch, (d.name,), [d.parent]
        shown = str(d.resolve().parent)
    else:
        candidates = [d, d / "src", *sorted(p for p in d.iterdir() if p.is_dir())] if d.is_dir() else []
        root = next((c for c in candidates if _packages_in(c, tops)), None)
        if root is None:
            raise ArtifactError(
                f"{given}: no package this plugin patches was found in this {kind} (looked for "
                f"{', '.join(f'{t}/' for t in sorted(tops))} in it, in src/ and one folder down). "
                "Pass a wheel, an sdist, a checkout or the package folder of verl, vLLM or vLLM-Ascend.")
        packages, meta_dirs = _packages_in(root, tops), [root, d]
        inner = root.relative_to(d).as_posix()
        shown = str(root) if kind == "directory" else f"{given}!" + ("" if inner == "." else f"/{inner}")
    found = {canonical_name(tops[p]): _artifact_version(p, tops[p], root, meta_dirs, d if kind == "directory" else None)
             for p in packages}
    versions = {dist: version for dist, (version, _) in found.items()}
    sources = {dist: source for dist, (_, source) in found.items()}
    distribution = next((d for d, v in versions.items() if v != UNKNOWN), next(iter(versions)))
    return Artifact(given, kind, root, shown, packages, distribution, versions[distribution], versions, sources)


def _artifact_version(package: str, distribution: str, root: Path, meta_dirs: list[Path],
                      tree: Path | None) -> tuple[str, str]:
    """The version of ``distribution`` in an artifact (not the installed one) and where it came from: its metadata
    (PKG-INFO, METADATA), a version file, for a directory in a git checkout the nearest tag (``git_version``),
    else "unknown" with why."""
    meta = _metadata_in(meta_dirs, {canonical_name(distribution)})
    if meta is not None:
        return meta[1], "metadata"
    for rel in VERSION_FILES:
        if rel.split("/")[0] == package and (root / rel).is_file():
            return (root / rel).read_text(encoding="utf-8").strip(), f"version file {rel}"
    if tree is not None:
        found = git_version(tree)
        if found is not None:
            return found
    return UNKNOWN, "no metadata, no version file" + ("" if tree is None else ", no git tag")


def git_version(tree: Path) -> tuple[str, str] | None:
    """(version, how it was assumed) of a git checkout from ``git describe --tags``: its nearest tag, as a PEP 440
    version; None when ``tree`` is not in a git checkout, has no tag, or git is not there."""
    try:
        proc = subprocess.run(["git", "-C", str(tree), "describe", "--tags"], capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    described = proc.stdout.strip()
    match = GIT_DESCRIBE.match(described)
    if proc.returncode != 0 or match is None:
        return None
    try:
        version = str(Version(match["tag"]))
    except InvalidVersion:
        return None
    ahead = f", {match['ahead']} commit(s) after it" if match["ahead"] else ""
    return version, f"assumed from git describe: {described} (the nearest tag{ahead})"


def _wanted(name: str) -> bool:
    return name.endswith((".py", "/METADATA", "/PKG-INFO")) or name in VERSION_FILES or any(
        name.endswith("/" + v) for v in VERSION_FILES)


def _unpack_wheel(given: str, dest: Path) -> None:
    try:
        with zipfile.ZipFile(given) as archive:
            for member in archive.namelist():
                if _wanted(member):
                    archive.extract(member, dest)
    except (zipfile.BadZipFile, OSError) as err:
        raise ArtifactError(f"{given}: not a readable wheel ({err}). Pass a .whl file as downloaded.") from err


def _unpack_sdist(given: str, dest: Path) -> None:
    try:
        if given.endswith(".zip"):
            with zipfile.ZipFile(given) as archive:
                for member in archive.namelist():
                    if _wanted(member):
                        archive.extract(member, dest)
            return
        with tarfile.open(given) as archive:
            members = [m for m in archive.getmembers() if m.isfile() and _wanted(m.name)]
            archive.extractall(dest, members=members, filter="data")
    except (tarfile.TarError, zipfile.BadZipFile, OSError) as err:
        raise ArtifactError(f"{given}: not a readable sdist ({err}). Pass a .tar.gz or .zip source archive.") from err


def open_artifact(given: str, scratch: Path) -> Artifact:
    """Identify ``given`` and make its packages readable under ``scratch`` (unpacked when it is an archive)."""
    path = Path(given)
    if not path.exists():
        raise ArtifactError(f"{given}: no such file or directory.")
    if path.is_dir():
        return _tree(given, "directory", path, scratch / "package")
    unpacked = scratch / "unpacked"
    if path.name.endswith(".whl"):
        _unpack_wheel(given, unpacked)
        return _tree(given, "wheel", unpacked, scratch / "package")
    if path.name.endswith((".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".zip")):
        _unpack_sdist(given, unpacked)
        return _tree(given, "sdist", unpacked, scratch / "package")
    raise ArtifactError(f"{given}: not a wheel (.whl), an sdist (.tar.gz, .zip) or a directory.")


def module_files(distribution: str) -> list[str]:
    """Relative paths of every file vet may read for ``distribution`` (both forms of each module: mod.py and
    mod/__init__.py); the fetch script keeps just these when it caches a large wheel."""
    modules = set()
    for record in registry().records:
        if canonical_name(record.distribution) == canonical_name(distribution):
            modules.add(record.module)
            shapes = [record.original, record.fixed, *record.fixed_shapes, *record.changes,
                      *(v.original for v in record.variants), *record.covered_shapes]
            parts = [*shapes, *(part for shape in shapes for part in shape.also)]
            modules.update(f.at.partition(":")[0] for f in parts if ":" in f.at)
        for copy in record.foreign_copies:
            module = copy.target.partition(":")[0]
            if FOREIGN_PACKAGES.get(module.split(".")[0]) == canonical_name(distribution):
                modules.add(module)
    paths = set()
    for module in modules:
        base = module.replace(".", "/")
        paths.update({f"{base}.py", f"{base}/__init__.py"})
    return sorted(paths)


def _foreign_copies(records: tuple[PatchRecord, ...]) -> list[dict[str, Any]]:
    """Other packages' copies of our fixes present in the artifacts, and whether each is the one we know."""
    rows, seen = [], set()
    for record in records:
        for copy in record.foreign_copies:
            key = (copy.target, copy.fingerprint)
            if key in seen or find_module_file(copy.target.partition(":")[0]) is None:
                continue
            seen.add(key)
            found = source_definition(copy.target)
            if found is None:  # e.g. verl 0.9.0: the module is there, the copy is not
                continue
            rows.append({"name": copy.name, "target": copy.target, "what": copy.fingerprint.description,
                         "where": found.where, "recognised": copy.fingerprint.matches(found.text),
                         "enabled_by": f"{record.gate.env} in {{{', '.join(copy.enabled_by)}}}" if copy.enabled_by
                         else "always"})
    return rows


def vet(paths: list[str]) -> tuple[dict[str, Any], int]:
    """The vet report for ``paths`` and its exit code (0 fine, 1 a gated patch would be refused, 2 bad input)."""
    with tempfile.TemporaryDirectory(prefix="verl-ascend-vet-") as tmp:
        try:
            artifacts = [open_artifact(p, Path(tmp) / str(i)) for i, p in enumerate(paths)]
        except ArtifactError as err:
            return {"artifacts": [], "ranges": [], "patches": [], "foreign_copies": [], "errors": [str(err)],
                    "exit_code": 2}, 2
        owners: dict[str, str] = {}
        for a in artifacts:
            for package in a.packages:
                if package in owners:
                    message = (f"{a.path}: package '{package}' is also in {owners[package]}; vet one release of "
                               "each package at a time.")
                    return {"artifacts": [], "ranges": [], "patches": [], "foreign_copies": [], "errors": [message],
                            "exit_code": 2}, 2
                owners[package] = a.path
        reg = registry()
        lookup = Lookup(tuple(a.root for a in artifacts), {d: v for a in artifacts for d, v in a.versions.items()})
        environ = {gate.env: "1" for gate in reg.gates}
        statuses = predict_all(reg.records, environ, lookup=lookup).statuses
        patches = [status.as_dict() for status in statuses]
        with looking_in(lookup):
            copies = _foreign_copies(reg.records)
        names = {str(a.root): a.shown for a in artifacts}
        for row in [*patches, *copies]:
            for key in ("detail", "where") & row.keys():
                row[key] = shown_paths(row[key], names)
        for row, status, record in zip(patches, statuses, reg.records, strict=True):
            row["distribution"] = record.distribution
            if status.status is Status.NOT_INSTALLED:
                row["detail"] = f"no {record.distribution} among the vetted artifacts"
    refused = any(s.status is Status.REFUSED for s in statuses)
    code = 1 if refused else 0
    report = {
        "artifacts": [{"path": a.path, "kind": a.kind, "distribution": a.distribution, "version": a.version,
                       "version_source": a.sources[a.distribution], "packages": list(a.packages),
                       "versions": a.versions, "version_sources": a.sources} for a in artifacts],
        "ranges": ranges(reg.records, {d: v for a in artifacts for d, v in a.versions.items()}),
        "gates": sorted(environ),
        "patches": patches,
        "foreign_copies": copies,
        "errors": [],
        "exit_code": code,
    }
    return report, code


def ranges(records: tuple[PatchRecord, ...], versions: dict[str, str]) -> list[dict[str, Any]]:
    """For each vetted distribution's records: the releases its code was read on (the record's ``versions``) and
    whether the vetted version lies in them, with what that means for its status."""
    rows = []
    for record in records:
        version = versions.get(canonical_name(record.distribution))
        if version is None:
            continue
        try:
            inside = Version(version) in SpecifierSet(record.versions, prereleases=True)
        except InvalidVersion:
            inside = None
        meaning = {
            True: "inside: the record was written on this code; its status is the fingerprint's verdict on it",
            False: "outside: the record was read on other releases; its status stands on the fingerprint alone "
                   "(fixed-upstream / refused / will-apply by what the code does)",
            None: "cannot tell (the version is unknown); the status comes from the code alone",
        }[inside]
        rows.append({"id": record.id, "distribution": record.distribution, "versions": record.versions,
                     "vetted": version, "inside": inside, "meaning": meaning})
    return rows


def shown_paths(text: str, names: dict[str, str]) -> str:
    """Paths inside the scratch directory shown as ``ARTIFACT!/path/in/it`` (a package folder: its real path)."""
    for root in sorted(names, key=len, reverse=True):
        text = text.replace(root + os.sep, names[root] + "/")
    return text


def format_report(report: dict[str, Any]) -> str:
    from verl_ascend_ext.tooling import tables

    out = ["verl-ascend vet", ""]
    if report["artifacts"]:
        out += ["Artifacts"]
        out.append(tables.table([[a["distribution"], a["version"], a["version_source"], a["kind"], a["path"]]
                                 for a in report["artifacts"]], ["distribution", "version", "from", "kind", "path"]))
        out += ["", "What the versions mean for each record's range (the releases its code was read on)"]
        out.append(tables.table([[r["id"], r["versions"], r["vetted"], r["meaning"]] for r in report["ranges"]],
                                ["id", "range", "vetted", "meaning"]))
        out += ["", f"Patches (as if installed, with {', '.join(report['gates'])} on)"]
        out.append(tables.table([[p["id"], p["status"], p["target"]] for p in report["patches"]],
                          ["id", "status", "target"]))
        for p in report["patches"]:
            if p["status"] in NEEDS_ATTENTION:
                out.append(f"  {p['id']}: {p['detail']}")
        out += ["", "Foreign copies of these fixes found in the artifacts"]
        if report["foreign_copies"]:
            out.append(tables.table([[c["target"], c["what"], "recognised" if c["recognised"] else "not this copy",
                                c["where"], c["enabled_by"]]
                               for c in report["foreign_copies"]],
                              ["copy (function)", "what it does", "status", "where", "enabled when"]))
        else:
            out.append("  none")
    for err in report["errors"]:
        out += [f"error: {err}"]
    out += ["", {0: "OK", 1: "A GATED PATCH WOULD BE REFUSED (exit 1)",
                 2: "UNUSABLE INPUT (exit 2)"}[report["exit_code"]]]
    return "\n".join(out)


def main(paths: list[str], as_json: bool = False) -> int:
    report, code = vet(paths)
    print(json.dumps(report, indent=2) if as_json else format_report(report))
    return code
