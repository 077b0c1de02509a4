"""The job watch on every other node of a job: one small actor a node (``NodeWatch``), heard by the trainer's watch
at each of its looks (``FarWatches``). Imported only in the process that runs verl's trainer, where Ray is connected.

A Ray cluster reports a lost actor to whoever waits on it, but vLLM's EngineCore and workers are subprocesses of the
``vLLMHttpServer`` actor: Ray never notices them, and vLLM's own engine monitor works within one host. The trainer's
watch (``records.watch``) sees the processes of its own host; on every other node that can take the job's workers
a ``NodeWatch`` actor (no CPU asked, pinned to the node, owned by the trainer's process: it ends with the job) runs
the same watch over that node's processes and status directory, and keeps what it finds. At each look the trainer
asks every node for what its watch found (``FarWatches.hear``: one call a node in flight at a time, never waited
on): a loss there ends the job as a loss on the trainer's host does, named with its node. The answer also carries
the node's rollout workers' new sleeps (first and newest of each), for the job's sleep-memory metric.

A lost node: a node whose watch answered once and then stopped answering for ``silence`` seconds
(``VERL_ASCEND_EXT_JOB_WATCH_NODE_TIMEOUT``: the node gone, its network cut, its raylet or the watch's process
killed or stopped), or whose watch Ray reports dead (the node marked dead by Ray's health checks, the actor's
process killed: at once; Ray's "temporarily unavailable" is only a round without an answer, except in the last
round, taken when the trainer's ``fit`` fails: a node whose watch does not answer it while its raylet takes no TCP
connection (``raylet_unreachable``) is lost then, dated when it was last heard; a lost node's peers often fail
before its silence bound, as gloo does on a closed connection, and name only themselves). A watch that never
answered within ``START_ALLOWANCE`` seconds of its start, or failed
to start, is said at WARNING and not counted (that node is then not watched: the job goes on).

When the job ends (the trainer's ``fit`` ends) or a loss ends it, each node's records of the job are gathered into
the trainer's status directory (``records.gathered``): ``verl-ascend status --dir`` there names what failed on any
node after the cluster is gone.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from verl_ascend_ext.runtime.records import gathered, identity, stacks, store
from verl_ascend_ext.runtime.records.ends import NO_WORD, Failure
from verl_ascend_ext.runtime.records.reader import collect, read_records, read_shared
from verl_ascend_ext.runtime.records.watch import INTERVAL, JobWatch, Loss

logger = logging.getLogger("verl_ascend_ext.features.job_watch")

START_ALLOWANCE = 180.0  # s a node's watch may take to answer first (a worker process started on a busy node)
GATHER_TIMEOUT = 10.0  # s the trainer waits for the nodes' records when the job ends
NODE_ROLE = "ray-node"
# Ray's errors that may pass (an actor "temporarily unavailable": a network blip, a busy raylet): a round without an
# answer, not the watch's end; Ray's ActorDiedError (the node marked dead, the process gone) ends it
PASSING = ("ActorUnavailableError", "GetTimeoutError")
RAYLET_CONNECT_TIMEOUT = 1.0  # s a node's raylet may take to accept a TCP connection in the last round
WORKER_RESOURCES = ("CPU", "GPU", "NPU")  # what a node offers the job's workers (verl's pools ask for these)


class NodeWatch:
    """On one node (a Ray actor): the job's watch of that node's processes (``records.watch.JobWatch``, as the
    trainer's own, from ``started``), what it found kept for the trainer's next ``report``."""

    def __init__(self, job: str, started: float, stopped_limit: float | None, interval: float = INTERVAL) -> None:
        import ray

        self.job = job
        self.node_id = ray.get_runtime_context().get_node_id()
        self.host = socket.gethostname()
        self.base = store.base_dir()
        self.found: list[Loss] = []
        self.sent: dict[tuple[Any, Any, Any], Any] = {}  # rollout worker -> the number of its newest sleep reported
        self.lock = threading.Lock()
        by = f"the job watch of node {self.node_id[:8]} (host {self.host}, pid {os.getpid()})"
        self.watch = JobWatch(job, self.base, self._keep, by=by, interval=interval, stopped_limit=stopped_limit,
                              started=started, keep_looking=True).start()

    def _keep(self, losses: list[Loss]) -> None:
        """The newest look's losses: every one found so far, dated again with what the look knows."""
        with self.lock:
            self.found = list(losses)

    def report(self) -> dict[str, Any]:
        """Who this watch is and what it found so far."""
        with self.lock:
            found = list(self.found)
        return {"host": self.host, "pid": os.getpid(), "proc_start": identity.start_ticks(),
                "node_id": self.node_id, "losses": found, "at": time.time(), "sleepers": self._new_sleeps()}

    def _new_sleeps(self) -> list[dict[str, Any]]:
        """The node's rollout workers of the job that slept since the last report (``gathered.sleeper``)."""
        records, _ = read_shared(self.base, max_age=INTERVAL)  # the watch's own read of its last look
        out = []
        for rec in records:
            if rec.get("job") != self.job or not rec.get("sleeps"):
                continue
            key = (rec.get("host"), rec.get("pid"), rec.get("proc_start"))
            if self.sent.get(key) != rec["sleeps"][-1].get("n"):
                self.sent[key] = rec["sleeps"][-1].get("n")
                out.append(gathered.sleeper(rec))
        return out

    def records(self) -> list[dict[str, Any]]:
        """This node's records of the job, as they are now."""
        records, _ = read_records(self.base)
        return [rec for rec in records if rec.get("job") == self.job]

    def stacks(self, timeout: float) -> list[dict[str, Any]]:
        """Where each live process of the job on this node waits (``records.stacks.ask``)."""
        records, _ = collect(self.base)
        return stacks.ask(stacks.of_job_here(records, self.job), timeout)

    def stop(self) -> None:
        self.watch.stop()


def raylet_unreachable(node: dict[str, Any], timeout: float = RAYLET_CONNECT_TIMEOUT) -> str | None:
    """Why the raylet of ``node`` (an entry of ``ray.nodes()``) takes no TCP connection, or None when it takes one.
    A raylet that runs, however busy, takes one (its kernel accepts); a killed one refuses, a machine gone or cut off
    does not answer within ``timeout``."""
    address = (node.get("NodeManagerAddress") or "", int(node.get("NodeManagerPort") or 0))
    try:
        with socket.create_connection(address, timeout=timeout):
            return None
    except OSError as err:
        return f"at {address[0]}:{address[1]} takes no connection ({type(err).__name__}: {err})"


class FarWatches:
    """The trainer's side: a ``NodeWatch`` on every alive node that can take the job's workers, this node aside."""

    def __init__(self, ray: Any, job: str, started: float, stopped_limit: float | None, silence: float,
                 interval: float = INTERVAL, now: Callable[[], float] = time.monotonic) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.ray, self.silence, self.now = ray, silence, now
        own = ray.get_runtime_context().get_node_id()
        self.nodes = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive") and n["NodeID"] != own
                      and any(n.get("Resources", {}).get(r, 0) > 0 for r in WORKER_RESOURCES)}
        actor = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=2)(NodeWatch)
        self.handles = {nid: actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=nid, soft=False))
                        .remote(job, started, stopped_limit, interval) for nid in self.nodes}
        self.pending: dict[str, Any] = {}
        self.heard: dict[str, tuple[float, float, dict[str, Any]]] = {}  # node -> (monotonic, wall, last answer)
        self.began = now()
        self.lost: set[str] = set()
        self.broken: str | None = None  # why the nodes can no longer be asked (Ray refused)

    def describe_node(self, nid: str) -> str:
        node = self.nodes[nid]
        return f"{node.get('NodeManagerAddress', '?')} (host {node.get('NodeManagerHostname', '?')}, node {nid[:8]})"

    def hear(self, final: bool = False) -> list[Loss]:
        """One round: what each node's watch found since it started, and the nodes lost (see the module; ``final``:
        the last round, see ``last``). Where Ray itself refuses (this process's connection gone), the other nodes are
        said unwatched, once, and not asked again."""
        if self.broken:
            return []
        ray = self.ray
        try:
            for nid, handle in self.handles.items():
                if nid not in self.pending and nid not in self.lost:
                    self.pending[nid] = handle.report.remote()
            refs = list(self.pending.values())
            ready = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) if refs else set()
        except Exception as err:
            self.broken = f"{type(err).__name__}: {err}"
            logger.warning("verl-ascend-ext: the job watch cannot hear the other nodes any more (%s): a process "
                           "lost there is not noticed from now on", self.broken)
            return []
        now = self.now()
        losses: list[Loss] = []
        unanswered: list[tuple[str, str]] = []  # (node, how) with no answer this round
        for nid, ref in list(self.pending.items()):
            if ref in ready:
                del self.pending[nid]
                try:
                    answer = ray.get(ref)
                except Exception as err:  # Ray's report of the actor's end: its process, its raylet, its node
                    first_line = (str(err).splitlines() or [""])[0][:200]
                    if type(err).__name__ in PASSING:  # no answer this round: the silence bound decides
                        unanswered.append((nid, f"{type(err).__name__}: {first_line}"))
                        continue
                    losses += self._ended(nid, f"its job watch ended ({type(err).__name__}: {first_line})")
                    continue
                self.heard[nid] = (now, time.time(), answer)
                gathered.heard.add(answer["sleepers"])
                losses += answer["losses"]
            elif nid in self.heard and now - self.heard[nid][0] > self.silence:
                losses.append(self._node_lost(nid, f"silent for {now - self.heard[nid][0]:.0f} s: its job watch "
                                                   f"stopped answering (the bound is {self.silence:g} s)"))
            elif final:
                unanswered.append((nid, "no answer"))
            elif nid not in self.heard and now - self.began > START_ALLOWANCE:
                self._not_watched(nid, f"its job watch did not answer within {START_ALLOWANCE:g} s of its start")
        for nid, how in unanswered if final else ():
            if nid in self.heard and nid not in self.lost and (refused := raylet_unreachable(self.nodes[nid])):
                losses.append(self._node_lost(nid, f"its job watch gave no answer to the last round (taken as the "
                                                   f"trainer's fit failed, {now - self.heard[nid][0]:.0f} s after "
                                                   f"its last answer: {how}), and its raylet {refused}"))
        return losses

    def last(self, timeout: float) -> list[Loss]:
        """A last round that waits up to ``timeout`` seconds for every node's answer (``fit`` is ending by an
        exception: what the nodes found before it is its likely cause). A node whose watch does not answer it while
        its raylet takes no connection is lost (see the module)."""
        if self.broken:
            return []
        try:
            for nid, handle in self.handles.items():
                if nid not in self.pending and nid not in self.lost:
                    self.pending[nid] = handle.report.remote()
            refs = list(self.pending.values())
            if refs:
                self.ray.wait(refs, num_returns=len(refs), timeout=timeout)
        except Exception as err:  # Ray refused: hear() says it and stops asking
            logger.warning("verl-ascend-ext: the job watch's last round on the other nodes failed: %s: %s",
                           type(err).__name__, err)
        return self.hear(final=True)

    def _ended(self, nid: str, why: str) -> list[Loss]:
        if nid in self.heard:
            return [self._node_lost(nid, why)]
        self._not_watched(nid, why)
        return []

    def _not_watched(self, nid: str, why: str) -> None:
        self.lost.add(nid)
        self.pending.pop(nid, None)
        logger.warning("verl-ascend-ext: node %s is not watched in this job: %s. A process lost there is not "
                       "noticed by the job watch. Fix: `verl-ascend doctor --ray` (is verl-ascend-ext installed "
                       "there?), then restart the job.", self.describe_node(nid), why)

    def _node_lost(self, nid: str, how: str) -> Loss:
        self.lost.add(nid)
        self.pending.pop(nid, None)
        node = self.nodes[nid]
        _, wall, answer = self.heard[nid]
        role = f"{NODE_ROLE} {node.get('NodeManagerAddress', '?')} node {nid[:8]}"
        record = {"role": role, "host": answer.get("host") or node.get("NodeManagerHostname"),
                  "pid": answer.get("pid"), "proc_start": answer.get("proc_start"), "node_id": nid,
                  "ip": node.get("NodeManagerAddress")}
        words = f"lost: {how}; last heard {time.strftime('%H:%M:%S', time.localtime(wall))}"
        notice = {"host": record["host"], "pid": record["pid"], "proc_start": record["proc_start"], "role": role,
                  "at": wall, "how": words, "by": "the job watch of the trainer's process"}
        return Loss(record, notice, Failure(NO_WORD, words, wall))

    def gather(self, base: str, timeout: float = GATHER_TIMEOUT) -> int:
        """Write every answering node's records of the job under ``base`` (``records.gathered``); how many."""
        ray = self.ray
        refs = {nid: handle.records.remote() for nid, handle in self.handles.items() if nid not in self.lost}
        if not refs:
            return 0
        ready = set(ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout)[0])
        written = 0
        for nid, ref in refs.items():
            if ref not in ready:
                logger.warning("verl-ascend-ext: node %s's records were not gathered (no answer in %g s): read them "
                               "there (`verl-ascend status --ray` while the cluster runs)", self.describe_node(nid),
                               timeout)
                continue
            try:
                written += gathered.write(base, nid, ray.get(ref))
            except Exception as err:  # one node's records not gathered: the others' still are
                logger.warning("verl-ascend-ext: node %s's records were not gathered: %s: %s",
                               self.describe_node(nid), type(err).__name__, err)
        return written

    def stacks(self, timeout: float) -> list[dict[str, Any]]:
        """Every answering node's processes' stacks (``NodeWatch.stacks``), within ``timeout`` + a few seconds; a
        node that does not answer is named as such."""
        refs = {nid: handle.stacks.remote(timeout) for nid, handle in self.handles.items() if nid not in self.lost}
        if not refs:
            return []
        ready = set(self.ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout + 5.0)[0])
        out: list[dict[str, Any]] = []
        for nid, ref in refs.items():
            node = self.nodes[nid]
            who = {"host": node.get("NodeManagerHostname"), "role": f"{NODE_ROLE} {node.get('NodeManagerAddress')}"}
            if ref not in ready:
                out.append({**who, "missing": f"its watch did not answer within {timeout + 5.0:g} s"})
                continue
            try:
                out += self.ray.get(ref)
            except Exception as err:  # that node's stacks are missing from the verdict, said
                out.append({**who, "missing": f"its watch failed: {type(err).__name__}: {err}"})
        return out

    def stop(self) -> None:
        for handle in self.handles.values():
            self.ray.kill(handle, no_restart=True)
