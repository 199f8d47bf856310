"""The critical path of a simulated step: the chain of ops that set its end time."""
from __future__ import annotations

from typing import TYPE_CHECKING

from simtrain.program.ir import EOp, stream_sequences

if TYPE_CHECKING:
    from simtrain.engine.core import Timeline


def critical_path(ops: list[EOp], tl: Timeline) -> list[tuple[int, float]]:
    """The chain of ops that set the step time, walked back from the op that ends last: at each op,
    the input that finished last (a dependency, the op before it on its stream, or the last peer
    to arrive at its collective) is the one it waited for. Returns (class id, seconds on the
    path) in path order, first op first."""
    pred = {}
    for seq in stream_sequences(ops).values():
        for a, b in zip(seq, seq[1:]):
            pred[b.id] = a.id
    arrivals: dict = {}
    for o in ops:
        if o.rendezvous is not None:
            arrivals.setdefault(o.rendezvous, []).append(o.id)
    start, end = tl.start, tl.end
    cur = max(range(len(ops)), key=lambda i: (end[i], i))
    path = []
    seen = set()
    while cur is not None and cur not in seen:
        seen.add(cur)
        o = ops[cur]
        path.append((o.cls, end[cur] - start[cur]))
        cands = list(o.deps) + ([pred[cur]] if cur in pred else [])
        if o.rendezvous is not None:
            # the peers' own inputs: whoever arrived last held the collective up
            for p in arrivals[o.rendezvous]:
                if p != cur:
                    q = ops[p]
                    cands += list(q.deps) + ([pred[p]] if p in pred else [])
        cands = [c for c in cands if end[c] <= start[cur] + 1e-12]
        cur = max(cands, key=lambda i: (end[i], i)) if cands else None
    path.reverse()
    return path
