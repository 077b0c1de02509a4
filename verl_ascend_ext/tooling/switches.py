"""The README's table of switches, generated from the declared gates and settings so that it cannot drift.

``render`` gives the block between the README's markers: the rule for boolean values (from the one gate parser's
spellings) and one row per gate (``verl_ascend_ext_gates``, in declaration order) and setting
(``verl_ascend_ext_settings``, then the core ones of ``runtime.settings``). ``verl-ascend switches`` prints it,
``--check README.md`` fails when the README's block differs, ``--write README.md`` replaces it.
"""

from __future__ import annotations

from pathlib import Path

from verl_ascend_ext.patching import gates
from verl_ascend_ext.runtime.registry import plugin_manager, registry
from verl_ascend_ext.runtime.settings import CORE, Setting

BEGIN = "<!-- switches: generated from the declared gates and settings by `verl-ascend switches --write README.md` -->"
END = "<!-- /switches -->"


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def settings() -> list[Setting]:
    """Every declared setting: the features' (``verl_ascend_ext_settings``), then the core ones."""
    declared = [s for batch in plugin_manager().hook.verl_ascend_ext_settings() for s in batch]
    return [*declared, *CORE]


def _spellings(values: tuple[str, ...]) -> str:
    return "/".join(v or "empty" for v in values)


def render() -> str:
    """The generated block, markers included."""
    rule = (f"Every on/off variable (default `on` or `off` below) accepts `{_spellings(gates.TRUE_VALUES)}` and "
            f"`{_spellings(gates.FALSE_VALUES)}` (any case, spaces ignored)")
    rule += "." if "" in gates.FALSE_VALUES else "; set but empty, it keeps its default."
    rule += " Anything else stops the process with an error naming the variable."
    rows = [f"| `{g.env}` | {'on' if g.default else 'off'} | {_cell(g.doc)} |" for g in registry().gates]
    rows += [f"| `{s.env}` | {s.default} | {_cell(s.doc)} |" for s in settings()]
    return "\n".join([BEGIN, "", rule, "", "| variable | default | what |", "|---|---|---|", *rows, "", END])


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
