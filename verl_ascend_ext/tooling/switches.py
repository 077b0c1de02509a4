"""The table of switches (docs/switches.md), generated from the declared gates and settings so that it cannot drift.

``render`` gives the block between docs/switches.md's markers: the rule for values (from the one gate parser's
spellings) and one row per gate (``verl_ascend_ext_gates``, in declaration order), per setting
(``verl_ascend_ext_settings``: ``patching.gates.Setting``, default and unit as declared) and per package variable
that no feature declares (``PACKAGE_VARIABLES``: the export-check mode, the kill switch, where the process records
go and how long they stay, each shown from the constant its code reads). ``verl-ascend switches`` prints it,
``--check docs/switches.md`` fails when that file's block differs, ``--write docs/switches.md`` replaces it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from verl_ascend_ext.features.checkpoint.mode import DEFAULT_MODE, MODE_ENV, MODES
from verl_ascend_ext.patching import gates
from verl_ascend_ext.runtime.boot import RUNTIME_GATES
from verl_ascend_ext.runtime.records.prune import DEFAULT_KEEP, KEEP_ENV
from verl_ascend_ext.runtime.records.store import DIR_ENV
from verl_ascend_ext.runtime.registry import registry

BEGIN = ("<!-- switches: generated from the declared gates and settings by "
         "`verl-ascend switches --write docs/switches.md` -->")
END = "<!-- /switches -->"


class Row(NamedTuple):
    """One variable of the table: name, default as shown, what it does."""

    env: str
    default: str
    doc: str


PACKAGE_VARIABLES = (
    Row(MODE_ENV, f"`{DEFAULT_MODE}`", f"{', '.join(f'`{m}`' for m in MODES)}: what an export failing the check "
        "does (also `verl-ascend export-check`)"),
    Row(gates.DISABLE_ENV, "empty", "kill switch: `id,id` or `*` (ids from `verl-ascend doctor`); an unknown id is "
        "an error, not a silent no-op"),
    Row(DIR_ENV, "`<temp dir>/verl-ascend-ext-status-<uid>`",
        "where each process records what ran in it (`verl-ascend status`); `${NAME}` in it is read from each "
        "process's environment (Ray expands it per node from the raylet's: a path of each node's own)"),
    Row(KEEP_ENV, f"`{int(DEFAULT_KEEP)}` s", "seconds a dead process's record is kept after it was last written "
        "(each process removes its own namespace's older ones at most hourly; `verl-ascend status --prune` all)"),
)


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def _shown(value: Any, unit: str) -> str:
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return f"`{text}` {unit}".rstrip()


def rows() -> list[Row]:
    """Every row: the declared gates, the declared settings, then the package's own variables."""
    reg = registry()
    out = [Row(g.env, "on" if g.default else "off", g.doc) for g in (*reg.gates, *RUNTIME_GATES)]
    out += [Row(s.env, _shown(s.default, s.unit), s.doc) for s in reg.settings]
    return [*out, *PACKAGE_VARIABLES]


def _spellings(values: tuple[str, ...]) -> str:
    return "/".join(v or "empty" for v in values)


def render() -> str:
    """The generated block, markers included."""
    rule = (f"Every on/off variable (default `on` or `off` below) accepts `{_spellings(gates.TRUE_VALUES)}` and "
            f"`{_spellings(gates.FALSE_VALUES)}` (any case, spaces ignored); anything else stops the process with "
            "an error naming the variable.")
    if "" not in gates.FALSE_VALUES:
        rule += (" One rule for every variable below: set but empty (or only spaces) means its default, exactly as "
                 "unset does (like `${VAR:-default}`), and `verl-ascend doctor` says so.")
    lines = [f"| `{r.env}` | {r.default} | {_cell(r.doc)} |" for r in rows()]
    return "\n".join([BEGIN, "", rule, "", "| variable | default | what |", "|---|---|---|", *lines, "", END])


def block_of(text: str, name: str) -> tuple[int, int]:
    """Start and end offsets of the generated block in ``text`` (``name`` for the error)."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{name} has no generated switches block: add the lines {BEGIN!r} and {END!r} where the "
                         "table goes, then run `verl-ascend switches --write` on it")
    return start, end + len(END)


def check(path: str) -> str | None:
    """None when ``path``'s block is current, else what to do."""
    text = Path(path).read_text(encoding="utf-8")
    start, end = block_of(text, path)
    if text[start:end] != render():
        return f"{path}: the table of switches is stale: regenerate it with `verl-ascend switches --write {path}`"
    return None


def write(path: str) -> None:
    text = Path(path).read_text(encoding="utf-8")
    start, end = block_of(text, path)
    Path(path).write_text(text[:start] + render() + text[end:], encoding="utf-8")
