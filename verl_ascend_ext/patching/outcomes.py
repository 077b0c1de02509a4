"""The statuses a patch can end in (``Status`` and its named groups), how its runs are seen (``Observed``, the
values the process records carry) and ``PatchStatus``: what the boot and the process records need, apart from the
record types (``record``, loaded when a feature declaration or a target's hook needs them; it re-exports these).
"""

from __future__ import annotations

from enum import Enum

from verl_ascend_ext.patching.values import Value


class Status(str, Enum):
    """What happened (in-process) or will happen (static prediction) to one patch."""

    APPLIED = "applied"
    WILL_APPLY = "will-apply"
    FIXED_UPSTREAM = "fixed-upstream"
    ALREADY_APPLIED = "already-applied"
    GATE_OFF = "gate-off"
    NOT_INSTALLED = "not-installed"
    DISABLED = "disabled"
    REFUSED = "refused"
    # The patched path no longer exists on its own in this code: it runs through targets other records fix
    # (``PatchRecord.covered_by``, named in the detail with their statuses), e.g. CP classes that now inherit the
    # indexer a device-operator record scales. Not ``fixed-upstream``: upstream did not fix it, they do.
    COVERED = "covered"
    PENDING = "pending"  # in-process only: gate on, hook registered, target module not imported yet
    # Static prediction only: the record's gate variable holds a value the gate parser rejects, so whether
    # the patch would run cannot be told (the process would refuse to start; doctor exits 2 naming it).
    UNDECIDED = "unknown"

    def __str__(self) -> str:
        return self.value


class Observed(str, Enum):
    """Whether a process can tell that a record's replacement has run (``status.exercised``)."""

    EAGER = "eager"  # the replacement reports its first call in each process
    ACTS = "acts"  # it runs on every call but does its work only on some (``acts_when``): it reports those itself
    TRACED = "traced"  # it can run inside a compiled graph, where nothing reports itself
    IMPORT = "import"  # an import-action record: applying it is all it does

    def __str__(self) -> str:
        return self.value


# Named groups of statuses, defined once. Status is a str enum whose hash is its value's, so a raw status
# string read back from JSON (a Ray node's report, a process record) is found in these sets too.
ACTIVE = frozenset({Status.APPLIED, Status.WILL_APPLY, Status.PENDING})  # the replacement runs or will run
DONE = frozenset({Status.APPLIED, Status.FIXED_UPSTREAM, Status.ALREADY_APPLIED,  # the fix is in place
                  Status.COVERED})
OFF = frozenset({Status.GATE_OFF, Status.DISABLED})  # switched off by its gate or the kill switch
NEEDS_ATTENTION = frozenset({Status.REFUSED, Status.UNDECIDED})  # doctor prints their detail and flags them


class PatchStatus(Value):
    """The status of one patch with the reason, and where the target code was found."""

    __slots__ = ("detail", "id", "status", "target", "where")
    id: str
    target: str
    status: Status
    detail: str
    where: str

    def __init__(self, id: str, target: str, status: Status, detail: str, where: str = "") -> None:
        self._set(id=id, target=target, status=status, detail=detail, where=where)

    def as_dict(self) -> dict[str, str]:
        return {"id": self.id, "target": self.target, "status": self.status.value, "detail": self.detail,
                "where": self.where}
