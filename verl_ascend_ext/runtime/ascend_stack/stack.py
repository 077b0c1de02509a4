"""Where the Ascend software stack of this machine is and which versions it has, read from files only.

No torch_npu import, no device call, no subprocess: the doctor must run on login nodes and predict
what a training process started with the same environment will load.

- **CANN toolkit**: the directory ``ASCEND_TOOLKIT_HOME`` names, else ``ASCEND_HOME_PATH`` (both
  exported by CANN's ``set_env.sh``; torch_npu's ``collect_env.get_cann_version`` reads the latter),
  else the standard install path ``/usr/local/Ascend/ascend-toolkit/latest`` (the path vLLM-Ascend's
  ``collect_env.py`` reads) or ``/usr/local/Ascend/cann`` (the CANN >= 8.5 layout). The version is the
  ``version=`` entry of ``<home>/<arch>-linux/ascend_toolkit_install.info``; without that file,
  ``version_dir=`` / ``Version=`` of ``<home>/runtime/version.info``.
- **NNAL/ATB**: ``ATB_HOME_PATH`` (exported by ``nnal/atb/set_env.sh``: ``.../nnal/atb/latest/atb/cxx_abi_N``,
  the ``version.info`` sits two levels up), else ``/usr/local/Ascend/nnal/atb/latest/version.info``;
  the version is its ``Ascend-cann-atb :`` entry.
- **driver / firmware**: the install roots ``Driver_Install_Path_Param`` / ``Firmware_Install_Path_Param``
  of ``/etc/ascend_install.info`` (what torch_npu's ``get_cann_version(module="DRIVER")`` documents and
  CANN's installers read), else ``/usr/local/Ascend``; then ``driver/version.info`` (``package_version``,
  else ``Version``) and ``firmware/version.info`` (``Version``).
- **npu-smi**: on ``PATH``, else ``/usr/local/bin/npu-smi`` or ``/usr/local/sbin/npu-smi``; not run.
- **variables**: ``ASCEND_RT_VISIBLE_DEVICES``, ``PYTORCH_NPU_ALLOC_CONF`` and every ``HCCL_*``.

``VERL_ASCEND_EXT_TEST_SYSROOT`` (tests only) is a directory that stands in for ``/`` for every fixed
path above (``/etc/ascend_install.info``, ``/usr/local/Ascend/...``, ``PATH`` entries, the roots named
in ``ascend_install.info``), so tests build fake install trees without touching the machine's. Paths
given by ``ASCEND_TOOLKIT_HOME``, ``ASCEND_HOME_PATH`` and ``ATB_HOME_PATH`` are used as they are.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verl_ascend_ext.runtime.ascend_stack.infofile import read_info, unknown

# Existence is tested with os.path.exists / isdir / isfile, not their pathlib forms: those raise on EACCES
# or ENAMETOOLONG, and a bad variable must read "unknown (...)", not stop the doctor.
SYSROOT_ENV = "VERL_ASCEND_EXT_TEST_SYSROOT"
TOOLKIT_ENVS = ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")
TOOLKIT_DEFAULTS = ("/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann")
TOOLKIT_INFO = "ascend_toolkit_install.info"
NNAL_ENV = "ATB_HOME_PATH"
NNAL_DEFAULT = "/usr/local/Ascend/nnal/atb/latest"
INSTALL_INFO = "/etc/ascend_install.info"
ASCEND_DEFAULT = "/usr/local/Ascend"
NPU_SMI_DEFAULTS = ("/usr/local/bin/npu-smi", "/usr/local/sbin/npu-smi")
ENV_NAMES = ("ASCEND_RT_VISIBLE_DEVICES", "PYTORCH_NPU_ALLOC_CONF")
ENV_PREFIXES = ("HCCL_",)


def system_path(path: str, environ: Mapping[str, str]) -> Path:
    """A fixed absolute path of the machine, under the test sysroot when one is set."""
    root = environ.get(SYSROOT_ENV)
    return Path(root, path.lstrip("/")) if root else Path(path)


def _toolkit_home(environ: Mapping[str, str]) -> tuple[Path, str] | None:
    for name in TOOLKIT_ENVS:
        if environ.get(name):
            return Path(environ[name]), name
    for default in TOOLKIT_DEFAULTS:
        path = system_path(default, environ)
        if os.path.isdir(path):
            return path, f"standard path {default}"
    return None


def _toolkit_version(home: Path) -> tuple[str, Path | None]:
    machine = platform.machine() or "unknown"
    candidates = [home / f"{machine}-linux" / TOOLKIT_INFO]
    candidates += [p for p in sorted(home.glob(f"*-linux/{TOOLKIT_INFO}")) if p != candidates[0]]
    for path in candidates:
        if os.path.exists(path):
            return read_info(path).version("version"), path
    runtime = home / "runtime" / "version.info"
    if os.path.exists(runtime):
        return read_info(runtime).version("version_dir", "Version"), runtime
    return unknown(f"no {machine}-linux/{TOOLKIT_INFO} (or runtime/version.info) under {home}"), None


def cann_info(environ: Mapping[str, str]) -> dict[str, Any] | None:
    """The CANN toolkit the environment selects: version, home, what selected it, the file read; None if none."""
    found = _toolkit_home(environ)
    if found is None:
        return None
    home, selected_by = found
    info: dict[str, Any] = {"version": None, "home": str(home), "real_home": None, "selected_by": selected_by,
                            "file": None, "note": None}
    if not os.path.isdir(home):
        info["version"] = unknown(f"{selected_by}={home} is not a directory")
        return info
    info["real_home"] = os.path.realpath(home)
    version, path = _toolkit_version(home)
    info["version"], info["file"] = version, str(path) if path else None
    homes = {name: environ[name] for name in TOOLKIT_ENVS if environ.get(name)}
    if len({os.path.realpath(p) for p in homes.values()}) > 1:
        info["note"] = ("ASCEND_TOOLKIT_HOME and ASCEND_HOME_PATH name different toolkits ("
                        + ", ".join(f"{k}={v}" for k, v in homes.items()) + "): source one CANN set_env.sh only")
    return info


def nnal_info(environ: Mapping[str, str]) -> dict[str, Any] | None:
    """NNAL (ATB) when installed: version and the file read; None when neither ATB_HOME_PATH nor the default exist."""
    if environ.get(NNAL_ENV):
        home = Path(environ[NNAL_ENV])
        candidates = [home / "version.info", *(p / "version.info" for p in home.parents[1:2])]
        selected_by = NNAL_ENV
    else:
        latest = system_path(NNAL_DEFAULT, environ)
        if not os.path.exists(latest):
            return None
        candidates, selected_by = [latest / "version.info"], f"standard path {NNAL_DEFAULT}"
    path = next((p for p in candidates if os.path.exists(p)), None)
    if path is None:
        return {"version": unknown(f"no version.info at {' or '.join(map(str, candidates))}"), "build": None,
                "selected_by": selected_by, "file": None}
    info = read_info(path)
    return {"version": info.version("Ascend-cann-atb"), "build": info.get("Ascend-cann-atb Version"),
            "selected_by": selected_by, "file": str(path)}


def _install_roots(environ: Mapping[str, str]) -> tuple[dict[str, Path], str, dict[str, bool]]:
    """Driver and firmware install roots, where they came from, and whether ascend_install.info named each."""
    path = system_path(INSTALL_INFO, environ)
    default = system_path(ASCEND_DEFAULT, environ)
    if not os.path.exists(path):
        return ({"driver": default, "firmware": default}, f"standard path {ASCEND_DEFAULT} ({INSTALL_INFO} absent)",
                {"driver": False, "firmware": False})
    info = read_info(path)
    roots, named = {}, {}
    for part, key in (("driver", "Driver_Install_Path_Param"), ("firmware", "Firmware_Install_Path_Param")):
        value = info.get(key)
        named[part] = bool(value)
        roots[part] = system_path(value.rstrip("/") or "/", environ) if value else default
    source = INSTALL_INFO if not info.error else f"standard path {ASCEND_DEFAULT} ({unknown(info.error)})"
    return roots, source, named


def _component(environ: Mapping[str, str], part: str, keys: tuple[str, ...], extra: tuple[str, ...]
               ) -> dict[str, Any] | None:
    roots, source, named = _install_roots(environ)
    path = roots[part] / part / "version.info"
    if not os.path.exists(path) and not (part == "driver" and named["driver"]):
        return None  # a container without the firmware mounted is normal; a named driver root without it is not
    info = read_info(path)
    out: dict[str, Any] = {"version": info.version(*keys), "file": str(path), "root_from": source}
    out.update({key: info.get(key) for key in extra})
    return out


def driver_info(environ: Mapping[str, str]) -> dict[str, Any] | None:
    return _component(environ, "driver", ("package_version", "Version"), ("ascendhal_version", "compatible_version_fw"))


def firmware_info(environ: Mapping[str, str]) -> dict[str, Any] | None:
    return _component(environ, "firmware", ("Version",), ("package_version", "compatible_version_drv"))


def npu_smi(environ: Mapping[str, str]) -> dict[str, str] | None:
    """Where ``npu-smi`` is (not run); None when it is not installed."""
    dirs = [d for d in environ.get("PATH", "").split(os.pathsep) if d]
    candidates = [str(Path(d) / "npu-smi") for d in dirs] + list(NPU_SMI_DEFAULTS)
    for candidate in candidates:
        path = system_path(candidate, environ) if os.path.isabs(candidate) else Path(candidate)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return {"path": str(path)}
    return None


def env_values(environ: Mapping[str, str]) -> dict[str, str] | None:
    found = {k: environ[k] for k in sorted(environ) if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}
    return found or None
