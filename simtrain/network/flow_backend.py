"""The flow-level network backend for one step: collectives and pipeline sends as flows over the
topology graph (`flows.FlowNetwork`), with contention between the ops that overlap in the run.

Takes the scenario (its parallel grid, algorithm and protocol choices, seed) and the rank
placement; times every tp / dp / ep collective with all the groups of its kind in the same
pipeline stage at once (they run the same program in lockstep; other stages are staggered by the
schedule) and every pipeline send with all the ranks of its class at once. Each `Timing` carries
the load the op leaves on the scale-out links, which the engine shares among overlapping ops.
After the run it reports the busiest links and their utilisation over the step. Measured
collective tables are not used: the flows are the model.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from simtrain.hardware.topology import Topology
from simtrain.network.backend import CollectiveChoice, Timing
from simtrain.network.collectives import p2p_time
from simtrain.network.flows import FlowNetwork, Transfer
from simtrain.network.nccl_tuning import policy_of
from simtrain.plan.grid import RankClass, RankGrid
from simtrain.spec.scenario import Scenario

if TYPE_CHECKING:
    from simtrain.engine.core import Timeline
    from simtrain.program.ir import EOp


class FlowBackend:
    contended = True

    def __init__(self, sc: Scenario, topo: Topology, place: list[int] | None = None, tables: tuple = ()):
        p = sc.parallel
        grid = RankGrid(p.tp, p.cp, p.dp, p.pp, p.ep, p.etp)
        place = place or list(range(grid.world))
        self.topo = topo
        self.net = FlowNetwork(topo, sc.seed)
        self.algo = sc.network.algorithm_for
        self.protocol = sc.network.protocol
        self.nccl = policy_of(sc.network)
        self.notes: set = set()
        self.groups: dict = {}     # (kind, stage) -> device lists of its groups
        for k in grid.kinds(sc.model.moe is not None):
            for g in grid.groups(k):
                self.groups.setdefault((k, grid.coords(g[0])["stage"]), []).append([place[r] for r in g])
        self.stats: dict = {}      # key -> (time, bytes per link, saturated s per link, Cost or None for a send)
        self.per_stage = grid.world // p.pp
        self.place = place
        self.pp_groups = {r: g for g in grid.groups("pp") for r in g}
        self._loads: dict = {}

    def load(self, key: tuple, share: float) -> tuple:
        """The engine's load of one class's part of a collective: its share of the stage's ranks
        times the collective's bytes on each scale-out link, over its duration and the link's
        capacity (the average fraction of the link it uses when it runs alone)."""
        hit = self._loads.get((key, share))
        if hit is None:
            t, moved = self.stats[key][0], self.stats[key][1]
            cap, out = self.net.cap, self.net.scale_out
            hit = self._loads[(key, share)] = tuple(
                (e, share * x / (t * cap[e])) for e, x in sorted(moved.items()) if e in out and x > 0) if t > 0 else ()
        return hit

    def shares_links(self, kind: str, c: RankClass) -> bool:
        return True

    def collective(self, collective: str, nbytes: float, kind: str, c: RankClass) -> Timing:
        """One collective run by every group of its kind in the class's stage at once
        (`FlowNetwork.select`); the class's load is its share of the stage's ranks."""
        key = (collective, nbytes, kind, c.stage)
        hit = self.stats.get(key)
        if hit is None:
            cost, moved, sat = self.net.select(collective, nbytes, self.groups[(kind, c.stage)], self.algo(collective),
                                               self.protocol, self.nccl)
            hit = self.stats[key] = (cost.seconds, moved, sat, cost)
        return Timing(hit[0], self.load(key, c.multiplicity / self.per_stage), key)

    def group_collective(self, collective: str, nbytes: float, devices: tuple) -> Timing:
        """The group's collective run by its members alone; each member carries 1/size of its load."""
        key = ("group", collective, nbytes, tuple(devices))
        hit = self.stats.get(key)
        if hit is None:
            cost, moved, sat = self.net.select(collective, nbytes, [list(devices)], self.algo(collective),
                                               self.protocol, self.nccl)
            hit = self.stats[key] = (cost.seconds, moved, sat, cost)
        return Timing(hit[0], self.load(key, 1.0 / len(devices)), key)

    def transfer(self, nbytes: float, link_class: str) -> float:
        return p2p_time(nbytes, link_class, self.topo)

    def p2p(self, src: int, dst: int, nbytes: float) -> Timing:
        """The link class's latency plus the flow's time over its route."""
        key = ("p2p1", src, dst, nbytes)
        hit = self.stats.get(key)
        if hit is None:
            data, moved, sat, _ = self.net.phase([Transfer(src, dst, nbytes)])
            t = self.topo.link(src, dst).latency + data
            hit = self.stats[key] = (t, moved, sat, None)
        return Timing(hit[0], self.load(key, 1.0), key)

    def sends(self, c: RankClass, peer: int, nbytes: float, link_class: str) -> Timing:
        """The link class's latency plus the time of the class's flows sharing the fabric."""
        key = ("p2p", tuple(c.ranks), peer, nbytes)   # ranks, not the class id: a reused backend sees other classes
        hit = self.stats.get(key)
        if hit is None:
            ts = [Transfer(self.place[r], self.place[self.pp_groups[r][peer]], nbytes) for r in c.ranks]
            data, moved, sat, _ = self.net.phase(ts)
            t = self.topo._link_by_class(link_class).latency + data
            hit = self.stats[key] = (t, moved, sat, None)
        return Timing(hit[0], self.load(key, 1.0), key)

    def choices(self) -> list:
        out = []
        for key, (_, _, _, cost) in self.stats.items():
            if cost is None:           # a pipeline send
                continue
            if key[0] == "group":      # an explicit group (a replayed trace)
                out.append(CollectiveChoice("group", key[1], key[2], len(key[3]), None, cost))
                continue
            coll, n, kind, stage = key
            out.append(CollectiveChoice(kind, coll, n, len(self.groups[(kind, stage)][0]), stage, cost))
        return out

    def links(self, ops: list[EOp], timeline: Timeline) -> tuple:
        runs = self._runs(ops)          # one pass over the ops serves both
        section, busiest = self.report(ops, runs=runs)
        return section, self.timeline(ops, timeline, busiest, runs=runs)

    def _runs(self, ops: list[EOp]) -> tuple:
        """Per key: how often it runs (in the class that runs it most) and that class."""
        count: dict = {}
        for op in ops:
            if op.net_key is not None:
                k = (op.net_key, op.cls)
                count[k] = count.get(k, 0) + 1
        runs, where = {}, {}
        for (key, cid), n in sorted(count.items(), key=lambda kv: kv[0][1]):
            if n > runs.get(key, 0):
                runs[key], where[key] = n, cid
        return runs, where

    def report(self, ops: list[EOp], top: int = 10, runs: tuple | None = None) -> tuple:
        """(links section of the result, the busiest links for the trace). A link's load is each
        collective's per-link load times the number of times it runs in the class that runs it
        most."""
        runs, _ = runs or self._runs(ops)
        moved, sat = {}, {}
        for key, n in runs.items():
            _, m, s, _ = self.stats[key]
            for e, x in m.items():
                moved[e] = moved.get(e, 0.0) + n * x
            for e, x in s.items():
                sat[e] = sat.get(e, 0.0) + n * x

        def row(e):
            return {"link": f"{e[0]}->{e[1]}", "bytes": moved.get(e, 0.0), "saturated_s": sat.get(e, 0.0),
                    "capacity_bytes_per_s": self.net.cap[e]}
        by_bytes = sorted(moved, key=lambda e: (-moved[e], e))[:top]
        by_sat = sorted(sat, key=lambda e: (-sat[e], e))[:top]
        section = {"by_bytes": [row(e) for e in by_bytes], "by_saturated_time": [row(e) for e in by_sat],
                   "scope": "tp and dp collectives and pipeline sends (flow backend)"}
        return section, by_sat[:8] or by_bytes[:8]

    def timeline(self, ops: list[EOp], tl: Timeline, links: list, runs: tuple | None = None) -> dict:
        """link -> [(time, utilisation)] change points over the step: while a collective or send
        runs, a link carries its per-link bytes spread over the op's simulated duration (stretched
        by contention on scale-out links, so overlapping ops share rather than add up there)."""
        _, where = runs or self._runs(ops)
        deltas: dict = {e: [] for e in links}
        for op in ops:
            key = op.net_key
            if key is None or where.get(key) != op.cls:
                continue
            s, e_ = tl.start[op.id], tl.end[op.id]
            if e_ <= s:
                continue
            moved = self.stats[key][1]
            for e in [x for x in links if x in moved]:
                u = moved[e] / (self.net.cap[e] * (e_ - s))
                deltas[e] += [(s, u), (e_, -u)]
        out = {}
        for e, ds in deltas.items():
            cur, pts = 0.0, [(0.0, 0.0)]
            for t, d in sorted(ds):
                cur += d
                if pts[-1][0] == t:
                    pts[-1] = (t, max(0.0, cur))
                else:
                    pts.append((t, max(0.0, cur)))
            out[e] = pts
        return out
