"""Compare an export's tensors with its reference checkpoint: names, shapes, dtypes, and plain-word diagnoses.

Missing names are tolerated only as the model family's declared omissions (``omissions.py``), dtype
changes only as its declared conversions (``conversions.py``); shapes must always match. Diagnoses say
what a pattern of differences usually means: a dimension exactly 1/N of the reference (an unmerged
tensor- or expert-parallel shard), whole consecutive layers missing (one pipeline stage), a dtype change.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_ascend_ext.features.checkpoint.conversions import Conversion, conversions_for
from verl_ascend_ext.features.checkpoint.omissions import omissions_for
from verl_ascend_ext.features.checkpoint.shards import Tensor, describe

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass
class Comparison:
    """The export against the reference; ``mismatched`` rows: name, reference, export, why."""

    missing: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    omitted: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    mismatched: list[dict[str, str]] = field(default_factory=list)
    converted: dict[str, int] = field(default_factory=dict)
    diagnoses: list[str] = field(default_factory=list)
    declared_omissions: list[str] = field(default_factory=list)
    declared_conversions: list[str] = field(default_factory=list)


def _unmerged_factor(reference: tuple[int, ...], export: tuple[int, ...]) -> tuple[int, int] | None:
    """``(dim, N)`` when the shapes differ in exactly one dimension and the export's is exactly 1/N of it."""
    if len(reference) != len(export):
        return None
    differ = [d for d, (r, e) in enumerate(zip(reference, export, strict=True)) if r != e]
    if len(differ) != 1:
        return None
    r, e = reference[differ[0]], export[differ[0]]
    return (differ[0], r // e) if e > 0 and r % e == 0 else None


def compare(reference: Mapping[str, Tensor], export: Mapping[str, Tensor], config: Mapping[str, Any],
            unreadable: frozenset[str] | set[str] = frozenset(), conversions: Sequence[Conversion] = ()) -> Comparison:
    """Names, shapes and dtypes of ``export`` against ``reference`` (``config``: the reference's config.json).

    ``unreadable``: names the export's index puts in shards that are absent or refused; reported apart
    from the missing ones (the integrity problem already says why). ``conversions``: allowed besides the
    model family's, for what the save path is known to do (``conversions.FSDP_MASTER_WEIGHTS``).
    """
    omissions, conversions = omissions_for(config), [*conversions_for(config), *conversions]
    out = Comparison(declared_omissions=[f"{o.family}: {o.description}" for o in omissions],
                     declared_conversions=[f"{c.family}: {c.description}" for c in conversions])
    for name in sorted(reference.keys() - export.keys()):
        if name in unreadable:
            out.unreadable.append(name)
            continue
        (out.omitted if any(o.matches(name, config) for o in omissions) else out.missing).append(name)
    out.extra = sorted(export.keys() - reference.keys())
    unmerged: dict[int, list[str]] = defaultdict(list)
    resized: list[str] = []
    retyped: dict[tuple[str, str], list[str]] = defaultdict(list)
    converted: Counter[str] = Counter()
    differ = {name for name, _ in reference.items() - export.items()} & export.keys()  # set algebra in C: 1e5 names
    for name in sorted(differ):
        (ref_dtype, ref_shape), (exp_dtype, exp_shape) = reference[name], export[name]
        dtype_ok = ref_dtype == exp_dtype
        if not dtype_ok:
            declared = next((c for c in conversions if c.allows(name, ref_dtype, exp_dtype, config)), None)
            if declared is not None:
                dtype_ok = True
                if ref_shape == exp_shape:
                    converted[f"{declared.family}: {declared.description}"] += 1
                    continue
        why = []
        if ref_shape != exp_shape:
            factor = _unmerged_factor(ref_shape, exp_shape)
            if factor is not None:
                dim, n = factor
                why.append(f"dimension {dim} is 1/{n} of the reference's: looks like a tensor- or expert-parallel "
                           f"shard saved unmerged, N={n}")
                unmerged[n].append(name)
            else:
                why.append("shape differs")
                resized.append(name)
        if not dtype_ok:
            why.append(f"dtype changed from {ref_dtype} to {exp_dtype}")
            retyped[(ref_dtype, exp_dtype)].append(name)
        out.mismatched.append({"name": name, "reference": describe(reference[name]), "export": describe(export[name]),
                               "why": "; ".join(why)})
    out.converted = dict(converted)
    rows = {row["name"]: row for row in out.mismatched}

    def example(name: str) -> str:
        return f"e.g. {name}: {rows[name]['reference']} in the reference, {rows[name]['export']} exported"

    for n, names in sorted(unmerged.items()):
        out.diagnoses.append(f"{len(names)} tensor(s) have one dimension exactly 1/{n} of the reference's "
                             f"({example(names[0])}): looks like a tensor- or expert-parallel shard saved unmerged, "
                             f"N={n}")
    if resized:
        out.diagnoses.append(f"{len(resized)} tensor(s) have another shape than the reference's "
                             f"({example(resized[0])})")
    for (ref_dtype, exp_dtype), names in sorted(retyped.items()):
        out.diagnoses.append(f"{len(names)} tensor(s) changed dtype from {ref_dtype} to {exp_dtype} "
                             f"({example(names[0])}), not a conversion declared for model_type "
                             f"{config.get('model_type')!r}")
    if out.missing:
        out.diagnoses.extend(_missing_layer_runs(reference, set(out.missing), set(out.omitted)))
    return out


def _missing_layer_runs(reference: Mapping[str, Tensor], missing: set[str], omitted: set[str]) -> list[str]:
    """Plain words for consecutive layers of which every (not omitted) tensor is missing."""
    per_layer: dict[int, list[str]] = defaultdict(list)
    for name in reference:
        found = _LAYER.search(name)
        if found and name not in omitted:
            per_layer[int(found.group(1))].append(name)
    gone = sorted(i for i, names in per_layer.items() if all(n in missing for n in names))
    runs: list[list[int]] = []
    for i in gone:
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    lines = []
    for run in runs:
        count = sum(len(per_layer[i]) for i in run)
        if len(run) == 1:
            lines.append(f"layer {run[0]} missing entirely ({count} tensors)")
        else:
            lines.append(f"layers {run[0]}..{run[-1]} missing entirely ({count} tensors): one pipeline stage's "
                         f"weights?")
    return lines
