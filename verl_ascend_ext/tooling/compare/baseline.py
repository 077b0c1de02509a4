"""``verl-ascend compare --write-baseline FILE RUN [--dir DIR]``: a run kept as plain text a recipe can ship.

The file is readable and diffable: a header line (``# verl-ascend-ext baseline 1``) and where it came from, then one
``step:N - key:value - ...`` line per step, as verl's console logger prints them, holding the metrics the rules
judge (the defaults and those of ``--rules``), the metrics the run logged non-finite at some step, all of them, on a
``nonfinite:`` line (JSON: metric -> first step, value as written, count, steps logged; ``{}`` when none: the
non-finite check, ``nonfinite``, must know which metrics the baseline's run had so, not only the rules'), and, when
the run's status directory was given (``--dir``), the plugin's status per role and patch on a ``status:`` line
(JSON). ``compare`` reads it as it reads a log.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from verl_ascend_ext.tooling.compare.nonfinite import scan
from verl_ascend_ext.tooling.compare.rules import Rule
from verl_ascend_ext.tooling.compare.runs import BASELINE_FORMAT, BASELINE_HEADER, Run


def write(path: str | Path, run: Run, rules: tuple[Rule, ...], status: dict[str, Any] | None) -> int:
    """Write ``run`` as a baseline to ``path`` (atomically); the number of steps written."""
    kept = {rule.metric for rule in rules}
    lines = [f"{BASELINE_HEADER} {BASELINE_FORMAT}",
             f"# from {run.path} ({run.kind}, {run.span}), written {time.strftime('%Y-%m-%d %H:%M:%S')} by "
             "`verl-ascend compare --write-baseline`",
             f"# metrics: {', '.join(sorted(kept))}"]
    steps = 0
    series = {metric: run.metric(metric) for metric in sorted(kept)}
    for step in sorted(run.raw):
        chosen = {metric: values[step] for metric, values in series.items() if step in values}
        if chosen:
            lines.append(" - ".join([f"step:{step}", *(f"{k}:{v!r}" for k, v in chosen.items())]))
            steps += 1
    nonfinite = {metric: first.as_dict() for metric, first in sorted(scan(run).items())}
    lines.append("nonfinite: " + json.dumps(nonfinite, sort_keys=True))
    if status is not None:
        lines.append("status: " + json.dumps(status, sort_keys=True))
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return steps
