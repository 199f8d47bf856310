"""Figures of a simulated step (the pipeline timeline) and the common figure saving.

Each figure has a builder that returns the matplotlib Figure (`timeline_figure`), so its texts
and artists can be checked, and a writer that builds and saves it (`timeline_png`). Labels pass
through `plain` so a `$` in a scenario name or a price stays a dollar sign, not mathtext.
"""
from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from simtrain.engine.core import Timeline
    from simtrain.plan.grid import RankClass
    from simtrain.program.ir import EOp

COLORS = {"F": "#4C78A8", "B": "#54A24B", "BW": "#54A24B", "W": "#EECA3B", "opt": "#B279A2", "tp": "#F58518",
          "pp": "#E45756", "dp": "#9D755D", "cp": "#72B7B2", "ep": "#FF9DA6", "busy": "#8A9BB8"}

DETAIL_MICROBATCHES = 24    # above this many microbatches a full-step row is a barcode: summarise and zoom
LEGEND = (("F", "forward"), ("B", "backward (B / BW)"), ("W", "weight grad (W)"), ("opt", "optimizer"),
          ("tp", "tp comm"), ("cp", "cp comm"), ("ep", "ep dispatch / combine"), ("pp", "pp send"), ("dp", "dp comm"))


def plain(text: str) -> str:
    """`text` with its dollar signs escaped, so matplotlib draws them instead of starting mathtext.
    Example: plain("US$ per M tokens (at $2/h)") == "US\\$ per M tokens (at \\$2/h)"."""
    return text.replace("\\$", "$").replace("$", "\\$")


def _row_spans(ops: list[EOp], tl: Timeline, row_of: dict[int, int]) -> dict[tuple[int, str, int], list[tuple[float, float]]]:
    """(row, category, lane) -> [(start, duration)] in seconds; lane 0 compute, 1 communication.
    A fused compute op is split into its parts, each drawn on its own stream's lane."""
    bars: dict = {}
    for op in ops:
        s, e = tl.start[op.id], tl.end[op.id]
        if e <= s or op.cls not in row_of:
            continue
        r = row_of[op.cls]
        if op.stream == "compute" and op.fused:
            t = s
            for stream, cat, secs, _ in op.fused:
                bars.setdefault((r, cat, 0 if stream == "compute" else 1), []).append((t, secs))
                t += secs
        else:
            bars.setdefault((r, op.category, 0 if op.stream == "compute" else 1), []).append((s, e - s))
    return bars


def _merge(spans: list[tuple[float, float]], tol: float) -> list[tuple[float, float]]:
    """Spans (start, duration) joined where the gap between them is at most `tol`."""
    out: list[list[float]] = []
    for s, d in sorted(spans):
        if out and s <= out[-1][1] + tol:
            out[-1][1] = max(out[-1][1], s + d)
        else:
            out.append([s, s + d])
    return [(s, e - s) for s, e in out]


def _busy_profile(spans: list[tuple[float, float]], lo: float, hi: float, bins: int) -> list[float]:
    """Fraction of each of `bins` equal slices of [lo, hi] that `spans` (start, duration) cover."""
    w = (hi - lo) / bins
    busy = [0.0] * bins
    for s, d in spans:
        a, b = max(s, lo), min(s + d, hi)
        i = int((a - lo) / w) if w > 0 else 0
        while a < b and i < bins:
            edge = lo + (i + 1) * w
            busy[i] += min(b, edge) - a
            a, i = edge, i + 1
    return [min(1.0, x / w) if w > 0 else 0.0 for x in busy]


def _draw_rows(ax: Axes, bars: dict, rows: int, lo: float, hi: float, summarised: set[int]) -> None:
    """Draws the rows of `bars` (seconds) in ms on ax over [lo, hi] s. A row in `summarised` shows
    its compute as a utilisation profile (the band's height is the busy fraction of each of 120
    slices of the window) and its communication merged per kind; the optimizer is kept apart.
    The optimizer is drawn last and at least 1/300 of the window wide, so it stays visible."""
    scale = 1e3
    tol = (hi - lo) / 1500.0
    minw = (hi - lo) / 300.0
    merged: dict = {}
    for (r, cat, lane), spans in bars.items():
        if r in summarised and lane == 0 and cat != "opt":
            merged.setdefault((r, "busy", 0), []).extend(spans)
        else:
            merged.setdefault((r, cat, lane), []).extend(spans)
    for (r, cat, lane), spans in sorted(merged.items(), key=lambda kv: (kv[0][1] == "opt", kv[0])):
        y = rows - 1 - r
        if cat == "busy":
            bins = 120
            util = _busy_profile(spans, lo, hi, bins)
            xs = [(lo + i * (hi - lo) / bins) * scale for i in range(bins + 1)]
            col = ax.fill_between(xs, y - 0.35, [y - 0.35 + 0.5 * u for u in util + util[-1:]], step="post",
                                  color=COLORS["busy"], linewidth=0, zorder=2)
            col.set_gid(f"busy:{r}")
            continue
        if r in summarised:
            spans = _merge(spans, tol)
        if cat == "opt":
            spans = [(s, max(d, minw)) for s, d in spans]
        spans = [(s * scale, d * scale) for s, d in spans if s + d >= lo and s <= hi]
        if not spans:
            continue
        box = (y - 0.35, 0.5) if lane == 0 else (y + 0.18, 0.17)
        col = ax.broken_barh(spans, box, facecolors=COLORS.get(cat, "#999999"), linewidth=0,
                             zorder=3 if cat == "opt" else 2)
        col.set_gid(f"{cat}:{r}")
    ax.set_facecolor("#F2F2F2")
    ax.set_xlim(lo * scale, hi * scale)
    ax.set_ylim(-0.6, rows - 0.4)


def _ms(v: float, span: float) -> str:
    """v seconds in ms with the decimals a window of `span` seconds needs: 1,426 or 0.062."""
    d = max(0, min(4, 2 - math.floor(math.log10(span * 1e3)))) if span > 0 else 0
    return f"{v * 1e3:,.{d}f}"


def _zoom_windows(ops: list[EOp], tl: Timeline, row_of: dict[int, int]) -> tuple[float, float]:
    """(end of the warm-up, start of the tail) in seconds: the warm-up lasts until every row has
    finished its first backward, the tail starts at the earliest last forward of a row. Each
    window is kept within 35 % of the step."""
    first_b: dict = {}
    last_f: dict = {}
    for op in ops:
        if op.stream != "compute" or op.cls not in row_of or tl.end[op.id] <= tl.start[op.id]:
            continue
        r = row_of[op.cls]
        if op.category in ("B", "BW"):
            first_b[r] = min(first_b.get(r, float("inf")), tl.end[op.id])
        elif op.category == "F":
            last_f[r] = max(last_f.get(r, 0.0), tl.start[op.id])
    step = tl.step_time
    warm = max(first_b.values(), default=0.15 * step) * 1.03
    tail = min(last_f.values(), default=0.85 * step)
    tail -= 0.03 * (step - tail)
    return min(warm, 0.35 * step), max(tail, 0.65 * step)


def timeline_figure(ops: list[EOp], tl: Timeline, classes: list[RankClass], title: str,
                    detail_microbatches: int = DETAIL_MICROBATCHES) -> Figure:
    """The step's timeline: one row per rank class, compute on the wide band, communication on
    the thin band above it, idle as grey background. Up to `detail_microbatches` microbatches
    every row is drawn in full. Above that, the full-step panel keeps the first and last
    pipeline ranks in full and summarises the others (their compute as a busy-fraction profile,
    the optimizer kept apart), and two panels below zoom on the warm-up and the tail with every row in full."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = len(classes)
    row_of = {c.id: i for i, c in enumerate(classes)}
    bars = _row_spans(ops, tl, row_of)
    mbs = len({op.mb for op in ops if op.stream == "compute" and op.mb >= 0})
    detailed = mbs <= detail_microbatches
    stages = [c.stage for c in classes]
    ends = (min(stages), max(stages)) if stages else (0, 0)
    summarised = set() if detailed else {i for i, c in enumerate(classes) if c.stage not in ends}
    band = 0.6 + 0.55 * rows
    step = tl.step_time
    labels = [f"stage {c.stage} (×{c.multiplicity})" + (", summarised" if i in summarised else "")
              for i, c in enumerate(classes)]
    top, bottom, gap = 0.45, 0.8, 1.0      # inches: title, x label and legend, between the panels
    height = band + top + bottom if detailed else 2 * band + gap + top + bottom
    fig = plt.figure(figsize=(14, height), dpi=110)
    gs = fig.add_gridspec(1 if detailed else 2, 2, hspace=gap / band, wspace=0.04,
                          top=1 - top / height, bottom=bottom / height, left=0.1, right=0.97)
    ax = fig.add_subplot(gs[0, :])
    zooms = [] if detailed else [fig.add_subplot(gs[1, 0]), fig.add_subplot(gs[1, 1])]
    _draw_rows(ax, bars, rows, 0.0, step, summarised)
    ax.set_yticks([rows - 1 - i for i in range(rows)])
    ax.set_yticklabels([plain(t) for t in labels], fontsize=8 if rows > 8 else 9)
    ax.set_xlabel("time (ms)")
    ax.set_title(plain(title + " — idle shows as grey background"))
    if zooms:
        warm, tail = _zoom_windows(ops, tl, row_of)
        for zax, (lo, hi), name in zip(zooms, ((0.0, warm), (tail, step)),
                                       ("warm-up", "tail: last backwards, gradient reduction, optimizer")):
            _draw_rows(zax, bars, rows, lo, hi, set())
            zax.set_yticks([rows - 1 - i for i in range(rows)])
            zax.set_yticklabels([f"stage {c.stage}" for c in classes], fontsize=7)
            zax.set_title(f"{name} ({_ms(lo, hi - lo)}–{_ms(hi, hi - lo)} ms)", fontsize=9, loc="left")
            zax.set_xlabel("time (ms)", fontsize=8)
            zax.tick_params(labelsize=7)
            ax.axvspan(lo * 1e3, hi * 1e3, color="#333333", alpha=0.07, zorder=1, lw=0)
        zooms[1].yaxis.tick_right()
        ax.set_title(plain(title + f" — {mbs} microbatches: middle stages summarised, shaded spans zoomed below; "
                           "idle shows as grey"), fontsize=10)
    cats = {op.category for op in ops} | {x[1] for op in ops for x in op.fused}
    legend = [(k, lab) for k, lab in LEGEND if k in ("F", "B", "W", "opt", "tp", "pp", "dp") or k in cats]
    if summarised:
        legend.insert(0, ("busy", "compute busy fraction (summarised row)"))
    fig.legend(handles=[Patch(color=COLORS[k], label=lab) for k, lab in legend], loc="lower center",
               ncol=len(legend), fontsize=8, frameon=False, bbox_to_anchor=(0.5, 0.05 / height))
    return fig


def timeline_png(ops: list[EOp], tl: Timeline, classes: list[RankClass], path: Path, title: str) -> None:
    """Writes `timeline_figure` to `path`."""
    save_figure(timeline_figure(ops, tl, classes, title), path, bbox_inches="tight")


def save_figure(fig: Figure, path: Path, **kw: Any) -> None:
    """Saves a matplotlib figure atomically (temp file + rename), without the software stamp so
    the same figure gives the same bytes, and closes it."""
    import matplotlib.pyplot as plt
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, metadata={"Software": None}, **kw)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)
