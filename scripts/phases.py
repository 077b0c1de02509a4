"""The phase table of a CI run, in one place: how a phase is logged, how the table is printed, how a printed row is
read back.

``scripts/test.sh`` logs each phase it runs (each set-up part, each pytest phase) and ``tests/engine`` each training job
(``add``: one tab-separated line per phase in the file ``CI_PHASE_LOG`` names); at the end the script prints the table
(``table``), its total against CI's budget; ``benchmarks/ci_side_by_side.py`` reads printed tables back (``parse_row``).
A training job's row is indented under the engine tier's, which it runs inside. The table's header names the CPU
(``machine``): its model, its bf16 and AMX flags and any oneDNN ISA ceiling, since bf16 results differ by the kernels a
CPU takes (``tests/engine/bf16_ties.py``), so a failure can be tied to the machine.

    python3 scripts/phases.py add LOG NAME SECONDS OUTCOME
    python3 scripts/phases.py print LOG WALL_SECONDS
"""

from __future__ import annotations

import os
import platform
import re
import sys
from pathlib import Path

HEADING = ("Phases (wall time; a training job runs inside the engine tier's pytest phase, a background part beside the",
           "parts after it)")
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8")  # what oneDNN's bf16 kernels need
MACHINE = "CPU: "  # the header line machine() writes starts so
INNER = "  "  # a row inside the phase above it (a training job inside the engine tier)
_PRINTED = re.compile(r"^ {2,}(?P<name>\S.*?)\s+(?P<seconds>\d+) s  (?P<outcome>.*)$")


def machine(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """One line: the CPU's model, which of ``CPU_FLAGS`` it has and lacks, and ``ONEDNN_MAX_CPU_ISA`` if set."""
    model, flags, unknown = platform.processor() or platform.machine(), None, "flags unknown"
    try:
        text = Path(cpuinfo).read_text()
    except OSError as err:
        text, unknown = "", f"flags unknown ({cpuinfo}: {err.strerror})"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            model = value.strip()
        elif key.strip() == "flags" and flags is None:
            flags = set(value.split())
    has = "" if flags is None else " ".join(f if f in flags else f"no-{f}" for f in CPU_FLAGS)
    ceiling = os.environ.get("ONEDNN_MAX_CPU_ISA")
    return (f"{MACHINE}{model}, {os.cpu_count()} cores; {has or unknown}"
            f"{f'; ONEDNN_MAX_CPU_ISA={ceiling}' if ceiling else ''}")


def add(log: str | Path, name: str, seconds: float, outcome: str) -> None:
    """Append one phase to ``log`` (a tab inside ``name`` would break the row: replaced by a space)."""
    with open(log, "a") as out:
        out.write(f"{name.replace(chr(9), ' ')}\t{seconds:.0f}\t{outcome}\n")


def printed_row(name: str, seconds: float, outcome: str) -> str:
    return f"  {name:<52} {seconds:7.0f} s  {outcome}"


def table(log: str | Path, wall: float) -> str:
    """The table of ``log``'s phases with the heading and the run's total wall time."""
    lines = [*HEADING, machine()]
    for line in Path(log).read_text().splitlines():
        name, seconds, outcome = ([*line.split("\t"), "", ""])[:3]
        lines.append(printed_row(name, float(seconds or 0), outcome))
    lines.append(printed_row("total (wall)", wall, f"({int(wall) // 60} min {int(wall) % 60} s)"))
    lines.append(against_budget(wall))
    return "\n".join(lines)


BUDGET_S = 40 * 60  # CI's time on a new 2-core machine (DEVELOPERS.md; 90 min is the hard limit)


def against_budget(wall: float) -> str:
    """The total against CI's budget, one line."""
    left = BUDGET_S - wall
    said = f"{int(left) // 60} min {int(left) % 60} s left" if left >= 0 else \
        f"OVER by {int(-left) // 60} min {int(-left) % 60} s"
    return f"  budget {BUDGET_S // 60} min on a new 2-core machine: {said}"


def parse_row(line: str) -> tuple[str, float, str] | None:
    """(name, seconds, outcome) of a printed row, or None for any other line."""
    found = _PRINTED.match(line)
    return None if found is None else (found["name"], float(found["seconds"]), found["outcome"].strip())


def main(argv: list[str]) -> int:
    if len(argv) == 5 and argv[0] == "add":
        add(argv[1], argv[2], float(argv[3]), argv[4])
        return 0
    if len(argv) == 3 and argv[0] == "print":
        print(table(argv[1], float(argv[2])))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
