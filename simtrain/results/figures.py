"""Figures of a simulated step (the pipeline timeline) and the common figure saving."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

COLORS = {"F": "#4C78A8", "B": "#54A24B", "BW": "#54A24B", "W": "#EECA3B", "opt": "#B279A2", "tp": "#F58518",
          "pp": "#E45756", "dp": "#9D755D", "cp": "#72B7B2", "ep": "#FF9DA6"}


def timeline_png(ops: list, tl, classes: list, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = len(classes)
    fig, ax = plt.subplots(figsize=(14, 0.6 + 0.55 * rows), dpi=110)
    row_of = {c.id: i for i, c in enumerate(classes)}
    bars: dict = {}
    for op in ops:
        s, e = tl.start[op.id], tl.end[op.id]
        if e <= s:
            continue
        r = row_of[op.cls]
        if op.stream == "compute" and op.fused:
            t = s
            for stream, cat, secs, _ in op.fused:
                bars.setdefault((r, cat, 0 if stream == "compute" else 1), []).append((t, secs))
                t += secs
        elif op.stream == "compute":
            bars.setdefault((r, op.category, 0), []).append((s, e - s))
        else:
            bars.setdefault((r, op.category, 1), []).append((s, e - s))
    scale = 1e3
    for (r, cat, lane), spans in sorted(bars.items()):
        y = rows - 1 - r
        spans = [(s * scale, d * scale) for s, d in spans]
        if lane == 0:
            ax.broken_barh(spans, (y - 0.35, 0.5), facecolors=COLORS[cat], linewidth=0)
        else:
            ax.broken_barh(spans, (y + 0.18, 0.17), facecolors=COLORS[cat], linewidth=0)
    ax.set_facecolor("#F2F2F2")
    ax.set_yticks([rows - 1 - i for i in range(rows)])
    ax.set_yticklabels([f"stage {c.stage} (×{c.multiplicity})" for c in classes])
    ax.set_xlim(0, tl.step_time * scale)
    ax.set_xlabel("time (ms)")
    ax.set_title(title + " — idle shows as grey background")
    cats = {op.category for op in ops} | {x[1] for op in ops for x in op.fused}
    legend = [(k, l) for k, l in (("F", "forward"), ("B", "backward (B / BW)"), ("W", "weight grad (W)"), ("opt", "optimizer"),
                                  ("tp", "tp comm"), ("cp", "cp comm"), ("ep", "ep dispatch / combine"), ("pp", "pp send"),
                                  ("dp", "dp comm")) if k in ("F", "B", "W", "opt", "tp", "pp", "dp") or k in cats]
    ax.legend(handles=[Patch(color=COLORS[k], label=l) for k, l in legend],
              loc="upper center", bbox_to_anchor=(0.5, -0.12 if rows > 2 else -0.3), ncol=len(legend), fontsize=8, frameon=False)
    fig.tight_layout()
    save_figure(fig, path)


def save_figure(fig, path: Path, **kw) -> None:
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
