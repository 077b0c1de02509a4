"""What was active when a checkpoint was saved: the driver's process record and the job's status summary.

Called by the export-check wrapper at save time (rank 0, after verl's export). The saving process reads
the status directory of its node (``runtime.records``; namespaces ``local`` and its own Ray session), so a
driver on another node is not visible from here: the file then says so instead of guessing. When the
saving process is itself the driver (no Ray), its own record is the driver's.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from verl_ascend_ext.runtime.records import recorder, store
from verl_ascend_ext.runtime.records.schema import DRIVER, LOCAL_NAMESPACE

logger = logging.getLogger("verl_ascend_ext")

STATUS_FILE = "verl_ascend_ext.status.json"


def job_status() -> dict[str, Any]:
    """The saving process's record, the driver's record (or why it is missing) and the job summary."""
    from verl_ascend_ext.runtime.records.reader import collect
    from verl_ascend_ext.runtime.records.report import aggregate

    own = recorder.current_record()
    namespaces = [LOCAL_NAMESPACE] + ([own["namespace"]] if own and own["namespace"] != LOCAL_NAMESPACE else [])
    records, notes = collect(store.base_dir(), namespaces)
    report = aggregate(records, notes)
    driver: dict[str, Any] | None = None
    if own is not None and own["role"] == DRIVER:
        driver = own
    elif report["driver"] is not None:
        driver = next(r for r in records if (r.get("host"), r.get("pid")) ==
                      (report["driver"]["host"], report["driver"]["pid"]))
        driver = {k: v for k, v in driver.items() if k != "file"}
    return {
        "saved_at": time.time(),
        "status_dir": store.base_dir(),
        "saved_by": own,
        "driver": driver,
        "driver_note": None if driver is not None else
        f"no active driver record in {store.base_dir()} on this node (the driver runs on another node, or its "
        "directory differs); see `verl-ascend status --ray` while the job runs",
        "summary": report["summary"], "by_role": report["by_role"], "active": report["active"],
        "problems": report["problems"],
    }


def write_beside(export_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Write ``verl_ascend_ext.status.json`` into the checkpoint directory holding ``export_dir``; return it.

    Never fails the save: an error costs one warning and returns None.
    """
    try:
        status = job_status()
        path = Path(export_dir).resolve().parent / STATUS_FILE
        tmp = path.with_name(f".{STATUS_FILE}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(status, indent=2) + "\n")
        os.replace(tmp, path)
    except (OSError, ValueError, TypeError, StopIteration) as err:
        logger.warning("verl-ascend-ext: checkpoint status not written next to %s: %s: %s", export_dir,
                       type(err).__name__, err)
        return None
    return status
