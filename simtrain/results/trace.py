"""The Chrome/Perfetto trace of a simulated step."""
from __future__ import annotations

from typing import TYPE_CHECKING

from simtrain import __version__

if TYPE_CHECKING:
    from simtrain.engine.core import Timeline
    from simtrain.hardware.topology import Topology
    from simtrain.plan.grid import RankClass
    from simtrain.program.ir import EOp


def chrome_trace(ops: list[EOp], tl: Timeline, classes: list[RankClass], topo: Topology,
                 link_series: dict | None = None, forward_only: bool = False) -> dict:
    """`link_series` (flow backend): counter tracks of the busiest links' utilisation, in a
    "network" process after the rank classes. `forward_only`: the ops are a forward-only pass
    (training.forward_only), which every process name and the trace's metadata say."""
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
                   "args": {"name": f"stage {c.stage} · rank {r0} ({topo.device_id(c.device)}) ×{c.multiplicity} ranks"
                                    + (" · forward only" if forward_only else "")}})
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
    out = {"traceEvents": ev, "displayTimeUnit": "ms"}
    if forward_only:
        out["otherData"] = {"pass": "forward only"}
    return out


def replay_trace(ops: list[EOp], tl: Timeline, world: int, topo: Topology, source: str) -> dict:
    """The Chrome/Perfetto trace of a replayed execution trace (simtrain.replay): one process per
    rank, one thread per stream in the order the rank first uses it (compute, a process group's
    `pg:<id>`, `send:<dst>`, `recv:<src>`, ...)."""
    ev = [{"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r} ({topo.device_id(r)})"}}
          for r in range(world)]
    tids: dict = {r: {} for r in range(world)}
    for op in ops:
        streams = tids[op.cls]
        if op.stream not in streams:
            streams[op.stream] = len(streams)
            ev.append({"ph": "M", "name": "thread_name", "pid": op.cls, "tid": streams[op.stream], "args": {"name": op.stream}})
        s, e = tl.start[op.id], tl.end[op.id]
        ev.append({"ph": "X", "name": op.label, "cat": op.kind, "pid": op.cls, "tid": streams[op.stream],
                   "ts": round(s * 1e6, 3), "dur": round((e - s) * 1e6, 3), **({"args": {"bytes": op.bytes}} if op.bytes else {})})
    return {"traceEvents": ev, "displayTimeUnit": "ms", "metadata": {"simtrain_version": __version__, "source": source}}
