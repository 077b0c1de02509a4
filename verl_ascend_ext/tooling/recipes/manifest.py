"""A recipe's dependency manifest and its comparison with what is installed here.

The manifest (TOML) pins packages by version specifier and, for packages built from git, by repo,
branch and commit. The installed commit is read from the package's PEP 610 ``direct_url.json``
(``vcs_info.commit_id`` of a ``pip install git+URL@REV``), or, for a ``pip install -e`` of a local
checkout or a module found on ``PYTHONPATH``, from that checkout with ``git rev-parse HEAD``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from verl_ascend_ext.runtime.findings import ERROR, NOT_CHECKED, OK, WARN, Finding

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

WHERE = ("all", "node", "npu", "gpu")
PACKAGE_KEYS = {"distribution", "version", "repo", "branch", "commit", "module", "on", "note"}


class ManifestError(ValueError):
    """A manifest file that does not follow the schema (names the file and the entry)."""


@dataclass(frozen=True)
class PackagePin:
    name: str
    distribution: str
    on: str
    version: str | None = None
    repo: str | None = None
    branch: str | None = None
    commit: str | None = None
    module: str | None = None

    def wanted(self) -> str:
        parts = [self.version or "any version"]
        if self.repo or self.branch or self.commit:
            parts.append(f"{self.repo or '?'}@{self.branch or '?'} {self.commit or '(no commit pinned)'}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Manifest:
    path: Path
    name: str
    title: str
    devices: tuple[str, ...]
    gates: tuple[str, ...]  # the run script must export these on
    packages: tuple[PackagePin, ...]
    expects: tuple[str, ...] = ()  # gates the recipe relies on: they must not be off in the launch environment
    upstream: str = ""
    expects_patches: tuple[str, ...] = ()  # patch ids that must not be predicted off or refused
    forbids: tuple[tuple[str, tuple[str, ...]], ...] = ()  # env var -> values (lower case) that break the recipe


def load_manifest(path: Path) -> Manifest:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ManifestError(f"{path}: cannot read manifest: {err}") from err
    recipe = data.get("recipe")
    if not isinstance(recipe, dict) or "name" not in recipe:
        raise ManifestError(f"{path}: missing [recipe] table with a 'name'")
    devices = tuple(recipe.get("devices", ()))
    if not devices or any(d not in ("npu", "gpu") for d in devices):
        raise ManifestError(f"{path}: [recipe] devices must be a non-empty list of 'npu'/'gpu', got {devices!r}")
    packages = []
    for name, entry in data.get("packages", {}).items():
        unknown = set(entry) - PACKAGE_KEYS
        if unknown:
            raise ManifestError(f"{path}: [packages.{name}] has unknown field(s) {sorted(unknown)}; "
                                f"known: {sorted(PACKAGE_KEYS)}")
        on = entry.get("on", "node")
        if on not in WHERE:
            raise ManifestError(f"{path}: [packages.{name}] on={on!r}; use one of {WHERE}")
        if "version" in entry:
            try:
                SpecifierSet(entry["version"])
            except InvalidSpecifier as err:
                raise ManifestError(f"{path}: [packages.{name}] version {entry['version']!r}: {err}") from err
        commit = entry.get("commit")
        if commit is not None and (len(commit) < 7 or any(c not in "0123456789abcdef" for c in commit.lower())):
            raise ManifestError(f"{path}: [packages.{name}] commit {commit!r} must be at least 7 hex digits")
        packages.append(PackagePin(name=name, distribution=entry.get("distribution", name), on=on,
                                   version=entry.get("version"), repo=entry.get("repo"),
                                   branch=entry.get("branch"), commit=commit, module=entry.get("module")))
    return Manifest(path=path, name=recipe["name"], title=recipe.get("title", ""), devices=devices,
                    gates=tuple(recipe.get("gates", ())), packages=tuple(packages),
                    upstream=recipe.get("upstream", ""), expects=tuple(recipe.get("expects", ())),
                    expects_patches=tuple(recipe.get("expects_patches", ())),
                    forbids=tuple((var, tuple(str(v).lower() for v in values))
                                  for var, values in dict(recipe.get("forbids", {})).items()))


@dataclass(frozen=True)
class Installed:
    """What is installed for one pin: version (None if not a distribution), commit and where it came from."""

    version: str | None
    commit: str | None
    origin: str
    requested_revision: str | None = None
    url: str | None = None


def _git_head(path: Path) -> str | None:
    if not shutil.which("git") or not path.exists():
        return None
    try:
        proc = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _file_url_path(url: str) -> Path | None:
    parsed = urlparse(url)
    return Path(unquote(parsed.path)) if parsed.scheme == "file" else None


def _module_dir(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module.split(".")[0])
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin).parent if spec.origin else None


def inspect_installed(pin: PackagePin) -> Installed | None:
    """Version and commit of what is installed for ``pin``, or None when nothing is."""
    try:
        dist = importlib.metadata.distribution(pin.distribution)
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        version = dist.version
        raw = dist.read_text("direct_url.json")
        if raw is None:
            return Installed(version, None, "a package index or local wheel (no direct_url.json, so no commit)")
        try:
            direct = json.loads(raw)
        except json.JSONDecodeError:
            return Installed(version, None, "an unreadable direct_url.json")
        url = direct.get("url")
        vcs = direct.get("vcs_info")
        if vcs:
            return Installed(version, vcs.get("commit_id"), f"{vcs.get('vcs', 'vcs')} {url} (direct_url.json)",
                             vcs.get("requested_revision"), url)
        if "dir_info" in direct and url:
            local = _file_url_path(url)
            head = _git_head(local) if local else None
            kind = "editable checkout" if direct["dir_info"].get("editable") else "local directory"
            how = "git rev-parse HEAD" if head else "not a git checkout"
            return Installed(version, head, f"{kind} {local} ({how})", None, url)
        return Installed(version, None, f"an archive {url} (direct_url.json has no commit)", None, url)
    if pin.module:
        where = _module_dir(pin.module)
        if where is not None:
            head = _git_head(where)
            how = "git rev-parse HEAD" if head else "not a git checkout"
            return Installed(None, head, f"module {pin.module} at {where}, not pip-installed ({how})")
    return None


def check_pin(pin: PackagePin, device: str, no_device: bool) -> Finding | None:
    """Compare one pin with this install; None when the pin does not concern ``device``."""
    if pin.on in ("npu", "gpu") and pin.on != device:
        return None
    installed = inspect_installed(pin)
    if no_device and pin.on != "all":
        here = f"installed here: {installed.version or installed.origin}" if installed else "not installed here"
        return Finding("manifest", pin.name, NOT_CHECKED,
                       f"needed on {pin.on if pin.on != 'node' else 'training'} nodes only ({here}); "
                       f"wants {pin.wanted()}")
    if installed is None:
        return Finding("manifest", pin.name, ERROR,
                       f"{pin.distribution} is not installed; the recipe was validated with {pin.wanted()}")
    problems: list[str] = []
    notes: list[str] = []
    if pin.version and installed.version is not None:
        try:
            ok = SpecifierSet(pin.version, prereleases=True).contains(Version(installed.version))
        except InvalidVersion:
            ok = False
        if not ok:
            problems.append(f"version {installed.version} is not {pin.version}")
    elif pin.version:
        notes.append(f"version unknown (not pip-installed), wanted {pin.version}")
    if pin.commit:
        if installed.commit is None:
            notes.append(f"commit not verifiable: installed from {installed.origin}; wanted {pin.commit}")
        elif not installed.commit.lower().startswith(pin.commit.lower()):
            problems.append(f"commit {installed.commit[:12]} is not {pin.commit} (installed from {installed.origin})")
    if pin.branch and installed.requested_revision and installed.requested_revision != pin.branch \
            and not (pin.commit and installed.requested_revision.startswith(pin.commit)):
        notes.append(f"requested revision {installed.requested_revision!r}, manifest branch {pin.branch!r}")
    have = f"{installed.version or '?'}" + (f" @ {installed.commit[:12]}" if installed.commit else "")
    if problems:
        return Finding("manifest", pin.name, ERROR,
                       f"{'; '.join(problems + notes)} (manifest: {pin.wanted()})")
    if notes:
        return Finding("manifest", pin.name, WARN, f"{have}: {'; '.join(notes)}")
    return Finding("manifest", pin.name, OK, f"{have} matches {pin.wanted()}")


def check_manifest(manifest: Manifest, device: str, no_device: bool) -> list[Finding]:
    findings = [f for pin in manifest.packages if (f := check_pin(pin, device, no_device)) is not None]
    if device not in manifest.devices:
        findings.append(Finding("manifest", "device", ERROR,
                                f"recipe {manifest.name} supports {', '.join(manifest.devices)}, not {device}"))
    return findings


def summary(manifest: Manifest) -> dict[str, Any]:
    return {"name": manifest.name, "title": manifest.title, "devices": list(manifest.devices),
            "gates": list(manifest.gates), "expects": list(manifest.expects), "upstream": manifest.upstream,
            "packages": [{"name": p.name, "distribution": p.distribution, "on": p.on, "version": p.version,
                          "repo": p.repo, "branch": p.branch, "commit": p.commit} for p in manifest.packages]}
