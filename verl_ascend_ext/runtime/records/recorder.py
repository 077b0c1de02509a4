"""This process's own record, kept up to date: the only writer of a process's record is that process.

Written at once, on the caller's thread, at the end of ``boot.activate`` and whenever a patch status changes (a
target module imported, a refusal), another loader boots the plugin again, an exception of the plugin's own escapes
a replacement or the boot (``failed``, when it escapes), when the process ends (``ending``, from ``process_end``),
once in a Ray worker that booted idle, when Ray binds it an actor (``actor_watch``), and when a rollout worker slept
(``slept``: once a step). Counts (an eager replacement's first run, an ``acts_when`` record's acts, a first
stand-down on a path: the hot path) are only counted in memory (``patching.status``); the record catches up with them at
most once every ``FLUSH_EVERY`` seconds, in a daemon thread started at the first count (``counted``), and at any
write above, which writes everything (the end of a process writes every count; so does ``flush`` and, for a process
whose end is not observed, the interpreter's exit). A process killed outright (SIGKILL) loses at most the last
``FLUSH_EVERY`` seconds of counts (``LAG_NOTE``). What a record holds is ``schema``'s. Once its record is written,
the process writes its threads' stacks next to it when asked (``stacks.arm``).

A write interrupted by a signal whose handler writes the end (``process_end``, on the same thread, re-entering the
lock) cannot lose that end: each write has its own temporary file, and the interrupted write, once it resumes,
writes the newest record again rather than leaving its older one in place.

Housekeeping is this writer's too, for its own kind only: after its first write it removes, at most once an hour
and in a daemon thread, the records of dead processes of its own host and namespace last written more than
``VERL_ASCEND_EXT_STATUS_KEEP`` seconds ago (``prune``). Reading records (``verl-ascend status``, a checkpoint save)
never writes. Any failure to write costs one WARNING per process and turns recording off in it; the job never
fails because of a record. Only the standard library is imported.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from verl_ascend_ext.patching.status import acts_of, on_count, stood_down_on, was_exercised
from verl_ascend_ext.patching.status import lock as status_lock
from verl_ascend_ext.runtime.records import actor_watch, identity, stacks, store
from verl_ascend_ext.runtime.records.schema import (
    ACTS,
    DRIVER,
    EAGER,
    JOB_ENV,
    LOCAL_NAMESPACE,
    MAX_SLEEPS,
    new_record,
)

logger = logging.getLogger("verl_ascend_ext")

PLUGIN_ENV = ("VERL_USE_EXTERNAL_PLUGINS", "VLLM_PLUGINS")
MAX_ERRORS = 20
PRUNE_EVERY = 3600.0  # a booting process prunes its namespace (in a daemon thread) at most this often
PRUNE_STAMP = ".pruned"
FLUSH_EVERY = 2.0  # s: counts (runs, acts, stand-downs) reach the record at most this late, written off the hot path
LAG_NOTE = (f"Counts (ran, acted, stood down) may lag by up to {FLUSH_EVERY:g} s: a process writes them at most "
            f"every {FLUSH_EVERY:g} s and when it ends, so one killed outright (SIGKILL, the OOM killer) lost at most "
            f"its last {FLUSH_EVERY:g} s of them.")  # for `verl-ascend status` to print beside the counts


class Recorder:
    """The record of this process: what it knows of itself, and the one writer of its file."""

    def __init__(self, source: str, gates: Mapping[str, bool], disable: str, statuses: Callable[[], Mapping],
                 observed: Mapping[str, str]):
        self.lock = status_lock  # the lock status changes are made under: one lock order, no deadlock
        self.statuses = statuses
        self.observed = dict(observed)
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.ppid = os.getppid()
        self.ticks = identity.start_ticks()
        self.session = identity.ray_session()
        self.namespace = self.session or LOCAL_NAMESPACE
        self.name = store.record_name(self.host, self.pid, self.ticks)
        self.base = store.base_dir()
        self.started = time.time()
        self.loaded_by = [source]
        self.gates = dict(gates)
        self.disable = disable
        self.failed = False
        self.errors: list[dict[str, Any]] = []
        self.ended: dict[str, Any] | None = None
        self.ip: str | None = None
        self.actor_id: str | None = None
        self.last: bytes = b""
        self.fd: int | None = None
        self.pending = False  # counts changed since the last write
        self.wake: threading.Event | None = None  # the flusher's, once it started (at the first count)
        self.closed = False  # the interpreter is exiting: the flusher writes no more
        self.last_write = 0.0  # time.monotonic() of the last write
        self.newest: tuple[int, bytes] = (0, b"")  # the newest record built, numbered: a nested write's is newer
        self.seen_dead: list[dict[str, Any]] = []
        self.teardown: float | None = None
        self.stuck: dict[str, Any] | None = None
        self.sleeps: list[dict[str, Any]] = []

    def record(self) -> dict[str, Any]:
        from verl_ascend_ext._version import __version__

        title = identity.process_title()
        mp_name = identity.mp_name()
        role, actor = identity.detect_role(self.loaded_by, sys.argv, title, mp_name, self.session)
        if self.session is not None:
            self.ip = self.ip or identity.node_ip()
            self.actor_id = self.actor_id or identity.ray_actor_id()
        patches = {}
        for pid, st in sorted(self.statuses().items()):
            module = st.target.partition(":")[0]
            observed = self.observed.get(pid, EAGER)
            patches[pid] = {"status": st.status.value, "detail": st.detail, "where": st.where, "target": st.target,
                            "imported": module in sys.modules, "observed": observed,
                            "exercised": was_exercised(pid) if observed in (EAGER, ACTS) else None,
                            "acts": acts_of(pid) if observed == ACTS else None, "stood_down": stood_down_on(pid)}
        return new_record(
            host=self.host, pid=self.pid, ppid=self.ppid, proc_start=self.ticks, started=self.started,
            updated=time.time(), role=role, actor_class=actor, title=title, ranks=identity.ranks(os.environ, mp_name),
            ip=self.ip, actor_id=self.actor_id, loaded_by=list(self.loaded_by), namespace=self.namespace,
            versions={"verl-ascend-ext": __version__, "python": sys.version.split()[0],
                      **identity.imported_versions()},
            gates=self.gates, disable=self.disable, plugin_env={k: os.environ.get(k) for k in PLUGIN_ENV},
            patches=patches, errors=list(self.errors), ended=self.ended, job=os.environ.get(JOB_ENV) or None,
            seen_dead=list(self.seen_dead), teardown=self.teardown, sleeps=list(self.sleeps), stuck=self.stuck)

    def write(self) -> None:
        """Write the record now, with every count (this process's own record only: not one inherited by ``fork``).

        A signal handler may write again from inside this call, on the same thread (the lock is re-entrant): the
        nested write completes (its own temporary file), and this one, when it resumes, writes the newest record
        over its own older one."""
        with self.lock:
            if self.failed or self.pid != os.getpid():
                return
            try:
                self.pending = False  # what is counted until the record is built below is in it
                seq = self.newest[0] + 1
                data = json.dumps(self.record(), separators=(",", ":")).encode()
                self.newest = (seq, data)
                if data == self.last:
                    return
                first = self.fd is None
                if first:
                    self._open()
                while True:
                    assert self.fd is not None
                    store.write_atomic(self.fd, self.name, data)
                    self.last_write = time.monotonic()
                    if self.newest[0] == seq:  # no nested write built a newer record while this one wrote
                        break
                    seq, data = self.newest  # the nested write's record: on top again
                self.last = data
                if first:
                    self._maybe_prune()
            except (OSError, ValueError, TypeError) as err:
                self.failed = True
                logger.warning("verl-ascend-ext: process status not recorded (pid %d): %s: %s. The job is not "
                               "affected; `verl-ascend status` will not see this process. Fix: set %s to a "
                               "private directory this user owns.", self.pid, type(err).__name__, err, store.DIR_ENV)

    def _open(self) -> None:
        base = store.open_base(self.base)
        try:
            fd = store.open_dir(self.namespace, dir_fd=base)
        finally:
            os.close(base)
        if self.fd is None:
            self.fd = fd
        else:  # a nested write (a signal handler's) opened it meanwhile
            os.close(fd)

    def counted(self) -> None:
        """A count changed (under the status lock): have the flusher write it within ``FLUSH_EVERY`` seconds."""
        if self.pending:
            return
        self.pending = True
        if self.failed or self.pid != os.getpid():
            return
        if self.wake is None:
            self.wake = threading.Event()
            _hold_lock_across_fork()
            threading.Thread(target=_flush_loop, args=(self,), name="verl-ascend-ext-record-flush",
                             daemon=True).start()
            atexit.register(_at_exit, self)
        self.wake.set()

    def flush(self) -> None:
        """Write now if counts changed since the last write."""
        with self.lock:
            if self.pending:
                self.write()

    def _maybe_prune(self) -> None:
        """Prune this host's old dead records of the namespace in a daemon thread, at most every PRUNE_EVERY s."""
        assert self.fd is not None
        try:
            last = os.stat(PRUNE_STAMP, dir_fd=self.fd, follow_symlinks=False).st_mtime
        except FileNotFoundError:
            last = 0.0
        if time.time() - last < PRUNE_EVERY:
            return
        store.write_atomic(self.fd, PRUNE_STAMP, b"")
        threading.Thread(target=_prune_own_kind, args=(self.base, self.namespace, self.host),
                         name="verl-ascend-ext-prune", daemon=True).start()


def _hold_lock_across_fork() -> None:
    """A fork while the flusher holds the status lock would leave it held for good in the child (which has no
    flusher): every ``os.fork`` from now on waits for the lock and the child gets it free."""
    global _fork_held
    if not _fork_held:
        _fork_held = True
        os.register_at_fork(before=status_lock.acquire, after_in_parent=status_lock.release,
                            after_in_child=status_lock.release)


def _flush_loop(rec: Recorder) -> None:
    """The flusher (a daemon thread: it never keeps the process alive): woken by the first count after a write, it
    writes once ``FLUSH_EVERY`` seconds have passed since the last write."""
    assert rec.wake is not None
    while True:
        rec.wake.wait()
        time.sleep(max(0.0, rec.last_write + FLUSH_EVERY - time.monotonic()))
        if rec.closed:
            return
        rec.wake.clear()  # before the write: a count from here on wakes the next round
        rec.flush()


def _at_exit(rec: Recorder) -> None:
    """The interpreter exits: the counts the flusher has not written yet are written now, and it stops."""
    rec.flush()
    rec.closed = True


def _prune_own_kind(base: str, namespace: str, host: str) -> None:
    from verl_ascend_ext.runtime.records.prune import keep_seconds, prune

    try:
        prune(base, [namespace], host=host, keep=keep_seconds())
    except OSError as err:
        logger.debug("verl-ascend-ext: pruning %s/%s failed: %s", base, namespace, err)


_recorder: Recorder | None = None
_fork_held = False  # whether ``_hold_lock_across_fork`` registered its handlers in this interpreter


def start(source: str, gates: Mapping[str, bool], disable: str, statuses: Callable[[], Mapping],
          observed: Mapping[str, str] | None = None) -> None:
    """Begin recording this process (end of boot): write the first record.

    ``observed``: patch id -> how its runs are seen (``schema``'s EAGER, ACTS, TRACED, IMPORT; default eager).
    """
    global _recorder
    _recorder = Recorder(source, gates, disable, statuses, observed or {})
    if not os.environ.get(JOB_ENV) and _recorder.session is None and identity.detect_role(
            [source], sys.argv, identity.process_title(), identity.mp_name(), None)[0] == DRIVER:
        os.environ[JOB_ENV] = _recorder.name  # a new job: every process it starts, every Ray worker, carries it
    on_count(_recorder.counted)
    _recorder.write()
    if not _recorder.failed:
        stacks.arm(os.path.join(_recorder.base, _recorder.namespace, _recorder.name))
    if _recorder.session is not None and identity.ray_actor(identity.process_title()) is None:
        actor_watch.watch_for_actor(changed)


def loaded_again(source: str) -> None:
    """Another loader (e.g. vLLM after verl) booted the plugin in this process."""
    if _recorder is not None:
        with _recorder.lock:
            _recorder.loaded_by.append(source)
        _recorder.write()


def changed(_patch_id: str | None = None) -> None:
    """A patch status changed after boot (or Ray bound this worker an actor): rewrite the record now."""
    if _recorder is not None:
        _recorder.write()


def flush() -> None:
    """Write the counts not written yet (runs, acts, stand-downs) now, on this thread; nothing when there are none.
    For a test or a tool reading this process's own record file: the flusher writes them within ``FLUSH_EVERY``."""
    if _recorder is not None:
        _recorder.flush()


def has_own_recorder() -> bool:
    """Whether this process has a recorder of its own (not one inherited through ``fork``)."""
    return _recorder is not None and _recorder.pid == os.getpid()


def failed(by: str, err: BaseException, where: str | None) -> None:
    """An exception of the plugin's own (``by``: the patch id, or "boot") escaped at ``where`` (file:line of the
    raise): recorded now, so the record holds it even when the process lives on (a Ray actor's failed call)."""
    if not has_own_recorder():
        return
    assert _recorder is not None
    entry = {"at": time.time(), "by": by, "type": type(err).__name__, "message": str(err), "where": where}
    with _recorder.lock:
        _recorder.errors = [*_recorder.errors, entry][-MAX_ERRORS:]
    _recorder.write()


def ending(ended: Mapping[str, Any]) -> None:
    """How this process ended (``process_end.ended``): written now, atomically, with every count; also from a signal
    handler that interrupted a write on this thread (``Recorder.write``)."""
    if not has_own_recorder():
        return
    assert _recorder is not None
    with _recorder.lock:
        _recorder.ended = dict(ended)
    _recorder.write()


def noticed(notice: Mapping[str, Any]) -> None:
    """This process noticed another one's death (``schema.NOTICE_FIELDS``): written now (a status reader then knows
    when a process that left no word died, and who saw it)."""
    if not has_own_recorder():
        return
    assert _recorder is not None
    with _recorder.lock:
        _recorder.seen_dead = [*_recorder.seen_dead, dict(notice)][-MAX_ERRORS:]
    _recorder.write()


def slept(entry: Mapping[str, Any]) -> None:
    """This process (a rollout worker) slept (``schema.SLEEP_FIELDS``): written now, so that the trainer's next log of
    the step's metrics reads it. The first sleep is kept for good (the growth since it), then the newest."""
    if not has_own_recorder():
        return
    assert _recorder is not None
    with _recorder.lock:
        kept = [*_recorder.sleeps, dict(entry)]
        _recorder.sleeps = kept if len(kept) <= MAX_SLEEPS else [kept[0], *kept[-(MAX_SLEEPS - 1):]]
    _recorder.write()


def stuck(verdict: Mapping[str, Any]) -> None:
    """This process (the trainer's) found the job stuck (``schema.STUCK_FIELDS``): written now, so that ``status``
    shows where every process waited, whatever happens next."""
    if not has_own_recorder():
        return
    assert _recorder is not None
    with _recorder.lock:
        _recorder.stuck = dict(verdict)
    _recorder.write()


def teardown_began() -> None:
    """The job's training has ended in this process (its trainer's ``fit``: the job watch stops): deaths from here on
    are the job's teardown's."""
    if not has_own_recorder():
        return
    assert _recorder is not None
    with _recorder.lock:
        _recorder.teardown = time.time()
    _recorder.write()


def job_id() -> str | None:
    """This process's job (``schema.JOB_ENV``), or None."""
    return os.environ.get(JOB_ENV) or None


def current_record() -> dict[str, Any] | None:
    """This process's record as last built (None when the plugin has not booted here)."""
    return None if _recorder is None else _recorder.record()


def record_path() -> str | None:
    if _recorder is None:
        return None
    return os.path.join(_recorder.base, _recorder.namespace, _recorder.name)
