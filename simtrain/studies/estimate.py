"""Closed-form step estimate (beside the pipeline, not part of it): the analytic formula a
spreadsheet model would use, from the same workload, costs and collective model as the
simulation, in microseconds instead of seconds. The scale benchmark times it for comparison, and
a plan search can prune with it before simulating.

    step ~ (m + (p - 1) / v) x max over stages (t_F + t_B) + t_opt + t_dp_exposed

with t_F, t_B a microbatch's forward and backward (recompute included) on one stage, communication
of the tp / cp / ep kinds added in series (Megatron issues it synchronously), m microbatches,
p pipeline ranks, v chunks per rank (Narayanan et al. SC'21: the interleaved bubble is (p-1)/v of
a stage time), the optimizer step, and the gradient reduction that the last microbatch's backward
cannot hide: at least its last bucket, and all of it beyond that backward's length (gradients
accumulate over microbatches, so only the last backward overlaps; none of it without
overlap_grad_reduce). The per-device speed spread (`cluster.variability`) slows compute by the
same slowest-of-world factor as in the simulation. No contention, no stragglers, no
schedule-specific overlap: that is what the simulation is for.
Worked example (interleaved, m 8, p 4, v 2, 1 s of F + B per rank and microbatch): (16 + 3) x
0.5 s = 9.5 s of pipeline.
"""
from __future__ import annotations

from collections.abc import Callable

from simtrain.cost.roofline import CalibratedRoofline, ComputeCostModel, sequence_time
from simtrain.cost.scaled import ScaledCosts
from simtrain.hardware.devices import device_of
from simtrain.hardware.topology import Topology
from simtrain.network.collectives import Cost, choose, p2p_time
from simtrain.plan.grid import RankGrid, group_shape, placement_of
from simtrain.plan.heterogeneity import variability_of
from simtrain.program.optimizer import OPT_BYTES_PER_PARAM
from simtrain.schedules import Schedule, schedule_for
from simtrain.spec.scenario import Scenario
from simtrain.workload.build import build_workload
from simtrain.workload.ir import Comm, Ring, grad_bytes


def estimate(sc: Scenario, topo: Topology, costs: ComputeCostModel | None = None, schedule: Schedule | None = None,
             collective: Callable[..., Cost] = choose) -> dict:
    """`costs`: any ComputeCostModel (default: the device's calibrated roofline, as `simulate`).
    `schedule`: the plan's schedule when the caller built it already (default: schedule_for);
    `collective`: what picks a collective's algorithm and cost (default network.collectives.choose;
    a plan search passes a memoized one)."""
    p = sc.parallel
    dev = device_of(sc.cluster)
    costs = costs or CalibratedRoofline(dev, sc.training.precision)
    var = variability_of(sc.cluster.variability, sc.world_size)
    if var is not None:
        costs = ScaledCosts(costs, var.factor, 1.0)
    m = sc.num_microbatches
    sched = schedule if schedule is not None else schedule_for(p, m)
    work = build_workload(sc, sched.num_stages)
    grid = RankGrid(p.tp, p.cp, p.dp, p.pp, p.ep, p.etp)
    place = placement_of(sc, grid, topo)
    shapes = {}
    for k in grid.kinds(sc.model.moe is not None):
        if grid.size(k) > 1:
            g = grid.group_arrays(k)[0][0]            # the first group of the kind (rank 0's)
            shapes[k] = group_shape([place[int(r)] for r in g], topo)
    net = sc.network

    def comm(c: Comm) -> float:
        if c.kind not in shapes:
            return 0.0
        if c.collective == "send_recv":
            return p2p_time(c.size_bytes, shapes[c.kind].span or "scale_up", topo)
        return collective(c.collective, c.size_bytes, shapes[c.kind], topo, net.algorithm_for(c.collective), net.protocol).seconds

    def items(seq) -> float:
        t = 0.0
        for it in seq:
            if isinstance(it, Comm):
                t += comm(it)
            elif isinstance(it, Ring):
                t += it.time(sequence_time(costs, it.segment), comm(it.comm))
            else:
                t += sequence_time(costs, it)
        return t

    stage_f, stage_b = [], []
    for w in work:
        progs = list(w.layers) + [x for x in (w.pre, w.post) if x is not None]
        stage_f.append(sum(items(lp.forward) for lp in progs))
        stage_b.append(sum(items(lp.recompute) + items(lp.backward) for lp in progs))
    # per pipeline rank and microbatch, all its chunks
    F = [sum(stage_f[k] for k in sched.stage_of[r]) for r in range(p.pp)]
    B = [sum(stage_b[k] for k in sched.stage_of[r]) for r in range(p.pp)]
    v = sched.num_stages // p.pp if not sched.duplicated_stages else 1
    busiest = max(range(p.pp), key=lambda r: (F[r] + B[r], -r))
    # (m·v + p − 1) chunk-passes of one chunk's time (F + B) / v: (m + (p − 1)/v) x (F + B)
    pipeline = (m * v + (p.pp - 1)) * (F[busiest] + B[busiest]) / v
    params = max(sum(work[k].params for k in sched.stage_of[r]) for r in range(p.pp))
    local = params / (p.dp * p.cp if p.zero_stage >= 1 else 1)
    opt = costs.memory_time(OPT_BYTES_PER_PARAM * local)
    gbytes = grad_bytes(sc.training)
    dp_t = 0.0
    if "dp" in shapes:
        coll = "all_reduce" if p.zero_stage == 0 else "reduce_scatter"
        bucket = min(p.bucket_size_params, params)
        n_buckets = -(-params // bucket)
        one = collective(coll, gbytes * bucket, shapes["dp"], topo, net.algorithm_for(coll), net.protocol).seconds
        whole = n_buckets * one
        # gradients accumulate over microbatches: the reduction can only overlap the last
        # microbatch's backward on the rank; the last bucket always comes after it
        dp_t = max(one, whole - B[busiest]) if p.overlap_grad_reduce else whole
    step = pipeline + opt + dp_t
    return {"step_time_s": step, "pipeline_s": pipeline, "optimizer_s": opt, "dp_exposed_s": dp_t,
            "bubble_fraction": (p.pp - 1) / (m * v + p.pp - 1)}
