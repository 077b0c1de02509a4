"""`verl-ascend status`: gather the process records (this machine, or every alive Ray node) and report them.

The entry point above ``status_report`` (aggregation of records) and ``cluster.status_ray`` (collection
across a Ray cluster), so that neither imports the other.
"""

from __future__ import annotations

import json
import os
import sys

from . import runtime_record as rr
from .status_report import aggregate, collect, format_report, merge


def main(as_json: bool = False, directory: str | None = None, ray: bool = False, address: str | None = None,
         timeout: float = 120.0) -> int:
    base = directory or rr.base_dir()
    if ray:
        from .cluster.status_ray import collect_cluster

        directory = directory or os.environ.get(rr.DIR_ENV)
        batches, notes, node_problems, error = collect_cluster(address, timeout, directory)
        if error is not None:
            report = {"processes": [], "summary": {}, "by_role": {}, "problems": [], "notes": [error],
                      "exit_code": 2}
            if as_json:
                print(json.dumps(report, indent=2))
            print(f"verl-ascend status --ray: error: {error}", file=sys.stderr)
            return 2
        records = merge(batches)
    else:
        node_problems = []
        records, notes = collect(base)
    report = aggregate(records, notes)
    if node_problems:
        report["problems"] = node_problems + report["problems"]
        report["exit_code"] = 1
    print(json.dumps(report, indent=2) if as_json else format_report(report))
    return report["exit_code"]
