"""Figures of the job model (results stage): goodput vs checkpoint interval, timeline of one trial.

Both are written with simtrain.results.save_figure (atomic, no software stamp: the same input
gives the same bytes).
"""
from __future__ import annotations

from pathlib import Path

from simtrain.results.figures import save_figure

COLORS = {"train": "#4c9a2a", "checkpoint": "#3a6ea5", "detection": "#e07b39", "spare_wait": "#9e9e9e",
          "restart": "#c0392b", "load": "#8e44ad", "warmup": "#f1c40f"}


def sweep_png(sweep: dict, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [t / 60 for t in sweep["intervals_s"]]
    m = sweep["goodput_mean"]
    fig, ax = plt.subplots(figsize=(8, 4.6))
    ax.fill_between(x, sweep["goodput_p5"], sweep["goodput_p95"], color="#4c72b0", alpha=0.15, label="5-95 % of trials")
    lo = [a - c for a, c in zip(m, sweep["goodput_ci95"])]
    hi = [a + c for a, c in zip(m, sweep["goodput_ci95"])]
    ax.fill_between(x, lo, hi, color="#4c72b0", alpha=0.45, label="95 % confidence of the mean")
    ax.plot(x, m, "o-", color="#1f3b73", ms=3.5, lw=1.4, label=f"Monte-Carlo mean ({sweep['trials']} trials each)")
    if sweep.get("closed_form"):
        ax.plot(x, sweep["closed_form"], "--", color="#555555", lw=1.0, label="Daly's closed form (exponential)")
    for key, style, name in (("refined_optimum_s", "-", "simulated optimum"), ("young_s", ":", "Young"), ("daly_s", "-.", "Daly")):
        v = sweep.get(key)
        if v:
            ax.axvline(v / 60, ls=style, color={"refined_optimum_s": "#c0392b", "young_s": "#2c3e50", "daly_s": "#27ae60"}[key],
                       lw=1.2, label=f"{name}: {v / 60:.1f} min")
    ax.set_xscale("log")
    from matplotlib.ticker import FixedLocator, NullFormatter, ScalarFormatter
    ticks = [v for v in (0.1, 0.2, 0.5, 1, 2, 3, 5, 7, 10, 15, 20, 30, 50, 70, 100, 200, 300, 500, 1000, 2000, 5000)
             if min(x) / 1.05 <= v <= max(x) * 1.05]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("checkpoint interval (minutes, log scale)")
    ax.set_ylabel("goodput (useful training time / wall time)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower center")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def timeline_png(events: list, marks: list, horizon_s: float, path: Path, title: str, days: float | None = None) -> None:
    """Phases of one trial as bars on one row per kind; failures as red ticks on top."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    end = horizon_s if days is None else min(horizon_s, days * 86400.0)
    unit = 3600.0 if end <= 3 * 86400 else 86400.0
    uname = "hours" if unit == 3600.0 else "days"
    kinds = ["train", "checkpoint", "detection", "spare_wait", "restart", "load", "warmup"]
    fig, ax = plt.subplots(figsize=(11, 3.6))
    wmin = end / unit / 1500.0          # a 10 s checkpoint in a 30-day run would be far below one pixel
    for row, kind in enumerate(kinds):
        segs = [(t0 / unit, max(wmin, (min(t1, end) - t0) / unit)) for t0, t1, k in events if k == kind and t0 < end]
        if segs:
            ax.broken_barh(segs, (len(kinds) - row - 0.8, 0.6), facecolors=COLORS[kind], edgecolors=COLORS[kind], linewidth=0.6)
    fails = [t / unit for t, c in marks if t < end and c != "planned"]
    planned = [t / unit for t, c in marks if t < end and c == "planned"]
    ax.vlines(planned, len(kinds) - 0.1, len(kinds) + 0.4, color="#7f7f7f", lw=0.8)
    ax.vlines(fails, len(kinds) - 0.1, len(kinds) + 0.4, color="#d62728", lw=0.8)
    ax.set_yticks([len(kinds) - r - 0.5 for r in range(len(kinds))] + [len(kinds) + 0.15])
    ax.set_yticklabels(kinds + [f"{len(fails)} failures (red), {len(planned)} planned (grey)"], fontsize=8)
    ax.set_xlim(0, end / unit)
    ax.set_ylim(0, len(kinds) + 0.6)
    ax.set_xlabel(uname)
    ax.set_title(title, fontsize=10)
    ax.legend(handles=[Patch(color=COLORS[k], label=k) for k in kinds], fontsize=7, ncol=7, loc="upper center",
              bbox_to_anchor=(0.5, -0.22), frameon=False)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
