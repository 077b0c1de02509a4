"""Process records (``runtime.records``) and their aggregation (``verl-ascend status``), on the local machine.

Real processes boot the plugin through its entry points and write their records; directory safety is
tested with real modes, owners (``os.chown`` to another uid: the tests run as root) and symlinks.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from records import GATE, write_record
from records import record as synthetic
from repo import verl_version
from subprocesses import last_json, run_command, run_python, scrubbed_env

from verl_ascend_ext.runtime.records import identity, recorder, store
from verl_ascend_ext.runtime.records.reader import collect, read_records
from verl_ascend_ext.runtime.records.report import aggregate
from verl_ascend_ext.runtime.records.schema import SCHEMA, new_patch
from verl_ascend_ext.tooling.status_cli import format_report

CLI = str(Path(sys.executable).with_name("verl-ascend"))
OTHER_UID = 12345


def record_files(base: Path) -> list[Path]:
    return sorted(p for p in base.rglob("*.json"))


def test_a_booted_process_records_itself_and_updates_on_import(tmp_path: Path) -> None:
    base = tmp_path / "status"
    code = """
    import json, os, sys
    import verl_ascend_ext
    from verl_ascend_ext.runtime.records import recorder, store
    verl_ascend_ext.activate()
    path = recorder.record_path()
    before = json.load(open(path))
    import verl.trainer.constants_ppo  # target of ray-runtime-env-gates: applied on import
    after = json.load(open(path))
    print(json.dumps({"pid": os.getpid(), "path": path, "before": before, "after": after}))
    """
    out = last_json(run_python(code, {"VERL_ASCEND_EXT_STATUS_DIR": str(base), GATE: "0"}).stdout)
    assert Path(out["path"]).parent == base / "local"
    assert [p.name for p in record_files(base)] == [Path(out["path"]).name]
    assert stat.S_IMODE(os.stat(base).st_mode) == 0o700 and stat.S_IMODE(os.stat(base / "local").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(out["path"]).st_mode) == 0o600
    before, after = out["before"], out["after"]
    assert before["pid"] == out["pid"] and before["host"] == socket.gethostname()
    assert before["role"] == "driver" and before["loaded_by"] == ["api"]
    assert before["gates"][GATE] is False and before["gates"]["VERL_ASCEND_EXT_FORWARD_ENV"] is True
    assert before["patches"]["distill-fsdp2-topk"]["status"] == "gate-off"
    gates_patch = "ray-runtime-env-gates"
    assert before["patches"][gates_patch]["status"] == "pending"
    assert after["patches"][gates_patch]["status"] == "applied" and after["patches"][gates_patch]["imported"]
    assert "verl" not in before["versions"]  # not imported yet at boot through the API...
    assert after["versions"]["verl"] == verl_version()  # ...refreshed when a status changed after importing it
    assert after["updated"] > before["updated"]
    assert not [p for p in base.rglob(".*.tmp")]


def test_runs_and_acts_are_counted_in_memory_and_reach_the_record_at_a_flush(tmp_path: Path) -> None:
    """An eager replacement's first run and an ``acts_when`` replacement's acts write nothing on the caller's thread
    (the hot path); they are counted, and the next write (``recorder.flush``, the flusher thread, a status change,
    the end) carries them: the first run once, every act counted."""
    code = """
    import json, os
    import verl_ascend_ext
    from verl_ascend_ext.runtime.records import recorder, store
    verl_ascend_ext.activate()
    import verl.utils.checkpoint.megatron_checkpoint_manager as manager  # checkpoint-config-whole (eager)
    import verl.trainer.constants_ppo as constants  # ray-runtime-env-gates (acts when there are variables to carry)
    recorder.FLUSH_EVERY = 3600.0  # no flusher write during this test: only the flush below
    writes = []
    write_atomic = store.write_atomic
    store.write_atomic = lambda *a: (writes.append(a[1]), write_atomic(*a))[1]
    path = recorder.record_path()
    applied = json.load(open(path))["patches"]
    for _ in range(4):
        manager._to_json_safe_config_dict({"a": 1})
    for _ in range(3):
        constants.get_ppo_ray_runtime_env()  # VERL_ASCEND_EXT_STATUS_DIR is set: something to carry
    before_flush = len(writes)
    recorder.flush()
    flushed = len(writes)
    recorder.flush()  # nothing counted since: nothing written
    print(json.dumps({"applied": applied, "ran": json.load(open(path))["patches"], "before_flush": before_flush,
                      "flushed": flushed, "again": len(writes)}))
    """
    out = last_json(run_python(code, {"VERL_ASCEND_EXT_STATUS_DIR": str(tmp_path)}).stdout)
    whole, gates_patch = "checkpoint-config-whole", "ray-runtime-env-gates"
    assert out["applied"][whole] == {**out["applied"][whole], "status": "applied", "observed": "eager",
                                     "exercised": False, "acts": None}
    assert (out["before_flush"], out["flushed"], out["again"]) == (0, 1, 1)  # one write, by the flush
    assert out["ran"][whole]["exercised"] is True
    assert out["ran"][gates_patch] == {**out["ran"][gates_patch], "observed": "acts", "exercised": True, "acts": 3}
    assert out["ran"]["glm52-ascend-rmsnorm-add-then-norm"]["observed"] == "traced"
    assert out["ran"]["glm52-ascend-rmsnorm-add-then-norm"]["exercised"] is None  # cannot be observed: not guessed


def test_traced_patches_are_shown_as_not_observable() -> None:
    rec = synthetic(5, role="engine-core")
    rec["patches"]["traced-fix"] = {"status": "applied", "target": "vllm_ascend.ops.layernorm:X.f", "imported": True,
                                    "observed": "traced", "exercised": None}
    rec["patches"]["vllm-fix"].update(observed="eager", exercised=True)
    report = aggregate([rec, synthetic(6, role="engine-core")])
    assert report["by_role_exercised"]["engine-core"]["vllm-fix"] == {"observed": "eager", "applied": 2, "ran": 1,
                                                                       "stood_down": []}
    text = format_report(report)
    assert "ran in 1 of 2" in text and "not observable inside compiled code" in text


def test_a_patch_that_acts_only_on_some_calls_is_counted_where_it_acted() -> None:
    """``acts_when`` records (e.g. distill-empty-micro-batch): "acted in N of M", with the condition named."""
    from verl_ascend_ext.features.distillation.declaration import EMPTY_MICRO_BATCH

    assert EMPTY_MICRO_BATCH.observed.value == "acts"
    recs = [synthetic(pid, role="ray-worker") for pid in (5, 6)]
    for rec, acted in zip(recs, (True, False), strict=True):
        rec["patches"][EMPTY_MICRO_BATCH.id] = new_patch(
            status="applied", target=EMPTY_MICRO_BATCH.target, imported=True, observed="acts", exercised=acted,
            acts=3 if acted else 0, stood_down=[] if acted else ["a path where it had nothing to do"])
    report = aggregate(recs)
    assert report["by_role_exercised"]["ray-worker"][EMPTY_MICRO_BATCH.id] == {
        "observed": "acts", "applied": 2, "ran": 1, "acts": 3, "stood_down": ["a path where it had nothing to do"]}
    report["acts_when"] = {EMPTY_MICRO_BATCH.id: EMPTY_MICRO_BATCH.acts_when}
    text = format_report(report)
    assert "acted in 1 of 2 (3 times)" in text
    assert f"{EMPTY_MICRO_BATCH.id}: acts when {EMPTY_MICRO_BATCH.acts_when}" in text
    assert f"ray-worker  {EMPTY_MICRO_BATCH.id}: stood down: a path where it had nothing to do" in text


def test_a_replacement_that_reports_itself_is_not_counted_when_merely_called() -> None:
    from verl_ascend_ext.patching import replacement, status

    calls = []
    acting = replacement.build(lambda original, x: calls.append(x) or original(x), lambda x: x, "test-acts", (),
                               traced=False, reports_itself=True)
    eager = replacement.build(lambda original, x: original(x), lambda x: x, "test-eager", (), traced=False)
    try:
        assert acting(1) == 1 and eager(1) == 1 and calls == [1]
        assert not status.was_exercised("test-acts")  # called, did not say it acted
        assert status.was_exercised("test-eager")  # an ordinary eager replacement: its first call counts
    finally:
        status.forget("test-acts")
        status.forget("test-eager")


def test_a_second_loader_is_recorded(tmp_path: Path) -> None:
    code = """
    import json
    from verl_ascend_ext.runtime import boot
    from verl_ascend_ext.runtime.records import recorder
    boot.activate("verl")
    boot.vllm_plugin()
    print(json.dumps(json.load(open(recorder.record_path()))))
    """
    rec = last_json(run_python(code, {"VERL_ASCEND_EXT_STATUS_DIR": str(tmp_path)}).stdout)
    assert rec["loaded_by"] == ["verl", "vllm"]


def test_writes_are_atomic_for_readers(tmp_path: Path) -> None:
    fd = store.open_base(str(tmp_path / "s"))
    stop = threading.Event()
    big = [json.dumps({"n": i, "pad": "x" * 20000}).encode() for i in range(2)]

    def writer() -> None:
        i = 0
        while not stop.is_set():
            store.write_atomic(fd, "r.json", big[i % 2])
            i += 1

    store.write_atomic(fd, "r.json", big[1])
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        seen = []
        for _ in range(300):
            seen.append(json.loads((tmp_path / "s" / "r.json").read_bytes())["n"])  # always there, never partial
    finally:
        stop.set()
        thread.join()
        os.close(fd)
    assert set(seen) <= {0, 1} and len(seen) == 300
    assert [p.name for p in (tmp_path / "s").iterdir()] == ["r.json"]


def _recorder(base: Path, monkeypatch: pytest.MonkeyPatch) -> recorder.Recorder:
    monkeypatch.setenv(store.DIR_ENV, str(base))
    return recorder.Recorder("api", {GATE: True}, "", dict, {})


def test_created_directories_are_private_even_with_a_permissive_umask(tmp_path: Path, monkeypatch) -> None:
    old = os.umask(0)
    try:
        _recorder(tmp_path / "a" / "b", monkeypatch).write()
    finally:
        os.umask(old)
    for d in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "local"):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d
    assert len(record_files(tmp_path)) == 1


@pytest.mark.parametrize("make_unsafe", ["foreign_owner", "world_writable", "symlink", "not_a_directory"])
def test_an_unsafe_directory_costs_one_warning_and_nothing_is_written(tmp_path: Path, monkeypatch, caplog,
                                                                     make_unsafe: str) -> None:
    base = tmp_path / "status"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    if make_unsafe == "foreign_owner":
        base.mkdir(mode=0o700)
        os.chown(base, OTHER_UID, OTHER_UID)
    elif make_unsafe == "world_writable":
        base.mkdir()
        os.chmod(base, 0o777)
    elif make_unsafe == "symlink":
        base.symlink_to(elsewhere)
    else:
        base.write_text("a file")
        base = base / "sub"
    recorder = _recorder(base, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="verl_ascend_ext"):
        for _ in range(3):  # boot, then two status changes
            recorder.write()
    warnings = [r for r in caplog.records if "process status not recorded" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    assert store.DIR_ENV in warnings[0].getMessage()
    assert list(elsewhere.iterdir()) == []


def test_a_symlinked_namespace_is_refused(tmp_path: Path, monkeypatch, caplog) -> None:
    base = tmp_path / "status"
    base.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (base / "local").symlink_to(elsewhere)
    with caplog.at_level(logging.WARNING, logger="verl_ascend_ext"):
        _recorder(base, monkeypatch).write()
    assert "symbolic link" in caplog.text and list(elsewhere.iterdir()) == []


def test_an_unwritable_directory_does_not_fail_the_process(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code = """
    import verl_ascend_ext
    verl_ascend_ext.activate()
    import verl.trainer.constants_ppo  # a status change after boot: no second warning
    print("still running")
    """
    proc = run_python(code, {"VERL_ASCEND_EXT_STATUS_DIR": str(blocker / "status")})
    assert proc.stdout.strip().endswith("still running")
    assert proc.stderr.count("process status not recorded") == 1, proc.stderr


def test_a_healthy_job_has_no_problem() -> None:
    records = [synthetic(1, role="driver"), synthetic(2), synthetic(3, host="node-b", role="vllm-worker")]
    report = aggregate(records)
    assert report["problems"] == [] and report["exit_code"] == 0
    assert report["summary"] == {"distill": {"pending": 3}, "vllm-fix": {"applied": 3}}
    assert report["by_role"]["ray-worker"] == {"distill": {"pending": 1}, "vllm-fix": {"applied": 1}}
    assert [p["pid"] for p in report["processes"]] == [1, 2, 3]
    assert set(report["processes"][0]) >= {"host", "pid", "role", "loaded_by", "alive", "patches"}
    assert report["processes"][0]["patches"] == {"distill": "pending", "vllm-fix": "applied"}


def test_problems_name_host_pid_and_role() -> None:
    refused = synthetic(5, actor_class="WorkerDict")
    refused["patches"]["vllm-fix"] = {"status": "refused", "detail": "unknown code", "where": "",
                                      "target": "vllm.v1.engine.core:X.f", "imported": True}
    stuck = synthetic(6, role="engine-core")
    stuck["patches"]["vllm-fix"]["status"] = "pending"  # its module was imported, the hook did not apply it
    other_gate = synthetic(7, host="node-b", gates={GATE: False, "VERL_VLLM_ASCEND_GLM52_PATCH": True})
    skewed = synthetic(8, host="node-c", versions={"verl-ascend-ext": "0.1.0", "verl": "0.9.1"})
    excluded = synthetic(9, role="vllm-frontend",
                         plugin_env={"VLLM_PLUGINS": "ascend", "VERL_USE_EXTERNAL_PLUGINS": None})
    dead = synthetic(10, alive=False, gates={GATE: False})
    report = aggregate([synthetic(1, role="driver"), refused, stuck, other_gate, skewed, excluded, dead])
    problems = "\n".join(report["problems"])
    assert report["exit_code"] == 1
    assert "node-a pid 5 (ray-worker WorkerDict): patch vllm-fix is refused" in problems and "unknown code" in problems
    assert "node-a pid 6 (engine-core): patch vllm-fix is pending although its module vllm.v1.engine.core" in problems
    assert (f"node-b pid 7 (ray-worker): settings differ from driver node-a pid 1 (driver): {GATE}=off (on in the "
            "reference)") in problems
    assert "version skew: verl 0.9.0 in 5 process(es)" in problems and "0.9.1 in 1 process(es) (e.g. node-c pid 8" \
        in problems
    assert "node-a pid 9 (vllm-frontend): VLLM_PLUGINS='ascend' excludes verl_ascend_ext" in problems
    assert "pid 10" not in problems  # dead: listed, not counted
    assert report["active"] == 6 and report["dead"] == 1
    assert sum(report["summary"]["distill"].values()) == 6


def test_without_a_driver_the_majority_is_the_reference() -> None:
    report = aggregate([synthetic(1), synthetic(2), synthetic(3, gates={GATE: False})])
    assert len(report["problems"]) == 1 and "pid 3" in report["problems"][0]
    assert "most processes" in report["problems"][0]


def snapshot(base: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file and directory under ``base``: bytes (files), mode and modification time in ns."""
    out = {}
    for path in sorted([base, *base.rglob("*")]):
        st = path.lstat()
        out[str(path.relative_to(base))] = (path.read_bytes() if path.is_file() else b"", st.st_mode, st.st_mtime_ns)
    return out


def test_reading_never_writes_and_pruning_is_an_explicit_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``collect``, the report, the CLI and a checkpoint save's summary leave the directory byte for byte as it was
    (a dead record a day old included: the post-mortem a user has not read yet); ``prune`` removes only this host's
    dead records last written more than ``keep`` seconds ago."""
    host = socket.gethostname()
    me = synthetic(os.getpid(), host=host, proc_start=identity.start_ticks(), updated=time.time())
    old_dead = synthetic(2**22 + 17, host=host, updated=time.time() - 2 * 86400)  # above any pid_max: not running
    new_dead = synthetic(2**22 + 19, host=host, updated=time.time() - 60)
    elsewhere = synthetic(3, host="another-host", updated=0.0)
    paths = [write_record(tmp_path, r) for r in (me, old_dead, new_dead, elsewhere)]
    before = snapshot(tmp_path)
    records, notes = collect(str(tmp_path))
    assert {r["pid"]: r["alive"] for r in records} == {os.getpid(): True, 2**22 + 17: False, 2**22 + 19: False,
                                                       3: None} and notes == []
    aggregate(records, notes)
    for args in (["status"], ["status", "--json"]):
        run_command([CLI, *args, "--dir", str(tmp_path)], check=False)
    from verl_ascend_ext.features.checkpoint import provenance

    saved = tmp_path.parent / "saved" / "huggingface"
    saved.mkdir(parents=True)
    monkeypatch.setenv(store.DIR_ENV, str(tmp_path))
    assert provenance.write_beside(saved)["status_dir"] == str(tmp_path)  # what a checkpoint save runs
    assert snapshot(tmp_path) == before
    proc = run_command([CLI, "status", "--prune", "--dir", str(tmp_path)], check=False)
    assert proc.returncode == 0 and "removed 1 record(s)" in proc.stdout, proc.stdout + proc.stderr
    assert [p.exists() for p in paths] == [True, False, True, True]


def test_a_zombie_counts_as_dead() -> None:
    """A killed process whose parent has not collected it yet (a zombie) still has /proc/PID: it is dead."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ticks = identity.start_ticks(child.pid)
    try:
        assert identity.alive(child.pid, ticks) is True
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child.pid}/stat").read_text().split(") ", 1)[1][0] != "Z":  # not waited for: a zombie
            assert time.monotonic() < deadline, "the killed child never became a zombie"
            time.sleep(0.05)
        assert identity.alive(child.pid, ticks) is False
    finally:
        child.kill()
        child.wait()


def test_foreign_and_symlinked_records_are_ignored_and_said_so(tmp_path: Path) -> None:
    good = write_record(tmp_path, synthetic(1, host="h"))
    foreign = write_record(tmp_path, synthetic(2, host="h", role="driver", gates={GATE: False}))
    os.chown(foreign, OTHER_UID, OTHER_UID)
    outside = tmp_path.parent / f"{tmp_path.name}-outside.json"
    outside.write_text(json.dumps(synthetic(3, host="h")))
    (tmp_path / "session_x" / "h-3-1.json").symlink_to(outside)
    records, notes = read_records(str(tmp_path))
    assert [r["pid"] for r in records] == [1] and records[0]["file"] == str(good)
    assert any("owned by another user" in n and "h-2-1.json (uid 12345)" in n for n in notes), notes
    assert any("h-3-1.json ignored: a symbolic link" in n for n in notes), notes


def test_a_foreign_owned_status_directory_is_not_read(tmp_path: Path) -> None:
    write_record(tmp_path, synthetic(1, host="h"))
    os.chown(tmp_path / "session_x", OTHER_UID, OTHER_UID)
    records, notes = read_records(str(tmp_path))
    assert records == [] and "owned by uid 12345" in notes[0]
    assert "Fix: run as uid 12345" in notes[0] and store.DIR_ENV in notes[0] and "--dir" in notes[0], notes[0]


def status_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return run_command([CLI, "status", *args], env, check=False, timeout=120)


def test_cli_exit_codes_and_json(tmp_path: Path) -> None:
    write_record(tmp_path, synthetic(1, host="h1", role="driver"))
    write_record(tmp_path, synthetic(2, host="h2"))
    proc = status_cli("--dir", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["exit_code"] == 0 and len(report["processes"]) == 2
    assert set(report) >= {"processes", "summary", "problems", "exit_code"}
    write_record(tmp_path, synthetic(3, host="h2", gates={GATE: False}))
    proc = status_cli("--dir", str(tmp_path))
    assert proc.returncode == 1 and "PROBLEMS FOUND (exit 1)" in proc.stdout and "h2 pid 3" in proc.stdout


def test_cli_reads_what_real_processes_wrote(tmp_path: Path) -> None:
    env = {"VERL_ASCEND_EXT_STATUS_DIR": str(tmp_path)}
    run_python("import verl_ascend_ext; verl_ascend_ext.activate()", env)
    run_python("import verl_ascend_ext; verl_ascend_ext.activate()", {**env, GATE: "0"})
    proc = status_cli("--json", "--all", env=env)
    report = json.loads(proc.stdout)
    assert len(report["processes"]) == 2 and all(p["alive"] is False for p in report["processes"])
    assert report["active"] == 0 and report["exit_code"] == 0 and proc.returncode == 0  # dead: not compared
    # two drivers are two jobs: by default, the newest one's
    newest = json.loads(status_cli("--json", env=env).stdout)
    assert len(newest["processes"]) == 1 and "1 record(s) of other jobs not shown" in newest["job_selection"]


def test_status_ray_unreachable_exits_2(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = status_cli("--ray", "--address", f"127.0.0.1:{port}", "--dir", str(tmp_path))
    assert proc.returncode == 2 and f"cannot reach a Ray cluster at 127.0.0.1:{port}" in proc.stderr


@pytest.mark.parametrize(("loaded_by", "argv", "title", "mp_name", "session", "want"), [
    (["verl"], ["main_ppo.py"], "python", "MainProcess", None, ("driver", None)),
    (["vllm"], ["/usr/bin/vllm", "serve"], "vllm", "MainProcess", None, ("vllm-frontend", None)),
    (["vllm"], ["-c"], "python", "EngineCore_DP0", None, ("engine-core", None)),
    (["vllm", "verl"], ["-c"], "VLLM::Worker_TP1", None, None, ("vllm-worker", None)),
    (["verl"], ["-c"], "python", "VllmWorker-0", None, ("vllm-worker", None)),
    (["verl"], ["-c"], "python", "SpawnProcess-1", None, ("other", None)),
    (["verl"], ["default_worker.py"], "ray::WorkerDict.init_model", None, "s", ("ray-worker", "WorkerDict")),
    (["verl"], ["default_worker.py"], "ray::IDLE", None, "s", ("ray-worker", None)),
    # a named actor (verl's fully-async rollout pool): Ray puts the actor's name before its class
    (["ray"], ["default_worker.py"], "ray::rollout_standalone_0CheckpointEngineWorker_0:0:CheckpointEngineWorker"
     ".__init__", None, "s", ("ray-worker", "CheckpointEngineWorker")),
    (["ray"], ["default_worker.py"], "ray::MessageQueue.get_sample", None, "s", ("ray-worker", "MessageQueue")),
    (["vllm"], ["default_worker.py"], "ray::RayWorkerWrapper.execute", None, "s", ("vllm-worker", "RayWorkerWrapper")),
    # vLLM's children spawned inside a Ray actor inherit the actor's command line (and so its session)
    (["vllm-engine-core"], ["default_worker.py"], "VLLM::EngineCore", "EngineCore_DP0", "s", ("engine-core", None)),
    (["vllm", "verl"], ["default_worker.py"], "python", "VllmWorker-0", "s", ("vllm-worker", None)),
    (["verl"], ["default_worker.py"], "python", "SpawnProcess-3", "s", ("other", None)),
    # `python -m vllm.model_executor.models.registry`: vLLM's model-inspection helper, not a front-end
    (["vllm"], ["/venv/lib/python3.11/site-packages/vllm/model_executor/models/registry.py"], "python", "MainProcess",
     None, ("other", None)),
    (["vllm"], ["/venv/lib/python3.11/site-packages/vllm/entrypoints/cli/main.py"], "python", "MainProcess", None,
     ("vllm-frontend", None)),
])
def test_role_from_cheap_signals(loaded_by, argv, title, mp_name, session, want) -> None:
    assert identity.detect_role(loaded_by, argv, title, mp_name, session) == want


def test_ray_session_from_the_worker_command_line() -> None:
    argv = ["/x/ray/_private/workers/default_worker.py", "--node-ip-address=1.2.3.4", "--session-name=session_1"]
    assert identity.ray_session(argv) == "session_1"
    assert identity.ray_session(["main_ppo.py", "--session-name=session_1"]) is None


SWALLOWING_IMPORTER = """
import sys
import verl
from verl_ascend_ext.patching import PatchRefusedError
try:
    import verl.trainer.distillation.losses
except PatchRefusedError:
    pass  # an importer that swallows the refusal: the process runs on, unpatched
print("ready", flush=True)
sys.stdin.read()
"""


def test_status_names_the_live_process_that_refused(tmp_path: Path) -> None:
    from test_refusal import LOSSES, NO_RAISE, PID, mutated_verl

    shadow = mutated_verl(tmp_path, LOSSES, *NO_RAISE)
    env = scrubbed_env({"VERL_ASCEND_EXT_STATUS_DIR": str(tmp_path / "status")}, pythonpath=str(shadow))
    proc = subprocess.Popen([sys.executable, "-c", SWALLOWING_IMPORTER], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        result = status_cli("--dir", str(tmp_path / "status"), "--json")
    finally:
        proc.communicate("", timeout=60)
    report = json.loads(result.stdout)
    assert result.returncode == 1 and report["exit_code"] == 1
    mine = next(p for p in report["processes"] if p["pid"] == proc.pid)
    assert mine["alive"] is True and mine["patches"][PID] == "refused"
    assert any(f"pid {proc.pid} (driver): patch {PID} is refused although its module "
               "verl.trainer.distillation.losses was imported" in p for p in report["problems"]), report["problems"]


def test_status_of_a_missing_directory_exits_2_naming_it_and_where_a_job_records(tmp_path: Path) -> None:
    """A mistyped --dir must not read as "nothing recorded, OK": a script gating on `status` would pass."""
    missing = tmp_path / "stauts"
    proc = run_command([CLI, "status", "--dir", str(missing)], {store.DIR_ENV: str(tmp_path / "status")}, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"no status directory at {missing}" in proc.stderr and str(tmp_path / "status") in proc.stderr
    assert store.DIR_ENV in proc.stderr and proc.stdout == ""
    assert run_command([CLI, "status", "--json", "--dir", str(missing)], check=False).returncode == 2


def test_status_of_a_directory_without_records_or_refused_exits_2_naming_why_and_the_fix(tmp_path: Path) -> None:
    """`status --dir` as a gate: an empty directory, or one the reader refuses (writable by others, as /tmp is), is
    no "nothing recorded, OK" either."""
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    proc = run_command([CLI, "status", "--dir", str(empty)], check=False)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert f"status directory {empty} holds no process record" in proc.stderr and "check the path" in proc.stderr
    shared = tmp_path / "shared"
    write_record(shared, synthetic(1, host="h1", role="driver"))
    shared.chmod(0o777)
    proc = run_command([CLI, "status", "--json", "--dir", str(shared)], check=False)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert f"status directory {shared} not read" in proc.stderr and "writable by other users" in proc.stderr
    assert "Fix: " in proc.stderr and "chmod 700" in proc.stderr
    shared.chmod(0o700)
    assert run_command([CLI, "status", "--dir", str(shared)], check=False).returncode == 0


def test_the_previous_schemas_records_are_read_and_counted_and_an_unknown_schema_is_named(tmp_path: Path) -> None:
    """A schema-1 record (what verl-ascend-ext wrote before this schema: no ranks, errors, end or stand-downs; a
    reader's ``dead_since``) is read with those fields at their defaults and counted in a note; a record of a schema
    this reader does not know is named with its count and the fix, not skipped silently."""
    old = {"schema": 1, "host": "n1", "pid": 7, "proc_start": 3, "started": 1.0, "updated": 2.0, "role": "driver",
           "actor_class": None, "title": "", "loaded_by": ["verl"], "namespace": "local", "versions": {},
           "gates": {GATE: True}, "disable": "", "plugin_env": {}, "dead_since": 5.0,
           "patches": {"p": {"status": "applied", "detail": "", "where": "", "target": "m:f", "imported": True}}}
    newer = {**old, "schema": 9, "pid": 8}
    for rec in (old, newer):
        write_record(tmp_path, rec, ns="local")
    records, notes = read_records(str(tmp_path))
    (rec,) = records
    assert rec["schema"] == SCHEMA and rec["pid"] == 7 and "dead_since" not in rec and rec["job"] is None
    assert (rec["ranks"], rec["errors"], rec["ended"]) == ({}, [], None)
    assert rec["patches"]["p"]["stood_down"] == [] and rec["patches"]["p"]["status"] == "applied"
    assert any(n.startswith(f"1 record(s) in {tmp_path} have schema 1") for n in notes), notes
    assert any(n.startswith(f"1 record(s) in {tmp_path} have schema 9") and "cannot read" in n and "Fix:" in n
               for n in notes), notes
    text = run_command([CLI, "status", "--dir", str(tmp_path)], check=False).stdout
    assert "have schema 9" in text and "have schema 1" in text, text


def test_records_are_built_through_the_schemas_factory() -> None:
    from verl_ascend_ext.runtime.records.schema import FIELDS, SCHEMA, SchemaError, new_record

    rec = new_record(pid=5, role="driver")
    assert list(rec) == list(FIELDS) and rec["schema"] == SCHEMA
    with pytest.raises(SchemaError, match="rnaks"):
        new_record(rnaks={"rank": 0})


def test_a_ray_worker_that_booted_idle_rewrites_its_record_once_ray_binds_it_an_actor() -> None:
    """fully-async's MessageQueue imports nothing the plugin patches after it booted in an idle worker: its record
    is rewritten when its title names the actor (asserted on a real job in tests/engine/test_fully_async.py)."""
    from verl_ascend_ext.runtime.records.actor_watch import watch_for_actor

    titles = iter(["ray::IDLE", "ray::IDLE", "ray::MessageQueue.__init__"])
    seen: list[str] = []
    current = ["ray::IDLE"]

    def title() -> str:
        current[0] = next(titles, current[0])
        return current[0]

    thread = watch_for_actor(lambda: seen.append(current[0]), title=title, interval=0.01)
    thread.join(timeout=5)
    assert not thread.is_alive() and seen == ["ray::MessageQueue.__init__"]


def test_stand_downs_of_one_path_from_many_ranks_are_one_line_and_the_lag_is_said() -> None:
    """Each rank keeps its first detail of a path (a shape, after ``status.DETAIL``); the report merges the ranks by
    the path's text, so a job of many ranks shows one line per path, and `status` says how late counts may be."""
    from verl_ascend_ext.patching.status import DETAIL

    def rank(pid: int, shape: str) -> dict:
        patch = new_patch(status="applied", target="verl.m:f", imported=True, observed="acts", exercised=True,
                          acts=3, stood_down=[f"no response mask{DETAIL}{shape}", "packed without offsets"])
        return synthetic(pid, role="ray-worker", actor_class="WorkerDict", patches={"r3-route-check": patch})

    report = aggregate([rank(1, "[2, 7]"), rank(2, "[4, 9]")])
    (entry,) = report["by_role_exercised"].values()
    assert entry["r3-route-check"]["stood_down"] == [f"no response mask{DETAIL}[2, 7]", "packed without offsets"]
    assert report["exercised"]["r3-route-check"]["acts"] == 6
    report["counts_lag_s"] = recorder.FLUSH_EVERY
    assert recorder.LAG_NOTE in format_report(report)
