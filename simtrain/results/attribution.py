"""Time attribution of a simulated step: compute, bubble and exposed communication per kind, per rank class."""
from __future__ import annotations

from typing import TYPE_CHECKING

from simtrain.plan.grid import RankClass
from simtrain.program.ir import EOp, stream_sequences

if TYPE_CHECKING:
    from simtrain.engine.core import Timeline

KINDS = ("tp", "cp", "ep", "pp", "dp")


def attribute(ops: list[EOp], tl: Timeline, classes: list[RankClass]) -> dict:
    """class id -> {compute_s, bubble_s, exposed: {tp, pp, dp}}."""
    start, end = tl.start, tl.end
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
