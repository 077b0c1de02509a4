"""This process's own record, kept up to date: the only writer of a process's record is that process.

Written at the end of ``boot.activate`` and again whenever a patch status changes (a target module imported, a
refusal), another loader boots the plugin again, an eager replacement runs (or acts) for the first time in the
process, a replacement stands down on a path for the first time, an exception of the plugin's own escapes a
replacement or the boot (``failed``, when it escapes) and when the process ends (``ending``, from
``process_end``), and once in a Ray worker that booted idle, when Ray binds it an actor (``actor_watch``). What a
record holds is ``schema``'s.

Housekeeping is this writer's too, for its own kind only: after its first write it removes, at most once an hour
and in a daemon thread, the records of dead processes of its own host and namespace last written more than
``VERL_ASCEND_EXT_STATUS_KEEP`` seconds ago (``prune``). Reading records (``verl-ascend status``, a checkpoint save)
never writes. Any failure to write costs one WARNING per process and turns recording off in it; the job never
fails because of a record. Only the standard library is imported.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from verl_ascend_ext.patching.status import acts_of, stood_down_on, was_exercised
from verl_ascend_ext.patching.status import lock as status_lock
from verl_ascend_ext.runtime.records import actor_watch, identity, store
from verl_ascend_ext.runtime.records.schema import ACTS, EAGER, LOCAL_NAMESPACE, new_record

logger = logging.getLogger("verl_ascend_ext")

PLUGIN_ENV = ("VERL_USE_EXTERNAL_PLUGINS", "VLLM_PLUGINS")
MAX_ERRORS = 20
PRUNE_EVERY = 3600.0  # a booting process prunes its namespace (in a daemon thread) at most this often
PRUNE_STAMP = ".pruned"


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
            patches=patches, errors=list(self.errors), ended=self.ended)

    def write(self) -> None:
        with self.lock:
            if self.failed:
                return
            try:
                data = json.dumps(self.record(), separators=(",", ":")).encode()
                if data == self.last:
                    return
                first = self.fd is None
                if first:
                    base = store.open_base(self.base)
                    try:
                        self.fd = store.open_dir(self.namespace, dir_fd=base)
                    finally:
                        os.close(base)
                store.write_atomic(self.fd, self.name, data)
                self.last = data
                if first:
                    self._maybe_prune()
            except (OSError, ValueError, TypeError) as err:
                self.failed = True
                logger.warning("verl-ascend-ext: process status not recorded (pid %d): %s: %s. The job is not "
                               "affected; `verl-ascend status` will not see this process. Fix: set %s to a "
                               "private directory this user owns.", self.pid, type(err).__name__, err, store.DIR_ENV)

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


def _prune_own_kind(base: str, namespace: str, host: str) -> None:
    from verl_ascend_ext.runtime.records.prune import keep_seconds, prune

    try:
        prune(base, [namespace], host=host, keep=keep_seconds())
    except OSError as err:
        logger.debug("verl-ascend-ext: pruning %s/%s failed: %s", base, namespace, err)


_recorder: Recorder | None = None


def start(source: str, gates: Mapping[str, bool], disable: str, statuses: Callable[[], Mapping],
          observed: Mapping[str, str] | None = None) -> None:
    """Begin recording this process (end of boot): write the first record.

    ``observed``: patch id -> how its runs are seen (``schema``'s EAGER, ACTS, TRACED, IMPORT; default eager).
    """
    global _recorder
    _recorder = Recorder(source, gates, disable, statuses, observed or {})
    _recorder.write()
    if _recorder.session is not None and identity.ray_actor(identity.process_title()) is None:
        actor_watch.watch_for_actor(changed)


def loaded_again(source: str) -> None:
    """Another loader (e.g. vLLM after verl) booted the plugin in this process."""
    if _recorder is not None:
        with _recorder.lock:
            _recorder.loaded_by.append(source)
        _recorder.write()


def changed(_patch_id: str | None = None) -> None:
    """A patch status changed after boot, or a replacement ran, acted or stood down for the first time on a path:
    rewrite the record."""
    if _recorder is not None:
        _recorder.write()


def mine() -> bool:
    """Whether this process has a recorder of its own (not one inherited through ``fork``)."""
    return _recorder is not None and _recorder.pid == os.getpid()


def failed(by: str, err: BaseException, where: str | None) -> None:
    """An exception of the plugin's own (``by``: the patch id, or "boot") escaped at ``where`` (file:line of the
    raise): recorded now, so the record holds it even when the process lives on (a Ray actor's failed call)."""
    if not mine():
        return
    assert _recorder is not None
    entry = {"at": time.time(), "by": by, "type": type(err).__name__, "message": str(err), "where": where}
    with _recorder.lock:
        _recorder.errors = [*_recorder.errors, entry][-MAX_ERRORS:]
    _recorder.write()


def ending(ended: Mapping[str, Any]) -> None:
    """How this process ended (``process_end.ended``): written now, atomically."""
    if not mine():
        return
    assert _recorder is not None
    with _recorder.lock:
        _recorder.ended = dict(ended)
    _recorder.write()


def current_record() -> dict[str, Any] | None:
    """This process's record as last built (None when the plugin has not booted here)."""
    return None if _recorder is None else _recorder.record()


def record_path() -> str | None:
    if _recorder is None:
        return None
    return os.path.join(_recorder.base, _recorder.namespace, _recorder.name)
