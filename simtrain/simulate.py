"""The whole pipeline for one training step: Scenario -> StepResult.

    schedule = schedule_for(parallel, microbatches)     per-rank actions, chunks, routes; validated
    workload = build_workload(scenario, num_stages)     per-model-stage operator templates
    classes  = equivalence_classes(grid, topology)      ranks that behave identically, once each
    ops      = Lowering(...).lower()                    per-class programs on streams
    timeline = engine.run(ops)                          SimPy
    result   = StepResult(...)                          attribution, memory, MFU (simtrain.results.step)

With `training.forward_only` the step is one forward pass over the batch: the schedule's
forwards alone, no gradient reduction or optimizer step, weights-only static memory, one
microbatch's forward working set as activations, and forward FLOPs for MFU and HFU.

Memory entries are per pipeline rank ("stage" is the rank's pipeline index; "model_stages" the
stages its chunks hold). `inflight_peak` counts microbatch-chunks whose activations were alive at
once; `inflight_microbatches_peak` scales it to stages of L/pp layers (x pp / model stages): a
V-shape's half-size chunks count 1/2, DualPipe's full-size stages 1.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from simtrain.cost.roofline import CalibratedRoofline, ComputeCostModel
from simtrain.cost.scaled import ScaledCosts
from simtrain.engine import core as engine
from simtrain.hardware.devices import device_of, get_device
from simtrain.hardware.topology import Topology
from simtrain.network.backend import NetworkBackend
from simtrain.network.nccl_tuning import borrowed_note
from simtrain.network.registry import backend_for
from simtrain.plan.grid import RankClass, RankGrid, equivalence_classes, placement_of
from simtrain.plan.heterogeneity import DeviceFactors, device_factors, variability_of
from simtrain.program.ir import EOp
from simtrain.program.lowering import Lowering
from simtrain.program.optimizer import steady_step_time
from simtrain.results.attribution import KINDS, attribute
from simtrain.results.critical_path import critical_path
from simtrain.results.kinds import compute_by_kind, device_time_by_kind
from simtrain.results.memory import (  # noqa: F401 (re-exported)
    budget_of,
    capacity_of,
    comm_buffers,
    largest_layer,
    memory_fit,
    rank_static,
    static_memory,
)
from simtrain.results.step import (
    Breakdown,
    Collective,
    ContextParallel,
    CriticalPathEntry,
    Heterogeneity,
    Links,
    MemoryEntry,
    MixedStage,
    MoeLayer,
    MoeSection,
    StageEntry,
    StepResult,
    Stragglers,
)
from simtrain.schedules import SCHEDULES, forward_pass, schedule_for
from simtrain.schedules.zb_auto import stage_times
from simtrain.spec.scenario import Scenario
from simtrain.workload.build import build_workload
from simtrain.workload.flops import hardware_flops_per_step, model_flops_per_step
from simtrain.workload.ir import Comm, Ring, StageWork
from simtrain.workload.moe import routing_shares


@dataclass
class StepRun:
    """Everything a step simulation produced: the result plus what the exporters need."""
    result: StepResult
    ops: list[EOp]
    timeline: engine.Timeline
    classes: list[RankClass]
    topology: Topology
    wall_s: float
    link_series: dict | None = None      # busiest links -> [(time, utilisation)] (flow backend)


def collectives_section(network: NetworkBackend) -> list[dict]:
    """Which algorithm and protocol each distinct collective of the step ran with (the tuner's
    choice, or the scenario's), and its predicted time split into latency and transfer."""
    out = []
    for ch in sorted(network.choices(), key=lambda r: (r.kind, r.collective, r.bytes, r.group_size,
                                                         r.stage if r.stage is not None else -1)):
        c = ch.cost
        row = {"kind": ch.kind, "collective": ch.collective, "bytes": ch.bytes, "group_size": ch.group_size,
               "algorithm": c.algorithm, "protocol": c.protocol, "seconds": c.seconds, "latency_s": c.latency,
               "transfer_s": c.transfer}
        if ch.stage is not None:
            row["stage"] = ch.stage
        out.append(row)
    return out


def straggler_section(sc: Scenario, topo: Topology, classes: list[RankClass], ops: list[EOp], tl: engine.Timeline,
                      factors: DeviceFactors, fuse: bool, costs: ComputeCostModel | None, place: list[int],
                      rfac: tuple, network: NetworkBackend | None = None) -> Stragglers:
    """The counterfactual (the same scenario without stragglers and jitter, simulated now, with
    the caller's network backend where one was given), the straggling devices, and the ranks on
    the critical path with their time on it."""
    clean = replace(sc, cluster=replace(sc.cluster, stragglers=(), jitter=None))
    base = simulate(clean, topo, costs, fuse=fuse, network=network).result.step_time_s
    by = {c.id: c for c in classes}
    on_path: dict = {}
    for cid, secs in critical_path(ops, tl):
        on_path[cid] = on_path.get(cid, 0.0) + secs
    chosen = set(factors.chosen)
    path = []
    for cid, secs in sorted(on_path.items(), key=lambda kv: (-kv[1], kv[0])):
        c = by[cid]
        d = c.device
        strag = [r for r in c.ranks if int(place[r]) in chosen]
        path.append(CriticalPathEntry(
            class_id=cid, representative_rank=c.ranks[0], ranks=c.multiplicity, stage=c.stage,
            device=topo.device_id(d), seconds=secs, straggler=bool(strag), straggler_ranks=strag[:20],
            factors={"compute": float(rfac[0][c.ranks[0]]), "memory": float(rfac[1][c.ranks[0]]), "link": float(rfac[2][c.ranks[0]])}))
    step = tl.step_time
    return Stragglers(devices=[topo.device_id(d) for d in factors.chosen[:50]], count=len(factors.chosen),
                      step_time_without_s=base, slowdown=step / base if base > 0 else 0.0, critical_path=path[:20])


def mixed_section(grid: RankGrid, place: list[int], factors: DeviceFactors) -> Heterogeneity:
    """Device types per pipeline stage, and a warning for every stage or tensor-parallel group
    that mixes types (its fast devices wait for its slow ones at every collective; place whole
    stages on one type and give slower stages fewer layers, parallel.layers_per_stage)."""
    dev = np.asarray([factors.device[int(d)] for d in place], dtype=object)
    stages, warnings = [], []
    per = grid.per_stage
    for s in range(grid.pp):
        kinds, counts = np.unique(dev[s * per:(s + 1) * per].astype(str), return_counts=True)
        stages.append(MixedStage(stage=s, devices={str(k): int(n) for k, n in zip(kinds, counts)}))
        if len(kinds) > 1:
            warnings.append(f"stage {s} mixes {', '.join(f'{n} {k}' for k, n in zip(kinds, counts))}: its faster devices wait for the slower ones")
    tp_members, _ = grid.group_arrays("tp")
    mixed_tp = sum(1 for row in tp_members if len(set(dev[row])) > 1)
    if mixed_tp:
        warnings.append(f"{mixed_tp} tensor-parallel groups mix device types")
    return Heterogeneity(stages=stages, warnings=warnings)


def moe_section(sc: Scenario, low: Lowering, ops: list[EOp], tl: engine.Timeline) -> MoeSection:
    """Routing and expert-parallel traffic of the step: per MoE layer, how uneven the expert-parallel
    ranks' loads are (largest rank's tokens over the mean) and what fraction of the assignments the
    capacity factor dropped; per rank and microbatch, the dispatch + combine bytes sent; and which
    expert-parallel rank is slowest (the most compute time)."""
    p, moe = sc.parallel, sc.model.moe
    per = moe.num_experts // p.ep
    layers = []
    for i, (shares, dropped) in enumerate(routing_shares(sc)):
        rank = [sum(shares[j * per:(j + 1) * per]) for j in range(p.ep)]
        mean = sum(rank) / p.ep
        layers.append(MoeLayer(layer=i, imbalance=(max(rank) / mean) if mean > 0 else 0.0, dropped_fraction=dropped,
                               hottest_ep_rank=max(range(p.ep), key=lambda j: (rank[j], -j))))
    a2a = {}
    for op in ops:
        if op.stream == "ep":
            a2a[op.cls] = a2a.get(op.cls, 0.0) + op.bytes
    comp = {}
    for op in ops:
        if op.stream == "compute":
            comp[op.cls] = comp.get(op.cls, 0.0) + tl.end[op.id] - tl.start[op.id]
    slow = max(low.classes, key=lambda c: (comp.get(c.id, 0.0), -c.id))
    m = sc.num_microbatches
    return MoeSection(
        num_experts=moe.num_experts, top_k=moe.top_k, ep=p.ep, etp=p.etp, expert_dp=sc.expert_dp,
        routing=moe.routing.distribution, capacity_factor=moe.capacity_factor,
        dropped_fraction_mean=sum(x.dropped_fraction for x in layers) / max(len(layers), 1),
        imbalance_max=max((x.imbalance for x in layers), default=1.0),
        ep_bytes_per_rank_per_microbatch=max(a2a.values(), default=0.0) / max(m, 1),
        slowest_ep_rank=slow.ep_rank, slowest_rank=slow.ranks[0], layers=layers)


def cp_section(sc: Scenario, work: tuple[StageWork, ...]) -> ContextParallel:
    """Context parallelism: the kind, tokens per rank, and per layer and microbatch the KV bytes
    each rank sends (forward, backward)."""
    lp = work[-1].layers[-1]
    def sent(items):
        tot = 0.0
        for it in items:
            if isinstance(it, Ring) and it.comm.kind == "cp":
                tot += it.transfers * it.comm.size_bytes
            elif isinstance(it, Comm) and it.kind == "cp":
                n = sc.parallel.cp
                tot += it.size_bytes * ((n - 1) / n)
        return tot
    return ContextParallel(cp=sc.parallel.cp, cp_kind=sc.parallel.cp_kind,
                           tokens_per_rank=sc.training.micro_batch_size * sc.model.seq_length / sc.parallel.cp,
                           bytes_sent_per_layer_forward=sent(lp.forward), bytes_sent_per_layer_backward=sent(lp.backward))


def simulate(sc: Scenario, topo: Topology, costs: ComputeCostModel | None = None, every_rank: bool = False, fuse: bool = True,
             network: NetworkBackend | None = None) -> StepRun:
    """`costs` replaces the calibrated compute cost model (any ComputeCostModel). `every_rank`
    simulates each rank on its own instead of one per equivalence class (the brute-force
    reference: the results must be the same). `fuse=False` keeps every class-local collective as
    its own op (the same results, twice the ops). `network` replaces the scenario's network
    backend (any NetworkBackend; by default the one `network.backend` names in the registry, with
    the device profile's measured collective tables)."""
    t0 = time.perf_counter()
    costs_given = costs is not None
    p = sc.parallel
    dev = device_of(sc.cluster)
    m = sc.num_microbatches
    d = SCHEDULES.get(p.schedule)
    times = None
    if d is not None and d.timed and not p.schedule_csv:
        # a searched schedule is built over the stages' profiled F / B / W times
        times = stage_times(build_workload(sc, d.num_stages(p.pp, p.vpp)), costs or CalibratedRoofline(dev, sc.training.precision))
    sched = schedule_for(p, m, times)
    if sc.training.forward_only:
        sched = forward_pass(sched)      # the configured schedule's forwards, in its order
    work = build_workload(sc, sched.num_stages)
    moe = sc.model.moe
    # uneven expert loads make expert-parallel ranks run different programs
    ep_split = moe is not None and p.ep > 1 and moe.routing.distribution != "uniform"
    works = {0: work}

    def work_of(ep_rank: int) -> tuple:
        if not ep_split:
            return work
        if ep_rank not in works:
            works[ep_rank] = build_workload(sc, sched.num_stages, ep_rank)
        return works[ep_rank]
    grid = RankGrid(p.tp, p.cp, p.dp, p.pp, p.ep, p.etp)
    place = placement_of(sc, grid, topo)
    het = sc.cluster.heterogeneous
    factors = device_factors(sc.cluster, topo.num_devices, topo.devices_per_node, sc.seed) if het else None
    if het:
        lock = grid.group_arrays("tp")[0] if sc.cluster.straggler_model == "lockstep" else None
        rcomp, rmem, rlink, rdev = factors.per_rank(place, lock)
    classes = equivalence_classes(grid, topo, place, mirror=sched.duplicated_stages, ep_split=ep_split, every_rank=every_rank,
                                  rank_key=factors.rank_key(rcomp, rmem, rlink, rdev) if het else None,
                                  experts=moe is not None)
    costs = costs or CalibratedRoofline(dev, sc.training.precision)
    class_costs, link_factor, dev_of = {}, {}, {}
    if het:
        bases = {dev.key: costs}
        for c in classes:
            d = c.device
            kind = factors.device[d]
            if kind not in bases:
                bases[kind] = CalibratedRoofline(get_device(kind), sc.training.precision)
            r0 = c.ranks[0]
            cf, mf = float(rcomp[r0]), float(rmem[r0])
            base = bases[kind]
            class_costs[c.id] = base if cf == mf == 1.0 else ScaledCosts(base, cf, mf)
            link_factor[c.id] = float(rlink[r0])
            dev_of[c.id] = kind
    var = variability_of(sc.cluster.variability, grid.world)
    if var is not None:
        # the slowest-member effect of per-device speed spread: one compute factor for every class
        # (order statistics, simtrain.plan.heterogeneity.Variability), so no class splits
        slowed: dict = {}
        for c in classes:
            cc = class_costs.get(c.id, costs)
            k = (id(cc.base), cc.compute, cc.memory) if isinstance(cc, ScaledCosts) else (id(cc), 1.0, 1.0)
            if k not in slowed:
                slowed[k] = (ScaledCosts(cc.base, cc.compute * var.factor, cc.memory) if isinstance(cc, ScaledCosts)
                             else ScaledCosts(cc, var.factor, 1.0))
            class_costs[c.id] = slowed[k]
    net_given = network
    network = network or backend_for(sc, topo, place, dev.collectives)
    interference = dev.slowdown_table()     # the folded bulk overlaps and the engine price the same slowdown
    low = Lowering(sc, topo, work, classes, sched, costs, place, work_of, fuse=fuse,
                   class_costs=class_costs, link_factor=link_factor, network=network,
                   interference=interference)
    ops = low.lower()
    tl = engine.run(ops, [c.id for c in classes], interference)
    if low.post_validation:
        # no barrier at the step boundary: steps follow each other at the longest rank span
        tl.step_time = steady_step_time(ops, tl.start, tl.end, low.validation_ops)
    attr = attribute(ops, tl, classes)
    step = tl.step_time

    nominal = build_workload(sc, sched.num_stages, uniform=True) if moe is not None else work
    mflops = model_flops_per_step(sc, nominal)
    hflops = hardware_flops_per_step(sc, nominal)
    peak = dev.peak(sc.training.precision)
    world = sc.world_size
    if het and sc.cluster.mixed:
        # mixed device types: MFU against the summed peaks of the devices in use
        peak = sum(get_device(factors.device[int(d)]).peak(sc.training.precision) for d in place) / world
    tokens = sc.training.global_batch_size * sc.model.seq_length

    stages = []
    for c in classes:
        a = attr[c.id]
        stages.append(StageEntry(
            class_id=c.id, stage=c.stage, model_stages=list(sched.stage_of[c.stage]),
            layers=sum(work[k].num_layers for k in sched.stage_of[c.stage]),
            ep_rank=c.ep_rank if ep_split else None,
            ranks=c.multiplicity, representative_rank=c.ranks[0], device=topo.device_id(c.device),
            compute_s=a["compute_s"], bubble_s=a["bubble_s"], exposed_comm_s={k: a["exposed"][k] for k in KINDS}))
    mixed = het and sc.cluster.mixed
    seen_stage = {}
    need = []               # (bytes, capacity) per class: the memory-fits rule
    peak_mem = 0.0
    buffers = comm_buffers(sc, *largest_layer(work))      # the same for every rank
    for c in classes:
        st = rank_static(sc, work, sched.stage_of[c.stage], buffers)
        act = tl.mem_peak[c.id]
        total = st.total + act
        capacity = (capacity_of(sc.cluster, get_device(dev_of[c.id]).memory_bytes, dev_of[c.id] == dev.key) if mixed
                    else capacity_of(sc.cluster, dev.memory_bytes))
        entry = MemoryEntry(stage=c.stage, weights=st.weights, gradients=st.gradients, optimizer=st.optimizer,
                            activations=act, communication_buffers=st.buffers, total=total,
                            inflight_peak=tl.inflight_peak[c.id],
                            inflight_microbatches_peak=tl.inflight_peak[c.id] * sched.pp / sched.num_stages,
                            device=dev_of[c.id] if mixed else None, capacity=capacity if mixed else None)
        if c.stage not in seen_stage or total > seen_stage[c.stage].total:
            seen_stage[c.stage] = entry
        peak_mem = max(peak_mem, total)
        need.append((total, capacity))
    memory = [seen_stage[s] for s in sorted(seen_stage)]
    fit = memory_fit(need, sc.cluster.reserve_of)
    budget = budget_of(sc.cluster, dev.memory_bytes)
    crit = max(classes, key=lambda c: (attr[c.id]["compute_s"], -c.id))
    ca = attr[crit.id]
    by_dev = device_time_by_kind(sched, crit.stage, work_of(crit.ep_rank), low.costs_of(crit))
    opt_s = sum(o.duration for o in ops if o.cls == crit.id and o.category == "opt" and o.kind == "compute")
    by_kind = compute_by_kind(by_dev, ca["compute_s"], opt_s)
    bubble_frac = sum(attr[c.id]["bubble_s"] * c.multiplicity for c in classes) / (step * world) if step > 0 else 0.0
    result = StepResult(
        scenario=sc.name,
        step_time_s=step,
        tokens_per_s=tokens / step if step > 0 else 0.0,
        mfu=mflops / (step * world * peak) if step > 0 else 0.0,
        hfu=hflops / (step * world * peak) if step > 0 else 0.0,
        model_flops_per_step=mflops,
        hardware_flops_per_step=hflops,
        bubble_fraction=bubble_frac,
        peak_memory_bytes=peak_mem,
        memory_capacity_bytes=budget.capacity,
        memory_reserve_bytes=budget.reserve,
        usable_memory_bytes=budget.usable,
        fits_in_memory=fit.fits,
        memory_shortfall_bytes=fit.shortfall_bytes,
        num_devices=world,
        num_microbatches=m,
        schedule=sched.name,
        model_stages=sched.num_stages,
        device=dev.key,
        precision=sc.training.precision,
        fp8_recipe=sc.training.fp8_recipe if sc.training.precision == "fp8" else None,
        breakdown=Breakdown(rank=crit.ranks[0], stage=crit.stage, compute_s=ca["compute_s"], bubble_s=ca["bubble_s"],
                            exposed_comm_s={k: ca["exposed"][k] for k in KINDS}, compute_by_kind_s=by_kind,
                            device_time_by_kind_s=by_dev),
        stages=stages,
        memory=memory,
        simulated_classes=len(classes),
        simulated_ops=len(ops),
        coverage=sorted(costs.coverage | {f"{dev.key}: {n}" for n in network.notes}
                        | {f"{dev.key}: {n}" for n in (borrowed_note(dev.vendor, bool(dev.collectives)),) if n}
                        | ({f"variability: compute x{var.factor:.4f}, the slowest of {var.group:,} devices at sigma "
                            f"{var.sigma:.2%} ({var.source})"} if var is not None else set())),
        calibration_warnings=sorted(getattr(costs, "outside", set()) | {f"{dev.key}: {n}" for n in network.notes}),
        forward_only=True if sc.training.forward_only else None,
    )
    result.collectives = [Collective.from_row(row) for row in collectives_section(network)]
    if mixed:
        result.heterogeneity = mixed_section(grid, place, factors)
    if sc.cluster.stragglers or (sc.cluster.jitter is not None and sc.cluster.jitter.sigma > 0):
        result.stragglers = straggler_section(sc, topo, classes, ops, tl, factors, fuse, costs if costs_given else None,
                                              place, (rcomp, rmem, rlink), net_given)
    if moe is not None:
        result.moe = moe_section(sc, low, ops, tl)
    if p.cp > 1:
        result.context_parallel = cp_section(sc, work)
    links, series = network.links(ops, tl)
    if links is not None:
        result.links = Links.from_report(links)
    return StepRun(result, ops, tl, classes, topo, time.perf_counter() - t0, series)
