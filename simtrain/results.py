"""Results (last pipeline stage): time attribution, StepResult, JSON, Chrome trace, timeline plot.

Attribution: every rank's step time splits exactly into compute + bubble + exposed communication
per kind. An idle gap on the compute stream is walked back along what blocked it: while the
blocking op is a communication op that is transferring, the time is exposed communication of its
kind; time spent waiting for another rank's computation (or for peers at a collective) is bubble.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

KINDS = ("tp", "cp", "ep", "pp", "dp")


def attribute(ops: list, tl, classes: list) -> dict:
    """class id -> {compute_s, bubble_s, exposed: {tp, pp, dp}}."""
    start, end = tl.start, tl.end
    from simtrain.program import stream_sequences
    pred = {}
    for seq in stream_sequences(ops).values():
        for a, b in zip(seq, seq[1:]):
            pred[b.id] = a.id
    out = {c.id: {"compute_s": 0.0, "bubble_s": 0.0, "exposed": {k: 0.0 for k in KINDS}} for c in classes}

    def walk(acc, g0, g1, op):
        while g1 - g0 > 0:
            if op.kind == "compute":
                acc["bubble_s"] += g1 - g0
                return
            s = start[op.id]
            if s < g1:
                acc["exposed"][op.category] += g1 - max(s, g0)
                g1 = max(s, g0)
                if g1 <= g0:
                    return
            cands = list(op.deps) + ([pred[op.id]] if op.id in pred else [])
            if not cands:
                acc["bubble_s"] += g1 - g0
                return
            b = max(cands, key=lambda i: (end[i], i))
            if end[b] < g1:   # waited at a rendezvous for peers
                acc["bubble_s"] += g1 - max(end[b], g0)
                g1 = max(end[b], g0)
            op = ops[b]

    by_cls: dict = {}
    for op in ops:
        by_cls.setdefault(op.cls, []).append(op)
    for cid, cops in by_cls.items():
        acc = out[cid]
        comp = sorted((o for o in cops if o.stream == "compute"), key=lambda o: (start[o.id], o.id))
        t = 0.0
        for o in comp:
            acc["compute_s"] += end[o.id] - start[o.id]
            for stream, cat, secs, _ in o.fused:
                if stream != "compute":
                    # a collective folded into the op: the compute stream waited while it transferred
                    acc["compute_s"] -= secs
                    acc["exposed"][cat] += secs
            if start[o.id] > t + 1e-15:
                deps = o.deps
                if deps:
                    b = max(deps, key=lambda i: (end[i], i))
                    if end[b] < start[o.id]:
                        acc["bubble_s"] += start[o.id] - max(end[b], t)
                    walk(acc, t, min(end[b], start[o.id]) if end[b] > t else t, ops[b])
                else:
                    acc["bubble_s"] += start[o.id] - t
            t = max(t, end[o.id])
        # tail: the class's own trailing communication, then waiting for the slowest rank
        last = max(cops, key=lambda o: (end[o.id], o.id))
        if end[last.id] > t and last.stream != "compute":
            walk(acc, t, end[last.id], last)
            t = end[last.id]
        acc["bubble_s"] += tl.step_time - t
    return out


def write_atomic(path: Path, data: bytes) -> None:
    """Writes to a temporary file beside `path`, then renames: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def to_json(result: dict) -> str:
    return json.dumps(result, indent=2, sort_keys=False) + "\n"


# ---------------------------------------------------------------------------------------------
# Chrome / Perfetto trace

def chrome_trace(ops: list, tl, classes: list, topo, link_series: dict | None = None) -> dict:
    """`link_series` (flow backend): counter tracks of the busiest links' utilisation, in a
    "network" process after the rank classes."""
    order = ("compute", "tp", "cp", "ep", "etp", "dp", "edp", "pp_next", "pp_prev")
    used = {op.stream for op in ops} | {x[0] for op in ops for x in op.fused}
    tids = {"compute": 0, "tp": 1, "dp": 2, "pp_next": 3, "pp_prev": 4}      # the dense streams keep their ids
    for name in order:
        if name in used and name not in tids:
            tids[name] = len(tids)
    ev = []
    if link_series:
        npid = max(c.id for c in classes) + 1
        ev.append({"ph": "M", "name": "process_name", "pid": npid, "args": {"name": "network: busiest links (utilisation)"}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": npid, "args": {"sort_index": npid}})
        for (u, v), pts in link_series.items():
            name = f"{u}->{v}"
            for t, x in pts:
                ev.append({"ph": "C", "name": name, "pid": npid, "ts": round(t * 1e6, 3), "args": {"utilisation": round(x, 4)}})
    for c in classes:
        r0 = c.ranks[0]
        ev.append({"ph": "M", "name": "process_name", "pid": c.id,
                   "args": {"name": f"stage {c.stage} · rank {r0} ({topo.device_id(c.device)}) ×{c.multiplicity} ranks"}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": c.id, "args": {"sort_index": c.id}})
        for s, t in tids.items():
            if s in ("compute", "tp", "dp", "pp_next", "pp_prev") or s in used:
                ev.append({"ph": "M", "name": "thread_name", "pid": c.id, "tid": t, "args": {"name": s}})
    consumer = {}
    for op in ops:
        for d in op.deps:
            if ops[d].kind == "send" and ops[d].cls != op.cls:
                consumer[d] = op.id
    for op in ops:
        s, e = tl.start[op.id], tl.end[op.id]
        if not op.fused:
            ev.append({"ph": "X", "name": op.label, "cat": op.category, "pid": op.cls, "tid": tids[op.stream],
                       "ts": round(s * 1e6, 3), "dur": round((e - s) * 1e6, 3),
                       "args": {"microbatch": op.mb, "bytes": op.bytes} if op.bytes else {"microbatch": op.mb}})
        t = s
        for stream, cat, secs, label in op.fused:
            # a merged op's parts, in order, each on its own stream
            ev.append({"ph": "X", "name": label, "cat": cat, "pid": op.cls, "tid": tids[stream],
                       "ts": round(t * 1e6, 3), "dur": round(secs * 1e6, 3), "args": {"microbatch": op.mb}})
            t += secs
        if op.kind == "send" and op.id in consumer:
            dst = ops[consumer[op.id]]
            ev.append({"ph": "s", "id": op.id, "name": "p2p", "cat": "pp", "pid": op.cls, "tid": tids[op.stream], "ts": round(s * 1e6, 3)})
            ev.append({"ph": "f", "bp": "e", "id": op.id, "name": "p2p", "cat": "pp", "pid": dst.cls, "tid": tids["compute"],
                       "ts": round(tl.start[dst.id] * 1e6, 3)})
    return {"traceEvents": ev, "displayTimeUnit": "ms"}


# ---------------------------------------------------------------------------------------------
# Timeline plot

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
