"""Figures of the job model (results stage): goodput vs checkpoint interval, timeline of one trial.

`sweep_figure` and `timeline_figure` build the matplotlib Figures (so a test can read their
texts and artists); `sweep_png` and `timeline_png` write them with
simtrain.results.save_figure (atomic, no software stamp: the same input gives the same bytes).
Goodput is drawn in percent, as the reports and the docs give it.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from simtrain.results.figures import plain, save_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLORS = {"train": "#4c9a2a", "checkpoint": "#3a6ea5", "detection": "#e07b39", "spare_wait": "#9e9e9e",
          "restart": "#c0392b", "load": "#8e44ad", "warmup": "#f1c40f"}
KINDS = ("train", "checkpoint", "detection", "spare_wait", "restart", "load", "warmup")
PIXELS = 1100          # about the axis width of the timeline in pixels at 120 dpi


def sweep_figure(sweep: dict, title: str) -> Figure:
    """Goodput (%) against the checkpoint interval (minutes, log scale): the Monte-Carlo mean with
    its 95 % confidence band and the trials' 5-95 % band, Daly's closed form, and the simulated,
    Young and Daly optima."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullFormatter, ScalarFormatter

    def pct(v: list[float]) -> list[float]:
        return [100.0 * a for a in v]

    x = [t / 60 for t in sweep["intervals_s"]]
    m = sweep["goodput_mean"]
    fig, ax = plt.subplots(figsize=(8, 4.6))
    ax.fill_between(x, pct(sweep["goodput_p5"]), pct(sweep["goodput_p95"]), color="#4c72b0", alpha=0.15,
                    label="5-95 % of trials")
    lo = [a - c for a, c in zip(m, sweep["goodput_ci95"])]
    hi = [a + c for a, c in zip(m, sweep["goodput_ci95"])]
    ax.fill_between(x, pct(lo), pct(hi), color="#4c72b0", alpha=0.45, label="95 % confidence of the mean")
    ax.plot(x, pct(m), "o-", color="#1f3b73", ms=3.5, lw=1.4, label=f"Monte-Carlo mean ({sweep['trials']} trials each)")
    if sweep.get("closed_form"):
        ax.plot(x, pct(sweep["closed_form"]), "--", color="#555555", lw=1.0, label="Daly's closed form (exponential)")
    for key, style, name in (("refined_optimum_s", "-", "simulated optimum"), ("young_s", ":", "Young"), ("daly_s", "-.", "Daly")):
        v = sweep.get(key)
        if v:
            ax.axvline(v / 60, ls=style, color={"refined_optimum_s": "#c0392b", "young_s": "#2c3e50", "daly_s": "#27ae60"}[key],
                       lw=1.2, label=f"{name}: {v / 60:.1f} min")
    ax.set_xscale("log")
    ticks = [v for v in (0.1, 0.2, 0.5, 1, 2, 3, 5, 7, 10, 15, 20, 30, 50, 70, 100, 200, 300, 500, 1000, 2000, 5000)
             if min(x) / 1.05 <= v <= max(x) * 1.05]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("checkpoint interval (minutes, log scale)")
    ax.set_ylabel("goodput (%): useful training time / wall time")
    ax.set_title(plain(title), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower center")
    fig.tight_layout()
    return fig


def sweep_png(sweep: dict, path: Path, title: str) -> None:
    """Writes `sweep_figure` to `path`."""
    save_figure(sweep_figure(sweep, title), path, dpi=120)


def _solid(segs: list[tuple[float, float]], gap: float, wmin: float) -> list[tuple[float, float]]:
    """(start, end) segments joined where they are less than `gap` apart, each at least `wmin`
    wide, as (start, width) for broken_barh: a 30-day row of thousands of short phases reads as
    one solid bar instead of a comb of sub-pixel slivers."""
    out: list[list[float]] = []
    for s, e in sorted(segs):
        e = max(e, s + wmin)
        if out and s <= out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e - s) for s, e in out]


def timeline_figure(events: list[tuple[float, float, str]], marks: list[tuple[float, str]], horizon_s: float, title: str,
                    days: float | None = None) -> Figure:
    """Phases of one trial as bars on one row per kind, each row labelled with its share of the
    wall time shown (%); failures as red ticks on top, planned interruptions grey. Phases closer
    than a pixel are joined, so the rows read as solid bars at any span."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    end = horizon_s if days is None else min(horizon_s, days * 86400.0)
    unit = 3600.0 if end <= 3 * 86400 else 86400.0
    uname = "hours" if unit == 3600.0 else "days"
    kinds = list(KINDS)
    fig, ax = plt.subplots(figsize=(11, 3.6))
    pixel = end / unit / PIXELS
    labels = []
    for row, kind in enumerate(kinds):
        raw = [(t0 / unit, min(t1, end) / unit) for t0, t1, k in events if k == kind and t0 < end]
        share = 100.0 * sum(e - s for s, e in raw) * unit / end if end > 0 else 0.0
        labels.append(f"{kind} {share:.1f} %" if share >= 0.05 or not raw else f"{kind} < 0.1 %")
        if raw:
            col = ax.broken_barh(_solid(raw, pixel, pixel), (len(kinds) - row - 0.8, 0.6), facecolors=COLORS[kind],
                                 edgecolors="none", linewidth=0, antialiased=False)
            col.set_gid(kind)
    fails = [t / unit for t, c in marks if t < end and c != "planned"]
    planned = [t / unit for t, c in marks if t < end and c == "planned"]
    ax.vlines(planned, len(kinds) - 0.1, len(kinds) + 0.4, color="#7f7f7f", lw=0.8)
    ax.vlines(fails, len(kinds) - 0.1, len(kinds) + 0.4, color="#d62728", lw=0.8)
    ax.set_yticks([len(kinds) - r - 0.5 for r in range(len(kinds))] + [len(kinds) + 0.15])
    ax.set_yticklabels(labels + [f"{len(fails)} failures (red), {len(planned)} planned (grey)"], fontsize=8)
    ax.set_xlim(0, end / unit)
    ax.set_ylim(0, len(kinds) + 0.6)
    ax.set_xlabel(f"{uname}; at the left, each row's share of the time shown (train includes work a failure later undid)")
    ax.set_title(plain(title), fontsize=10)
    ax.legend(handles=[Patch(color=COLORS[k], label=k) for k in kinds], fontsize=7, ncol=7, loc="upper center",
              bbox_to_anchor=(0.5, -0.22), frameon=False)
    fig.tight_layout()
    return fig


def timeline_png(events: list[tuple[float, float, str]], marks: list[tuple[float, str]], horizon_s: float, path: Path,
                 title: str, days: float | None = None) -> None:
    """Writes `timeline_figure` to `path`."""
    save_figure(timeline_figure(events, marks, horizon_s, title, days), path, dpi=120)
