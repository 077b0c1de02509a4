"""Removing old records: an explicit step, never a side effect of reading.

A record is removed when its process ran on this host, is no longer alive, and the record was last written more
than ``keep`` seconds ago (``VERL_ASCEND_EXT_STATUS_KEEP``, default one day): a failed job's records stay for its
post-mortem at least that long after its processes last wrote. Two callers: each process's recorder, for its own
namespace, at most once an hour (``recorder``), and the user, ``verl-ascend status --prune`` (every namespace
of the directory). Records of other hosts are never removed here (their liveness cannot be told).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterable, Mapping

from verl_ascend_ext.runtime.records import identity, store
from verl_ascend_ext.runtime.records.reader import read_records

logger = logging.getLogger("verl_ascend_ext")

KEEP_ENV = "VERL_ASCEND_EXT_STATUS_KEEP"  # seconds a dead process's record is kept (default one day)
DEFAULT_KEEP = 86400.0


def keep_seconds(environ: Mapping[str, str] | None = None) -> float:
    env = os.environ if environ is None else environ
    raw = env.get(KEEP_ENV)
    if raw is None or not raw.strip():  # unset or empty: the default, like every variable of the package
        return DEFAULT_KEEP
    try:
        return max(0.0, float(raw))
    except ValueError:
        logger.warning("verl-ascend-ext: %s=%r is not a number of seconds; keeping dead records %d s", KEEP_ENV,
                       raw, DEFAULT_KEEP)
        return DEFAULT_KEEP


def prune(base: str, namespaces: Iterable[str] | None = None, *, host: str | None = None, keep: float | None = None,
          now: float | None = None) -> list[str]:
    """Remove this host's records of dead processes last written more than ``keep`` seconds before ``now``; the
    paths removed. A record that cannot be removed stays (logged at DEBUG)."""
    host = socket.gethostname() if host is None else host
    keep = keep_seconds() if keep is None else keep
    now = time.time() if now is None else now
    records, _ = read_records(base, namespaces)
    removed = []
    for rec in records:
        if rec.get("host") != host or identity.alive(int(rec.get("pid", 0)), rec.get("proc_start")):
            continue
        if now - float(rec.get("updated") or 0.0) < keep:
            continue
        try:
            store.remove(rec["file"])
        except OSError as err:
            logger.debug("verl-ascend-ext: %s not removed: %s", rec["file"], err)
            continue
        removed.append(rec["file"])
    return removed
