"""When a process writes its record (``runtime.records.recorder``): nothing on the hot path, counts within
``FLUSH_EVERY`` seconds from a daemon thread, everything at the end, and an end that survives a signal landing in
the middle of a write.

Each case is a real process that boots the plugin; what it wrote is read back from disk.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from subprocesses import last_json, run_python, scrubbed_env

from verl_ascend_ext.patching import status
from verl_ascend_ext.runtime.records.recorder import FLUSH_EVERY, LAG_NOTE

ROUTE_CHECK = "r3-route-check"


def the_record(base: Path) -> dict:
    (path,) = base.rglob("*.json")
    return json.loads(path.read_text())


def test_acts_write_nothing_on_the_callers_thread_and_reach_the_record_within_the_flush_interval(
        tmp_path: Path) -> None:
    """2,000 acts: no write on the calling thread, no flusher thread before the first count, then one daemon thread
    that writes them all within ``FLUSH_EVERY`` seconds; a status change is still written at once."""
    code = f"""
    import json, threading, time
    import verl_ascend_ext
    from verl_ascend_ext.patching.status import acted
    from verl_ascend_ext.runtime.records import recorder, store
    verl_ascend_ext.activate()
    threads_at_boot = sorted(t.name for t in threading.enumerate())
    writers = []
    write_atomic = store.write_atomic
    store.write_atomic = lambda *a: (writers.append(threading.current_thread().name), write_atomic(*a))[1]
    start = time.monotonic()
    for _ in range(2000):
        acted("{ROUTE_CHECK}")
    on_caller = list(writers)
    flusher = [t for t in threading.enumerate() if t.name == "verl-ascend-ext-record-flush"]
    path = recorder.record_path()
    while json.load(open(path))["patches"]["{ROUTE_CHECK}"]["acts"] != 2000:
        assert time.monotonic() - start < {FLUSH_EVERY} + 5, "the flusher never wrote the acts"
        time.sleep(0.05)
    import verl.trainer.constants_ppo  # ray-runtime-env-gates: pending -> applied, a status change
    print(json.dumps({{"threads_at_boot": threads_at_boot, "on_caller": on_caller,
                      "flusher_daemon": [t.daemon for t in flusher], "writers": writers,
                      "status": json.load(open(path))["patches"]["ray-runtime-env-gates"]["status"]}}))
    """
    out = last_json(run_python(code, {"VERL_ASCEND_EXT_STATUS_DIR": str(tmp_path)}).stdout)
    assert "verl-ascend-ext-record-flush" not in out["threads_at_boot"]  # started at the first count, not at boot
    assert out["on_caller"] == [] and out["flusher_daemon"] == [True]
    writers = out["writers"]  # the flusher wrote the acts; the import's status changes were written at once
    assert writers[0] == "verl-ascend-ext-record-flush" and set(writers[1:]) == {"MainThread"}, writers
    assert out["status"] == "applied"


@pytest.mark.parametrize("end", ["exit", "process-end-off"])
def test_the_end_writes_the_counts_the_flusher_had_not(tmp_path: Path, end: str) -> None:
    """A process that ends right after acting: its end (observed, or only the interpreter's exit when the
    process-end gate is off) writes every act."""
    code = f"""
    import verl_ascend_ext
    from verl_ascend_ext.patching.status import acted, stood_down
    from verl_ascend_ext.runtime.records import recorder
    verl_ascend_ext.activate()
    recorder.FLUSH_EVERY = 3600.0  # the flusher would write nothing before the end
    for _ in range(7):
        acted("{ROUTE_CHECK}")
    stood_down("{ROUTE_CHECK}", "a path")
    """
    env = {"VERL_ASCEND_EXT_STATUS_DIR": str(tmp_path)}
    if end == "process-end-off":
        env["VERL_ASCEND_EXT_PROCESS_END"] = "0"
    run_python(code, env)
    rec = the_record(tmp_path)
    patch = rec["patches"][ROUTE_CHECK]
    assert (patch["acts"], patch["exercised"], patch["stood_down"]) == (7, True, ["a path"]), patch
    assert (rec["ended"] or {}).get("how") == ("exit" if end == "exit" else None), rec["ended"]


def test_sigkill_loses_at_most_the_last_flush_interval_of_counts(tmp_path: Path) -> None:
    """Acts counted more than ``FLUSH_EVERY`` seconds before a SIGKILL are in the record; the last ones may not
    be: what ``LAG_NOTE`` says."""
    code = f"""
    import json, os, signal, time
    import verl_ascend_ext
    from verl_ascend_ext.patching.status import acted
    from verl_ascend_ext.runtime.records import recorder
    verl_ascend_ext.activate()
    for _ in range(5):
        acted("{ROUTE_CHECK}")
    start = time.monotonic()  # the flusher's write of the 5, awaited (a loaded machine may run it late)
    while json.load(open(recorder.record_path()))["patches"]["{ROUTE_CHECK}"]["acts"] != 5:
        assert time.monotonic() - start < 60, "the flusher never wrote the acts"
        time.sleep(0.05)
    for _ in range(3):
        acted("{ROUTE_CHECK}")
    os.kill(os.getpid(), signal.SIGKILL)
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=scrubbed_env({"VERL_ASCEND_EXT_STATUS_DIR": str(tmp_path)}), timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    rec = the_record(tmp_path)
    assert rec["ended"] is None and rec["patches"][ROUTE_CHECK]["acts"] == 5, rec["patches"][ROUTE_CHECK]
    assert f"{FLUSH_EVERY:g} s" in LAG_NOTE and "SIGKILL" in LAG_NOTE


def test_a_forked_child_neither_writes_its_parents_record_nor_inherits_a_held_lock(tmp_path: Path) -> None:
    """The flusher holds the status lock while it writes: a fork at that moment must not leave the child's lock held
    (os.fork waits for it). The child's counts and status changes never rewrite its parent's record."""
    code = """
    import json, os, threading, time
    import verl_ascend_ext
    from verl_ascend_ext.patching import status
    from verl_ascend_ext.runtime.records import recorder
    verl_ascend_ext.activate()
    status.acted("r3-route-check")  # starts the flusher
    recorder.flush()
    path = recorder.record_path()
    before = open(path, "rb").read()
    held = threading.Event()
    def hold():  # as the flusher does while it writes
        with status.lock:
            held.set()
            time.sleep(0.5)
    threading.Thread(target=hold).start()
    held.wait()
    pid = os.fork()
    if pid == 0:
        if not status.lock.acquire(timeout=5):
            os._exit(3)  # held for good: the child's next count would hang
        status.acted("r3-route-check")
        recorder.changed()
        recorder.flush()
        os._exit(0)
    _, code = os.waitpid(pid, 0)
    print(json.dumps({"child_exit": os.waitstatus_to_exitcode(code), "unchanged": open(path, "rb").read() == before}))
    """
    out = last_json(run_python(code, {"VERL_ASCEND_EXT_STATUS_DIR": str(tmp_path)}, timeout=60).stdout)
    assert out == {"child_exit": 0, "unchanged": True}


# ---- stand-down paths: a fixed set of texts -------------------------------------------------------------------

def test_a_thousand_stand_downs_with_different_shapes_leave_one_path_with_the_first_detail() -> None:
    """The route check's patch code on 1,000 micro-batches whose masks do not match their samples, each of another
    width: one stand-down path, the first micro-batch's shapes as its detail, the record bounded."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    from verl_ascend_ext.features.routing.patch_code import check_routes_before_replay

    def jagged(rows: list[torch.Tensor]) -> torch.Tensor:
        return torch.nested.nested_tensor(rows, layout=torch.jagged)

    config = SimpleNamespace(num_moe_experts=4, moe_router_topk=2, num_layers=1, moe_layer_freq=1)
    engine = SimpleNamespace(engine_config=SimpleNamespace(router_replay=SimpleNamespace(mode="R3")), tf_config=config)
    ids = jagged([torch.zeros(4, dtype=torch.long), torch.zeros(3, dtype=torch.long)])
    routes = jagged([torch.tensor([[[0, 1]], [[2, 3]], [[1, 2]], [[0, 3]]]),
                     torch.tensor([[[3, 1]], [[2, 0]], [[0, 0]]])])

    def model_inputs(engine: object, batch: TensorDict) -> dict:
        return {"input_ids": batch["input_ids"], "routed_experts": batch["routed_experts"]}

    status.forget(ROUTE_CHECK)
    try:
        for width in range(4, 1004):  # the response mask one column wider than the attention mask: they do not match
            batch = TensorDict({"input_ids": ids, "routed_experts": routes,
                                "attention_mask": torch.ones(2, width, dtype=torch.long),
                                "response_mask": torch.ones(2, width + 1, dtype=torch.long)}, batch_size=[2])
            tu.assign_non_tensor(batch, enable_routing_replay=True)
            check_routes_before_replay(model_inputs, engine, batch)
        paths = status.stood_down_on(ROUTE_CHECK)
        acts = status.acts_of(ROUTE_CHECK)
    finally:
        status.forget(ROUTE_CHECK)
    assert paths == ["routes not checked: attention_mask / response_mask do not match the packed samples"
                     f"{status.DETAIL}attention_mask (2, 4), response_mask (2, 5), 2 packed samples"], paths
    assert acts == 0


def test_stand_down_paths_are_keyed_by_their_text_before_the_detail() -> None:
    pid = "test-stand-down-keys"
    try:
        for i in range(3):
            status.stood_down(pid, f"no rollout{status.DETAIL}rank {i}")
            status.stood_down(pid, "one rank")
        assert status.stood_down_on(pid) == [f"no rollout{status.DETAIL}rank 0", "one rank"]
    finally:
        status.forget(pid)


# ---- a signal during a write ----------------------------------------------------------------------------------

SIGNALLED = """
import json, os, signal, sys, threading
def handler(signum, frame):  # the handler the process had (Ray's worker raises SystemExit)
    print("handled", flush=True)
    if sys.argv[1] == "exits":
        sys.exit(7)
signal.signal(signal.SIGTERM, handler)
import verl_ascend_ext
verl_ascend_ext.activate()  # chains the process-end observer in front of it
from verl_ascend_ext.runtime.records import recorder
real_replace, armed = os.replace, [True]
def blocked_replace(*args, **kwargs):  # the record write on the main thread stops before its rename
    if armed and threading.current_thread() is threading.main_thread():
        armed.clear()
        print("writing", flush=True)
        sys.stdin.readline()  # SIGTERM lands here
    return real_replace(*args, **kwargs)
os.replace = blocked_replace
recorder.changed()
print(json.dumps(json.load(open(recorder.record_path()))), flush=True)
os._exit(0)
"""


@pytest.mark.parametrize("previous", ["exits", "returns"])
def test_sigterm_during_a_record_write_records_the_end(tmp_path: Path, previous: str) -> None:
    """SIGTERM arrives while the main thread is inside the record write (stopped deterministically before its
    rename): the handler's own write of the end completes inside it. The previous handler then either exits (as
    Ray's does: the interrupted write is abandoned) or returns (the interrupted write resumes, and must not put its
    older record back over the end)."""
    base = tmp_path / "status"
    proc = subprocess.Popen([sys.executable, "-c", SIGNALLED, previous], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=scrubbed_env({"VERL_ASCEND_EXT_STATUS_DIR": str(base)}))
    try:
        lines = [proc.stdout.readline().strip()]
        if lines == ["writing"]:
            os.kill(proc.pid, signal.SIGTERM)
            lines.append(proc.stdout.readline().strip())
        during = the_record(base)["ended"] if lines == ["writing", "handled"] else None  # before the old handler ran
        out, err = proc.communicate("go\n", timeout=60)
    finally:
        proc.kill()
    assert lines == ["writing", "handled"], (lines, err)
    assert during is not None and (during["how"], during["signal"]) == ("signal", "SIGTERM"), during
    assert "process status not recorded" not in err, err
    if previous == "exits":
        assert proc.returncode == 7, err
        assert the_record(base)["ended"]["signal"] == "SIGTERM"
    else:
        assert proc.returncode == 0, err
        resumed = last_json(out)  # the record as the resumed write left it
        assert resumed["ended"] is not None and resumed["ended"]["signal"] == "SIGTERM", resumed["ended"]
    assert [p.name for p in base.rglob(".*.tmp")] == []
