"""Where records live and how they are written: a private per-user directory, atomic writes, safe removal.

Where: ``$VERL_ASCEND_EXT_STATUS_DIR`` or ``<system temp dir>/verl-ascend-ext-status-<uid>``, then one namespace
directory: the Ray session name for Ray worker processes, ``local`` for every other process. File name:
``<host>-<pid>-<process start ticks>.json``, so a reused pid never overwrites a live record.

Safety: directories are created 0700 and must be owned by this user, not be symlinks and not be writable by
others; files are written through directory file descriptors with ``O_NOFOLLOW|O_EXCL`` to a temporary name of
their own, then renamed (atomic for readers). Only the standard library is imported.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import re
import stat
import threading
from collections.abc import Mapping

logger = logging.getLogger("verl_ascend_ext")

DIR_ENV = "VERL_ASCEND_EXT_STATUS_DIR"
SUFFIX = ".json"
_writes = itertools.count()  # numbers each write's temporary file (next() is atomic: also from a signal handler)


class UnsafeDirectoryError(OSError):
    """A status directory that is not this user's own private directory."""


def default_base() -> str:
    import tempfile  # already imported in any process that imports verl or vLLM

    return os.path.join(tempfile.gettempdir(), f"verl-ascend-ext-status-{os.geteuid()}")


def base_dir(environ: Mapping[str, str] | None = None) -> str:
    """The status directory this process's environment names (``VERL_ASCEND_EXT_STATUS_DIR``, else the default).

    ``${NAME}`` (or ``$NAME``) in it is that variable of the same environment, as Ray expands a runtime env's
    variables on each node from its raylet's: a job's driver can give every node a path of its own (an unknown name
    is left as written)."""
    env = os.environ if environ is None else environ
    raw = env.get(DIR_ENV)
    if not raw:
        return default_base()
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m[1] or m[2], m[0]), raw)


def record_name(host: str, pid: int, ticks: int | None) -> str:
    return f"{host}-{pid}-{ticks or 0}{SUFFIX}"


def _check_dir(fd: int, path: str) -> None:
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectoryError(f"{path} is not a directory")
    if st.st_uid != os.geteuid():
        raise UnsafeDirectoryError(f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}). Fix: "
                                   f"run as uid {st.st_uid}, the user whose processes record there, or use a "
                                   f"directory this user owns ({DIR_ENV} for a job, --dir for `verl-ascend status`)")
    if st.st_mode & 0o022:
        raise UnsafeDirectoryError(f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}); "
                                   "use a private directory (chmod 700)")


def open_dir(path: str, dir_fd: int | None = None, create: bool = True) -> int:
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
    return open_dir(os.path.abspath(base), create=create)


def write_atomic(dir_fd: int, name: str, data: bytes) -> None:
    """Write ``name`` inside ``dir_fd`` atomically: a fresh temporary file (no symlink followed), then rename.

    Each call has a temporary name of its own (process, thread, and a counter), so that a write a signal handler
    makes while this thread is inside another one does not collide with it."""
    tmp = f".{name}.{os.getpid()}.{threading.get_ident()}.{next(_writes)}.tmp"
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


def remove(path: str) -> None:
    """Remove one record file (its directory checked as ours first)."""
    dir_fd = open_dir(os.path.dirname(path), create=False)
    try:
        os.unlink(os.path.basename(path), dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
