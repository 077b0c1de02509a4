"""`verl-ascend stacks`: where every live process of a job waits, from each process's own Python stacks
(``records.stacks``: faulthandler on a signal of its own, no ptrace), grouped by identical place.

One job by default (the newest driver's, as `status`), this host's processes (`--dir`: a job's status directory);
``--ray``: every node of a running cluster, each asking its own processes (one task a node, as `status --ray`).
Exit 0 when every asked process answered, 1 when one did not (itself a sign: stopped, or stuck in a native call
with the signal blocked), 2 when there was nothing to ask.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from verl_ascend_ext.runtime.records import stacks
from verl_ascend_ext.runtime.records.outcome import newest_driver
from verl_ascend_ext.runtime.records.reader import collect
from verl_ascend_ext.runtime.records.store import base_dir


def node_stacks(directory: str | None, job: str | None, timeout: float) -> dict[str, Any]:
    """Run on one node (``--ray``), or here: the answers of the job's live processes on this host."""
    from verl_ascend_ext.runtime.records.store import DIR_ENV

    base = base_dir({**os.environ, DIR_ENV: directory}) if directory else base_dir()
    records, _ = collect(base)
    if job is None:  # the newest driver's job; on a node without the driver, the newest live process's
        driver = newest_driver(records)
        live = [r for r in records if r.get("alive") and r.get("job")]
        job = driver.get("job") if driver is not None else max(live, key=lambda r: r.get("started", 0))["job"] \
            if live else None
    return {"base": base, "job": job, "answers": stacks.ask(stacks.of_job_here(records, job), timeout)}


def main(as_json: bool = False, directory: str | None = None, ray: bool = False, address: str | None = None,
         timeout: float = 5.0, job: str | None = None) -> int:
    """``verl-ascend stacks``."""
    if ray:
        from verl_ascend_ext.tooling.cluster.status_ray import ask_nodes

        answers, looked, error = ask_nodes(address, timeout + 60.0, node_stacks, (directory, job, timeout))
        if error is not None:
            print(f"verl-ascend stacks --ray: error: {error}", file=sys.stderr)
            return 2
        found = [a for answer in answers for a in answer["answers"]]
    else:
        answer = node_stacks(directory, job, timeout)
        found, looked = answer["answers"], [answer["base"]]
    if not found:
        print(f"verl-ascend stacks: error: no live process of the job to ask (looked in {'; '.join(looked)}). Fix: "
              "pass the job's status directory (--dir) or --job ID (`verl-ascend status --all` lists the jobs)",
              file=sys.stderr)
        return 2
    groups = stacks.group(found)
    silent = sum(1 for a in found if "threads" not in a)
    if as_json:
        print(json.dumps({"groups": groups, "processes": found, "not_answering": silent}, indent=2))
    else:
        print(f"{len(found)} process(es) asked, {len(found) - silent} answered, grouped by where the main thread "
              "waits (innermost first):")
        for g in groups:
            print(f"\n{len(g['processes'])} process(es): {g['where']}")
            print("\n".join(f"  {p}" for p in g["processes"]))
    return 1 if silent else 0
