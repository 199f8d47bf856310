"""The network seam: what the lowering and the result ask of a network model.

A backend takes one step's communication as the lowering meets it -- a rank class's collective
(its kind, collective and bytes), a point-to-point transfer (bytes over a link class), a
pipeline send that every rank of a class makes at once -- and returns its `Timing`: the seconds
it takes when nothing else runs, the load it leaves on the links that the engine shares among
overlapping ops (`engine.core.FluidNetwork`), and the key the backend's report knows it by. A
backend whose ops all contend says so (`contended`); one where only some do (the analytical
backend's rings over an oversubscribed tier) answers `shares_links` per class and kind.
After the run it gives the result its collectives section (which algorithm and protocol each
distinct collective ran with) and, where it models links, the busiest links and their load
over the step.

Backends are built per step, `factory(scenario, topology, placement, tables)`, where `tables`
are the device profile's measured collective sweeps (`Device.collectives`); the registry
(`network.registry`) maps the scenario's `network.backend` name to its factory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from simtrain.network.collectives import Cost
from simtrain.plan.grid import RankClass

if TYPE_CHECKING:
    from simtrain.engine.core import Timeline
    from simtrain.program.ir import EOp


@dataclass(frozen=True)
class Timing:
    """One collective or transfer as a backend times it."""
    seconds: float          # when it runs alone
    load: tuple = ()        # ((link, fraction of its capacity used when alone), ...); () shares nothing
    key: object = None      # the backend's name for it (its report counts the ops that carry it)


@dataclass(frozen=True)
class CollectiveChoice:
    """One distinct collective of the step and how the backend ran it (the result's section)."""
    kind: str
    collective: str
    bytes: float
    group_size: int
    stage: int | None       # the pipeline stage it was timed for, where the backend times per stage
    cost: Cost


class NetworkBackend(Protocol):
    """What a network model answers for one step."""

    contended: bool
    """True where an op's time depends on what else runs (its load is shared during the run): the
    lowering then keeps every collective as its own op and merges no compute chains across them."""

    notes: set
    """What the backend had to stretch (a measured table used beyond its sizes or group): reported
    with the result's calibration warnings."""

    def shares_links(self, kind: str, c: RankClass) -> bool:
        """True where class c's collectives of `kind` may carry a link load (their time then
        depends on what else runs, so the lowering keeps each as its own op)."""
        ...

    def collective(self, collective: str, nbytes: float, kind: str, c: RankClass) -> Timing:
        """A collective of `nbytes` (the nccl-tests buffer) over class c's group of `kind`."""
        ...

    def transfer(self, nbytes: float, link_class: str) -> float:
        """Seconds of one point-to-point transfer over a link of the class, alone on it."""
        ...

    def sends(self, c: RankClass, peer: int, nbytes: float, link_class: str) -> Timing:
        """Every rank of class c sends `nbytes` to the rank at pipeline position `peer` of its
        pipeline group, all at once, over links of `link_class`."""
        ...

    def group_collective(self, collective: str, nbytes: float, devices: tuple) -> Timing:
        """A collective of `nbytes` (the nccl-tests buffer) over one explicit group of devices,
        run by its members alone (a replayed trace's process group). Each member's op carries
        1/len(devices) of the group's link load."""
        ...

    def p2p(self, src: int, dst: int, nbytes: float) -> Timing:
        """One point-to-point transfer of `nbytes` from device src to device dst."""
        ...

    def choices(self) -> list:
        """The CollectiveChoice of every distinct collective timed so far."""
        ...

    def links(self, ops: list[EOp], timeline: Timeline) -> tuple:
        """(links section of the result or None, busiest link -> [(time, utilisation)] or None)
        after the run of `ops`."""
        ...
