"""Releases a contract runs on: a directory holding a release's top-level packages and its ``.dist-info``.

A release comes from an artifact (a wheel, an sdist or a source directory, read as ``verl-ascend vet`` reads
them: ``tooling.vet.open_artifact``), from the installed environment, or from another release with a source
diff applied (a fix in the shape upstream would write it, e.g. ``patches/``). Every release tree carries a
``<name>-<version>.dist-info/METADATA`` (written when the artifact has none), so that a process with the tree
first on ``sys.path`` reports that version through ``importlib.metadata``, as the engine reads it.
``link_copy`` makes a tree another process can change one file of without touching the original (links to
the release's files and folders but on the way to that file), for mutants.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import NamedTuple

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from verl_ascend_ext.patching.distributions import installed
from verl_ascend_ext.patching.record import PatchRecord
from verl_ascend_ext.patching.source import Lookup, canonical_name, find_module_file


class Release(NamedTuple):
    """One release of one distribution, readable (and maybe importable) from ``root``."""

    distribution: str  # canonical name, e.g. "vllm-ascend"
    version: str
    root: Path  # holds the top-level package(s) and <name>-<version>.dist-info/
    label: str  # where it came from, e.g. "verl-0.9.1-py3-none-any.whl"
    # Its modules import for real here (a pure-Python release whose dependencies are installed, or the installed
    # one); otherwise the in-process half runs on its definitions compiled from its files (``standin``).
    importable: bool = False
    # When set, the only records this release is for (e.g. a release with one record's diff applied: the other
    # records' checks would repeat those on the release it was made from).
    only: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.distribution} {self.version} ({self.label})"

    def lookup(self) -> Lookup:
        """What ``looking_in`` needs to predict on this release as vet does."""
        return Lookup((self.root,), {self.distribution: self.version})

    def covers(self, record: PatchRecord) -> bool:
        """Whether ``record`` concerns this release: its distribution, a version in its ``versions``."""
        if canonical_name(record.distribution) != self.distribution or (self.only and record.id not in self.only):
            return False
        try:
            return Version(self.version) in SpecifierSet(record.versions)
        except InvalidVersion:
            return False


def _dist_info(root: Path, distribution: str, version: str) -> None:
    """Write ``<name>-<version>.dist-info/METADATA`` into ``root`` unless a .dist-info of that name is there."""
    stem = distribution.replace("-", "_")
    if any(p.name.lower().startswith(f"{stem}-") for p in root.glob("*.dist-info")):
        return
    info = root / f"{stem}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n",
                                   encoding="utf-8")


def from_artifact(path: str | os.PathLike[str], work: Path, *, importable: bool = False) -> Release:
    """The release in a wheel, sdist or source directory, unpacked under ``work`` (vet's reading).

    ``importable``: a wheel is unpacked whole (not only its Python files), for a real import of its modules.
    """
    from verl_ascend_ext.tooling.vet import open_artifact

    artifact = open_artifact(str(path), work / "artifact")
    distribution = artifact.distribution
    root = work / "release"
    if importable and artifact.kind == "wheel":
        with zipfile.ZipFile(path) as archive:
            archive.extractall(root)
    else:
        copy_packages(artifact.root, root, artifact.packages)
    _dist_info(root, distribution, artifact.version)
    return Release(distribution, artifact.version, root, Path(path).name, importable)


def from_tree(tree: str | os.PathLike[str], distribution: str, version: str, work: Path, label: str = "") -> Release:
    """A source directory holding ``distribution``'s top-level package(s), as release ``version``."""
    root = work / "release"
    copy_packages(Path(tree), root, tuple(p.name for p in Path(tree).iterdir() if p.is_dir()))
    _dist_info(root, canonical_name(distribution), version)
    return Release(canonical_name(distribution), version, root, label or str(tree))


def installed_release(distribution: str, work: Path, package: str | None = None) -> Release:
    """The release installed in this environment, importable: a tree under ``work`` whose package folder and
    .dist-info are links to the installed ones (so it can be put first on ``sys.path`` like any other)."""
    found = installed(distribution)
    if found is None:
        raise LookupError(f"{distribution} is not installed in this environment")
    top = package or distribution.replace("-", "_")
    init = find_module_file(top)
    if init is None or init.name != "__init__.py":
        raise LookupError(f"{distribution} is installed but its package {top} has no Python source here")
    site = init.parent.parent
    root = work / "release"
    root.mkdir(parents=True)
    os.symlink(init.parent, root / top, target_is_directory=True)
    stem = found.name.replace("-", "_").lower()
    for info in site.glob("*.dist-info"):
        if info.name.lower().startswith(f"{stem}-{found.version}.".lower()) or \
                info.name.lower() == f"{stem}-{found.version}.dist-info".lower():
            os.symlink(info, root / info.name, target_is_directory=True)
    _dist_info(root, canonical_name(found.name), found.version)
    return Release(canonical_name(distribution), found.version, root, f"installed in {site}", True)


def with_diff(release: Release, diff: str | os.PathLike[str], work: Path) -> Release:
    """``release`` with a unified diff (``patch -p1``, paths relative to the root) applied: a fix in upstream's form."""
    root = work / "release"
    copy_packages(release.root, root, None)
    proc = subprocess.run(["patch", "-p1", "--forward", "-d", str(root), "-i", str(diff)], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{diff} does not apply to {release.name}:\n{proc.stdout}{proc.stderr}")
    return release._replace(root=root, label=f"{release.label} + {Path(diff).name}")


def copy_packages(source: Path, dest: Path, packages: tuple[str, ...] | None) -> None:
    """Copy ``packages`` (None: everything, and the .dist-info folders always) of ``source`` to ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for entry in sorted(source.iterdir()):
        if packages is None or entry.name in packages or entry.name.endswith(".dist-info"):
            if entry.is_dir():
                shutil.copytree(entry, dest / entry.name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(entry, dest / entry.name)


def link_copy(release: Release, dest: Path, changing: Path) -> Release:
    """A tree at ``dest`` that reads as ``release`` but lets ``changing`` (a file of it) be replaced (fast).

    Only the folders on the way to ``changing`` are made; everything else is a symbolic link to ``release``'s,
    whole folders where possible (a mutant of a large release costs a few dozen links, not one per file).
    """
    relative = changing.relative_to(release.root)
    source, target = release.root, dest
    for part in relative.parts:
        target.mkdir(parents=True, exist_ok=True)
        for entry in source.iterdir():
            if entry.name != part and entry.name != "__pycache__":
                os.symlink(entry, target / entry.name, target_is_directory=entry.is_dir())
        source, target = source / part, target / part
    os.symlink(source, target)
    return release._replace(root=dest)


def replace_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` in a ``link_copy`` tree (the link is replaced, its target untouched)."""
    if path.is_symlink():
        path.unlink()
    path.write_text(text, encoding="utf-8")
