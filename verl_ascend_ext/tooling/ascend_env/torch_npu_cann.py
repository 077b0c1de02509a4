"""Which CANN toolkit each torch_npu release is built for: the matching table torch_npu publishes, as data.

Source: Ascend/pytorch ``COMPATIBILITY.en.md`` ("TorchNPU version mapping table", active versions and
the expanded history back to CANN 8.0.RC1), at commit 9e73e708ab9350d203475609f36f8a43f6a0c2ab
(2026-08-21). Columns kept: TorchNPU installation package version, CANN version, GitCode branch.
Update this table, and its commit, when torch_npu publishes a new row.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from verl_ascend_ext.runtime.findings import INFO, OK, WARN, Finding

SOURCE = "Ascend/pytorch COMPATIBILITY.en.md (TorchNPU version mapping table) @ 9e73e708ab93"

# (torch_npu package version, CANN version, torch_npu branch)
TABLE: tuple[tuple[str, str, str], ...] = (
    ("2.12.0", "9.1.0", "v2.12.0-26.1.0"),
    ("2.11.0", "9.1.0", "v2.11.0-26.1.0"),
    ("2.10.0.post4", "9.1.0", "v2.10.0-26.1.0"),
    ("2.9.0.post6", "9.1.0", "v2.9.0-26.1.0"),
    ("2.7.1.post8", "9.1.0", "v2.7.1-26.1.0"),
    ("2.9.0.post2", "9.0.0", "v2.9.0-26.0.0"),
    ("2.8.0.post4", "9.0.0", "v2.8.0-26.0.0"),
    ("2.7.1.post4", "9.0.0", "v2.7.1-26.0.0"),
    ("2.9.0", "8.5.0", "v2.9.0-7.3.0"),
    ("2.8.0.post2", "8.5.0", "v2.8.0-7.3.0"),
    ("2.7.1.post2", "8.5.0", "v2.7.1-7.3.0"),
    ("2.6.0.post5", "8.5.0", "v2.6.0-7.3.0"),
    ("2.8.0", "8.3.RC1", "v2.8.0-7.2.0"),
    ("2.7.1", "8.3.RC1", "v2.7.1-7.2.0"),
    ("2.6.0.post3", "8.3.RC1", "v2.6.0-7.2.0"),
    ("2.1.0.post17", "8.3.RC1", "v2.1.0-7.2.0"),
    ("2.6.0", "8.2.RC1", "v2.6.0-7.1.0"),
    ("2.5.1.post1", "8.2.RC1", "v2.5.1-7.1.0"),
    ("2.1.0.post13", "8.2.RC1", "v2.1.0-7.1.0"),
    ("2.5.1", "8.1.RC1", "v2.5.1-7.0.0"),
    ("2.4.0.post4", "8.1.RC1", "v2.4.0-7.0.0"),
    ("2.3.1.post6", "8.1.RC1", "v2.3.1-7.0.0"),
    ("2.1.0.post12", "8.1.RC1", "v2.1.0-7.0.0"),
    ("2.4.0.post2", "8.0.0", "v2.4.0-6.0.0"),
    ("2.3.1.post4", "8.0.0", "v2.3.1-6.0.0"),
    ("2.1.0.post10", "8.0.0", "v2.1.0-6.0.0"),
    ("2.4.0", "8.0.RC3", "v2.4.0-6.0.rc3"),
    ("2.3.1.post2", "8.0.RC3", "v2.3.1-6.0.rc3"),
    ("2.1.0.post8", "8.0.RC3", "v2.1.0-6.0.rc3"),
    ("2.3.1", "8.0.RC2", "v2.3.1-6.0.rc2"),
    ("2.2.0.post2", "8.0.RC2", "v2.2.0-6.0.rc2"),
    ("2.1.0.post6", "8.0.RC2", "v2.1.0-6.0.rc2"),
    ("1.11.0.post14", "8.0.RC2", "v1.11.0-6.0.rc2"),
    ("2.2.0", "8.0.RC1", "v2.2.0-6.0.rc1"),
    ("2.1.0.post4", "8.0.RC1", "v2.1.0-6.0.rc1"),
    ("1.11.0.post11", "8.0.RC1", "v1.11.0-6.0.rc1"),
)


def same_cann(a: str, b: str) -> bool:
    """CANN versions are spelled with either case of ``RC`` (8.0.RC3, 8.0.rc3)."""
    return a.strip().lower() == b.strip().lower()


def cann_for(torch_npu_version: str) -> tuple[str, str] | None:
    """(CANN version, branch) the table lists for this torch_npu release (local ``+...`` part ignored), or None."""
    try:
        wanted = Version(torch_npu_version).public
    except InvalidVersion:
        return None
    for release, cann, branch in TABLE:
        if Version(release).public == wanted:
            return cann, branch
    return None


def compatibility(torch_npu_version: str | None, cann_version: str | None) -> Finding | None:
    """Doctor finding ``torch_npu/CANN``: does the installed CANN match the one torch_npu's table names?

    None when torch_npu is not installed (nothing to match). ``cann_version`` is the toolkit version read
    from its install info, None when no toolkit was found, or ``unknown (reason)``.
    """
    if torch_npu_version is None:
        return None
    name = "torch_npu/CANN"
    row = cann_for(torch_npu_version)
    if row is None:
        return Finding.check(name, INFO, f"torch_npu {torch_npu_version} is not in the matching table ({SOURCE}); "
                             "cannot tell which CANN it needs")
    expected, branch = row
    if cann_version is None:
        return Finding.check(name, WARN, f"torch_npu {torch_npu_version} needs CANN {expected} ({SOURCE}), but no "
                             "CANN toolkit was found: source CANN's set_env.sh (it exports ASCEND_TOOLKIT_HOME / "
                             "ASCEND_HOME_PATH)")
    if cann_version.startswith("unknown ("):
        return Finding.check(name, WARN, f"torch_npu {torch_npu_version} needs CANN {expected}; the toolkit's version "
                             f"is {cann_version}")
    if same_cann(cann_version, expected):
        return Finding.check(name, OK, f"CANN {cann_version} is the one torch_npu {torch_npu_version} ({branch}) is "
                             "built for")
    return Finding.check(name, WARN, f"torch_npu {torch_npu_version} ({branch}) is built for CANN {expected}, this "
                         f"toolkit is CANN {cann_version} ({SOURCE}): install CANN {expected} or the torch_npu release "
                         f"made for CANN {cann_version}")
