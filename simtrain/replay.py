"""A recorded workload instead of a modelled one: an MLCommons Chakra execution trace (ASTRA-sim's
input, or simtrain's own export) replayed on the scenario's cluster.

    trace    = read_trace(DIR)                          every rank's nodes, checked (program.chakra)
    ops      = lower_trace(trace, network, costs)       one class per rank; comm through the backend
    timeline = engine.run(ops)                          the same SimPy engine as a training step
    result   = ReplayResult(...)                        per-rank compute / exposed comm / idle

The scenario gives the cluster (topology, device, network backend, algorithms, seed); its model,
parallelism and training sections play no part. Rank r runs on device r of the topology.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from simtrain.cost.roofline import CalibratedRoofline
from simtrain.engine import core as engine
from simtrain.errors import ConfigError, Problem
from simtrain.hardware.devices import device_of
from simtrain.hardware.topology import Topology
from simtrain.network.backend import NetworkBackend
from simtrain.network.registry import backend_for
from simtrain.program.chakra import Trace, lower_trace, read_trace
from simtrain.results.replay import ReplayResult, rank_times
from simtrain.results.step import Collective, Links
from simtrain.simulate import collectives_section
from simtrain.spec.scenario import Scenario


@dataclass
class ReplayRun:
    result: ReplayResult
    ops: list
    timeline: engine.Timeline
    trace: Trace
    topology: Topology
    wall_s: float
    link_series: dict | None = None


def replay_chakra(spec: str | Path, sc: Scenario, topo: Topology, trace_durations: bool = False,
                  network: NetworkBackend | None = None,
                  trace: Trace | None = None) -> ReplayRun:
    """Replays the trace at `spec` (DIR or DIR/PREFIX) on the scenario's cluster. `trace_durations`
    keeps every compute node's recorded duration even where it gives num_ops. `network` replaces
    the scenario's backend (any NetworkBackend with group_collective and p2p)."""
    t0 = time.perf_counter()
    t = trace or read_trace(spec)
    if t.world > topo.num_devices:
        raise ConfigError([Problem(str(t.source), "", f"the trace has {t.world} ranks but the topology {topo.name} "
                                   f"holds {topo.num_devices} devices",
                                   "choose a larger topology (--set cluster.topology=...) or a trace of fewer ranks")])
    dev = device_of(sc.cluster)
    costs = CalibratedRoofline(dev, sc.training.precision)
    network = network or backend_for(sc, topo, None, dev.collectives)
    ops, counts = lower_trace(t, network, costs, trace_durations)
    tl = engine.run(ops, list(range(t.world)), dev.slowdown_table())
    step = tl.step_time
    per = rank_times(ops, tl.start, tl.end, t.world, step, topo.device_id)
    busy = max(per, key=lambda x: (x.compute_s, -x.rank))
    coverage = set(network.notes)
    if counts["cost_model"]:
        coverage |= costs.coverage
        coverage.add("compute nodes with num_ops priced as the square GEMM of num_ops FLOPs, bounded below by "
                     "tensor_size bytes at the memory-bound efficiency")
    result = ReplayResult(
        trace=str(t.source), prefix=t.prefix, chakra_version=t.version, ranks=t.world, nodes=t.node_counts(),
        step_time_s=step, compute_from=counts, busiest_rank=busy.rank, compute_s=busy.compute_s,
        exposed_comm_s=busy.exposed_comm_s, idle_s=busy.idle_s, per_rank=per,
        collectives=[Collective.from_row(row) for row in collectives_section(network)],
        device=dev.key, topology=topo.name, network_backend=sc.network.backend, simulated_ops=len(ops),
        coverage=sorted(coverage), kind="chakra")
    links, series = network.links(ops, tl)
    if links is not None:
        result.links = Links.from_report(links)
    return ReplayRun(result, ops, tl, t, topo, time.perf_counter() - t0, series)
