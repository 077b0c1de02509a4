"""A run as verl leaves it, read into steps: its console log, its file logger's JSON lines, or a baseline file.

- **console log** (what a user always has: verl's ``console`` logger is the default, and the job's stdout is kept
  by every launcher): each ``step:N - key:value - ...`` line verl's ``LocalLogger`` prints (a Ray prefix such as
  ``(TaskRunner pid=12)`` before it is fine; numbers as ``pprint`` writes them, numpy's ``np.float64(...)`` too);
  a later line for the same step (a resumed job re-logging) replaces the earlier one;
  a value's colons and `` - `` inside brackets or quotes (``tensor(0.5, device='npu:0')``) belong to the value,
  and a key may hold a colon (``val-core/gsm8k:acc``): a pair splits at its last colon outside brackets and quotes;
- **file logger** (``trainer.logger=[...,file]``, ``VERL_FILE_LOGGER_PATH``): one JSON object per line,
  ``{"step": N, "data": {key: value}}``; verl writes it with orjson, which writes NaN and +-inf as ``null``: a
  ``null`` metric is read as a non-finite value (``NULL``), which ``compare`` fails;
- **baseline file** (``baseline.write``): the first line says so; the same step lines, the plugin's status on a
  ``status:`` line, and the metrics its run logged non-finite on a ``nonfinite:`` line (``nonfinite``).

A console log also tells which process was the job's driver: the plugin's boot line names its pid (``verl-ascend-ext
(pid N, loaded by verl)``), which a status directory given for the run must hold (``status.side``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STEP_LINE = re.compile(r"(?:^|\s)step:(\d+) - (.*)$")
WRAPPED = re.compile(r"^[A-Za-z_][\w.]*\((.*)\)$")  # np.float64(0.5), tensor(0.5)
DRIVER_BOOT = re.compile(r"verl-ascend-ext \(pid (\d+), loaded by verl\)")
BASELINE_HEADER = "# verl-ascend-ext baseline"
BASELINE_FORMAT = 1
NULL = "null"  # a file logger's null: verl's orjson writes NaN and +-inf so
QUOTES, OPENS, CLOSES = "'\"", "([{", ")]}"
ENCLOSED = re.compile(r"['\"]|[(\[{][^)\]}]*(?::| - )")  # a quote, or a colon or " - " after an open bracket


class RunError(ValueError):
    """A run that cannot be compared (the message names the file and the fix)."""


@dataclass
class Run:
    """One run's steps (step -> metric -> value as written; numbers parsed when a metric is asked for: a 1000-step log
    holds ~100k values, a comparison reads a few metrics) and what else it tells."""

    path: str
    kind: str  # "console log", "file logger", "baseline"
    raw: dict[int, dict[str, str | float]]
    driver_pids: list[int] = field(default_factory=list)  # from the plugin's boot lines (console logs only)
    status: dict[str, Any] | None = None  # the status summary a baseline file carries
    # a baseline file's record of its run's non-finite metrics (metric -> step, value, count, logged); None: no record
    nonfinite: dict[str, dict[str, Any]] | None = None

    def metric(self, name: str) -> dict[int, float]:
        """step -> value of ``name``, in step order (steps without it, or where it is not a number, left out)."""
        out = {}
        for step, values in sorted(self.raw.items()):
            if name in values:
                value = number(values[name])
                if value is not None:
                    out[step] = value
        return out

    def metrics(self) -> set[str]:
        return {name for values in self.raw.values() for name in values}

    @property
    def steps(self) -> dict[int, dict[str, float]]:
        """Every step's numbers (every value parsed)."""
        return {step: {k: v for k, raw in values.items() if (v := number(raw)) is not None}
                for step, values in sorted(self.raw.items())}

    @property
    def span(self) -> str:
        return f"steps {min(self.raw)}-{max(self.raw)} ({len(self.raw)} logged)"


def number(value: str | float) -> float | None:
    """A metric value as verl prints it (``0.5``, ``np.float64(0.5)``, ``nan``; a file logger's ``null`` is NaN), or
    None when it is not a number."""
    if isinstance(value, float):
        return value
    if value == NULL:
        return math.nan
    try:
        return float(value)
    except ValueError:
        wrapped = WRAPPED.match(value.strip())
        if wrapped is None:
            return None
    try:
        return float(wrapped.group(1).split(",")[0])
    except ValueError:
        return None


def _outside(text: str) -> list[bool]:
    """Per character of ``text``: whether it stands outside brackets and quotes."""
    flags, depth, quote, escaped = [], 0, "", False
    for char in text:
        flags.append(depth == 0 and not quote)
        if quote:
            escaped, quote = (not escaped and char == "\\"), ("" if char == quote and not escaped else quote)
        elif char in QUOTES:
            quote = char
        elif char in OPENS:
            depth += 1
        elif char in CLOSES:
            depth = max(0, depth - 1)
    return flags


def parse_step_line(rest: str) -> dict[str, str]:
    """key -> value text of one ``step:N - key:value - ...`` line (after ``step:N - ``): pairs split at `` - ``
    and each pair at its last ``:``, both outside brackets and quotes."""
    if not ENCLOSED.search(rest):  # the common line: nothing inside brackets or quotes that could split
        pairs = (part.rpartition(":") for part in rest.split(" - "))
        return {key.strip(): value for key, sep, value in pairs if sep and key.strip()}
    outside = _outside(rest)
    values, start = {}, 0
    cuts = [i for i in range(len(rest)) if outside[i] and rest.startswith(" - ", i)] + [len(rest)]
    for cut in cuts:
        if cut < start:
            continue  # " - - " : the second cut overlaps the first
        colons = [i for i in range(start, cut) if rest[i] == ":" and outside[i]]
        if colons and rest[start:colons[-1]].strip():
            values[rest[start:colons[-1]].strip()] = rest[colons[-1] + 1:cut]
        start = cut + 3
    return values


def read_run(path: str | Path) -> Run:
    """The run in ``path`` (a console log, a file logger's JSON lines or a baseline file); RunError when it holds
    no step."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise RunError(f"{path}: cannot be read ({err.strerror or err}). Pass verl's console log of the run, its "
                       "file logger output (.jsonl) or a baseline file written by `verl-ascend compare "
                       "--write-baseline`.") from err
    first = text.lstrip().split("\n", 1)[0]
    if first.startswith(BASELINE_HEADER):
        run = _baseline(path, text, first)
    elif first.startswith("{"):
        run = _jsonl(path, text)
    else:
        run = _console(path, text)
    if not run.raw:
        raise RunError(f"{path}: no step found in this {run.kind} (verl's console logger prints one "
                       "`step:N - key:value - ...` line per step; its file logger one JSON object per line). Pass "
                       "the log of a run that trained at least one step.")
    return run


def _console(path: Path, text: str) -> Run:
    steps: dict[int, dict[str, str | float]] = {}
    pids: list[int] = []
    for line in text.splitlines():
        found = STEP_LINE.search(line)
        if found:
            steps[int(found.group(1))] = parse_step_line(found.group(2))
            continue
        boot = DRIVER_BOOT.search(line)
        if boot and not line.lstrip().startswith("("):  # a Ray worker's lines come prefixed "(Actor pid=N)"
            pid = int(boot.group(1))
            if pid not in pids:
                pids.append(pid)
    return Run(str(path), "console log", steps, pids)


def _jsonl(path: Path, text: str) -> Run:
    steps: dict[int, dict[str, str | float]] = {}
    for number_, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            step, data = int(row["step"]), row["data"]
        except (ValueError, KeyError, TypeError) as err:
            raise RunError(f"{path}:{number_}: not a line of verl's file logger ({{\"step\": N, \"data\": "
                           f"{{...}}}}): {err}") from err
        steps[step] = {k: NULL if v is None else float(v) for k, v in data.items()
                       if v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))}
    return Run(str(path), "file logger", steps)


def _baseline(path: Path, text: str, first: str) -> Run:
    found = re.search(r"baseline (\d+)", first)
    if found is None or int(found.group(1)) != BASELINE_FORMAT:
        raise RunError(f"{path}: a baseline of format {found.group(1) if found else '?'}; this verl-ascend-ext reads "
                       f"format {BASELINE_FORMAT}. Write it again with `verl-ascend compare --write-baseline`.")
    steps: dict[int, dict[str, str | float]] = {}
    status = nonfinite = None
    for line in text.splitlines():
        if line.startswith("status: "):
            status = json.loads(line[len("status: "):])
            continue
        if line.startswith("nonfinite: "):
            nonfinite = json.loads(line[len("nonfinite: "):])
            continue
        found_step = STEP_LINE.search(line)
        if found_step:
            steps[int(found_step.group(1))] = parse_step_line(found_step.group(2))
    return Run(str(path), "baseline", steps, status=status, nonfinite=nonfinite)
