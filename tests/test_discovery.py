"""The feature scan (``runtime.discovery``) finds what ``importlib.metadata.entry_points`` finds, on real dist-info
directories and a zip on ``sys.path``: every distribution naming the group, the first of a name on ``sys.path``
winning (whether or not it names the group), none of those that do not name it."""

from __future__ import annotations

import importlib.metadata
import zipfile
from pathlib import Path

import pytest

from verl_ascend_ext.runtime import discovery

GROUP = "verl_ascend_ext.features"


def dist_info(root: Path, name: str, version: str, entry_points: str | None) -> None:
    d = root / f"{name.replace('-', '_')}-{version}.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if entry_points is not None:
        (d / "entry_points.txt").write_text(entry_points)


def zipped(path: Path, name: str, version: str, entry_points: str) -> None:
    stem = f"{name.replace('-', '_')}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{stem}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        archive.writestr(f"{stem}/entry_points.txt", entry_points)


def expected(group: str) -> list[tuple[str, str, str]]:
    """What importlib.metadata finds (it keeps the first distribution of a name on sys.path)."""
    return sorted((ep.dist.metadata["Name"], ep.name, ep.value)
                  for ep in importlib.metadata.entry_points(group=group))


def found(group: str) -> list[tuple[str, str, str]]:
    return sorted((name, ep.name, ep.value) for name, ep in discovery.scan(group))


def test_the_scan_finds_what_importlib_metadata_finds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second, archive = tmp_path / "first", tmp_path / "second", tmp_path / "dists.zip"
    dist_info(first, "feature-a", "1.0", f"[{GROUP}]\na = feature_a.declaration\n[console_scripts]\nx = y:z\n")
    dist_info(first, "plain", "2.0", "[console_scripts]\nplain = plain:main\n")
    dist_info(first, "no-entry-points", "1.0", None)
    dist_info(second, "feature-a", "0.9", f"[{GROUP}]\nold = feature_a.old\n")  # shadowed by first's
    dist_info(second, "feature_b", "1.0", f"[{GROUP}]\nb = feature_b.declaration\n")
    dist_info(first, "Shadow.Pkg", "2.0", "[console_scripts]\nshadow = shadow:main\n")  # the first: no features
    dist_info(second, "shadow-pkg", "1.0", f"[{GROUP}]\nshadowed = shadow.declaration\n")
    zipped(archive, "feature-c", "1.0", f"[{GROUP}]\nc = feature_c.declaration\n")
    monkeypatch.setattr("sys.path", [str(first), str(tmp_path / "missing"), str(second), str(archive)])
    assert found(GROUP) == expected(GROUP) == [
        ("feature-a", "a", "feature_a.declaration"), ("feature-c", "c", "feature_c.declaration"),
        ("feature_b", "b", "feature_b.declaration")]
    assert found("console_scripts") == expected("console_scripts")
    assert found("nobody.declares.this") == []


def test_the_name_is_the_metadata_header_not_the_directory_nor_the_description(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan reads only the metadata's headers for the name; it is the header's spelling wherever it stands
    among them, never a ``Name:`` line of the long description, and an egg-info's ``PKG-INFO`` counts too."""
    site = tmp_path / "site"
    dist_info(site, "Feature.Dotted", "1.0", f"[{GROUP}]\nd = feature_dotted.declaration\n")
    (site / "Feature.Dotted-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nVersion: 1.0\nSummary: a name after other headers\nName: Feature.Dotted\n\n"
        "Name: not-this-one\n" + "long description\n" * 2000)
    egg = site / "feature_egg-2.0.egg-info"
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 1.1\nName: feature-egg\nVersion: 2.0\n")
    (egg / "entry_points.txt").write_text(f"[{GROUP}]\ne = feature_egg.declaration\n")
    monkeypatch.setattr("sys.path", [str(site)])
    assert found(GROUP) == expected(GROUP) == [
        ("Feature.Dotted", "d", "feature_dotted.declaration"), ("feature-egg", "e", "feature_egg.declaration")]
