"""Flow-level network backend (behind the engine's communication seam, next to `collectives`).

A collective is the sequence of its algorithm's phases; a phase is a set of point-to-point
transfers that start together. Each transfer is a flow routed over the topology graph (shortest
paths, ECMP among equal-cost ones by a seeded deterministic hash of the flow id). Flows share
every directed link by max-min fairness (progressive filling), and the rates are recomputed each
time a flow starts or ends, so a phase lasts until its slowest flow has delivered its last byte.

Contention is modelled between all groups that run the same collective at the same time: the
data-parallel (or tensor-parallel) groups of an SPMD step issue it in lockstep, so the backend
times one collective as the concurrent phases of *every* group of that kind. That is where
oversubscribed uplinks, shared NICs and placement bite. Traffic of different kinds overlapping
in time (a gradient bucket under a pipeline send) is not yet made to contend.

Max-min fairness, progressive filling (Bertsekas & Gallager, "Data Networks", §6.5.2): raise
every unfrozen flow's rate equally until some link is full; freeze the flows on it; repeat.
Worked example: link A (10) carries f1, f2; link B (10) carries f2, f3, f4. B fills first at
10/3 each, freezing f2, f3, f4; f1 then takes A's remaining 10 - 10/3 = 20/3.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import networkx as nx


def maxmin(paths: list, cap: dict) -> list:
    """Max-min fair rate of each flow; `paths` are tuples of directed links, `cap` link -> bytes/s."""
    n = len(paths)
    rate = [0.0] * n
    frozen = [False] * n
    on_link: dict = {}
    for i, p in enumerate(paths):
        for e in p:
            on_link.setdefault(e, []).append(i)
    left = {e: cap[e] for e in on_link}
    active = {e: len(fs) for e, fs in on_link.items()}
    todo = n
    for i, p in enumerate(paths):
        if not p:             # a flow to itself: no link, infinite rate
            rate[i], frozen[i] = math.inf, True
            todo -= 1
    while todo:
        share = min(left[e] / active[e] for e in active if active[e])
        full = [e for e in active if active[e] and left[e] / active[e] <= share * (1 + 1e-12)]
        newly = sorted({i for e in full for i in on_link[e] if not frozen[i]})
        for i in newly:
            frozen[i] = True
            rate[i] = share
            todo -= 1
            for e in paths[i]:
                left[e] -= share
                active[e] -= 1
    return rate


def run_flows(paths: list, sizes: list, cap: dict, latency: list | None = None) -> list:
    """Finish time of each flow, all starting at t=0: max-min rates recomputed whenever a flow
    ends; a flow finishes when its last byte is sent plus its path latency.
    Worked example: two flows of 1 and 3 bytes on one link of 1 B/s share it at 0.5 until t=2,
    when the first is done; the second then runs at 1 B/s with 2 bytes left and ends at t=4."""
    n = len(paths)
    remaining = list(map(float, sizes))
    done_at = [0.0] * n
    live = [i for i in range(n) if remaining[i] > 0]
    t = 0.0
    while live:
        rates = maxmin([paths[i] for i in live], cap)
        dt = min(remaining[i] / r for i, r in zip(live, rates))
        nxt = []
        for i, r in zip(live, rates):
            remaining[i] -= r * dt
            if remaining[i] <= 1e-9 * max(1.0, sizes[i]):
                done_at[i] = t + dt
            else:
                nxt.append(i)
        t += dt
        live = nxt
    lat = latency or [0.0] * n
    return [done_at[i] + lat[i] for i in range(n)]


# -----------------------------------------------------------------------------------------------
# collective algorithms as phases of transfers (member indices 0..p-1, bytes per transfer)

def ring_phases(coll: str, p: int, n: float) -> list:
    """Ring: p-1 steps (reduce-scatter or all-gather) or 2(p-1) (all-reduce), each member sending
    n/p to the next one."""
    steps = 2 * (p - 1) if coll == "all_reduce" else p - 1
    step = [(i, (i + 1) % p, n / p) for i in range(p)]
    return [step] * steps


def halving_doubling_phases(coll: str, p: int, n: float) -> list:
    """Recursive halving (reduce-scatter) then recursive doubling (all-gather), p a power of two:
    step k exchanges n/2^(k+1) with the partner i xor p/2^(k+1) (Thakur, Rabenseifner & Gropp 2005)."""
    if p & (p - 1):
        raise ValueError("halving-doubling needs a power-of-two group")
    k = p.bit_length() - 1
    rs = [[(i, i ^ (p >> (s + 1)), n / 2 ** (s + 1)) for i in range(p)] for s in range(k)]
    ag = list(reversed(rs))
    if coll == "reduce_scatter":
        return rs
    if coll == "all_gather":
        return ag
    return rs + ag


def pairwise_all_to_all_phases(coll: str, p: int, n: float) -> list:
    """Pairwise exchange: p-1 steps, step k sends n/p to member i+k."""
    return [[(i, (i + k) % p, n / p) for i in range(p)] for k in range(1, p)]


def direct_all_to_all_phases(coll: str, p: int, n: float) -> list:
    """Direct: every member sends n/p to every other member at once."""
    return [[(i, j, n / p) for i in range(p) for j in range(p) if i != j]]


PHASES = {
    "ring": (ring_phases, "ring (Patarasuk & Yuan 2009)"),
    "halving_doubling": (halving_doubling_phases, "recursive halving-doubling (Thakur, Rabenseifner & Gropp 2005)"),
    "pairwise": (pairwise_all_to_all_phases, "pairwise-exchange all-to-all"),
    "direct": (direct_all_to_all_phases, "direct all-to-all"),
}


@dataclass(frozen=True)
class Transfer:
    src: int      # device index
    dst: int
    bytes: float


def hierarchical_phases(coll: str, groups_of_nodes: list, n: float) -> list:
    """2-D: intra-node ring reduce-scatter, inter-node ring all-reduce of n/k across the members
    with the same local index (one rail each), intra-node ring all-gather. `groups_of_nodes` is
    the group's members grouped by node (equal sizes k); returns phases of Transfer."""
    k = len(groups_of_nodes[0])
    N = len(groups_of_nodes)
    out = []

    def intra(kind):
        return [[Transfer(node[a], node[b], nb) for node in groups_of_nodes for a, b, nb in ph]
                for ph in ring_phases(kind, k, n)] if k > 1 else []

    inter = [[Transfer(groups_of_nodes[a][j], groups_of_nodes[b][j], nb) for j in range(k) for a, b, nb in ph]
             for ph in ring_phases(coll, N, n / k)] if N > 1 else []
    if coll == "all_reduce":
        out = intra("reduce_scatter") + inter + intra("all_gather")
    elif coll == "reduce_scatter":
        out = intra("reduce_scatter") + inter
    else:
        out = inter + intra("all_gather")
    return out


# -----------------------------------------------------------------------------------------------

class FlowNetwork:
    """Routes and times concurrent transfers over a topology's graph.

    Capacities are each link's `bw` per direction, times the topology's measured bus-bandwidth
    efficiency of its tier (scale-up links by the scale-up efficiency, everything else by the
    scale-out one), the same efficiencies the closed-form backend applies."""

    def __init__(self, topo, seed: int = 0):
        self.topo = topo
        self.g = topo.graph()
        self.seed = seed
        self._paths: dict = {}
        self._phase_cache: dict = {}
        self.cap = {}
        for u, v, d in self.g.edges(data=True):
            up = self.g.nodes[u].get("kind") == "scale_up_switch" or self.g.nodes[v].get("kind") == "scale_up_switch"
            eff = topo.scale_up_efficiency if up else topo.scale_out_efficiency
            self.cap[(u, v)] = self.cap[(v, u)] = d["bw"] * eff
        self.lat = {(u, v): d["latency"] for u, v, d in self.g.edges(data=True)}
        self.lat.update({(v, u): x for (u, v), x in list(self.lat.items())})

    def route(self, src: int, dst: int, flow_id) -> tuple:
        """Directed links of one shortest path; ECMP picks among equal-cost paths by a CRC32 of
        (seed, flow id), so the same input and seed give the same routes."""
        if src == dst:
            return ()
        key = (src, dst)
        paths = self._paths.get(key)
        if paths is None:
            a, b = self.topo.device_id(src), self.topo.device_id(dst)
            paths = self._paths[key] = sorted(tuple(p) for p in nx.all_shortest_paths(self.g, a, b))
        p = paths[zlib.crc32(repr((self.seed, flow_id)).encode()) % len(paths)] if len(paths) > 1 else paths[0]
        return tuple(zip(p, p[1:]))

    def phase_time(self, transfers: list) -> float:
        """Duration of one phase: all transfers start together; it ends with the slowest flow."""
        key = tuple((t.src, t.dst, t.bytes) for t in transfers)
        hit = self._phase_cache.get(key)
        if hit is None:
            paths = [self.route(t.src, t.dst, (t.src, t.dst, i)) for i, t in enumerate(transfers)]
            lat = [sum(self.lat[e] for e in p) for p in paths]
            hit = self._phase_cache[key] = max(run_flows(paths, [t.bytes for t in transfers], self.cap, lat), default=0.0)
        return hit

    def collective_time(self, coll: str, n: float, groups: list, algorithm: str = "ring") -> float:
        """Time of one collective run at once by every group in `groups` (device lists)."""
        if not groups or len(groups[0]) <= 1 or n <= 0:
            return 0.0
        if algorithm == "hierarchical":
            by_node = []
            for g in groups:
                nodes: dict = {}
                for d in g:
                    nodes.setdefault(self.topo.node_of(d), []).append(d)
                by_node.append(list(nodes.values()))
            if any(len({len(x) for x in bn}) != 1 or len(bn) == 1 or len(bn[0]) == 1 for bn in by_node):
                return self.collective_time(coll, n, groups, "ring")
            per_group = [hierarchical_phases(coll, bn, n) for bn in by_node]
            phases = [sum((pg[i] for pg in per_group), []) for i in range(len(per_group[0]))]
        else:
            build = PHASES[algorithm][0]
            p = len(groups[0])
            phases = [[Transfer(g[a], g[b], nb) for g in groups for a, b, nb in ph] for ph in build(coll, p, n)]
        return sum(self.phase_time(ph) for ph in phases)
