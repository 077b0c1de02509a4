"""Patch records: the declared contract of every runtime patch, and the statuses it can end in.

A record says what a patch is for, where it goes, which code it knows how to change, which code
already carries the fix, and when it can go away. It holds no replacement code itself, only the
import path of the wrapper, so that declaring a record costs nothing at start-up. Records are
immutable NamedTuples rather than frozen dataclasses: most processes of a training job define these
classes (with the registry, at the first import of a target), and a NamedTuple class costs a fifth of a
dataclass to create. The statuses a patch ends in are in ``outcomes`` (the boot needs only those).
"""

from __future__ import annotations

import re
from enum import Enum
from typing import TYPE_CHECKING, NamedTuple

from verl_ascend_ext.patching.gates import Gate
from verl_ascend_ext.patching.outcomes import ACTIVE as ACTIVE  # the statuses: re-exported where they were declared
from verl_ascend_ext.patching.outcomes import DONE as DONE
from verl_ascend_ext.patching.outcomes import NEEDS_ATTENTION as NEEDS_ATTENTION
from verl_ascend_ext.patching.outcomes import OFF as OFF
from verl_ascend_ext.patching.outcomes import Observed as Observed
from verl_ascend_ext.patching.outcomes import PatchStatus as PatchStatus
from verl_ascend_ext.patching.outcomes import Status as Status


class Action(str, Enum):
    """How the engine installs a record's ``wrapper`` (see ``PatchRecord``); checked when features are collected."""

    WRAP = "wrap"
    IMPORT = "import"
    STATICMETHOD = "staticmethod"

    def __str__(self) -> str:
        return self.value


def split_target(target: str) -> tuple[str, str]:
    """``"pkg.mod:Qual.name"`` -> ``("pkg.mod", "Qual.name")``."""
    module, sep, qualname = target.partition(":")
    if not sep or not module or not qualname:
        raise ValueError(f"patch target {target!r} must look like 'package.module:Qualified.name'")
    return module, qualname


class Fingerprint(NamedTuple):
    """Recognises a definition by what its normalised source does.

    ``contains``: regular expressions that must all match; ``absent``: none may match. The text
    searched is ``ast.unparse`` output (single quotes, no comments, no docstring, canonical
    spacing), so write patterns against that form.
    """

    contains: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    description: str = ""
    # Cross-definition checks (e.g. a fix that upstream put in the caller of the patched function):
    # ``at`` is a "module:Qual.name" whose definition this fingerprint reads instead of the patch's own
    # target (a bare "Qual.name" is read from the same file as the target, inherited methods included);
    # ``also`` are further fingerprints (each read at its own ``at``) that must match as well.
    # The engine resolves them from source files (see ``engine.fingerprint_matches``).
    at: str = ""
    also: tuple[Fingerprint, ...] = ()
    # A fingerprint that recognises nothing, on purpose: the ``fixed`` of a patch no upstream release carries
    # (``Fingerprint.never_matching``). A fingerprint without patterns that does not say so is a declaration error.
    never: bool = False
    # Patterns kept although no mutation of a released source shows them needed (the contract suite,
    # ``verl_ascend_ext.testing``, reports such a pattern as dead or unexercised): (pattern, why it is kept).
    # A pattern listed here that the fingerprint does not hold is a declaration error.
    kept: tuple[tuple[str, str], ...] = ()

    @classmethod
    def never_matching(cls, description: str) -> Fingerprint:
        """The ``fixed`` fingerprint of a patch with no upstream form: ``description`` says why."""
        return cls(description=description, never=True)

    def matches(self, text: str) -> bool:
        if self.never or (not self.contains and not self.absent):
            return False
        return all(re.search(p, text, re.M) for p in self.contains) and not any(
            re.search(p, text, re.M) for p in self.absent
        )

    def patterns(self) -> tuple[str, ...]:
        """Every regular expression of this fingerprint itself (not of its ``also`` parts)."""
        return (*self.contains, *self.absent)

    def explain(self, text: str) -> str:
        """Which requirement fails on ``text`` (for refusal messages)."""
        missing = [p for p in self.contains if not re.search(p, text, re.M)]
        present = [p for p in self.absent if re.search(p, text, re.M)]
        parts = []
        if missing:
            parts.append("missing " + ", ".join(repr(p) for p in missing))
        if present:
            parts.append("unexpected " + ", ".join(repr(p) for p in present))
        return "; ".join(parts) or "matches"


class Variant(NamedTuple):
    """Another shape of the code a patch fixes, with the replacement written for that shape (``wrapper``, as the
    record's own): e.g. a later release that dropped a helper the first replacement calls."""

    original: Fingerprint
    wrapper: str


class ForeignCopy(NamedTuple):
    """Another package's copy of a fix (e.g. verl's in-tree one), recognised statically by its source.

    ``target`` ("module:Qual.name") is the function that applies the copy; ``fingerprint`` recognises it;
    ``enabled_by`` are the values (stripped, lower-case) of the record's gate that switch the copy on
    (empty: always on). ``predict`` reports ``already-applied`` when such a copy is installed and enabled:
    whichever copy loads first applies the fix, the other stands down.
    """

    name: str
    target: str
    fingerprint: Fingerprint
    enabled_by: tuple[str, ...] = ()


class PatchRecord(NamedTuple):
    """One runtime patch, declared.

    ``wrapper`` is ``"module:function"`` of the patch code ``impl(original, *args, **kwargs)`` (for a method
    ``args[0]`` is ``self``), imported only when the patch is applied; the engine installs a plain function
    calling it (``replacement.build``), which torch.compile traces. ``traced`` says whether the target can
    run inside a model forward that torch.compile traces or a graph captures (True) or only eagerly
    (False): a traced replacement must not read a ContextVar, a thread-local or the call stack, and is
    tested eagerly and under ``torch.compile(fullgraph=True)``. ``foreign_markers`` are attribute names
    other patchers (e.g. verl's in-tree copy of the same fix) set on the object they replaced: seeing one
    means the fix is in place already and we stand down.
    """

    id: str
    feature: str
    why: str
    target: str
    gate: Gate  # the object, not its name: every decision about the record needs only the record
    distribution: str
    versions: str  # PEP 440 specifier of the releases whose code was read for this record
    original: Fingerprint
    fixed: Fingerprint
    wrapper: str
    upstream: str
    remove_when: str
    traced: bool
    foreign_markers: tuple[str, ...] = ()
    # "wrap": wrap the target function with ``wrapper``. "import": the target is a module's top-level
    # code ("pkg.mod:<module>"); when its original fingerprint is recognised, the engine imports the
    # module named by ``wrapper`` (a module path, no function), once, and reports its status like a wrap.
    # "staticmethod": the target is a staticmethod; ``wrapper`` names a module-level function installed as
    # ``staticmethod(function)`` in its place, so it pickles by reference (e.g. as a multiprocessing spawn
    # target); the function reaches the original through ``engine.original(record.id)``.
    action: Action = Action.WRAP
    # Marker attributes set to True on our replacement function (the original is not touched): another copy
    # of the same fix that checks these markers stands down. When the fix is upstream, the engine sets them on
    # the upstream function itself (attribute only, see ``shield``).
    exposes_markers: tuple[str, ...] = ()
    # The patches (same target module, declared earlier) this record exists for, e.g. an entry point that
    # carries them into spawned processes: it stands down unless one of them is applied. Records, not ids, so
    # that the engine decides from the record alone and never looks anything up in the feature registry.
    serves: tuple[PatchRecord, ...] = ()
    # Other packages' copies of the same fix, recognised in their installed source (doctor's prediction).
    foreign_copies: tuple[ForeignCopy, ...] = ()
    # Further shapes of the fix (any one of ``fixed`` and these suffices). A shape whose ``at`` names another
    # "module:Qual.name" can recognise a fix that removed the target itself (e.g. a class that is gone).
    fixed_shapes: tuple[Fingerprint, ...] = ()
    # Shapes read in later releases that this patch does not handle: when the code is refused, the
    # description of each one that matches is added to the refusal, saying what changed.
    changes: tuple[Fingerprint, ...] = ()
    # Patches whose replacement this one relies on (e.g. it reads a ContextVar theirs sets): this one stands
    # down (``disabled``, naming them) when one of them is off or will not be applied.
    needs: tuple[PatchRecord, ...] = ()
    # Further shapes of the code to fix, each with its own replacement: ``original``/``wrapper`` are tried first,
    # then each variant in order; the first whose fingerprint matches is applied (the status detail names it).
    variants: tuple[Variant, ...] = ()
    # Shapes in which the patched path runs through the targets of ``covered_by`` (all of them, e.g. one per
    # device), so those records fix it: status ``covered``, naming them and their statuses; ``disabled`` when
    # one of them is off or refused (nothing fixes the path then). Checked after ``fixed``, before ``original``.
    covered_shapes: tuple[Fingerprint, ...] = ()
    covered_by: tuple[PatchRecord, ...] = ()
    # For an eager replacement that is called every time but changes something only in some calls (e.g. a micro-batch
    # with no response token): that condition, in words. Such a replacement reports itself (``status.exercised``)
    # when it does its work, not when it is merely called, so "exercised" means the fix acted; status shows this text.
    acts_when: str = ""

    @property
    def module(self) -> str:
        return split_target(self.target)[0]

    @property
    def observed(self) -> Observed:
        """How a process reports that this record's replacement ran (see ``Observed``)."""
        if self.action == Action.IMPORT:
            return Observed.IMPORT
        if self.traced:
            return Observed.TRACED
        return Observed.ACTS if self.acts_when else Observed.EAGER

    @property
    def qualname(self) -> str:
        return split_target(self.target)[1]


if TYPE_CHECKING:
    from typing import Protocol

    class Patch(Protocol):
        """What the boot knows of a patch before its target is imported: a record, or the boot's plan of one
        (``runtime.boot_plan.Planned``)."""

        id: str
        target: str
        module: str
        gate: Gate
