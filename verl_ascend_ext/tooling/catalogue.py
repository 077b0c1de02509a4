"""The patch catalogue (docs/patches.md), generated from the patch records so it cannot drift."""

from __future__ import annotations

from verl_ascend_ext.runtime.registry import registry

HEADER = """# Patch catalogue

Generated from the patch records by `verl-ascend catalogue`; do not edit by hand
(`tests/test_catalogue.py` fails when this file is stale). Each patch applies only when its gate is
on, `VERL_ASCEND_EXT_DISABLE` does not name it, and its target's code is recognised; otherwise it
stands down (`fixed-upstream`, `already-applied`, `covered` by other records) or refuses loudly.
`verl-ascend doctor` shows what each patch will do on an install.
"""


RUNS = {
    True: "traced: inside the model forward that torch.compile traces and graphs capture; the replacement is a plain "
    "function, tested eagerly and under torch.compile(fullgraph=True)",
    False: "eagerly only (not inside a compiled model forward)",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    lines = [HEADER]
    for record in sorted(registry().records, key=lambda r: (r.feature, r.id)):
        lines += [
            f"## `{record.id}` ({record.feature})",
            "",
            "| | |",
            "|---|---|",
            f"| why | {_cell(record.why)} |",
            f"| target | `{record.target}` ({record.distribution} {record.versions}) |",
            f"| gate | `{record.gate.env}` |",
            f"| runs | {RUNS[record.traced]} |",
            *([f"| acts (counted as exercised) when | {_cell(record.acts_when)} |"] if record.acts_when else []),
            f"| patches code that | {_cell(record.original.description)} |",
            *(f"| or (variant, replacement `{v.wrapper.rpartition(':')[2]}`) | {_cell(v.original.description)} |"
              for v in record.variants),
            f"| stands down when | {_cell('; or '.join(f.description for f in (record.fixed, *record.fixed_shapes)))}"
            + (f"; or marker `{'`, `'.join(record.foreign_markers)}` present" if record.foreign_markers else "")
            + " |",
            *([f"| covered (by {', '.join(f'`{c.id}`' for c in record.covered_by)}) when | "
               f"{_cell('; or '.join(c.description for c in record.covered_shapes))} |"]
              if record.covered_shapes else []),
            *([f"| refuses, naming the change, when | {_cell('; or '.join(c.description for c in record.changes))} |"]
              if record.changes else []),
            f"| upstream | {_cell(record.upstream)} |",
            f"| remove when | {_cell(record.remove_when)} |",
            "",
        ]
    return "\n".join(lines)
