"""Who a process is, from cheap signals: role, Ray actor, ranks, start time, liveness, versions of what it imported.

Everything here reads the process's own state (``sys.argv``, ``/proc``, already-imported modules, the environment)
or another process's ``/proc`` entry; nothing is imported that the process has not imported already (Ray and
vLLM are looked up in ``sys.modules``). Only the standard library is imported.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from verl_ascend_ext.runtime.records.schema import DRIVER, ENGINE_CORE, OTHER, RAY_WORKER, VLLM_FRONTEND, VLLM_WORKER

logger = logging.getLogger("verl_ascend_ext")

# Modules whose ``__version__`` a record reports when they are already imported (never imported here).
VERSION_MODULES = {"verl": "verl", "vllm": "vllm", "vllm_ascend": "vllm-ascend", "torch": "torch",
                   "torch_npu": "torch_npu", "transformers": "transformers", "ray": "ray"}
RANK_ENV = {"rank": "RANK", "local_rank": "LOCAL_RANK", "world_size": "WORLD_SIZE"}  # torch.distributed's, verl's
DP_ENGINE = re.compile(r"EngineCore_DP(\d+)")  # vLLM names each data-parallel engine core process so
# Ray actors that are vLLM processes: vLLM's data-parallel engine cores and Ray-executor workers, and verl's
# rollout server, which runs vLLM's front-end (AsyncLLM) in its own process. Their role is vLLM's.
VLLM_ACTORS = {"DPEngineCoreActor": ENGINE_CORE, "EngineCoreActor": ENGINE_CORE, "RayWorkerWrapper": VLLM_WORKER,
               "vLLMHttpServer": VLLM_FRONTEND}
# This package's own tasks in a job's pool workers (the cluster check's question to each node at the job's start):
# no work of the job, so the worker that ran one stays an idle pool worker (not watched, not counted)
OWN_TASKS = frozenset({"node_inventory"})


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


def stopped(pid: int, ticks: int | None) -> bool:
    """Whether the process ``pid`` that started at ``ticks`` is stopped (state T: SIGSTOP, SIGTSTP; t: a tracer):
    alive, but it cannot run until it is continued."""
    found = _stat(pid)
    return found is not None and found[0] in ("T", "t") and (ticks is None or found[1] == ticks)


def ray_actor(title: str) -> str | None:
    """Actor class (or task name) from a Ray worker's title ``ray::Name.method`` / ``ray::Name``, or a named
    actor's ``ray::<actor name>:<...>:Name.method``; None when idle or running one of this package's own tasks."""
    if not title.startswith("ray::"):
        return None
    name = title[5:].split()[0] if title[5:].strip() else ""
    name = name.split(".", 1)[0].rsplit(":", 1)[-1]
    return None if name in ("", "IDLE") or name in OWN_TASKS else name


def ray_role(actor: str | None) -> str:
    """The role of a Ray worker running ``actor`` (a vLLM process's role for vLLM's and verl's vLLM actors)."""
    return VLLM_ACTORS.get(actor or "", RAY_WORKER)


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
        return ray_role(actor), actor
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


def mp_name() -> str | None:
    """The multiprocessing name of this process (vLLM names its spawned children), when multiprocessing is loaded."""
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


def ray_actor_owners(timeout: float) -> dict[str, str]:
    """Actor id -> the id of the actor that owns it (created it: Ray ends it when that one dies), for every actor of
    Ray's actor table (the GCS's, alive and dead) whose owner is an actor, matched by the owner's address (ip, port);
    {} where Ray is not connected in this process, or its GCS does not answer within ``timeout`` seconds (a thread
    reads it: the caller never waits longer). Ray is not imported here; only the job's watch asks, when a look holds a
    death without a word beside a recorded end."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return {}
    found: dict[str, str] = {}
    failed: list[BaseException] = []

    def read() -> None:
        try:
            from ray._private.state import state

            rows = state.actor_table(None)
            by_address = {(row["Address"]["IPAddress"], row["Address"]["Port"]): actor
                          for actor, row in rows.items()}
            for actor, row in rows.items():
                owner = by_address.get((row["OwnerAddress"]["IPAddress"], row["OwnerAddress"]["Port"]))
                if owner is not None and owner != actor:
                    found[actor] = owner
        except Exception as err:  # Ray's private table differs by release or its GCS failed: parentage alone then
            failed.append(err)

    reader = threading.Thread(target=read, name="verl-ascend-ext-actor-owners", daemon=True)
    reader.start()
    reader.join(timeout)
    if reader.is_alive() or failed:
        why = f"no answer within {timeout:g} s" if reader.is_alive() else f"{type(failed[0]).__name__}: {failed[0]}"
        logger.warning("verl-ascend-ext: Ray's actor table could not be read (%s): deaths are dated by parentage "
                       "alone", why)
        return {}
    return dict(found)


def imported_versions() -> dict[str, str]:
    out = {}
    for module, dist in VERSION_MODULES.items():
        version = getattr(sys.modules.get(module), "__version__", None)
        if isinstance(version, str):
            out[dist] = version
    return out


def now_running_as(pid: int) -> dict[str, Any]:
    """What the live Ray worker ``pid`` runs now, read from its title (a pool worker gets its actor after it
    booted): the ``title``, ``actor_class`` and ``role`` to show instead of what it recorded, or nothing."""
    title = process_title(pid)
    actor = ray_actor(title)
    return {} if actor is None else {"title": title, "actor_class": actor, "role": ray_role(actor)}
