"""Comparison of scenario variants (after results): a sweep over one or more keys, one row each.

    simtrain compare S.yaml --set parallel.schedule=1f1b,zb_h1,zb_v --set parallel.vpp=1

A `--set` with comma-separated values is a sweep axis (commas inside [..] belong to a list
value), keys joined by `+` move together (`a+b=1+2,3+4`, as in `sweep`); several axes give their
cartesian product; single values apply to every variant. Each
variant is loaded and simulated on its own, so one invalid combination is reported in its row
and does not stop the others. Output: a text table; with `--out DIR` also `compare.csv` and
`compare.png` (the variants' pipeline timelines one above the other, then step time and peak
memory as bars).
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from simtrain import progress
from simtrain.results.figures import COLORS, plain, save_figure
from simtrain.results.step import StepResult
from simtrain.spec.overrides import parse_axes, product, split_values  # noqa: F401  (split_values: kept importable here)
from simtrain.studies.runner import run_factors
from simtrain.studies.textable import Column, render
from simtrain.units import fmt_time

if TYPE_CHECKING:
    from collections.abc import Sequence

    from matplotlib.figure import Figure

    from simtrain.simulate import StepRun

GiB = 2.0**30


def variants(sets: Sequence[str] | None, base_label: str = "as written") -> list:
    """--set arguments -> list of (label, overrides) in sweep order (first axis varies slowest); the
    axis syntax (`k=v1,v2`, `a+b=1+2,3+4` zipped) is simtrain.spec.overrides', as in `sweep`. A
    label names the varied keys' values (`parallel.tp=4`); a single variant is labelled by its
    fixed overrides, or `base_label` when there are none (the scenario as written)."""
    fixed, axes = parse_axes(sets, "--set")
    if not axes:
        return [(" ".join(fixed) or base_label, list(fixed))]
    return product(fixed, axes)


@dataclass
class Row:
    label: str
    overrides: list
    result: StepResult | None = None
    error: str | None = None
    spans: list = field(default_factory=list)     # (rank, category, start, end, mb) compute spans
    step: float = 0.0
    pp: int = 1


def run_variants(scenario: str | Path, sets: Sequence[str] | None) -> list[Row]:
    """One Row per variant of `sets` (see `variants`), each loaded and simulated on its own."""
    labelled = variants(sets, f"{Path(scenario).name} as written")
    rows = []
    outcomes = run_factors(scenario, [over for _, over in labelled])
    # the bar first in zip: its last update runs when zip asks it for one more outcome
    for o, (label, over) in zip(progress.track(outcomes, len(labelled), "compare", "variant"), labelled):
        row = Row(label, over)
        if not o.ok:
            row.error = o.error.splitlines()[0]
        else:
            row.result = o.result
            row.step = o.result.step_time_s
            row.pp = o.scenario.parallel.pp
            row.spans = compute_spans(o.run)
        rows.append(row)
    return rows


def compute_spans(run: StepRun) -> list[tuple]:
    """One block per action of one representative class per pipeline rank: (rank, category,
    start, end, microbatch, chunk, lane). A block runs from the action's first to its last
    kernel (tensor-parallel waits inside it included); blocks of an overlapped pair share the
    time, so they get lanes 1 (upper half) and 2 (lower half); lane 0 is the full row. The
    data-parallel communication (gradient reduction, parameter gathers) follows as category
    "dp" blocks on lane 3, a thin band above the row, overlapping transfers joined."""
    rep = {}
    for c in run.classes:
        rep.setdefault(c.stage, c.id)
    want = {cid: st for st, cid in rep.items()}
    tl = run.timeline
    blocks: dict = {}
    dp: dict = {}
    for o in run.ops:
        if o.cls not in want or tl.end[o.id] <= tl.start[o.id]:
            continue
        if o.stream == "compute":
            key = (want[o.cls], o.category, o.mb, o.chunk)
            b = blocks.get(key)
            if b is None:
                blocks[key] = [tl.start[o.id], tl.end[o.id]]
            else:
                b[0] = min(b[0], tl.start[o.id])
                b[1] = max(b[1], tl.end[o.id])
        elif o.category == "dp":
            dp.setdefault(want[o.cls], []).append((tl.start[o.id], tl.end[o.id]))
    out = []
    by_rank: dict = {}
    for key, (s, e) in blocks.items():
        by_rank.setdefault(key[0], []).append((s, e, key))
    for rank in sorted(by_rank):
        items = sorted(by_rank[rank])
        lanes = [0] * len(items)
        for i in range(1, len(items)):
            if items[i][0] < items[i - 1][1] - 1e-12:
                # overlapped with the previous block: forward on top, backward below
                a, b = i - 1, i
                fa = items[a][2][1] == "F"
                lanes[a], lanes[b] = (1, 2) if fa else (2, 1)
        for (s, e, key), lane in zip(items, lanes):
            out.append((rank, key[1], s, e, key[2], key[3], lane))
    for rank in sorted(dp):
        joined: list = []
        for s, e in sorted(dp[rank]):
            if joined and s <= joined[-1][1]:
                joined[-1][1] = max(joined[-1][1], e)
            else:
                joined.append([s, e])
        out += [(rank, "dp", s, e, -1, 0, 3) for s, e in joined]
    return out


def table(rows: list[Row], width: int | None = None) -> str:
    """The text table, one row per variant. The variant column (the varied keys' values) is never
    cut: on a terminal of `width` columns the others are left out, per-rank peaks first, then
    exposed communication, bubble, fits, MFU, peak memory (simtrain.studies.textable)."""
    cols = [Column("variant", key=True), Column("step", ">", drop=6), Column("MFU", ">", drop=2), Column("bubble", ">", drop=2),
            Column("exposed tp/pp/dp (s)", ">", drop=1), Column("peak mem", ">", drop=5), Column("fits", ">", drop=3),
            Column("peak per pipeline rank (GiB)", drop=0)]
    out = []
    for r in rows:
        if r.error:
            out.append((r.label, f"invalid: {r.error}"))
            continue
        x = r.result
        ex = x.breakdown.exposed_comm_s
        fp8 = "*" if x.precision == "fp8" else ""        # MFU of the FP8 peak
        out.append([r.label, fmt_time(x.step_time_s), f"{100 * x.mfu:.1f}%{fp8}", f"{100 * x.bubble_fraction:.1f}%",
                    "/".join(f"{ex[k]:.2f}" for k in ("tp", "pp", "dp")), f"{x.peak_memory_bytes / GiB:.1f} GiB",
                    "yes" if x.fits_in_memory else "NO", " ".join(f"{m.total / GiB:.0f}" for m in x.memory)])
    lines = render(cols, out, width)
    if any(r.result is not None and r.result.precision == "fp8" for r in rows):
        lines.append("  * MFU of the FP8 peak (the run's linear layers in FP8)")
    return "\n".join(lines)


def to_csv(rows: list[Row]) -> str:
    n = max((len(r.result.memory) for r in rows if r.result), default=0)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    # mfu is of the peak of the variant's precision: mfu_peak says which (fp8: the FP8 peak)
    w.writerow(["variant", "overrides", "schedule", "step_time_s", "mfu", "mfu_peak", "bubble_fraction",
                "exposed_tp_s", "exposed_pp_s", "exposed_dp_s", "peak_memory_gib", "fits_in_memory"]
               + [f"rank{i}_peak_gib" for i in range(n)] + [f"rank{i}_activations_gib" for i in range(n)] + ["error"])
    for r in rows:
        if r.error:
            w.writerow([r.label, " ".join(r.overrides)] + [""] * (10 + 2 * n) + [r.error])
            continue
        x = r.result
        per = [f"{m.total / GiB:.6g}" for m in x.memory]
        act = [f"{m.activations / GiB:.6g}" for m in x.memory]
        w.writerow([r.label, " ".join(r.overrides), x.schedule, f"{x.step_time_s:.9g}", f"{x.mfu:.6g}", x.precision,
                    f"{x.bubble_fraction:.5f}"] + [f"{x.breakdown.exposed_comm_s[k]:.6g}" for k in ("tp", "pp", "dp")]
                   + [f"{x.peak_memory_bytes / GiB:.6g}", x.fits_in_memory]
                   + per + [""] * (n - len(per)) + act + [""] * (n - len(act)) + [""])
    return buf.getvalue()


def _row_height(pp: int) -> float:
    """Inches per pipeline rank in a timeline panel: 0.28 up to 8 ranks, then shrinking so a
    panel stays near 2.4 inches, never below 0.08 (32 ranks: 2.6 inches)."""
    return max(0.08, min(0.28, 2.4 / max(pp, 1)))


def compare_figure(rows: list[Row], title: str) -> Figure:
    """Timelines of the variants one above the other (stage rows, F/B/W coloured, the
    data-parallel communication and the optimizer step after them, idle grey, same time axis),
    then bars of step time and peak memory with their values. The figure is laid out in inches
    from its content: each panel is as tall as its ranks need, the gaps are fixed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ok = [r for r in rows if r.result]
    W = 14.0
    head, ptitle, ticks, xlab, gap_bars = 0.75, 0.32, 0.3, 0.3, 0.4
    panel = [r.pp * _row_height(r.pp) + 0.3 for r in ok]
    bars_h = 0.32 * max(len(ok), 1) + 0.45
    H = head + sum(ptitle + h + ticks for h in panel) + xlab + gap_bars + bars_h + 0.45
    fig = plt.figure(figsize=(W, H), dpi=110)
    left, width = 0.07, 0.92

    def rect(top_in: float, h_in: float, x0: float = left, w: float = width) -> tuple:
        return (x0, 1 - (top_in + h_in) / H, w, h_in / H)

    tmax = max((r.step for r in ok), default=1.0) * 1e3
    y = head
    ax = None
    for r, h in zip(ok, panel):
        y += ptitle
        ax = fig.add_axes(rect(y, h))
        y += h + ticks
        ax.set_facecolor("#E6E6E6")
        by: dict = {}
        for rank, cat, s, e, mb, ch, lane in r.spans:
            by.setdefault((rank, cat, ch > 0, lane), []).append((s * 1e3, (e - s) * 1e3))
        band = {0: (-0.42, 0.84), 1: (0.0, 0.42), 2: (-0.42, 0.42), 3: (0.22, 0.2)}
        for (rank, cat, later_chunk, lane), spans in sorted(by.items(), key=lambda kv: (kv[0][1] == "opt", kv[0])):
            y0, hgt = band[lane]
            if cat == "opt":     # a few ms in a step of seconds: at least 1/250 of the axis wide
                spans = [(s, max(d, tmax / 250)) for s, d in spans]
            ax.broken_barh(spans, (r.pp - 1 - rank + y0, hgt), facecolors=COLORS.get(cat, "#999999"),
                           alpha=0.6 if later_chunk else 1.0, edgecolor="white", linewidth=0.3 if lane < 3 else 0,
                           zorder=3 if cat == "opt" else 2, gid=cat)
        m = r.result.num_microbatches
        if m <= 24 and _row_height(r.pp) >= 0.15:
            for rank, cat, s, e, mb, ch, lane in r.spans:
                if cat in ("F", "B", "BW", "W") and (e - s) * 1e3 > tmax / 120:
                    y0, hgt = band[lane]
                    ax.text((s + e) / 2 * 1e3, r.pp - 1 - rank + y0 + hgt / 2, str(mb), ha="center", va="center",
                            fontsize=5.5 if lane else 6, color="white" if cat != "W" else "black")
        ax.set_xlim(0, tmax)
        ax.set_ylim(-0.6, r.pp - 0.4)
        step_ticks = max(1, r.pp // 8)
        ax.set_yticks([r.pp - 1 - k for k in range(0, r.pp, step_ticks)])
        ax.set_yticklabels([str(k) for k in range(0, r.pp, step_ticks)], fontsize=7)
        ax.set_ylabel("rank", fontsize=8)
        x = r.result
        ax.set_title(plain(f"{r.label}: step {fmt_time(x.step_time_s)}, bubble {100 * x.bubble_fraction:.1f} %, "
                           f"peak {x.peak_memory_bytes / GiB:.1f} GiB"), fontsize=9, loc="left")
        ax.tick_params(axis="x", labelsize=7)
    if ax is not None:
        ax.set_xlabel("time (ms); grey = idle; numbers = microbatch; paler = the rank's later chunks; "
                      "half-height = an overlapped forward/backward pair; thin band = dp communication", fontsize=8)
    y += xlab + gap_bars
    axs = fig.add_axes(rect(y, bars_h, left, 0.42))
    axm = fig.add_axes(rect(y, bars_h, left + 0.50, 0.42), sharey=axs)
    labels = [plain(r.label) for r in ok]
    pos = list(range(len(ok)))
    steps = [r.step for r in ok]
    c = axs.barh(pos, steps, color="#4C78A8", gid="step")
    axs.bar_label(c, labels=[fmt_time(v) for v in steps], padding=3, fontsize=7)
    axs.set_xlim(0, max(steps, default=1.0) * 1.18)
    axs.set_yticks(pos)
    axs.set_yticklabels(labels)
    axs.set_xlabel("step time (s)", fontsize=8)
    axs.invert_yaxis()
    cap = ok[0].result.memory_capacity_bytes / GiB if ok else 0
    mem = [r.result.peak_memory_bytes / GiB for r in ok]
    c = axm.barh(pos, mem, color=["#54A24B" if r.result.fits_in_memory else "#E45756" for r in ok], gid="memory")
    axm.bar_label(c, labels=[f"{v:.1f} GiB" for v in mem], padding=3, fontsize=7)
    axm.set_xlim(0, max(mem + [cap], default=1.0) * 1.18)
    axm.tick_params(axis="y", labelleft=False)
    if ok:
        axm.axvline(cap, color="black", linestyle="--", linewidth=1)
        axm.text(cap, -0.6, f" capacity {cap:.1f} GiB", fontsize=7, va="bottom")
    axm.set_xlabel("peak memory per rank (GiB); red = does not fit", fontsize=8)
    for a in (axs, axm):
        a.tick_params(labelsize=7)
    fig.legend(handles=[Patch(color=COLORS[k], label=lab) for k, lab in
                        (("F", "forward F"), ("B", "backward B / BW"), ("W", "weight gradient W"),
                         ("dp", "dp communication"), ("opt", "optimizer"))],
               loc="upper right", ncol=5, fontsize=8, frameon=False, bbox_to_anchor=(left + width, 1 - 0.3 / H))
    fig.suptitle(plain(title), x=left, y=1 - 0.12 / H, ha="left", va="top", fontsize=10)
    return fig


def figure(rows: list[Row], path: Path, title: str) -> None:
    """Writes `compare_figure` to `path`."""
    save_figure(compare_figure(rows, title), path, bbox_inches="tight")
