"""How this process ended, as it can see it: put in its status record (``recorder``) at the end.

What a Python process can observe of its own end without changing it, installed once at boot (a few
attribute swaps; nothing runs until the end):

- an uncaught exception (``sys.excepthook``, chained to the hook that was there): type, message, the
  innermost frame's file:line, and the chain of causes, through the remote cause a Ray ``RayTaskError``
  carries (with the pid and address of the process where it was raised);
- ``sys.exit(code)`` called on the main thread (wrapped): the code, and the exception being handled when it
  was called: Hydra, which runs verl's ``main_ppo``, catches the job's exception, prints it and calls
  ``sys.exit(1)``;
- SIGTERM and SIGHUP where the process already handles them in Python when the plugin boots (Ray's workers
  do): the signal is recorded (also when it lands while this thread is writing the record: the handler's write
  completes inside it, ``recorder.Recorder.write``), then the handler that was there runs, as it would have.
  Over the default action nothing is installed: a Python handler runs only when the main thread runs Python, so a
  process blocked in native code (a hung collective) would no longer end on SIGTERM. SIGINT arrives as
  ``KeyboardInterrupt``, an exception;
- the interpreter's end (``atexit``): the record is written with what was seen (an exit without any of the
  above: the code is not known, ``None``).

Each of these writes the record at once, with every count the recorder had not written yet.

The gate ``VERL_ASCEND_EXT_PROCESS_END`` (default on) switches all of it off: then nothing is installed, and an
ended process shows as "ended without a word" (its errors raised by the plugin are still recorded).

A process that ends without any of these (SIGKILL, the OOM killer, a crash in native code, ``os._exit``, a
host that went away) leaves its last record as it was: ``verl-ascend status`` shows it as "ended without a
word", with the time that record was written (its counts up to ``recorder.FLUSH_EVERY`` seconds old). Errors
the plugin raises itself are recorded when they are raised (``recorder.failed``, by the patch engine). Only the
standard library is imported.
"""

from __future__ import annotations

import atexit
import re
import signal
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import Any

from verl_ascend_ext.patching.gates import Gate
from verl_ascend_ext.patching.status import raised_at
from verl_ascend_ext.runtime.records import recorder
from verl_ascend_ext.runtime.records.schema import EXCEPTION, EXIT, SIGNAL

MAX_CHAIN = 8
MAX_MESSAGE = 2000
SIGNALS = ("SIGTERM", "SIGHUP")
# Patterns compiled at first use (``re``'s cache): the boot imports this module in every process.
FILE_LINE = r'File "([^"]+)", line (\d+)'
RAY_TASK = r"\(pid=(\d+), ip=([^,)\s]+)"  # Ray's task error: "ray::Actor.method() (pid=N, ip=A, ...)"
ANSI = r"\x1b\[[0-9;]*m"
GATE = Gate("VERL_ASCEND_EXT_PROCESS_END", True,
            "Record how each process ended in its status record (exit code, uncaught exception with its chain, "
            "SIGTERM / SIGHUP through the handler that was there; `verl-ascend status`). Off: nothing is installed "
            "and ended processes show as ended without a word.")

_installed = False
_exit_call: tuple[Any, list[dict[str, Any]] | None] | None = None  # sys.exit's code, what was being handled
_uncaught: list[dict[str, Any]] | None = None
_signalled: str | None = None


def _ray_task_error(exc: BaseException) -> bool:
    """Ray's ``RayTaskError``, or the class Ray makes to be both it and its cause (``RayTaskError(KeyError)``, whose
    attributes other than ``cause`` are the cause's): told by name, Ray is not imported here."""
    return any(cls.__name__ == "RayTaskError" for cls in type(exc).__mro__)


def _remote(exc: BaseException) -> tuple[dict[str, Any], BaseException | None]:
    """A Ray task error's entry (the task, the pid and address of the process it failed in, the innermost
    file:line of its traceback) and its cause (raised in that process)."""
    text = re.sub(ANSI, "", _text(exc))
    first = text.splitlines()[0] if text else ""
    task = re.search(RAY_TASK, first)
    files = re.findall(FILE_LINE, text)
    cause = vars(exc).get("cause")
    entry = {"type": type(exc).__name__, "message": f"failed in {first.strip()[:300]}",
             "where": f"{files[-1][0]}:{files[-1][1]}" if files else None,
             "pid": int(task.group(1)) if task else None, "ip": task.group(2) if task else None}
    return entry, cause if isinstance(cause, BaseException) and cause is not exc else None


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception as err:  # a broken __str__ must not cost the record
        return f"<str() failed: {type(err).__name__}>"


def _message(exc: BaseException) -> str:
    text = _text(exc)
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + " ..."


def describe(exc: BaseException) -> list[dict[str, Any]]:
    """The exception and its causes, outermost first: type, message, innermost file:line; a Ray task error's
    entry adds the pid and address of the process that raised its cause."""
    chain: list[dict[str, Any]] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(chain) < MAX_CHAIN:
        seen.add(id(current))
        if _ray_task_error(current):
            entry, current = _remote(current)
            chain.append(entry)
            continue
        entry = {"type": type(current).__name__, "message": _message(current), "where": raised_at(current)}
        if current.__cause__ is not None:
            current = current.__cause__
        else:
            current = None if current.__suppress_context__ else current.__context__
        chain.append(entry)
    return chain


def ended() -> dict[str, Any]:
    """What is known of this process's end so far (``how``: signal, exception or exit)."""
    out: dict[str, Any] = {"at": time.time()}
    code = None if _exit_call is None else _exit_code(_exit_call[0])
    if _signalled is not None:
        out.update(how=SIGNAL, signal=_signalled, code=code)
    elif _uncaught is not None:
        out.update(how=EXCEPTION, code=1, error=_uncaught)
    else:
        out.update(how=EXIT, code=code)
        if _exit_call is not None and _exit_call[1] and code != 0:
            out["error"] = _exit_call[1]  # exiting while handling it: the cause of a non-zero exit
    return out


def exit_now(code: int, error: BaseException) -> None:
    """End this process at once with ``code`` (``os._exit``: no handler, no ``atexit``), its end recorded first as an
    exit after ``error``, and its standard streams flushed: for a process that must not wait on what it would wait
    on to end normally (a driver blocked in ``ray.get`` on a job that lost a process)."""
    import os

    recorder.ending({"at": time.time(), "how": EXIT, "code": code, "error": describe(error)})
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or gone: nothing left to flush
            continue
    os._exit(code)


def _exit_code(arg: Any) -> int:
    if arg is None:
        return 0
    return arg if isinstance(arg, int) else 1  # sys.exit("message") prints it and exits 1


def _write() -> None:
    recorder.ending(ended())


def _excepthook(previous: Callable[..., Any]) -> Callable[..., Any]:
    def excepthook(kind: type[BaseException], value: BaseException, tb: types.TracebackType | None) -> Any:
        global _uncaught
        if recorder.has_own_recorder():
            _uncaught = describe(value)
            _write()
        return previous(kind, value, tb)

    excepthook.verl_ascend_ext = True  # type: ignore[attr-defined]
    return excepthook


def _exit(previous: Callable[..., Any]) -> Callable[..., Any]:
    def exit(status: Any = None) -> Any:
        global _exit_call
        if threading.current_thread() is threading.main_thread() and recorder.has_own_recorder():
            handling = sys.exc_info()[1]
            _exit_call = (status, describe(handling) if handling is not None else None)
        return previous(status)

    exit.__doc__ = previous.__doc__
    exit.verl_ascend_ext = True  # type: ignore[attr-defined]
    return exit


def _chained(previous: Callable[..., Any]) -> Callable[..., Any]:
    def handler(signum: int, frame: types.FrameType | None) -> Any:
        global _signalled
        if recorder.has_own_recorder():
            _signalled = signal.Signals(signum).name
            _write()
        return previous(signum, frame)

    handler.verl_ascend_ext = True  # type: ignore[attr-defined]
    return handler


def _at_exit() -> None:
    if recorder.has_own_recorder():
        _write()


def install(on: bool = True) -> None:
    """Observe this process's end from now on (once per process; boot calls it with its gate's value, ``GATE``)."""
    global _installed
    if _installed or not on:
        return
    _installed = True
    if not getattr(sys.excepthook, "verl_ascend_ext", False):
        sys.excepthook = _excepthook(sys.excepthook)
    if not getattr(sys.exit, "verl_ascend_ext", False):
        sys.exit = _exit(sys.exit)
    atexit.register(_at_exit)
    rechain()


def rechain() -> None:
    """Put the process-end observer back in front of a signal handler installed after ``install`` (Ray's worker
    loop sets its SIGTERM handler after the runtime env's setup hook booted the plugin; a later loader may too).
    Nothing before ``install``, off the main thread (``signal.signal`` works there only), or where ours is first."""
    if not _installed or threading.current_thread() is not threading.main_thread():
        return
    for name in SIGNALS:
        sig = getattr(signal, name, None)
        previous = None if sig is None else signal.getsignal(sig)
        if callable(previous) and not getattr(previous, "verl_ascend_ext", False):
            signal.signal(sig, _chained(previous))
