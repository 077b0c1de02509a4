"""What really ran: one small JSON record per process that booted the plugin, kept up to date.

Written once at the end of ``boot.activate`` and again whenever a patch status changes (a target module
imported, a refusal), another loader boots the plugin again, an eager replacement runs for the first time
in the process (once per patch; never again on later calls), the plugin raises an error of its own
(``raised``: when it is raised) and when the process ends (``ending``, from ``process_end``). A record holds
host, pid, start time, role, distributed ranks (``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` of verl's workers,
vLLM's data-parallel rank of an engine core), who loaded the plugin, versions of the stack modules already
imported, gates as parsed, every patch's in-process status, the errors the plugin raised and how the
process ended. ``verl-ascend status`` reads them (``status_report``).

Where: ``$VERL_ASCEND_EXT_STATUS_DIR`` or ``<system temp dir>/verl-ascend-ext-status-<uid>``, then one
namespace directory: the Ray session name for Ray worker processes (from the worker's command line),
``local`` for every other process (drivers, vLLM servers and the processes they spawn). File name:
``<host>-<pid>-<process start ticks>.json``, so a reused pid never overwrites a live record.

Safety: directories are created 0700 and must be owned by this user, not be symlinks and not be writable
by others; files are written through directory file descriptors with ``O_NOFOLLOW|O_EXCL`` to a temporary
name, then renamed (atomic for readers). Any failure costs one WARNING per process and turns recording
off in it; the job never fails because of a record. Only the standard library is imported.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from verl_ascend_ext.patching.status import lock as status_lock
from verl_ascend_ext.patching.status import was_exercised

logger = logging.getLogger("verl_ascend_ext")

DIR_ENV = "VERL_ASCEND_EXT_STATUS_DIR"
KEEP_ENV = "VERL_ASCEND_EXT_STATUS_KEEP"  # seconds a dead process's record is kept (default one day)
DEFAULT_KEEP = 86400.0
PRUNE_EVERY = 3600.0  # a booting process prunes its namespace (in a daemon thread) at most this often
PRUNE_STAMP = ".pruned"
LOCAL_NAMESPACE = "local"
SCHEMA = 1
EAGER = "eager"  # record.Observed.EAGER: the replacement reports its first run (``exercised``)
ACTS = "acts"  # record.Observed.ACTS: the replacement reports the first call in which it did its work
SUFFIX = ".json"
# Modules whose ``__version__`` a record reports when they are already imported (never imported here).
VERSION_MODULES = {"verl": "verl", "vllm": "vllm", "vllm_ascend": "vllm-ascend", "torch": "torch",
                   "torch_npu": "torch_npu", "transformers": "transformers", "ray": "ray"}
PLUGIN_ENV = ("VERL_USE_EXTERNAL_PLUGINS", "VLLM_PLUGINS")
RANK_ENV = {"rank": "RANK", "local_rank": "LOCAL_RANK", "world_size": "WORLD_SIZE"}  # torch.distributed's, verl's
DP_ENGINE = re.compile(r"EngineCore_DP(\d+)")  # vLLM names each data-parallel engine core process so
MAX_ERRORS = 20
# Roles; a Ray actor class is kept beside the role (``actor_class``).
DRIVER, RAY_WORKER, VLLM_FRONTEND, ENGINE_CORE, VLLM_WORKER, OTHER = (
    "driver", "ray-worker", "vllm-frontend", "engine-core", "vllm-worker", "other")
# Ray actors that are vLLM processes: vLLM's data-parallel engine cores and Ray-executor workers, and verl's
# rollout server, which runs vLLM's front-end (AsyncLLM) in its own process. Their role is vLLM's.
VLLM_ACTORS = {"DPEngineCoreActor": ENGINE_CORE, "EngineCoreActor": ENGINE_CORE, "RayWorkerWrapper": VLLM_WORKER,
               "vLLMHttpServer": VLLM_FRONTEND}


class UnsafeDirectoryError(OSError):
    """A status directory that is not this user's own private directory."""


def default_base() -> str:
    import tempfile  # already imported in any process that imports verl or vLLM

    return os.path.join(tempfile.gettempdir(), f"verl-ascend-ext-status-{os.geteuid()}")


def base_dir(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return env.get(DIR_ENV) or default_base()


def ray_session(argv: Sequence[str] | None = None) -> str | None:
    """The Ray session of this process when it is a Ray worker (Ray passes ``--session-name`` to its workers)."""
    args = sys.argv if argv is None else argv
    if not args or not args[0].endswith("default_worker.py"):
        return None
    for arg in args[1:]:
        if arg.startswith("--session-name="):
            return arg.split("=", 1)[1] or None
    return None


def process_title(pid: int | str = "self") -> str:
    """The process title (Ray and vLLM rewrite it, e.g. ``ray::WorkerDict.actor_rollout_init``); "" if unknown."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read(512).split(b"\0", 1)[0].decode(errors="replace").strip()
    except OSError:
        return ""


def _stat(pid: int | str) -> tuple[str, int] | None:
    """(state, start ticks) from ``/proc/PID/stat`` (fields 3 and 22), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:
        fields = data[data.rindex(b")") + 2:].split()
        return fields[0].decode(), int(fields[19])
    except (ValueError, IndexError):
        return None


def start_ticks(pid: int | str = "self") -> int | None:
    """Start time in clock ticks since boot (``/proc/PID/stat`` field 22): with the pid, a process's identity."""
    found = _stat(pid)
    return None if found is None else found[1]


def alive(pid: int, ticks: int | None) -> bool:
    """Whether the process ``pid`` that started at ``ticks`` still runs on this host (a zombie does not: it
    has exited and waits only for its parent to collect the exit status)."""
    found = _stat(pid)
    if found is not None:
        state, now = found
        return state not in ("Z", "X") and (ticks is None or now == ticks)
    if os.path.isdir("/proc"):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ray_actor(title: str) -> str | None:
    """Actor class (or task name) from a Ray worker's title ``ray::Name.method`` / ``ray::Name``; None when idle."""
    if not title.startswith("ray::"):
        return None
    name = title[5:].split(".", 1)[0].split()[0] if title[5:].strip() else ""
    return None if name in ("", "IDLE") else name


def detect_role(loaded_by: Sequence[str], argv: Sequence[str], title: str, mp_name: str | None,
                session: str | None) -> tuple[str, str | None]:
    """(role, actor class) from cheap signals: the multiprocessing process name vLLM gives its children and
    vLLM's process titles (first: a child spawned by a Ray worker inherits the worker's command line), Ray's
    worker command line and title, and who loaded the plugin."""
    name = mp_name or ""
    if name.startswith("EngineCore") or title.startswith("VLLM::EngineCore"):
        return ENGINE_CORE, None
    if name.startswith("VllmWorker") or title.startswith("VLLM::Worker"):
        return VLLM_WORKER, None
    if name.startswith("ApiServer") or title.startswith("VLLM::APIServer"):
        return VLLM_FRONTEND, None
    if name not in ("", "MainProcess"):
        return OTHER, None
    if session is not None:
        actor = ray_actor(title)
        return VLLM_ACTORS.get(actor or "", RAY_WORKER), actor
    program = os.path.basename(argv[0]) if argv else ""
    if _vllm_helper(argv):
        return OTHER, None
    if program == "vllm" or (loaded_by and loaded_by[0] == "vllm"):
        return VLLM_FRONTEND, None
    return DRIVER, None


def _vllm_helper(argv: Sequence[str]) -> bool:
    """A short-lived ``python -m vllm.<module>`` helper (e.g. the model registry's inspection subprocess):
    ``argv[0]`` is a module file inside vLLM that is not one of its entry points."""
    path = (argv[0] if argv else "").replace(os.sep, "/")
    return "/vllm/" in path and path.endswith(".py") and "/vllm/entrypoints/" not in path


def _mp_name() -> str | None:
    process = sys.modules.get("multiprocessing.process")  # set in spawned children before their target runs
    return process.current_process().name if process is not None else None


def ranks(environ: Mapping[str, str], mp_name: str | None) -> dict[str, int]:
    """This process's distributed ranks where it has them: ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` (what
    verl gives each worker actor and torch.distributed reads) and vLLM's data-parallel rank of an engine core."""
    out = {key: int(environ[name]) for key, name in RANK_ENV.items()
           if environ.get(name, "").strip().isdigit()}
    found = DP_ENGINE.match(mp_name or "")
    if found:
        out["dp_rank"] = int(found.group(1))
    return out


def node_ip() -> str | None:
    """The node address Ray knows this worker by (what its errors name), when Ray is imported and connected."""
    worker = getattr(sys.modules.get("ray._private.worker"), "global_worker", None)
    node = getattr(worker, "node", None)
    address = getattr(node, "node_ip_address", None)
    return address if isinstance(address, str) else None


def ray_actor_id() -> str | None:
    """The Ray actor this worker process runs (what Ray's errors about it name), when Ray is imported."""
    worker = getattr(sys.modules.get("ray._private.worker"), "global_worker", None)
    core = getattr(worker, "core_worker", None)
    if core is None:
        return None
    actor = core.get_actor_id()
    return None if actor.is_nil() else actor.hex()


def imported_versions() -> dict[str, str]:
    out = {}
    for module, dist in VERSION_MODULES.items():
        version = getattr(sys.modules.get(module), "__version__", None)
        if isinstance(version, str):
            out[dist] = version
    return out


# --- the private directory ------------------------------------------------------------------------------

def _check_dir(fd: int, path: str) -> None:
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectoryError(f"{path} is not a directory")
    if st.st_uid != os.geteuid():
        raise UnsafeDirectoryError(f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})")
    if st.st_mode & 0o022:
        raise UnsafeDirectoryError(f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}); "
                                   "use a private directory (chmod 700)")


def _open_dir(path: str, dir_fd: int | None = None, create: bool = True) -> int:
    """Open (creating with 0700 when asked) one directory level without following a symlink; check it is ours."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700, dir_fd=dir_fd)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeDirectoryError(f"{path} is a symbolic link or not a directory; a status directory must be "
                                       "a real directory") from err
        raise
    try:
        _check_dir(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_base(base: str, create: bool = True) -> int:
    """File descriptor of ``base``; parents are created (0700) when missing, the last component is checked."""
    parent = os.path.dirname(os.path.abspath(base))
    if create and not os.path.isdir(parent):
        os.makedirs(parent, 0o700, exist_ok=True)
    return _open_dir(os.path.abspath(base), create=create)


def write_atomic(dir_fd: int, name: str, data: bytes) -> None:
    """Write ``name`` inside ``dir_fd`` atomically: a fresh temporary file (no symlink followed), then rename."""
    tmp = f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError as err:
            logger.debug("could not remove %s: %s", tmp, err)
        raise


# --- this process's record ------------------------------------------------------------------------------

class _Recorder:
    def __init__(self, source: str, gates: Mapping[str, bool], disable: str, statuses: Callable[[], Mapping],
                 observed: Mapping[str, str]):
        self.lock = status_lock  # the lock status changes are made under: one lock order, no deadlock
        self.statuses = statuses
        self.observed = dict(observed)
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.ppid = os.getppid()  # which process started it (e.g. a vLLM server's EngineCore)
        self.ticks = start_ticks()
        self.session = ray_session()
        self.namespace = self.session or LOCAL_NAMESPACE
        self.name = f"{self.host}-{self.pid}-{self.ticks or 0}{SUFFIX}"
        self.base = base_dir()
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

        title = process_title()
        mp_name = _mp_name()
        role, actor = detect_role(self.loaded_by, sys.argv, title, mp_name, self.session)
        if self.session is not None:
            self.ip = self.ip or node_ip()
            self.actor_id = self.actor_id or ray_actor_id()
        patches = {}
        for pid, st in sorted(self.statuses().items()):
            module = st.target.partition(":")[0]
            observed = self.observed.get(pid, EAGER)
            patches[pid] = {"status": st.status.value, "detail": st.detail, "where": st.where, "target": st.target,
                            "imported": module in sys.modules, "observed": observed,
                            "exercised": was_exercised(pid) if observed in (EAGER, ACTS) else None}
        return {
            "schema": SCHEMA, "host": self.host, "pid": self.pid, "ppid": self.ppid, "proc_start": self.ticks,
            "started": self.started,
            "updated": time.time(), "role": role, "actor_class": actor, "title": title,
            "ranks": ranks(os.environ, mp_name), "ip": self.ip, "actor_id": self.actor_id,
            "loaded_by": list(self.loaded_by), "namespace": self.namespace,
            "versions": {"verl-ascend-ext": __version__, "python": sys.version.split()[0], **imported_versions()},
            "gates": self.gates, "disable": self.disable,
            "plugin_env": {k: os.environ.get(k) for k in PLUGIN_ENV},
            "patches": patches,
            "errors": list(self.errors), "ended": self.ended,
        }

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
                    base = open_base(self.base)
                    try:
                        self.fd = _open_dir(self.namespace, dir_fd=base)
                    finally:
                        os.close(base)
                write_atomic(self.fd, self.name, data)
                self.last = data
                if first:
                    self._maybe_prune()
            except (OSError, ValueError, TypeError) as err:
                self.failed = True
                logger.warning("verl-ascend-ext: process status not recorded (pid %d): %s: %s. The job is not "
                               "affected; `verl-ascend status` will not see this process. Fix: set %s to a "
                               "private directory this user owns.", self.pid, type(err).__name__, err, DIR_ENV)


    def _maybe_prune(self) -> None:
        """Prune this host's dead records of the namespace in a daemon thread, at most every PRUNE_EVERY s."""
        assert self.fd is not None
        try:
            last = os.stat(PRUNE_STAMP, dir_fd=self.fd, follow_symlinks=False).st_mtime
        except FileNotFoundError:
            last = 0.0
        if time.time() - last < PRUNE_EVERY:
            return
        write_atomic(self.fd, PRUNE_STAMP, b"")
        path = os.path.join(self.base, self.namespace)
        threading.Thread(target=_prune_quietly, args=(path, self.host), name="verl-ascend-ext-prune",
                         daemon=True).start()


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


def _prune_quietly(path: str, host: str) -> None:
    try:
        records, _ = read_records(os.path.dirname(path), [os.path.basename(path)])
        housekeep(records, host, time.time(), keep_seconds())
    except OSError as err:
        logger.debug("verl-ascend-ext: pruning %s failed: %s", path, err)


_recorder: _Recorder | None = None


def start(source: str, gates: Mapping[str, bool], disable: str, statuses: Callable[[], Mapping],
          observed: Mapping[str, str] | None = None) -> None:
    """Begin recording this process (end of boot): write the first record.

    ``observed``: patch id -> how its first run is seen (``record.Observed`` values; default "eager").
    """
    global _recorder
    _recorder = _Recorder(source, gates, disable, statuses, observed or {})
    _recorder.write()


def loaded_again(source: str) -> None:
    """Another loader (e.g. vLLM after verl) booted the plugin in this process."""
    if _recorder is not None:
        with _recorder.lock:
            _recorder.loaded_by.append(source)
        _recorder.write()


def status_changed(_status: object = None) -> None:
    """A patch status changed after boot (post-import apply, refusal) or a replacement ran for the first time:
    rewrite the record."""
    if _recorder is not None:
        _recorder.write()


def mine() -> bool:
    """Whether this process has a recorder of its own (not one inherited through ``fork``)."""
    return _recorder is not None and _recorder.pid == os.getpid()


def raised(err: BaseException, by: str) -> None:
    """The plugin is raising ``err`` (``by``: the patch or part raising it): record it now, with the raiser's
    file:line, so the record holds it even when the process never ends on it (a Ray actor's failed call)."""
    if not mine():
        return
    assert _recorder is not None
    caller = sys._getframe(1)
    entry = {"at": time.time(), "by": by, "type": type(err).__name__, "message": str(err),
             "where": f"{caller.f_code.co_filename}:{caller.f_lineno}"}
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


# --- reading --------------------------------------------------------------------------------------------

def read_records(base: str, namespaces: Iterable[str] | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Records under ``base`` (all namespaces, or those given) and notes on what was ignored and why.

    Files owned by another user, symlinks, unreadable or malformed files are ignored and named in the notes.
    """
    notes: list[str] = []
    records: list[dict[str, Any]] = []
    try:
        base_fd = open_base(base, create=False)
    except FileNotFoundError:
        return records, [f"no status directory at {base} (no process has recorded its status there)"]
    except OSError as err:
        return records, [f"status directory {base} not read: {err}"]
    try:
        names = sorted(os.listdir(base_fd)) if namespaces is None else list(namespaces)
        for ns in names:
            if ns.startswith("."):
                continue
            try:
                ns_fd = _open_dir(ns, dir_fd=base_fd, create=False)
            except FileNotFoundError:
                continue
            except OSError as err:
                notes.append(f"namespace {os.path.join(base, ns)} ignored: {err}")
                continue
            try:
                _read_namespace(base, ns, ns_fd, records, notes)
            finally:
                os.close(ns_fd)
    finally:
        os.close(base_fd)
    return records, notes


def _read_namespace(base: str, ns: str, ns_fd: int, records: list[dict[str, Any]], notes: list[str]) -> None:
    foreign = []
    uid = os.geteuid()
    for name in os.listdir(ns_fd):
        if not name.endswith(SUFFIX) or name.startswith("."):
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
            data = f.read()
        try:
            rec = json.loads(data)
            if not isinstance(rec, dict) or rec.get("schema") != SCHEMA:
                raise ValueError(f"not a schema-{SCHEMA} record")
        except ValueError as err:
            notes.append(f"{path} ignored: {err}")
            continue
        rec["file"] = path
        rec["namespace"] = ns
        records.append(rec)
    if foreign:
        notes.append(f"ignored {len(foreign)} record(s) in {os.path.join(base, ns)} owned by another user: "
                     + ", ".join(sorted(foreign)[:5]) + (" ..." if len(foreign) > 5 else ""))


def mark_dead(path: str, rec: dict[str, Any], now: float) -> None:
    """Rewrite a dead process's record with ``dead_since`` (atomically; a failure only leaves it unmarked)."""
    rec = {k: v for k, v in rec.items() if k not in ("file", "alive")}
    rec["dead_since"] = now
    dir_fd = _open_dir(os.path.dirname(path), create=False)
    try:
        write_atomic(dir_fd, os.path.basename(path), json.dumps(rec, separators=(",", ":")).encode())
    finally:
        os.close(dir_fd)


def remove(path: str) -> None:
    dir_fd = _open_dir(os.path.dirname(path), create=False)
    try:
        os.unlink(os.path.basename(path), dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def housekeep(records: list[dict[str, Any]], host: str, now: float, keep: float) -> list[dict[str, Any]]:
    """Set ``alive`` on each record (None for another host's), mark this host's dead records, prune old ones.

    Returns the records still on disk. A record whose process is gone gets ``dead_since`` (rewritten once);
    ``keep`` seconds later it is removed. Failures to rewrite or remove leave the file as it was.
    """
    kept = []
    for rec in records:
        if rec.get("host") != host:
            rec["alive"] = None
            kept.append(rec)
            continue
        rec["alive"] = alive(int(rec.get("pid", 0)), rec.get("proc_start"))
        if rec["alive"]:
            rec.pop("dead_since", None)
            kept.append(rec)
            continue
        try:
            if rec.get("dead_since") is None:
                rec["dead_since"] = now
                mark_dead(rec["file"], rec, now)
            elif now - float(rec["dead_since"]) >= keep:
                remove(rec["file"])
                continue
        except OSError as err:
            logger.debug("verl-ascend-ext: %s not updated: %s", rec.get("file"), err)
        kept.append(rec)
    return kept
