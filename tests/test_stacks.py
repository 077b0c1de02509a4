"""Stacks on request (``records.stacks``, ``verl-ascend stacks``): real processes that boot the plugin, each asked by
its own signal, without ptrace.

Three processes of one job: one waits in ``threading.Event.wait`` (Python), one in a native call that holds the GIL
(libc's ``sleep`` through ``ctypes.PyDLL``, as a collective stuck in C would), one SIGSTOPped. ``verl-ascend stacks``
shows the first two where they wait, apart, and names the stopped one as not answering (exit 1).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from subprocesses import run_command, scrubbed_env

from verl_ascend_ext.runtime.records import stacks

CLI = str(Path(sys.executable).with_name("verl-ascend"))
JOB = "stacks-test-job"
CHILD = r"""
import ctypes, sys, threading, verl_ascend_ext
verl_ascend_ext.activate()
print("ready", flush=True)

def waits_in_python():
    threading.Event().wait(120)

def waits_in_native_code_holding_the_gil():
    while True:  # libc's sleep returns early when a signal comes (as a real native wait retries)
        ctypes.PyDLL(None).sleep(120)

{"python": waits_in_python, "native": waits_in_native_code_holding_the_gil, "stopped": waits_in_python}[sys.argv[1]]()
"""


def test_stacks_show_where_each_process_waits_a_native_wait_too_and_name_one_that_does_not_answer(
        tmp_path: Path) -> None:
    env = scrubbed_env({"VERL_ASCEND_EXT_STATUS_DIR": str(tmp_path / "status"), "VERL_ASCEND_EXT_JOB": JOB})
    procs = {kind: subprocess.Popen([sys.executable, "-c", CHILD, kind], env=env, stdout=subprocess.PIPE, text=True)
             for kind in ("python", "native", "stopped")}
    try:
        for proc in procs.values():
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # each in its wait
        os.kill(procs["stopped"].pid, signal.SIGSTOP)
        out = run_command([CLI, "stacks", "--dir", tmp_path / "status", "--job", JOB, "--json", "--timeout", "3"],
                          check=False, timeout=120)
        text = run_command([CLI, "stacks", "--dir", tmp_path / "status", "--job", JOB, "--timeout", "3"],
                           check=False, timeout=120)
    finally:
        os.kill(procs["stopped"].pid, signal.SIGCONT)
        for proc in procs.values():
            proc.kill()
            proc.wait()
    assert out.returncode == 1, out.stdout + out.stderr  # one did not answer
    report = json.loads(out.stdout)
    by_pid = {p["pid"]: p for p in report["processes"]}
    assert set(by_pid) == {p.pid for p in procs.values()}, by_pid
    assert "not answering" in by_pid[procs["stopped"].pid]["missing"]
    for kind, func in (("python", "waits_in_python"), ("native", "waits_in_native_code_holding_the_gil")):
        threads = [stacks.Thread(t["ident"], t["current"], [stacks.Frame(**f) for f in t["frames"]])
                   for t in by_pid[procs[kind].pid]["threads"]]
        assert func in [f.func for f in stacks.waiting_in(threads)], (kind, threads)
    wheres = [g["where"] for g in report["groups"]]
    assert len(wheres) == 3 and wheres[-1] == "did not answer", wheres  # the two waits apart, the silent one last
    assert any("waits_in_native_code_holding_the_gil" in w for w in wheres), wheres
    assert text.returncode == 1 and "3 process(es) asked, 2 answered" in text.stdout, text.stdout


def test_a_process_whose_signal_another_handler_took_is_not_armed(tmp_path: Path) -> None:
    code = ("import signal, sys\nfrom verl_ascend_ext.runtime.records import stacks\n"
            "signal.signal(stacks.SIGNAL, lambda *a: None)\n"
            f"print(stacks.arm({str(tmp_path / 'r.json')!r}))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == "False" and not (tmp_path / "r.stacks").exists()


def test_a_faulthandler_dump_parses_into_threads_main_thread_last() -> None:
    dump = ('Thread 0x00007f2a (most recent call first):\n  File "/x/zmq.py", line 10 in send_pyobj\n\n'
            'Current thread 0x00007f1b (most recent call first):\n  File "/x/dist.py", line 3 in all_gather\n'
            '  File "/x/sync.py", line 7 in update_weights\n')
    threads = stacks.parse(dump)
    assert [t.current for t in threads] == [False, True]
    assert [f.func for f in stacks.waiting_in(threads)] == ["all_gather", "update_weights"]


def test_a_ray_actor_whose_main_thread_sits_in_rays_task_loop_waits_where_its_task_thread_does() -> None:
    """An async Ray actor runs its task in its event loop's thread: that thread says where it waits, not the main
    thread between tasks (a plain process: its main thread, even when a helper thread is deeper)."""
    worker = "/site-packages/ray/_private/worker.py"
    dump = ('Thread 0x2 (most recent call first):\n  File "/x/probe.py", line 9 in update_then_fault\n'
            '  File "/x/rollout.py", line 4 in update_weights\n  File "/x/asyncio.py", line 1 in _run\n\n'
            f'Current thread 0x1 (most recent call first):\n  File "{worker}", line 1069 in main_loop\n'
            '  File "/x/default_worker.py", line 323 in <module>\n')
    assert [f.func for f in stacks.waiting_in(stacks.parse(dump))][:2] == ["update_then_fault", "update_weights"]
    plain = dump.replace(worker, "/x/script.py")
    assert [f.func for f in stacks.waiting_in(stacks.parse(plain))] == ["main_loop", "<module>"]
