"""Read the plain-text version files Ascend's installers write, never raising.

Two line formats occur, both one entry per line:

- ``key=value``: the CANN toolkit's ``<home>/<arch>-linux/ascend_toolkit_install.info``
  (``package_name=Ascend-cann-toolkit``, ``version=9.1.0``, ``innerversion=...``, ``arch=...``,
  ``path=...``; read with ``cat`` by vLLM-Ascend's ``collect_env.py`` and by torch_npu's
  ``torch_npu/utils/collect_env.py:get_cann_version``, which takes the value after ``=`` on the first
  line naming ``version``), the per-component ``version.info`` CANN's packaging scripts write
  (``Version=``, ``version_dir=``, ``timestamp=``; ``VersionInfoFile`` in CANN's
  ``scripts/package/common/py/version_info.py``, vendored in vLLM-Ascend's ``csrc/scripts/package``),
  the driver's and firmware's ``version.info`` (``Version=``, ``package_version=``,
  ``compatible_version_fw=`` / ``compatible_version_drv=``) and ``/etc/ascend_install.info``
  (``Driver_Install_Path_Param=``, ``Firmware_Install_Path_Param=``);
- ``key : value``: NNAL's ``nnal/atb/latest/version.info`` (``Ascend-cann-atb : 8.2.RC2``,
  ``Ascend-cann-atb Version : 8.2.RC2.B030``, ``Platform : aarch64``, ``branch : ...``).

A file that cannot be read, is not text, or lacks the wanted entry gives ``unknown (<reason>)``
instead of an exception, so the doctor always finishes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

MAX_BYTES = 64 * 1024  # these files are a few hundred bytes; anything larger is not one of them
VALUE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.\-_+]*$")  # what a version looks like (9.1.0, 8.0.RC3, 25.0.rc1.1)


def unknown(reason: str) -> str:
    return f"unknown ({reason})"


def is_unknown(value: str | None) -> bool:
    return value is not None and value.startswith("unknown (")


@dataclass(frozen=True)
class InfoFile:
    """A parsed info file: its entries (first occurrence of a key wins), or why it could not be read."""

    path: Path
    entries: dict[str, str] = field(default_factory=dict)
    error: str | None = None

    def version(self, *keys: str) -> str:
        """The first of ``keys`` present with a version-like value, else ``unknown (reason)``."""
        if self.error:
            return unknown(self.error)
        for key in keys:
            if key in self.entries:
                value = self.entries[key].strip().strip('"')
                if VALUE.match(value):
                    return value
                return unknown(f"garbled {key} value {value[:40]!r} in {self.path}")
        return unknown(f"no {' or '.join(repr(k) for k in keys)} entry in {self.path}")

    def get(self, key: str) -> str | None:
        return None if self.error else self.entries.get(key)


def read_info(path: Path) -> InfoFile:
    """Parse ``key=value`` and ``key : value`` lines of ``path``; never raises."""
    try:
        with path.open("rb") as stream:
            raw = stream.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return InfoFile(path, error=f"{path} does not exist")
    except OSError as err:
        return InfoFile(path, error=f"cannot read {path}: {err.strerror or err}")
    if len(raw) > MAX_BYTES:
        return InfoFile(path, error=f"{path} is larger than {MAX_BYTES} bytes: not an info file")
    if b"\x00" in raw:
        return InfoFile(path, error=f"{path} is binary, not an info file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return InfoFile(path, error=f"{path} is not UTF-8 text (byte {err.start})")
    entries: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        sep = "=" if "=" in line else (":" if ":" in line else None)
        if sep is None:
            continue
        key, _, value = line.partition(sep)
        entries.setdefault(key.strip(), value.strip())
    if not entries:
        return InfoFile(path, error=f"{path} has no 'key=value' or 'key : value' lines")
    return InfoFile(path, entries)
