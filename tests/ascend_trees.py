"""Fake Ascend install trees for tests: files only, in the formats CANN's installers write.

Formats (see ``verl_ascend_ext/runtime/ascend_stack/infofile.py`` for the sources): the toolkit's
``<home>/<arch>-linux/ascend_toolkit_install.info`` and ``runtime/version.info``, NNAL's
``nnal/atb/latest/version.info``, the driver's and firmware's ``version.info`` and
``/etc/ascend_install.info``. Layout as CANN >= 8.5 installs it: ``<root>/cann-<version>`` with
``ascend-toolkit/latest`` a symlink to it. ``set_env`` gives the variables CANN's and NNAL's
``set_env.sh`` export for a tree; ``sysroot`` trees stand in for ``/`` through the tests-only
``VERL_ASCEND_EXT_TEST_SYSROOT`` (driver, firmware, ``/etc``, ``npu-smi``). ``shadow_install`` writes a
second install of this package (a dist-info, optionally with the code) for the duplicate-install checks.
"""

from __future__ import annotations

import importlib.metadata
import platform
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARCH = platform.machine()
SYSROOT_ENV = "VERL_ASCEND_EXT_TEST_SYSROOT"


def toolkit(ascend: Path, version: str = "9.1.0", inner: str = "V100R001C26SPC001B100") -> Path:
    """``<ascend>/cann-<version>`` with its install info; ``<ascend>/ascend-toolkit/latest`` links to it."""
    home = ascend / f"cann-{version}"
    (home / f"{ARCH}-linux").mkdir(parents=True)
    (home / f"{ARCH}-linux" / "ascend_toolkit_install.info").write_text(
        "package_name=Ascend-cann-toolkit\n"
        f"version={version}\n"
        f"innerversion={inner}\n"
        "compatible_version=[V100R001C15],[V100R001C18],[V100R001C19],[V100R001C20],[V100R001C21],[V100R001C23]\n"
        f"arch={ARCH}\n"
        "os=linux\n"
        f"path={home}/{ARCH}-linux\n")
    (home / "runtime").mkdir()
    (home / "runtime" / "version.info").write_text(
        f"Version={version}.0.100\nversion_dir={version}\ntimestamp=20260701_120000000\n")
    (ascend / "ascend-toolkit").mkdir(exist_ok=True)
    latest = ascend / "ascend-toolkit" / "latest"
    if latest.is_symlink():
        latest.unlink()
    latest.symlink_to(home)
    return latest


def nnal(ascend: Path, version: str = "9.1.0") -> Path:
    """``<ascend>/nnal/atb/latest`` with its version.info; returns the ATB_HOME_PATH set_env.sh exports."""
    latest = ascend / "nnal" / "atb" / "latest"
    (latest / "atb" / "cxx_abi_1").mkdir(parents=True)
    (latest / "version.info").write_text(
        f"Ascend-cann-atb : {version}\n"
        f"Ascend-cann-atb Version : {version}.B100\n"
        f"Platform : {ARCH}\n"
        f"branch : br_release_cann_{version}\n"
        "commit id : 0123456789abcdef0123456789abcdef01234567\n")
    return latest / "atb" / "cxx_abi_1"


def driver_firmware(sysroot: Path, driver: str = "25.5.0", firmware: str = "7.8.0.2.212",
                    root: str = "/usr/local/Ascend", npu_smi: bool = True) -> None:
    """Driver, firmware, /etc/ascend_install.info naming ``root`` (and npu-smi) under ``sysroot``."""
    (sysroot / "etc").mkdir(parents=True, exist_ok=True)
    (sysroot / "etc" / "ascend_install.info").write_text(
        "UserName=HwHiAiUser\nUserGroup=HwHiAiUser\n"
        f"Firmware_Install_Type=full\nFirmware_Install_Path_Param={root}\n"
        f"Driver_Install_Type=full\nDriver_Install_Path_Param={root}\nDriver_Install_For_All=no\n")
    base = sysroot / root.lstrip("/")
    (base / "driver").mkdir(parents=True)
    (base / "driver" / "version.info").write_text(
        f"Version={driver}\nascendhal_version=7.35.23\naicpu_version=1.0\ntdt_version=1.0\nlog_version=1.0\n"
        "prof_version=2.0\ndvppkernels_version=1.1\ntsfw_version=1.0\nInnerversion=V100R001C26SPC001B100\n"
        "compatible_version=[V100R001C21],[V100R001C22],[V100R001C23],[V100R001C25],[V100R001C26]\n"
        f"compatible_version_fw=[7.0.0,8.9.9]\npackage_version={driver}\n")
    (base / "firmware").mkdir(parents=True)
    (base / "firmware" / "version.info").write_text(
        f"Version={firmware}\nfirmware_version=1.0\npackage_version={driver}\n"
        "compatible_version_drv=[24.1,24.1.],[25.0,25.0.],[25.5,25.5.]\n")
    if npu_smi:
        tool = sysroot / "usr" / "local" / "bin" / "npu-smi"
        tool.parent.mkdir(parents=True, exist_ok=True)
        tool.write_text("#!/bin/sh\necho 'test tree: npu-smi must not be run by the doctor' >&2\nexit 3\n")
        tool.chmod(0o755)


def set_env(toolkit_home: Path | None, atb_home: Path | None = None) -> dict[str, str]:
    """What ``source <toolkit>/set_env.sh`` (and ``nnal/atb/set_env.sh``) export that the doctor reads."""
    env: dict[str, str] = {}
    if toolkit_home is not None:
        env.update(ASCEND_TOOLKIT_HOME=str(toolkit_home), ASCEND_HOME_PATH=str(toolkit_home),
                   ASCEND_OPP_PATH=str(toolkit_home / "opp"), ASCEND_AICPU_PATH=str(toolkit_home))
    if atb_home is not None:
        env["ATB_HOME_PATH"] = str(atb_home)
    return env


def full_node(base: Path, cann: str = "9.1.0", nnal_version: str = "9.1.0", driver: str = "25.5.0",
              firmware: str = "7.8.0.2.212") -> dict[str, str]:
    """A whole node: sysroot with driver/firmware/npu-smi and a toolkit + NNAL; returns its environment."""
    sysroot = base / "sysroot"
    ascend = sysroot / "usr" / "local" / "Ascend"
    ascend.mkdir(parents=True)
    driver_firmware(sysroot, driver=driver, firmware=firmware)
    env = set_env(toolkit(ascend, cann), nnal(ascend, nnal_version))
    env[SYSROOT_ENV] = str(sysroot)
    return env


def shadow_install(tmp_path: Path, version: str, with_code: bool) -> Path:
    """A site directory holding another install of verl-ascend-ext: dist-info (+ the package when ``with_code``)."""
    real = importlib.metadata.distribution("verl-ascend-ext")
    site = tmp_path / "site"
    info = site / f"verl_ascend_ext-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: verl-ascend-ext\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(real.read_text("entry_points.txt"))
    (info / "top_level.txt").write_text("verl_ascend_ext\n")
    (info / "INSTALLER").write_text("pip\n")
    records = [f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
    if with_code:
        shutil.copytree(REPO / "verl_ascend_ext", site / "verl_ascend_ext",
                        ignore=shutil.ignore_patterns("__pycache__"))
        records += [f"{p.relative_to(site).as_posix()},," for p in sorted((site / "verl_ascend_ext").rglob("*"))
                    if p.is_file()]
    (info / "RECORD").write_text("\n".join(records) + "\n")
    return site
