"""Network backends by name: the scenario's `network.backend` -> the factory that builds the
backend for one step, `factory(scenario, topology, placement, tables) -> NetworkBackend`.

A new backend is one module with its class and one `register_backend` call (here for the
shipped ones; a caller's own backend registers itself the same way).
"""
from __future__ import annotations

from typing import Callable

from simtrain.hardware.topology import Topology
from simtrain.network.analytical import AnalyticalBackend
from simtrain.network.backend import NetworkBackend
from simtrain.network.flow_backend import FlowBackend
from simtrain.spec.scenario import Scenario

BACKENDS: dict = {}


def register_backend(name: str, factory: Callable[..., NetworkBackend]) -> None:
    """Makes `factory` the backend a scenario selects with `network.backend: <name>`."""
    BACKENDS[name] = factory


def backend_for(sc: Scenario, topo: Topology, place: list[int] | None = None, tables: tuple = ()) -> NetworkBackend:
    """The scenario's backend for one step over this placement, with the device's measured
    collective tables."""
    name = sc.network.backend
    factory = BACKENDS.get(name)
    if factory is None:
        raise ValueError(f"unknown network backend {name!r}; registered: {', '.join(sorted(BACKENDS))}")
    return factory(sc, topo, place, tables)


register_backend("analytical", AnalyticalBackend)
register_backend("flow", FlowBackend)
