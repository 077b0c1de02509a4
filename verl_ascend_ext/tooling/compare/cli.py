"""``verl-ascend compare BASELINE RUN``: did this upgrade (or this fix) change the run?

Reads both runs (``runs``), judges every rule (``rules``, ``judge``), reads every metric of the run at every step
for a non-finite value (``nonfinite``), puts the plugin's statuses side by side when status directories (or a
baseline's summary) are there (``status_side``), prints a table (or ``--json``), draws the picture (``--plot``,
``picture``). ``--write-baseline FILE RUN`` keeps a run as a baseline instead (``baseline``).
Exit 0: nothing failed; 1: a rule failed (beyond its bound and beyond the runs' noise, a NaN or inf in its window,
or the run lacking steps of it the baseline has, unless ``--allow-missing``), or the run logs a metric non-finite at
some step that the baseline logs finite (unless ``--allow-nonfinite METRIC``); 2: unusable input.

``--dir`` is ``status``'s flag: ``status --dir DIR`` reads one job's directory (default VERL_ASCEND_EXT_STATUS_DIR);
``compare`` has two jobs, so ``--dir BASELINE_DIR RUN_DIR`` and no default (the variable names one job's directory,
never both); ``--write-baseline`` keeps one run, so ``--dir DIR``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from verl_ascend_ext.tooling.compare import baseline as baselines
from verl_ascend_ext.tooling.compare import nonfinite
from verl_ascend_ext.tooling.compare.judge import Verdict, judge_all
from verl_ascend_ext.tooling.compare.rules import Rule, RulesError, load_rules
from verl_ascend_ext.tooling.compare.runs import Run, RunError, read_run
from verl_ascend_ext.tooling.compare.status_side import differences, summary
from verl_ascend_ext.tooling.tables import table


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "compare", help="compare two runs' verl metrics (noise-aware) and the plugin's statuses",
        description="Compare RUN with BASELINE: each is verl's console log of a run, its file logger output (.jsonl) "
        "or a baseline file (--write-baseline). Rules: the defaults of verl's nightly Ascend CI plus the plugin's "
        "own; --rules FILE (TOML, [[rule]] tables: name, metric, window [first, last] or \"last\", statistic "
        "mean|median|max|min|last, bound +x|-x|±x with x a number or a percentage) overrides or adds. Exit 0: no rule "
        "failed; 1: a rule failed: beyond its bound and the runs' noise, a NaN or inf in its window (either run), or "
        "the run lacking steps of its window that the baseline has (unless --allow-missing); or a metric, any metric "
        "at any step, that the run logs non-finite (NaN, inf, a file logger's null) and the baseline logs finite "
        "(unless --allow-nonfinite METRIC); 2: unusable input.")
    parser.add_argument("runs", nargs="*", metavar="RUN", help="BASELINE RUN (or the one RUN of --write-baseline)")
    parser.add_argument("--rules", metavar="FILE", help="rules file (TOML) over the defaults")
    parser.add_argument("--dir", nargs="+", metavar="DIR",
                        help="status directories (each job's VERL_ASCEND_EXT_STATUS_DIR, as `status --dir` reads "
                        "them): BASELINE_DIR RUN_DIR, '-' for a side without one; with --write-baseline the one RUN's "
                        "DIR. No default: the variable names one job's directory, so pass it on its side, e.g. "
                        "--dir ST_BEFORE \"$VERL_ASCEND_EXT_STATUS_DIR\". Put it after the runs")
    parser.add_argument("--allow-missing", action="store_true",
                        help="a run lacking steps of a rule's window that the baseline has (it ended early or "
                        "stopped logging the metric) is a note (judged on the steps both have), not a failure; a NaN "
                        "or inf still fails")
    parser.add_argument("--allow-nonfinite", action="append", default=[], metavar="METRIC",
                        help="a metric known to be non-finite at some step (repeatable): the run logging it so is "
                        "reported as allowed, not failed, wherever the baseline logs it finite; a rule reading such a "
                        "value in its window still fails")
    parser.add_argument("--plot", metavar="PNG", help="draw the compared curves into this PNG (needs matplotlib)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--status-only", action="store_true",
                        help="compare the plugin's statuses only (runs over different steps: a job and its resume)")
    parser.add_argument("--write-baseline", metavar="FILE",
                        help="keep the one RUN as a baseline file: --write-baseline FILE RUN [--dir DIR], DIR the "
                        "run's status directory when its statuses are to be kept")


def run(args: argparse.Namespace) -> int:
    try:
        rules = load_rules(args.rules)
        if args.write_baseline:
            return _write_baseline(args, rules)
        _check_dirs(args.dir, 2, "BASELINE_DIR RUN_DIR ('-' for a side without one)")
        if len(args.runs) != 2:
            raise RunError(f"compare takes BASELINE and RUN; {len(args.runs)} given ({' '.join(args.runs)}): "
                           "verl-ascend compare BASELINE RUN [--dir BASELINE_DIR RUN_DIR]")
        report = compare(args.runs[0], args.runs[1], rules, args.dir, explicit=args.rules is not None,
                         status_only=args.status_only, allow_missing=args.allow_missing,
                         allow_nonfinite=tuple(args.allow_nonfinite))
    except (RunError, RulesError) as err:
        print(f"verl-ascend compare: error: {err}", file=sys.stderr)
        return 2
    if args.plot:
        report["picture"] = _picture(args.plot, report)
    print(json.dumps(_public(report), indent=2) if args.json else format_report(report))
    return report["exit_code"]


def _check_dirs(dirs: list[str] | None, count: int, what: str) -> None:
    if dirs is not None and len(dirs) != count:
        raise RunError(f"--dir takes {count} here, {what}; {len(dirs)} given ({' '.join(dirs)}). Put --dir after the "
                       "runs: verl-ascend compare BASELINE RUN --dir BASELINE_DIR RUN_DIR, or verl-ascend compare "
                       "--write-baseline FILE RUN --dir DIR")


def compare(baseline_path: str, run_path: str, rules: tuple[Rule, ...], status_dirs: list[str] | None = None,
            explicit: bool = False, status_only: bool = False, allow_missing: bool = False,
            allow_nonfinite: tuple[str, ...] = ()) -> dict[str, Any]:
    """The comparison report of two runs (``explicit``: the rules came from a file, so a metric neither run logged
    is an error; ``status_only``: no rule is judged, the statuses alone are compared; ``allow_missing``: steps the
    run lacks and the baseline has are a note, not a failure; ``allow_nonfinite``: metrics the non-finite check
    reports as allowed, not failed)."""
    base, new = read_run(baseline_path), read_run(run_path)
    if status_only:
        statuses = _statuses(base, new, status_dirs)
        if statuses is None or "differences" not in statuses:
            raise RunError("--status-only needs the statuses of both runs: --dir BASELINE_DIR RUN_DIR (or "
                           "baseline files written with their statuses)")
        return {"baseline": {"path": base.path, "kind": base.kind, "steps": base.span},
                "run": {"path": new.path, "kind": new.kind, "steps": new.span}, "verdicts": [], "nonfinite": [],
                "status": statuses, "failed": [], "exit_code": 0, "_runs": (base, new)}
    common = set(base.raw) & set(new.raw)
    if not common:
        raise RunError(f"the runs share no step: {base.path} has {base.span}, {new.path} has {new.span}. Compare "
                       "runs over the same steps, or their statuses alone (--status-only --dir BASELINE_DIR RUN_DIR).")
    if explicit:
        logged = base.metrics() | new.metrics()
        unknown = sorted({r.metric for r in rules if not r.default} - logged)
        if unknown:
            raise RulesError(f"the rules name metric(s) neither run logged: {', '.join(unknown)}. Write in the rules "
                             f"file a metric the runs log; known here: {', '.join(sorted(logged)[:40])}"
                             f"{' ...' if len(logged) > 40 else ''}")
    findings = nonfinite.check(base, new, allow_nonfinite)
    verdicts = judge_all(rules, base, new, allow_missing)
    statuses = _statuses(base, new, status_dirs)
    failed = [v.rule.name for v in verdicts if v.failed] + [f.name for f in findings if f.failed]
    return {"baseline": {"path": base.path, "kind": base.kind, "steps": base.span},
            "run": {"path": new.path, "kind": new.kind, "steps": new.span},
            "verdicts": verdicts, "nonfinite": findings, "status": statuses, "failed": failed,
            "exit_code": 1 if failed else 0, "_runs": (base, new)}


def _statuses(base: Run, new: Run, dirs: list[str] | None) -> dict[str, Any] | None:
    sides = []
    for run_, directory in zip((base, new), dirs or [None, None], strict=True):
        if directory not in (None, "-"):
            sides.append(summary(directory, run_))
        else:
            sides.append(run_.status)
    if sides[0] is None or sides[1] is None:
        return None if sides == [None, None] else {"note": "only one side has statuses: nothing compared"}
    return {"baseline": sides[0], "run": sides[1], "differences": differences(sides[0], sides[1])}


def _write_baseline(args: argparse.Namespace, rules: tuple[Rule, ...]) -> int:
    _check_dirs(args.dir, 1, "the RUN's status directory")
    if len(args.runs) != 1:
        raise RunError(f"--write-baseline keeps one RUN; {len(args.runs)} given ({' '.join(args.runs)}): "
                       "verl-ascend compare --write-baseline FILE RUN [--dir DIR]")
    source = read_run(args.runs[0])
    status = summary(args.dir[0], source) if args.dir and args.dir[0] != "-" else None
    steps = baselines.write(args.write_baseline, source, rules, status)
    print(f"verl-ascend compare: wrote {args.write_baseline}: {steps} step(s) of {source.path}"
          + (", with the plugin's statuses" if status else ""))
    return 0


def _picture(path: str, report: dict[str, Any]) -> dict[str, Any]:
    from verl_ascend_ext.tooling.compare.picture import PictureError, draw

    try:
        return {"path": str(draw(path, report["verdicts"], *report["_runs"])), "error": None}
    except PictureError as err:
        return {"path": None, "error": str(err)}


def _public(report: dict[str, Any]) -> dict[str, Any]:
    return {**{k: v for k, v in report.items() if not k.startswith("_")},
            "verdicts": [v.as_dict() for v in report["verdicts"]],
            "nonfinite": [f.as_dict() for f in report["nonfinite"]]}


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _allowed(verdict: Verdict) -> str:
    low, high = verdict.allowed
    if low is None and high is None:
        return "-"
    return f"{_num(low) if low is not None else '...'} .. {_num(high) if high is not None else '...'}"


def format_report(report: dict[str, Any]) -> str:
    out = [f"verl-ascend compare: baseline {report['baseline']['path']} ({report['baseline']['kind']}, "
           f"{report['baseline']['steps']})",
           f"                    run      {report['run']['path']} ({report['run']['kind']}, {report['run']['steps']})",
           ""]
    rows = [[v.rule.name, v.rule.metric, f"{v.rule.statistic}, {v.rule.window_text}", _num(v.baseline), _num(v.run),
             _allowed(v), _num(v.noise), v.verdict] for v in report["verdicts"]]
    if rows:
        out.append(table(rows, ["rule", "metric", "statistic", "baseline", "run", "allowed", "noise (3 SE)",
                                "verdict"]))
    else:
        out.append("Metrics: not compared (--status-only)")
    notes = [f"  {v.rule.name}: {v.note}" for v in report["verdicts"] if v.note and v.verdict != "not logged"]
    if report["verdicts"]:
        out += ["", *_nonfinite_table(report["nonfinite"])]
        notes += [f"  {f.name}: {f.note}" for f in report["nonfinite"]]
    if notes:
        out += ["", "Notes", *notes]
    status = report.get("status")
    if status and "differences" in status:
        out += ["", "Plugin statuses that differ (per role and patch)"]
        if status["differences"]:
            out.append(table([[d["role"], d["patch"], d["baseline"], d["run"]] for d in status["differences"]],
                             ["role", "patch", "baseline", "run"]))
        else:
            out.append("  none: every role ran the same records the same way")
    elif status:
        out += ["", f"Plugin statuses: {status['note']}"]
    picture = report.get("picture")
    if picture:
        out += ["", f"Picture: {picture['path']}" if picture["path"] else f"Picture not drawn: {picture['error']}"]
    out += ["", f"FAILED: {', '.join(report['failed'])} (exit 1)" if report["failed"] else
            "OK: no rule failed, no metric failed the non-finite check (exit 0)"]
    return "\n".join(out)


def _nonfinite_table(findings: list[nonfinite.Finding]) -> list[str]:
    title = "Non-finite values (every metric of the run, every step)"
    if not findings:
        return [f"{title}: none"]
    rows = [[f.metric, f"{f.run.written} at step {f.run.step}", f"{f.run.count} of {f.run.logged}",
             f.baseline_side, f.verdict]
            for f in findings]
    return [title, table(rows, ["metric", "run: first non-finite", "steps", "baseline", "verdict"])]
