"""CI on a new machine, revision beside revision: `.ci/run` of each from a clean clone, then their phases side by side.

A new machine, as far as one machine can be made one again: a clean clone of the revision; HOME an empty
directory holding only pip's and git's configuration (no pip cache, no engine venvs, no test fixtures, no vLLM or
Hugging Face cache); torch inductor's and Ray's directories under the temporary directory moved aside (into the
work directory, not deleted); the page cache dropped when this runs as root. Then `CI=true bash .ci/run`, as CI
runs it. The revisions run one after the other (never beside each other: they would share the cores), each log
kept in the work directory; `--warm` runs every clone again with its caches kept (the warm-run figure).

Prints, per phase of the test command's phase table and per pytest summary line (in the order they ran, so an
older revision without the table still compares by its pytest runs), the seconds of each run and their ratio to
the first; then the wall time, exit status, average busy cores (from /proc/stat) and peak used memory of each.

    python benchmarks/ci_side_by_side.py BASE_REV NEW_REV [--warm] [--workdir DIR]
    python benchmarks/ci_side_by_side.py --compare LOG [LOG ...]   # runs already made (a log of this script's)
"""

from __future__ import annotations

import argparse
import getpass
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import phases  # noqa: E402  (scripts/phases.py: the phase table's format, defined once)

CONFIG_KEPT = (".config/pip", ".pip", ".gitconfig")  # reaching the package index, cloning: nothing cached
PYTEST_SUMMARY = re.compile(r"^=*\s*(?P<summary>(?:\d+ \w+(?:, )?)+) in (?P<seconds>[\d.]+)s\b")
RUN_LINE = re.compile(r"^ci_side_by_side: (?P<fields>.*)$")


@dataclass
class Run:
    """What one log says: the phases (name -> seconds, outcome) in order, and the run's own figures."""

    label: str
    phases: dict[str, tuple[float, str]] = field(default_factory=dict)
    figures: dict[str, str] = field(default_factory=dict)


def parse_log(text: str, label: str) -> Run:
    """The phase table's rows, each pytest summary ("pytest run K: ...") and this script's closing line."""
    run = Run(label)
    in_table = False
    pytest_runs = 0
    for line in text.splitlines():
        if line == phases.HEADING[0]:
            in_table = True
            continue
        if in_table:
            row = phases.parse_row(line)
            if row:
                run.phases[row[0]] = (row[1], row[2])
                continue
            in_table = line == phases.HEADING[1] or line.startswith(phases.MACHINE)
        summary = PYTEST_SUMMARY.match(line.strip())
        if summary:
            pytest_runs += 1
            run.phases[f"pytest run {pytest_runs}"] = (float(summary["seconds"]), summary["summary"].strip(", "))
        closing = RUN_LINE.match(line)
        if closing:
            run.figures = dict(part.split("=", 1) for part in closing["fields"].split())
    return run


def comparison(runs: list[Run]) -> str:
    """One table: a row per phase any run has, a column of seconds per run, then each run's ratio to the first."""
    names: list[str] = []
    for run in runs:
        names += [name for name in run.phases if name not in names]
    width = max([len(n) for n in names] + [len("phase")])
    head = f"{'phase':<{width}}" + "".join(f" {run.label:>14}" for run in runs)
    head += "".join(f" {run.label + '/' + runs[0].label:>14}" for run in runs[1:])
    lines = [head]
    for name in names:
        got = [run.phases.get(name) for run in runs]
        cells = [f"{g[0]:>8.0f} s" + (" !" if _failed(g[1]) else "  ") if g else "" for g in got]
        first = got[0][0] if got[0] else 0
        ratios = [f"{g[0] / first:>14.2f}" if g and first else " " * 14 for g in got[1:]]
        lines.append(f"{name:<{width}}" + "".join(f" {c:>14}" for c in cells) + "".join(f" {r}" for r in ratios))
    for key in ("rev", "exit", "wall_s", "busy_cores", "peak_used_gib"):
        lines.append(f"{key:<{width}}" + "".join(f" {run.figures.get(key, '-'):>14}" for run in runs))
    summaries = [f"  {run.label} {name}: {got[1]}" for run in runs for name, got in run.phases.items()
                 if name.startswith("pytest run")]
    return "\n".join([*lines, "(! failed)", "pytest summaries:", *summaries])


def _failed(outcome: str) -> bool:  # test.sh's "FAILED (exit N)", pytest's "N failed" / "N error(s)"
    return "failed" in outcome.lower() or "error" in outcome


def _busy_jiffies() -> tuple[int, int]:
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


def _used_gib() -> float:
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    kib = int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])
    return kib / 2**20


def new_machine_home(home: Path) -> None:
    """An empty HOME with only the configuration that reaches the package index."""
    home.mkdir(parents=True)
    for rel in CONFIG_KEPT:
        source = Path.home() / rel
        if source.is_dir():
            shutil.copytree(source, home / rel)
        elif source.is_file():
            (home / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, home / rel)


def move_caches_aside(aside: Path) -> None:
    """torch inductor's and Ray's directories under the temporary directory, kept in ``aside``."""
    tmp = Path(tempfile.gettempdir())
    for cache in (tmp / f"torchinductor_{getpass.getuser()}", tmp / "ray"):
        if cache.exists():
            aside.mkdir(parents=True, exist_ok=True)
            target = aside / f"{cache.name}.{time.strftime('%Y%m%dT%H%M%S')}"
            shutil.move(cache, target)
            print(f"moved {cache} aside to {target}", flush=True)


def drop_page_cache() -> None:
    if os.geteuid() != 0:
        print("not root: the page cache is not dropped (the first run reads files the machine may have cached)")
        return
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def run_ci(clone: Path, home: Path, log: Path, rev: str) -> None:
    """`CI=true bash .ci/run` in ``clone`` with ``home``; its output and a closing line of figures in ``log``."""
    environ = {**os.environ, "HOME": str(home), "CI": "true"}
    peak = [_used_gib()]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(5):
            peak[0] = max(peak[0], _used_gib())

    sampler = threading.Thread(target=sample, daemon=True)
    busy0, total0 = _busy_jiffies()
    start = time.monotonic()
    sampler.start()
    with log.open("w") as out:
        ci = subprocess.run(["bash", ".ci/run"], cwd=clone, env=environ, stdout=out, stderr=subprocess.STDOUT)
        rc = ci.returncode
        wall = time.monotonic() - start
        done.set()
        busy1, total1 = _busy_jiffies()
        cores = (busy1 - busy0) / max(total1 - total0, 1) * os.cpu_count()
        out.write(f"ci_side_by_side: rev={rev} exit={rc} wall_s={wall:.0f} busy_cores={cores:.2f} "
                  f"peak_used_gib={peak[0]:.1f}\n")
    print(f"{log}: exit {rc}, {wall / 60:.1f} min", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("revs", nargs="*", help="revisions of this repository, the base first")
    parser.add_argument("--warm", action="store_true", help="then run each clone again, caches kept")
    parser.add_argument("--workdir", type=Path, default=None, help="clones, homes and logs (default: a new temp dir)")
    parser.add_argument("--compare", nargs="+", type=Path, metavar="LOG", help="only compare logs already made")
    args = parser.parse_args()
    if args.compare:
        logs = args.compare
    else:
        if len(args.revs) < 1:
            parser.error("name at least one revision (the base first), or --compare LOG...")
        work = args.workdir or Path(tempfile.mkdtemp(prefix="ci-side-by-side-"))
        logs, names = [], []
        for i, rev in enumerate(args.revs):
            sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", rev], check=True,
                                 capture_output=True, text=True).stdout.strip()
            name = f"{i}-{sha}"
            names.append(name)
            clone, home = work / name, work / f"{name}-home"
            if clone.exists() or home.exists():
                sys.exit(f"{clone} or {home} exists already: name another --workdir (nothing was run)")
            subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
            subprocess.run(["git", "-C", str(clone), "checkout", "-q", sha], check=True)
            new_machine_home(home)
            move_caches_aside(work / "aside")
            drop_page_cache()
            logs.append(work / f"{name}.new.log")
            run_ci(clone, home, logs[-1], sha)
        if args.warm:
            for rev, name in zip(args.revs, names, strict=True):
                logs.append(work / f"{name}.warm.log")
                run_ci(work / name, work / f"{name}-home", logs[-1], f"{rev}(warm)")
    runs = [parse_log(log.read_text(errors="replace"), f"run{i}") for i, log in enumerate(logs)]
    for i, log in enumerate(logs):
        print(f"run{i}: {log}")
    print(comparison(runs))


if __name__ == "__main__":
    main()
