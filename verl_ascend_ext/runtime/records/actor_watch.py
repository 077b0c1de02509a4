"""A Ray worker's record names its actor once Ray binds one to it.

A Ray worker boots the plugin before Ray gives it an actor (the runtime env's setup hook runs first, and the class
is unpickled, importing verl, while the title still says ``ray::IDLE``). Most actors later import a patch target,
which rewrites the record with the role read then; one that never does (fully-async's ``MessageQueue``) would stay
"idle" in ``status``. So a worker that boots idle watches its own title in a daemon thread and rewrites its record
once, when the title names an actor. Only the standard library is imported.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from verl_ascend_ext.runtime.records import identity

INTERVAL = 0.5  # seconds between two reads of /proc/self/cmdline (a few microseconds each)


def watch_for_actor(rewrite: Callable[[], None], title: Callable[[], str] = identity.process_title,
                    interval: float = INTERVAL) -> threading.Thread:
    """Call ``rewrite`` once, from a daemon thread, when ``title()`` first names a Ray actor."""
    stop = threading.Event()

    def wait_then_rewrite() -> None:
        while identity.ray_actor(title()) is None:
            stop.wait(interval)
        rewrite()

    thread = threading.Thread(target=wait_then_rewrite, name="verl-ascend-ext-ray-actor", daemon=True)
    thread.start()
    return thread
