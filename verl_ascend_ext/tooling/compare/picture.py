"""The picture of a comparison: each judged metric's curve in both runs, the rule's window shaded, the baseline's
statistic and the bound's limits drawn, the verdict in the panel's title; one PNG.

matplotlib draws it: what people who train models already have in their environment and read (every RL codebase's
plotting, verl's own examples' included, is matplotlib), it writes a PNG without a display (the Agg backend), and
a PNG goes into a CI artifact, a chat or an issue as it is. It is imported only when a picture is asked for
(``--plot``); without matplotlib ``compare`` says how to get it and still prints its verdicts.
"""

from __future__ import annotations

from pathlib import Path

from verl_ascend_ext.tooling.compare.judge import FAIL, MISSING, NOT_LOGGED, Verdict
from verl_ascend_ext.tooling.compare.runs import Run

COLOURS = {"baseline": "#4c72b0", "run": "#dd8452"}


class PictureError(RuntimeError):
    """The picture cannot be drawn here (matplotlib missing)."""


def draw(path: str | Path, verdicts: list[Verdict], baseline: Run, run: Run) -> Path:
    """Write the picture of ``verdicts`` to ``path`` (PNG); the path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError as err:
        raise PictureError("matplotlib is not installed here: `pip install matplotlib` (or verl-ascend-ext[compare]) "
                           "to draw the picture; the verdicts above do not need it") from err
    shown = [v for v in verdicts if v.verdict not in (NOT_LOGGED,)]
    columns = 2 if len(shown) > 1 else 1
    rows = max(1, (len(shown) + columns - 1) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(6.4 * columns, 3.2 * rows), squeeze=False)
    for ax in axes.flat[len(shown):]:
        ax.set_visible(False)
    for ax, verdict in zip(axes.flat, shown, strict=False):
        rule = verdict.rule
        for label, source in (("baseline", baseline), ("run", run)):
            series = source.metric(rule.metric)
            if series:
                ax.plot(list(series), list(series.values()), marker="." if len(series) < 50 else None,
                        color=COLOURS[label], label=f"{label}: {Path(source.path).name}")
        if rule.window is not None:
            ax.axvspan(rule.window[0] - 0.5, rule.window[1] + 0.5, color="#cccccc", alpha=0.35, lw=0,
                       label=rule.window_text)
        if verdict.baseline is not None:
            ax.axhline(verdict.baseline, color=COLOURS["baseline"], ls="--", lw=1,
                       label=f"baseline {rule.statistic} {verdict.baseline:.4g}")
            limits = [limit for limit in verdict.allowed if limit is not None]
            for i, limit in enumerate(limits):
                ax.axhline(limit, color="#c44e52", ls=":", lw=1.2,
                           label=None if i else f"allowed ({rule.bound.text})")
        if verdict.run is not None:
            ax.axhline(verdict.run, color=COLOURS["run"], ls="--", lw=1,
                       label=f"run {rule.statistic} {verdict.run:.4g}")
        title = f"{rule.name}: {verdict.verdict} (bound {rule.bound.text})"
        ax.set_title(title, fontsize=9, color="#c44e52" if verdict.verdict in (FAIL, MISSING) else "black")
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel(rule.metric, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=6, loc="best")
    figure.suptitle(f"verl-ascend compare: {Path(baseline.path).name} vs {Path(run.path).name}", fontsize=10)
    figure.tight_layout()
    out = Path(path)
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out
