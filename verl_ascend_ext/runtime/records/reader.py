"""Reading records: every process's record under a status directory, with this host's liveness. Never writes.

``read_records`` returns what the files hold (upgraded to this schema, ``schema.upgrade``) and notes on what was
not read and why: files owned by another user, symbolic links, unreadable or malformed files, records of a
schema this reader does not know (counted, with the fix). ``collect`` adds, in memory only, ``alive`` (this
host's processes, from ``/proc``; None for another host's) and, for a live Ray worker, the actor it runs now.
Nothing on disk changes: ``verl-ascend status`` and a checkpoint save read the directory as it is (removing old
records is ``prune``'s, an explicit step).

``read_shared`` is a process's one read of a directory for the readers in it that read again and again (in verl's
trainer: the job's watch every second, the sleep-memory metric at every logged step): one cache per directory (a file
unchanged since the last read is not parsed again), and a read younger than ``REUSE_S`` (the caller's ``max_age``) is
handed out again rather than repeated.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from verl_ascend_ext.runtime.records import identity, store
from verl_ascend_ext.runtime.records.gathered import newest_copies
from verl_ascend_ext.runtime.records.schema import (
    LOCAL_NAMESPACE,
    OLDER,
    SCHEMA,
    MalformedRecord,
    SchemaError,
    upgrade,
)

Cache = dict[str, tuple[tuple[int, int, int], dict[str, Any]]]  # path -> ((inode, size, mtime ns), record read)
REUSE_S = 1.0  # s: a shared read this young is handed out again (the job watch's interval: one read a look)


def read_records(base: str, namespaces: Iterable[str] | None = None,
                 cache: Cache | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Records under ``base`` (all namespaces, or those given) and notes on what was ignored and why. ``cache``
    (kept by a caller that reads again and again, e.g. a job's watch): a file unchanged since the last read is not
    parsed again (each write replaces the file: a new inode)."""
    notes: list[str] = []
    records: list[dict[str, Any]] = []
    try:
        base_fd = store.open_base(base, create=False)
    except FileNotFoundError:
        return records, [f"no status directory at {base} (no process has recorded its status there)"]
    except OSError as err:
        return records, [f"status directory {base} not read: {err}"]
    schemas: Counter[Any] = Counter()
    try:
        names = sorted(os.listdir(base_fd)) if namespaces is None else list(namespaces)
        for ns in names:
            if ns.startswith("."):
                continue
            try:
                ns_fd = store.open_dir(ns, dir_fd=base_fd, create=False)
            except FileNotFoundError:
                continue
            except OSError as err:
                notes.append(f"namespace {os.path.join(base, ns)} ignored: {err}")
                continue
            try:
                _read_namespace(base, ns, ns_fd, records, notes, schemas, cache)
            finally:
                os.close(ns_fd)
    finally:
        os.close(base_fd)
    return records, notes + _schema_notes(base, schemas)


def _read_namespace(base: str, ns: str, ns_fd: int, records: list[dict[str, Any]], notes: list[str],
                    schemas: Counter[Any], cache: Cache | None = None) -> None:
    foreign = []
    uid = os.geteuid()
    for name in os.listdir(ns_fd):
        if not name.endswith(store.SUFFIX) or name.startswith("."):
            continue
        path = os.path.join(base, ns, name)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=ns_fd)
        except OSError as err:
            notes.append(f"{path} ignored: {'a symbolic link' if err.errno == errno.ELOOP else err}")
            continue
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_uid != uid:
                foreign.append(f"{name} (uid {st.st_uid})")
                continue
            if not stat.S_ISREG(st.st_mode):
                notes.append(f"{path} ignored: not a regular file")
                continue
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            if cache is not None and path in cache and cache[path][0] == key:
                records.append(dict(cache[path][1]))
                continue
            data = f.read()
        try:
            raw = json.loads(data)
        except ValueError as err:
            notes.append(f"{path} ignored: not JSON ({err}). Fix: remove it (a process writes its record whole; "
                         "this one was cut short or changed by another program)")
            continue
        schema = raw.get("schema") if isinstance(raw, dict) else None
        try:
            rec = upgrade(raw)
        except MalformedRecord as err:
            notes.append(f"{path} ignored: not a readable record ({err}). Fix: remove it (a process writes its "
                         "record whole; this one was changed by hand or by another program)")
            continue
        except SchemaError:
            schemas[schema] += 1
            continue
        if schema != SCHEMA:
            schemas[schema] += 1
        rec["file"] = path
        rec["namespace"] = ns
        records.append(rec)
        if cache is not None:
            cache[path] = (key, dict(rec))
    if foreign:
        notes.append(f"ignored {len(foreign)} record(s) in {os.path.join(base, ns)} owned by another user: "
                     + ", ".join(sorted(foreign)[:5]) + (" ..." if len(foreign) > 5 else ""))


def _schema_notes(base: str, schemas: Counter[Any]) -> list[str]:
    """What the reader did with records of another schema: read the previous one (fields it lacks unknown),
    name any other with its count and the fix."""
    out = []
    for schema, count in sorted(schemas.items(), key=lambda item: str(item[0])):
        if schema in OLDER:
            out.append(f"{count} record(s) in {base} have schema {schema} (written by an older verl-ascend-ext): "
                       "read, the fields that schema lacks shown as unknown (ranks, how the process ended, errors, "
                       "stand-downs, the job, deaths noticed). Fix: install the same verl-ascend-ext on every node "
                       "and restart the job")
        else:
            out.append(f"{count} record(s) in {base} have schema {schema!r}, which this verl-ascend-ext (schema "
                       f"{SCHEMA}) cannot read: not counted. Fix: run `verl-ascend status` from the verl-ascend-ext "
                       "release the job ran with (a newer one wrote them)")
    return out


def collect(base: str, namespaces: Iterable[str] | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Records of ``base`` with ``alive`` set in memory (this host's processes; None for another host's) and a
    live Ray worker's current actor, and the notes; a process recorded twice (its own record and a copy gathered from
its node, ``gathered``) counts once, by its newest copy. Reads only."""
    records, notes = read_records(base, namespaces)
    records = newest_copies(records)
    host = socket.gethostname()
    for rec in records:
        if rec.get("host") != host:
            rec["alive"] = None
            continue
        rec["alive"] = identity.alive(int(rec.get("pid", 0)), rec.get("proc_start"))
        if rec["alive"] and rec.get("namespace") != LOCAL_NAMESPACE:
            rec.update(identity.now_running_as(int(rec["pid"])))
    return records, notes


class _SharedReads:
    """This process's reads of each status directory (``read_shared``): the newest, with when it began, and the
    cache of parsed files."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.newest: dict[str, tuple[float, list[dict[str, Any]], list[str]]] = {}
        self.caches: dict[str, Cache] = {}


_shared = _SharedReads()


def _forget_in_child() -> None:
    """A forked child starts with no shared read (and a lock no thread of its parent can hold)."""
    global _shared
    _shared = _SharedReads()


os.register_at_fork(after_in_child=_forget_in_child)


def read_shared(base: str, max_age: float = REUSE_S,
                now: Callable[[], float] = time.monotonic) -> tuple[list[dict[str, Any]], list[str]]:
    """``read_records(base)`` shared by this process's readers: the newest read of ``base`` when it began less than
    ``max_age`` seconds ago, else a new one, with this process's one cache of ``base``. Each caller gets its own
    copy of the list and of each record (a shallow one: the records' fields are shared, and read only)."""
    key = os.path.abspath(base)
    shared = _shared
    with shared.lock:
        began = now()
        newest = shared.newest.get(key)
        if newest is None or began - newest[0] >= max_age:
            cache = shared.caches.setdefault(key, {})
            records, notes = read_records(base, cache=cache)
            kept = {rec["file"] for rec in records}
            for gone in [path for path in cache if path not in kept]:  # removed (pruned) since: not kept for ever
                del cache[gone]
            newest = shared.newest[key] = (began, records, notes)
        return [dict(rec) for rec in newest[1]], list(newest[2])
