"""What one Ray node reports to ``doctor --ray``: its inventory (``node_inventory``, what the cluster check at a
job's start asks too) and the static doctor run in that node's own environment.

Shipped to the node by value (``doctor_ray`` registers this module and the inventory's with Ray's cloudpickle), so it
runs even where verl-ascend-ext is not installed: then the inventory says so and no doctor runs.
"""

from __future__ import annotations

from typing import Any

from verl_ascend_ext.features.device.node_inventory import node_inventory


def node_report(driver_paths: tuple[str, ...] = ()) -> dict[str, Any]:
    """The node's inventory plus, where this package imports, its doctor report and exit code.

    ``driver_paths``: the doctor's working and script directories, which Ray puts at the front of every
    worker's ``sys.path``; they are removed first, so a checkout next to the doctor cannot stand in for
    what is installed on the node.
    """
    answer = node_inventory(driver_paths)
    if not answer["installed"]:
        return answer
    try:
        from verl_ascend_ext.tooling.doctor import build_report
    except ImportError as err:
        answer.update(installed=False, import_error=f"{type(err).__name__}: {err}")
        return answer
    report, code = build_report()
    answer.update(report=report, exit_code=code)
    return answer
