"""The closed-form network backend: collectives by NCCL's cost model (`collectives.choose`),
transfers as latency plus bytes over bandwidth, no contention between ops.

Takes the scenario's algorithm and protocol choices and the device profile's measured collective
tables (where a table covers a collective, the measurement times it); returns a `Timing` without
link loads for every collective and transfer, caches each distinct collective's `Cost` for the
result's collectives section, and has no link report.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from simtrain.hardware.topology import Topology
from simtrain.network.backend import CollectiveChoice, Timing
from simtrain.network.collectives import Cost, choose, p2p_time
from simtrain.plan.grid import GroupShape, RankClass
from simtrain.spec.scenario import Scenario

if TYPE_CHECKING:
    from simtrain.engine.core import Timeline
    from simtrain.program.ir import EOp


class AnalyticalBackend:
    contended = False

    def __init__(self, sc: Scenario, topo: Topology, place=None, tables: tuple = ()):
        self.topo = topo
        self.network = sc.network
        self.tables = tuple(tables or ())
        self.notes: set = set()
        self.chosen: dict = {}       # (kind, collective, bytes, group shape) -> Cost

    def shape_cost(self, collective: str, nbytes: float, shape: GroupShape) -> Cost:
        """The Cost of a collective over a group of this shape (the scenario's algorithm and
        protocol, the measured tables where they apply)."""
        net = self.network
        return choose(collective, nbytes, shape, self.topo, net.algorithm_for(collective), net.protocol,
                      self.tables, self.notes)

    def collective(self, collective: str, nbytes: float, kind: str, c: RankClass) -> Timing:
        shape = c.shape_of(kind)
        key = (kind, collective, nbytes, shape)
        pick = self.chosen.get(key)
        if pick is None:
            pick = self.chosen[key] = self.shape_cost(collective, nbytes, shape)
        return Timing(pick.seconds)

    def transfer(self, nbytes: float, link_class: str) -> float:
        return p2p_time(nbytes, link_class, self.topo)

    def sends(self, c: RankClass, peer: int, nbytes: float, link_class: str) -> Timing:
        # every rank has its own link to its peer: the class's sends do not meet
        return Timing(self.transfer(nbytes, link_class))

    def choices(self) -> list:
        return [CollectiveChoice(kind, coll, n, shape.size, None, c) for (kind, coll, n, shape), c in self.chosen.items()]

    def links(self, ops: list[EOp], timeline: Timeline) -> tuple:
        return None, None
