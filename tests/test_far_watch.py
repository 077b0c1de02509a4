"""The job watch on every node: verl's real ``run_ppo`` on a real 3-node loopback Ray cluster whose nodes each record
in a status directory of their own (``${NODE_STATUS}``, expanded on each node from its raylet's environment, as on
separate machines), the two worker nodes in namespaces of their own (``nsnode.py``: their own host names, ``/proc``
and pids, so that no node's watch can see another's processes), the stand-in TaskRunner of
``scenarios/ray_gates.py`` waiting inside the job watch as verl's trainer's ``fit`` does.

- ``verl-ascend stacks --ray`` shows where the job's processes on every node wait (the TaskRunner in its wait);
- a worker on a node the TaskRunner is not on is SIGKILLed: the trainer's own host's records cannot show it; the
  watch of that node finds it, the job ends within seconds (exit 1) naming it, and `verl-ascend status --dir` on
  the trainer's host alone names it first (that node's records gathered there, the death noticed);
- the watch of another node is SIGSTOPped (what a node cut off looks like to the trainer: no answer): after the
  node bound (5 s here) the job ends naming that node as lost, and `status` names the node first;
- a whole worker node is lost at once (its PID 1 killed: the kernel kills every process of it, raylet included)
  while the runner holds a TCP connection to a worker there: the runner fails first, as gloo does on a peer's
  closed connection, before any node bound (raised out of the way here, ``FAR_BOUND``, so that only the last round
  can name the node); the job ends within seconds naming that node (the watch's last round: no answer, its raylet
  refuses a connection), and `status` names the node first, not the runner's error.

How fast: the watch's own part tightly (``SEEN``), the job's end as the test sees it loosely (``JOB_END``), as in
``test_ray_status.py``, which says why.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nsnode import NamespacedNode
from raycluster import driver_env, loopback_cluster, namespaced_nodes
from repo import REPO
from subprocesses import run_command
from test_ray_status import JOB_END, SEEN, wait_for

from verl_ascend_ext.runtime.records.reader import read_records

pytestmark = pytest.mark.long_module  # a 3-node Ray cluster and two held jobs (~60 s)
SCENARIO = str(REPO / "tests" / "scenarios" / "ray_gates.py")
CLI = str(Path(sys.executable).with_name("verl-ascend"))
NODE_STATUS = "NODE_STATUS"
FAR_BOUND = "600"  # VERL_ASCEND_EXT_JOB_WATCH_NODE_TIMEOUT where only the last round may name a node: past the test


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """Three nodes, each with its own status directory (node 0: the head; nodes 1 and 2 namespaced): the cluster,
    the directories, the namespaced nodes."""
    root = tmp_path_factory.mktemp("far-watch")
    dirs = [root / f"node{i}" for i in range(3)]
    with loopback_cluster({NODE_STATUS: str(dirs[0])}) as c, \
            namespaced_nodes(c, [{NODE_STATUS: str(d)} for d in dirs[1:]]) as nodes:
        yield c, dirs, nodes


def held_job(c, dirs: list[Path], tmp_path: Path, **env: str) -> tuple[subprocess.Popen, dict, Path, object]:
    """The held job started (its workers on every node, the victim on a node the runner is not on): the driver, what
    ready.json says, the hold directory and the driver's log file."""
    for d in dirs:  # each job its own records
        for found in sorted(d.rglob("*"), reverse=True):
            found.unlink() if found.is_file() else found.rmdir()
    hold = tmp_path / "hold"
    hold.mkdir()
    denv = driver_env(VERL_ASCEND_EXT_STATUS_DIR=f"${{{NODE_STATUS}}}", RAY_GATES_HOLD_DIR=str(hold),
                      RAY_GATES_VICTIM="far", **{NODE_STATUS: str(dirs[0])}, **env)
    log = (tmp_path / "driver.log").open("w+")
    driver = subprocess.Popen([sys.executable, SCENARIO, c.address, "hold"], env=denv, stdout=log, stderr=log,
                              text=True)
    wait_for(hold / "ready.json", driver, *dirs, tmp_path / "driver.log")
    return driver, json.loads((hold / "ready.json").read_text()), hold, log


def node_dir(dirs: list[Path], who: dict) -> Path:
    """The status directory holding the record of ``who`` (its ``host`` and ``pid``: each node numbers its own)."""
    (found,) = [d for d in dirs if any((r["host"], r["pid"]) == (who["host"], who["pid"])
                                       for r in read_records(str(d))[0])]
    return found


def outer_pid(nodes: list[NamespacedNode], who: dict) -> int | None:
    """The pid, in this namespace, of the process ``who`` (``host``, ``pid``): on a namespaced node, mapped (None when
    it no longer runs there); on the head (this machine's own host), its own."""
    node = next((n for n in nodes if n.host == who["host"]), None)
    return int(who["pid"]) if node is None else node.outer(who["pid"])


def here(nodes: list[NamespacedNode], who: dict) -> int:
    """``outer_pid`` of a process that must still run."""
    found = outer_pid(nodes, who)
    assert found is not None, f"{who} not found on {who['host']}"
    return found


def resume(nodes: list[NamespacedNode], who: dict) -> None:
    """SIGCONT to the stopped process ``who`` if it still runs: the job's end may have killed it (Ray ends a job's
    actors, stopped or not), and then there is nothing to resume."""
    pid = outer_pid(nodes, who)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):  # it may end between the lookup and the signal
            os.kill(pid, signal.SIGCONT)


def node_watch(where: list[Path], what: str) -> dict:
    """The record of a ``NodeWatch`` actor in one of the status directories ``where``, waited for (120 s at most; its
    node's watch starts with the job); ``what``: those directories, in the failure's words."""
    deadline = time.monotonic() + 120
    while True:
        found = next((r for d in where for r in read_records(str(d))[0] if r.get("actor_class") == "NodeWatch"), None)
        if found is not None:
            return found
        assert time.monotonic() < deadline, f"no NodeWatch actor recorded on {what}"
        time.sleep(0.5)


def status_of(status_dir: Path) -> dict:
    proc = run_command([CLI, "status", "--dir", status_dir, "--json"], driver_env(), check=False, cwd=REPO)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def end(driver: subprocess.Popen, hold: Path, log) -> None:
    (hold / "go").write_text("")
    driver.wait(timeout=240)
    log.close()


def test_a_worker_lost_on_another_node_ends_the_job_named_and_status_on_the_trainers_host_names_it(
        cluster, tmp_path: Path) -> None:
    c, dirs, nodes = cluster
    driver, info, hold, log = held_job(c, dirs, tmp_path)
    try:
        victim, runner = info["victim"], info["runner"]
        assert victim["node_id"] != runner["node_id"] and victim["host"] != runner["host"], (victim, runner)
        runner_dir, victim_dir = node_dir(dirs, runner), node_dir(dirs, victim)
        assert runner_dir != victim_dir  # the trainer's host's records cannot show the victim
        time.sleep(3)  # the node watches answer
        # where every process of the job waits, asked on every node (each asks its own, by signal)
        asked = run_command([CLI, "stacks", "--ray", "--address", c.address, "--dir", f"${{{NODE_STATUS}}}", "--json"],
                            driver_env(), check=False, timeout=180, cwd=REPO)
        killed, killed_at = time.monotonic(), time.time()
        os.kill(here(nodes, victim), signal.SIGKILL)
        returncode = driver.wait(timeout=120)
        took = time.monotonic() - killed
    finally:
        end(driver, hold, log)
    text = (tmp_path / "driver.log").read_text()
    assert returncode == 1 and took < JOB_END, (returncode, took, text[-4000:])
    lost = (f"JobProcessLost: a process of this job was lost while it trained: ray-worker Holder (host "
            f"{victim['host']}, pid {victim['pid']}) ended without a word")
    assert lost in text and f"noticed by the job watch of node {victim['node_id'][:8]}" in text, text[-4000:]
    assert asked.returncode in (0, 1), asked.stdout + asked.stderr
    shown = json.loads(asked.stdout)
    answered = {p["pid"]: p for p in shown["processes"] if "threads" in p}
    answered = {(p["host"], p["pid"]): p for p in shown["processes"] if "threads" in p}
    both = {(who["host"], who["pid"]) for who in (runner, victim)}
    assert both <= set(answered), shown["groups"]  # both nodes' processes answered
    runner_waits = [f["func"] for f in answered[runner["host"], runner["pid"]]["threads"][-1]["frames"]]
    assert "run" in runner_waits, runner_waits  # the stand-in TaskRunner's run, in its wait for `go`
    report = status_of(runner_dir)  # the trainer's host only, its cluster still up or not: the same files
    first = report["outcome"]["first_failure"]
    assert report["outcome"]["state"] == "failed", report["outcome"]
    assert (first["host"], first["pid"]) == (victim["host"], victim["pid"]), first
    assert first["how"].startswith("ended without a word, seen dead by the job watch of node"), first
    assert 0 <= first["at"] - killed_at < SEEN, (first["at"] - killed_at, first)  # the watch's own part
    gathered = [p for p in report["processes"] if (p["host"], p["pid"]) == (victim["host"], victim["pid"])]
    # the gathered copy of the victim's record: dead where its host is this machine; another host's liveness is not
    # judged here (unknown), its death known from the watch's notice (above)
    assert gathered and gathered[0]["alive"] is (False if victim["host"] == socket.gethostname() else None), gathered


def test_a_node_whose_watch_stops_answering_is_lost_and_named(cluster, tmp_path: Path) -> None:
    c, dirs, nodes = cluster
    driver, info, hold, log = held_job(c, dirs, tmp_path, VERL_ASCEND_EXT_JOB_WATCH_NODE_TIMEOUT="5")
    stopped = None
    try:
        runner_dir = node_dir(dirs, info["runner"])
        stopped = node_watch([d for d in dirs if d != runner_dir], "another node")  # a far node's watch
        time.sleep(3)
        stopped_here = here(nodes, stopped)
        os.kill(stopped_here, signal.SIGSTOP)
        halted = time.monotonic()
        returncode = driver.wait(timeout=120)
        took = time.monotonic() - halted
    finally:
        if stopped is not None:
            resume(nodes, stopped)
        end(driver, hold, log)
    text = (tmp_path / "driver.log").read_text()
    assert returncode == 1 and 5 <= took < 5 + JOB_END, (returncode, took, text[-4000:])  # the 5 s bound, then the end
    assert "JobProcessLost: a process of this job was lost while it trained: ray-node 127.0.0.1 node" in text
    assert "lost: silent for" in text, text[-4000:]
    first = status_of(runner_dir)["outcome"]["first_failure"]
    assert first["role"].startswith("ray-node 127.0.0.1 node") and "silent for" in first["how"], first


def test_a_job_without_progress_is_stuck_its_stacks_on_every_node_recorded_and_the_one_in_a_native_wait_apart(
        cluster, tmp_path: Path) -> None:
    """The stand-in TaskRunner completes no step; one worker on another node waits for ever in a native call that
    holds the GIL. With a 3 s floor (a first step's allowance of 12 s), the job ends non-zero as stuck, and
    `status --dir` on the runner's node shows where every process of the job waited, that worker apart."""
    c, dirs, _ = cluster
    driver, info, hold, log = held_job(c, dirs, tmp_path, VERL_ASCEND_EXT_JOB_STUCK_TIMEOUT="3", RAY_GATES_BLOCK="1")
    try:
        returncode = driver.wait(timeout=180)
    finally:
        end(driver, hold, log)
    text = (tmp_path / "driver.log").read_text()
    assert returncode == 1 and "JobStuck: this job made no progress for" in text, text[-4000:]
    report = status_of(node_dir(dirs, info["runner"]))
    stuck = report["outcome"]["stuck"]
    assert stuck is not None and stuck["mode"] == "error" and stuck["idle_s"] >= 12, stuck
    listed = " ".join(p for g in stuck["groups"] for p in g["processes"])
    victim = info["victim"]
    for name in ("worker0", "worker1", "worker2", "victim"):  # every node's processes
        assert f"host {info[name]['host']}, pid {info[name]['pid']})" in listed, (name, stuck["groups"])
    assert any(f"host {victim['host']}, pid {victim['pid']})" in a and "block" in a for a in stuck["apart"]), \
        stuck["apart"]
    assert report["outcome"]["state"] == "failed" and "JobStuck" in str(report["outcome"]["root_cause"]), report
    shown = run_command([CLI, "status", "--dir", node_dir(dirs, info["runner"])], driver_env(), check=False,
                        cwd=REPO).stdout
    assert "Job: FAILED (STUCK)" in shown and "apart from the rest:" in shown, shown


def test_a_silent_node_whose_raylet_answers_is_not_named_lost_when_the_trainer_fails(cluster, tmp_path: Path) -> None:
    """The last round's quiet side: a node whose watch is stopped (no answer) but whose raylet takes connections is
    not named lost when the runner fails for another cause (its peer killed on that node). The node bound is raised
    out of the way (``FAR_BOUND``): its silence outlasting the default 30 s on a busy machine would name the node
    rightly, and hide what this test is for."""
    c, dirs, nodes = cluster
    driver, info, hold, log = held_job(c, dirs, tmp_path, RAY_GATES_PEER="1",
                                       VERL_ASCEND_EXT_JOB_WATCH_NODE_TIMEOUT=FAR_BOUND)
    stopped = None
    try:
        victim = info["victim"]
        stopped = node_watch([node_dir(dirs, victim)], "the victim's node")
        time.sleep(3)  # its watch answers
        os.kill(here(nodes, stopped), signal.SIGSTOP)
        os.kill(here(nodes, victim), signal.SIGKILL)
        killed = time.monotonic()
        returncode = driver.wait(timeout=120)
        took = time.monotonic() - killed
    finally:
        if stopped is not None:
            resume(nodes, stopped)
        end(driver, hold, log)
    text = (tmp_path / "driver.log").read_text()
    assert returncode == 1 and took < JOB_END, (returncode, took, text[-4000:])  # the runner's error, fast
    assert "ConnectionError: Connection closed by peer" in text, text[-4000:]
    assert "gave no answer to the last round" not in text and "ray-node 127.0.0.1 node" not in text, text[-4000:]
    first = status_of(node_dir(dirs, info["runner"]))["outcome"]["first_failure"]
    assert not str(first["role"]).startswith("ray-node"), first


def test_a_whole_node_lost_at_once_ends_the_job_named_and_status_names_that_node_first(cluster, tmp_path: Path) -> None:
    """Last in the module: it takes a node away. A namespaced node the runner is not on is lost at once, its PID 1
    killed (every process of it with it, raylet and watch included): no word from it, as from a machine that lost
    power. The runner holds a TCP connection to the victim there and fails when it closes (gloo's way). The node
    bound is raised out of the way (``FAR_BOUND``): the last round names the node, whatever the machine's load."""
    c, dirs, nodes = cluster
    driver, info, hold, log = held_job(c, dirs, tmp_path, RAY_GATES_PEER="1",
                                       VERL_ASCEND_EXT_JOB_WATCH_NODE_TIMEOUT=FAR_BOUND)
    try:
        runner_dir = node_dir(dirs, info["runner"])
        lost = next(n for n in nodes if n.host == info["victim"]["host"])  # a namespaced node, not the runner's
        lost_dir = dirs[nodes.index(lost) + 1]
        (node_id,) = {w["node_id"][:8] for w in info.values() if w["host"] == lost.host}
        node_watch([lost_dir], "the node to lose")
        time.sleep(3)  # its watch answers
        lost.kill()
        killed = time.monotonic()
        returncode = driver.wait(timeout=120)
        took = time.monotonic() - killed
    finally:
        end(driver, hold, log)
    assert lost.processes() == [], lost.processes()  # nothing of the node runs
    text = (tmp_path / "driver.log").read_text()
    assert returncode == 1 and took < JOB_END, (returncode, took, text[-4000:])
    assert "gave no answer to the last round" in text and "its raylet at 127.0.0.1:" in text, text[-4000:]
    assert f"fit ends by an exception; lost before it: ray-node 127.0.0.1 node {node_id}" in text, text[-4000:]
    first = status_of(runner_dir)["outcome"]["first_failure"]
    assert first["role"].startswith(f"ray-node 127.0.0.1 node {node_id}"), first
    print(f"a whole namespaced node lost: the job ended {took:.1f} s later, named {first['role']!r}: {first['how']}")


def test_a_raylet_that_takes_a_connection_is_reachable_and_a_closed_port_is_named() -> None:
    """The last round's second witness (``far_nodes.raylet_unreachable``): a listening port, however busy its
    process (it never accepts here: the kernel does), is reachable; a port nobody holds refuses, named."""
    from verl_ascend_ext.features.job_watch.far_nodes import raylet_unreachable

    with socket.create_server(("127.0.0.1", 0), backlog=1) as busy:
        port = busy.getsockname()[1]
        assert raylet_unreachable({"NodeManagerAddress": "127.0.0.1", "NodeManagerPort": port}) is None
    why = raylet_unreachable({"NodeManagerAddress": "127.0.0.1", "NodeManagerPort": port})
    assert why is not None and why.startswith(f"at 127.0.0.1:{port} takes no connection (ConnectionRefusedError"), why
