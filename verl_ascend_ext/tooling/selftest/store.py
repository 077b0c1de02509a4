"""Where the last selftest result of each host is kept, and the one-line summaries ``status`` and ``doctor`` show.

One JSON file per host, ``<status dir>/.selftest/<host>.json``, the whole report (when, where, device, stack, every
line): the status directory is the private per-user one the process records use (``VERL_ASCEND_EXT_STATUS_DIR``,
else ``<temp dir>/verl-ascend-ext-status-<uid>``), with the same safety (directories 0700 owned by this user, no
symlink followed, atomic writes; files of other users ignored). The leading dot keeps it out of the process
records ``verl-ascend status`` reads. Standard library only: doctor and status must not import torch.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from collections.abc import Mapping
from typing import Any

from verl_ascend_ext.runtime.records import store as status_store

SUBDIR = ".selftest"


def _dir_fd(base: str, create: bool) -> int:
    os.close(status_store.open_base(base, create=create))  # checks the status directory itself first
    return status_store.open_base(os.path.join(base, SUBDIR), create=create)


def save(report: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """Store ``report`` as this host's last result: (path, "") or (None, why it was not stored)."""
    base = status_store.base_dir(environ)
    name = f"{socket.gethostname()}.json"
    try:
        fd = _dir_fd(base, create=True)
        try:
            status_store.write_atomic(fd, name, json.dumps(report, separators=(",", ":")).encode())
        finally:
            os.close(fd)
    except (OSError, ValueError, TypeError) as err:
        return None, (f"not stored ({type(err).__name__}: {err}); set {status_store.DIR_ENV} to a private "
                      "directory this user owns")
    return os.path.join(base, SUBDIR, name), ""


def load(environ: Mapping[str, str] | None = None, base: str | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Every host's last result in the status directory (newest first) and notes on what was ignored."""
    base = base or status_store.base_dir(environ)
    try:
        fd = _dir_fd(base, create=False)
    except FileNotFoundError:
        return [], []
    except OSError as err:
        return [], [f"selftest results in {os.path.join(base, SUBDIR)} not read: {err}"]
    results, notes = [], []
    try:
        for name in sorted(os.listdir(fd)):
            if name.startswith(".") or not name.endswith(".json"):
                continue
            path = os.path.join(base, SUBDIR, name)
            try:
                with os.fdopen(os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd), "rb") as f:
                    st = os.fstat(f.fileno())
                    if st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode):
                        notes.append(f"{path} ignored: not a regular file of this user")
                        continue
                    data = json.loads(f.read())
            except (OSError, ValueError) as err:
                notes.append(f"{path} ignored: {err}")
                continue
            if isinstance(data, dict) and data.get("schema") == 1:
                data["file"] = path
                results.append(data)
            else:
                notes.append(f"{path} ignored: not a selftest result")
    finally:
        os.close(fd)
    results.sort(key=lambda r: r.get("started") or 0, reverse=True)
    return results, notes


def summary(result: Mapping[str, Any]) -> str:
    """One line: when, where, on what, and the counts, e.g. for ``verl-ascend status`` and ``doctor``."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(result.get("started") or 0))
    counts = result.get("counts") or {}
    shown = ", ".join(f"{counts[k]} {k}" for k in ("holds", "FAILS", "not run", "could not run") if counts.get(k))
    verdict = {0: "all hold", 1: "A FIX FAILS", 2: "could not run"}.get(result.get("exit_code"), "?")
    return (f"{when} on {result.get('host')} ({result.get('device') or result.get('requested_device')}; "
            f"{result.get('stack') or 'no stack'}): {verdict} ({shown or 'no lines'}; exit {result.get('exit_code')})")


def report_section(environ: Mapping[str, str] | None = None, base: str | None = None) -> dict[str, Any]:
    """What doctor and status put in their JSON: the stored results' summaries (not every line)."""
    results, notes = load(environ, base)
    return {"results": [{"host": r.get("host"), "started": r.get("started"), "device": r.get("device"),
                         "stack": r.get("stack"), "exit_code": r.get("exit_code"), "counts": r.get("counts"),
                         "file": r.get("file"), "summary": summary(r)} for r in results], "notes": notes}


def format_section(section: Mapping[str, Any]) -> list[str]:
    out = ["", "Selftest (last `verl-ascend selftest` per host)"]
    if not section["results"]:
        out.append("  never run here (run `verl-ascend selftest` on one node before a big job)")
    out += [f"  {r['summary']}" for r in section["results"]]
    out += [f"  note: {n}" for n in section["notes"]]
    return out
