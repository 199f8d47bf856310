"""The closed-form network backend: collectives by NCCL's cost model (`collectives.choose`),
transfers as latency plus bytes over bandwidth.

Ops contend only on a fabric with an oversubscribed tier (`Topology.oversubscribed`): there a
ring collective that leaves its leaf carries the load its pipeline stage's rings put on each
leaf's (and pod's) uplinks (`Topology.tier_loads`), and the engine shares those among the ops
that overlap in the run (`engine.core.FluidNetwork`) -- two stages' gradient reductions through
one leaf's uplinks slow each other down, one stage's alone does not.

Takes the scenario's algorithm and protocol choices and the device profile's measured collective
tables (where a table covers a collective, the measurement times it); returns a `Timing` without
link loads for every collective and transfer, caches each distinct collective's `Cost` for the
result's collectives section, and has no link report.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from simtrain.hardware.topology import Topology
from simtrain.network.backend import CollectiveChoice, Timing
from simtrain.network.collectives import Cost, LoadedShape, choose, p2p_time
from simtrain.network.nccl_tuning import policy_of
from simtrain.plan.grid import GroupShape, RankClass, RankGrid, group_shape
from simtrain.spec.scenario import Scenario

if TYPE_CHECKING:
    from simtrain.engine.core import Timeline
    from simtrain.program.ir import EOp


class AnalyticalBackend:
    contended = False

    def __init__(self, sc: Scenario, topo: Topology, place=None, tables: tuple = ()):
        self.topo = topo
        self.network = sc.network
        self.nccl = policy_of(sc.network)
        self.tables = tuple(tables or ())
        self.notes: set = set()
        self.chosen: dict = {}       # (kind, collective, bytes, group shape) -> Cost
        p = sc.parallel
        self.grid = RankGrid(p.tp, p.cp, p.dp, p.pp, p.ep, p.etp)
        self.place = place
        self.moe = sc.model.moe is not None
        self._shapes: dict = {}      # (kind, stage) -> (the ring's tier bandwidth, its flows' sources, destinations)
        self._loads: dict = {}       # (kind, stage) -> the tier loads of the stage's rings
        self.per_stage = self.grid.world // p.pp
        self._sends: dict = {}       # (stage, peer position) -> (tier bandwidth, tier loads at it) of its sends

    def loaded_shape(self, kind: str, c: RankClass) -> GroupShape:
        """The class's group shape; on a fabric with an oversubscribed tier (`Topology.tier_bandwidth`),
        with the per-flow bandwidth the ring hops of every group of the kind in the class's
        pipeline stage get when they run at once (the flow backend's concurrent set), so that an
        uncontended collective is not charged the full-load oversubscribed bandwidth."""
        shape = c.shape_of(kind)
        if not shape.spans_nodes or not self.topo.oversubscribed:
            return shape
        if (kind, c.stage) not in self._shapes:
            for stage, (src, dst) in ring_flows(self.grid, kind, self.place, self.topo).items():
                self._shapes[(kind, stage)] = (self.topo.tier_bandwidth(src, dst) if src else None, src, dst)
        bw = self._shapes.get((kind, c.stage), (None,))[0]
        return shape if bw is None else LoadedShape(**vars(shape), ring_net_bw=bw)

    def shares_links(self, kind: str, c: RankClass) -> bool:
        """True where class c's collectives of the kind carry a tier load (a ring of its stage
        leaves its leaf on an oversubscribed fabric): the lowering keeps them as their own ops."""
        return isinstance(self.loaded_shape(kind, c), LoadedShape)

    def tier_load(self, kind: str, c: RankClass, cost: Cost) -> tuple:
        """Class c's share of the load its stage's rings of `kind` put on the oversubscribed
        tiers: every ring flow at the per-flow bandwidth it gets alone (`loaded_shape`), for the
        part of the collective that moves bytes (its transfer term over its time), times the
        class's share of the stage's ranks, so that the stage's classes together carry the
        stage's load. Only ring collectives (the flows laid out); others carry none."""
        hit = self._shapes.get((kind, c.stage))
        if cost.algorithm != "ring" or hit is None or hit[0] is None or cost.seconds <= 0:
            return ()
        key = (kind, c.stage)
        if key not in self._loads:
            bw, src, dst = hit
            self._loads[key] = self.topo.tier_loads(src, dst, bw)
        return self._class_share(self._loads[key], c, cost.transfer / cost.seconds)

    def _class_share(self, loads: tuple, c: RankClass, busy: float) -> tuple:
        """A stage's tier loads as one of its classes carries them: times the class's share of the
        stage's ranks and the fraction `busy` of the op's time its flows move bytes."""
        share = c.multiplicity / self.per_stage * busy
        return tuple((e, share * u) for e, u in loads)

    def shape_cost(self, collective: str, nbytes: float, shape: GroupShape) -> Cost:
        """The Cost of a collective over a group of this shape (the scenario's algorithm and
        protocol, the measured tables where they apply)."""
        net = self.network
        return choose(collective, nbytes, shape, self.topo, net.algorithm_for(collective), net.protocol,
                      self.tables, self.notes, self.nccl)

    def collective(self, collective: str, nbytes: float, kind: str, c: RankClass) -> Timing:
        shape = self.loaded_shape(kind, c)
        key = (kind, collective, nbytes, shape)
        pick = self.chosen.get(key)
        if pick is None:
            pick = self.chosen[key] = self.shape_cost(collective, nbytes, shape)
        if isinstance(shape, LoadedShape):
            return Timing(pick.seconds, self.tier_load(kind, c, pick))
        return Timing(pick.seconds)

    def group_collective(self, collective: str, nbytes: float, devices: tuple) -> Timing:
        shape = group_shape(devices, self.topo)
        key = ("group", collective, nbytes, shape)
        pick = self.chosen.get(key)
        if pick is None:
            pick = self.chosen[key] = self.shape_cost(collective, nbytes, shape)
        return Timing(pick.seconds)

    def transfer(self, nbytes: float, link_class: str) -> float:
        return p2p_time(nbytes, link_class, self.topo)

    def p2p(self, src: int, dst: int, nbytes: float) -> Timing:
        return Timing(self.transfer(nbytes, self.topo.link_class_name(src, dst)))

    def sends(self, c: RankClass, peer: int, nbytes: float, link_class: str) -> Timing:
        """Every rank has its own link to its peer, so the class's sends meet only on an
        oversubscribed tier: there a send that leaves its leaf runs at the per-flow bandwidth the
        whole stage's sends to that pipeline position get at once (`Topology.tier_bandwidth`, as
        for a ring) and carries its share of their tier load, which the engine shares with what
        overlaps it; elsewhere it takes the link class."""
        if not self.topo.oversubscribed or link_class not in ("spine", "core"):
            return Timing(self.transfer(nbytes, link_class))
        key = (c.stage, peer)
        if key not in self._sends:
            per = self.per_stage
            lo = c.stage * per
            place = self.place if self.place is not None else range(self.grid.world)
            src = np.array([place[r] for r in range(lo, lo + per)], dtype=np.int64)
            dst = np.array([place[r - lo + peer * per] for r in range(lo, lo + per)], dtype=np.int64)
            bw = self.topo.tier_bandwidth(src, dst)
            self._sends[key] = (bw, self.topo.tier_loads(src, dst, bw) if bw is not None else ())
        bw, loads = self._sends[key]
        if bw is None:
            return Timing(self.transfer(nbytes, link_class))
        link = self.topo._link_by_class(link_class)
        transfer = nbytes / (bw * link.efficiency)
        t = link.latency + transfer
        return Timing(t, self._class_share(loads, c, transfer / t))

    def choices(self) -> list:
        return [CollectiveChoice(kind, coll, n, shape.size, None, c) for (kind, coll, n, shape), c in self.chosen.items()]

    def links(self, ops: list[EOp], timeline: Timeline) -> tuple:
        return None, None


def ring_flows(grid: RankGrid, kind: str, place: list | None, topo: Topology) -> dict:
    """Per pipeline stage, (sources, destinations) of the network flows of one ring step run by
    every group of `kind` in the stage at once, as the flow backend lays them out: member i sends
    to member i+1 (the last to the first); a hop between two nodes is striped member c to member
    c over the k members each node holds (NCCL's channels), so it is k flows."""
    out: dict = {}
    for g in grid.groups(kind):
        src, dst = out.setdefault(grid.coords(g[0])["stage"], ([], []))
        devs = [place[r] for r in g] if place else list(g)
        by_node: dict = {}
        for d in devs:
            by_node.setdefault(topo.node_of(d), []).append(d)
        if len(by_node) <= 1:
            continue
        for a, b in zip(devs, devs[1:] + devs[:1]):
            na, nb = topo.node_of(a), topo.node_of(b)
            if na == nb:
                continue
            on_a, on_b = by_node[na], by_node[nb]
            k = min(len(on_a), len(on_b))
            if k <= 1:
                src.append(a)
                dst.append(b)
            else:
                src += on_a[:k]
                dst += on_b[:k]
    return out
