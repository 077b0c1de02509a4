"""TEST-ONLY: a loopback Ray worker node that looks like another machine to the plugin.

On one machine every loopback raylet shares the host name and ``/proc`` with the others, which hides what a cluster
shows: a node's watch could read every node's processes, and two nodes' processes never share a pid. Here a worker
node runs in PID, UTS and mount namespaces of its own (``unshare``, as root): each of its processes gets the node's own
host name from ``socket.gethostname()`` and sees only the node's processes in its ``/proc``, under the node's own
pids (from 1). Shared still: the network (loopback, Ray's ports), the file system (status directories, Ray's session
directory, ``/dev/shm``), the cores and the memory. Start nodes one at a time (each registered before the next
starts): a Ray node numbers its files and sockets in the shared session directory by what it finds there when it
starts (``raylet.1.out``, ``sockets/raylet.1``), and two starting at once take the same (measured: the second never
registers).

PID 1 of the node is this module run as a script (``python nsnode.py HOST COMMAND...``): it sets the host name,
starts COMMAND (this module again, ``--raylet``: a Ray node started as ``ray.cluster_utils.Cluster.add_node`` starts
one, which ``ray start`` refuses on loopback), and reaps every process orphaned in the node,
as a machine's init does (an orphan left a zombie would look alive to nobody but would hold its pid); it exits with
COMMAND, and the kernel then kills whatever is left in the node. SIGKILL to it from outside is the whole node lost
at once. From outside (the test, the root namespace) a process of the node has another pid: ``outer`` maps one to
the other (``NSpid`` in ``/proc/PID/status``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

UNSHARE = ("unshare", "--pid", "--uts", "--mount-proc", "--fork", "--kill-child")


def require_unshare() -> str:
    """The ``unshare`` program, or an error naming what a namespaced node needs."""
    found = shutil.which("unshare")
    if found is None or os.geteuid() != 0:
        raise RuntimeError("a namespaced test node needs util-linux's `unshare` on PATH and root (CI runs as root): "
                           f"unshare {'found' if found else 'not found'}, uid {os.geteuid()}")
    return found


class NamespacedNode:
    """A Ray worker node joined to the cluster at ``address`` (the GCS), in namespaces of its own named ``host``; its
    raylet started with ``env`` (the whole environment, ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` in it) and
    ``node_args`` (``ray._private.parameter.RayParams``'s: ``num_cpus``, ``num_gpus``, ``resources``...)."""

    def __init__(self, address: str, host: str, env: Mapping[str, str], node_args: Mapping[str, object],
                 log: IO[str] | None = None) -> None:
        require_unshare()
        self.host = host
        command = [sys.executable, __file__, "--raylet", address, json.dumps(dict(node_args))]
        self.proc = subprocess.Popen([*UNSHARE, sys.executable, __file__, host, *command], env=dict(env),
                                     stdout=log or subprocess.DEVNULL, stderr=log or subprocess.DEVNULL,
                                     start_new_session=True)
        self.init = self._child(self.proc.pid, 10.0)
        ns = pid_namespace(self.init)
        if ns is None:
            raise RuntimeError(f"namespaced node {host}: its PID 1 (pid {self.init}) ended at once; see its log")
        self.ns = ns

    @staticmethod
    def _child(pid: int, wait: float) -> int:
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
                if children:
                    return int(children[0])
            time.sleep(0.05)
        raise RuntimeError(f"namespaced node: unshare (pid {pid}) started no child within {wait} s")

    def outer(self, pid: int) -> int | None:
        """The pid, in this (the root) namespace, of the node's process ``pid`` (its pid inside the node)."""
        return outer(self.ns, pid)

    def processes(self) -> list[int]:
        """Every process of the node, by its pid outside."""
        return members(self.ns)

    def kill(self) -> None:
        """The whole node lost at once: its PID 1 killed, the kernel kills every process in it."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.init, signal.SIGKILL)

    def stop(self, wait: float = 20.0) -> None:
        """Ray stopped on the node (SIGTERM to its PID 1, passed to the raylet's starter), then whatever is left
        killed."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.init, signal.SIGTERM)
        try:
            self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait(timeout=wait)


def wait_alive(cluster: object, count: int, timeout: float) -> list[dict]:
    """Wait until ``count`` nodes of ``cluster`` (a ``ray.cluster_utils.Cluster``) are alive in its GCS; their entries
    (Ray's ``node_table``: ``NodeID``, ``NodeManagerHostname``...)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [n for n in cluster.global_state.node_table() if n["Alive"]]  # type: ignore[attr-defined]
        if len(alive) >= count:
            return alive
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(alive)} of {count} Ray nodes alive after {timeout:.0f} s: "
                               f"{[n['NodeManagerHostname'] for n in alive]}")
        time.sleep(0.2)


def pid_namespace(pid: int) -> str | None:
    """The PID namespace of the process ``pid`` (``pid:[INODE]``), None when it is gone."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def members(ns: str) -> list[int]:
    """The processes of the PID namespace ``ns``, by their pids in this (the root) namespace."""
    return [int(entry.name) for entry in Path("/proc").iterdir()
            if entry.name.isdigit() and pid_namespace(int(entry.name)) == ns]


def outer(ns: str, pid: int) -> int | None:
    """The pid, in this (the root) namespace, of the process that is ``pid`` in the namespace ``ns``."""
    for found in members(ns):
        try:
            lines = Path(f"/proc/{found}/status").read_text().splitlines()
        except OSError:
            continue  # gone meanwhile
        nspid = next((line.split()[1:] for line in lines if line.startswith("NSpid:")), [])
        if nspid and int(nspid[-1]) == pid:
            return found
    return None


def _init(host: str, command: list[str]) -> int:
    """PID 1 of a node: the host name set, ``command`` run, every orphan reaped; ``command``'s exit status."""
    socket.sethostname(host)
    child = subprocess.Popen(command)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        if pid == child.pid:
            return os.waitstatus_to_exitcode(status)


def _raylet(address: str, node_args: Mapping[str, object]) -> None:
    """Start a Ray worker node as ``Cluster.add_node`` does and keep it until SIGTERM or SIGINT."""
    import ray._private.node
    import ray._private.parameter

    params = ray._private.parameter.RayParams(**node_args)
    params.update_if_absent(num_cpus=1, num_gpus=0, object_store_memory=150 << 20, min_worker_port=0,
                            max_worker_port=0, gcs_address=address, node_manager_port=0,
                            include_log_monitor=False)  # the head's log monitor reads the shared session directory
    params.dashboard_agent_listen_port = None  # a port of its own, not the head's agent's
    node = ray._private.node.Node(params, head=False, shutdown_at_exit=False, spawn_reaper=False)
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stopping.append(signum))
    while not stopping:
        signal.pause()
    node.kill_all_processes(check_alive=False, allow_graceful=True)


if __name__ == "__main__":
    if sys.argv[1] == "--raylet":
        _raylet(sys.argv[2], json.loads(sys.argv[3]))
    else:
        sys.exit(_init(sys.argv[1], sys.argv[2:]))
