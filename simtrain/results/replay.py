"""The typed result of a replayed execution trace (simtrain.replay): what `simtrain run --workload
chakra:DIR` reports. Per rank: compute time (busy time of its compute and CPU streams), exposed
communication (a collective or transfer running while no compute does) and idle time (neither),
so that compute + exposed + idle = the step on every rank."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from simtrain.results.step import Collective, Links, Section, keyed, optional


@dataclass(kw_only=True)
class RankTime(Section):
    rank: int
    device: str
    compute_s: float
    exposed_comm_s: float
    idle_s: float
    comm_s: float                 # time any collective or transfer of the rank was running


@dataclass(kw_only=True)
class ReplayResult(Section):
    """One replayed trace: the step, its split on the busiest rank and on every rank."""
    trace: str
    prefix: str
    chakra_version: str
    ranks: int
    nodes: dict                   # node type -> count over every rank
    step_time_s: float
    compute_from: dict            # {"trace_duration": n, "cost_model": n} compute nodes
    busiest_rank: int
    compute_s: float              # the busiest rank's
    exposed_comm_s: float
    idle_s: float
    per_rank: list[RankTime]
    collectives: list[Collective]
    device: str
    topology: str
    network_backend: str
    simulated_ops: int
    coverage: list[str]
    links: Links | None = optional()
    kind: str = keyed("workload")


def _union(iv: list) -> list:
    out = []
    for s, e in sorted(iv):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return out


def _length(iv: list) -> float:
    return sum(e - s for s, e in iv)


def _minus(a: list, b: list) -> float:
    """Length of the union `a` outside the union `b` (both sorted, disjoint)."""
    tot, j = 0.0, 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while cur < e:
            if k >= len(b) or b[k][0] >= e:
                tot += e - cur
                break
            if b[k][0] > cur:
                tot += b[k][0] - cur
            cur = max(cur, b[k][1])
            k += 1
    return tot


def rank_times(ops: list, start: list, end: list, world: int, step: float, device_name: Callable[[int], str]) -> list[RankTime]:
    """Per rank: compute busy time, communication outside compute, idle (the rest of the step)."""
    comp: dict = {r: [] for r in range(world)}
    comm: dict = {r: [] for r in range(world)}
    for op in ops:
        (comp if op.kind == "compute" else comm)[op.cls].append((start[op.id], end[op.id]))
    out = []
    for r in range(world):
        c, m = _union(comp[r]), _union(comm[r])
        cs = _length(c)
        ex = _minus(m, c)
        out.append(RankTime(rank=r, device=device_name(r), compute_s=cs, exposed_comm_s=ex,
                            idle_s=max(step - cs - ex, 0.0), comm_s=_length(m)))
    return out
