"""Closed-form step estimate (beside the pipeline, not part of it): the analytic formula a
spreadsheet model would use, from the same workload, costs and collective model as the
simulation, in microseconds instead of seconds. The scale benchmark times it for comparison, and
a plan search can prune with it before simulating.

    step ~ (m + (p - 1) / v) x max over stages (t_F + t_B) + t_opt + t_dp_exposed

with t_F, t_B a microbatch's forward and backward (recompute included) on one stage, communication
of the tp / cp / ep kinds added in series (Megatron issues it synchronously), m microbatches,
p pipeline ranks, v chunks per rank (Narayanan et al. SC'21: the interleaved bubble is (p-1)/v of
a stage time), the optimizer step, and the gradient reduction of the last layer's bucket (the
rest overlaps the backward when overlap_grad_reduce is on, none of it otherwise). No contention,
no stragglers, no schedule-specific overlap: that is what the simulation is for.
"""
from __future__ import annotations

from simtrain.collectives import choose
from simtrain.costs import CalibratedRoofline
from simtrain.devices import device_of
from simtrain.parallel import RankGrid, group_shape, placement_of
from simtrain.program import OPT_BYTES_PER_PARAM
from simtrain.schedules import schedule_for
from simtrain.workload import Comm, Ring, build_workload


def estimate(sc, topo, costs=None) -> dict:
    """`costs`: any ComputeCostModel (default: the device's calibrated roofline, as `simulate`)."""
    p = sc.parallel
    dev = device_of(sc.cluster)
    costs = costs or CalibratedRoofline(dev, sc.training.precision)
    m = sc.num_microbatches
    sched = schedule_for(p, m)
    work = build_workload(sc, sched.num_stages)
    grid = RankGrid(p.tp, p.cp, p.dp, p.pp, p.ep, p.etp)
    place = placement_of(sc, grid, topo)
    shapes = {}
    for k in ("tp", "cp", "ep", "etp", "dp", "edp"):
        size = {"tp": p.tp, "cp": p.cp, "ep": p.ep, "etp": p.etp, "dp": p.dp * p.cp, "edp": sc.expert_dp}[k]
        if size > 1 and (k in ("tp", "cp", "dp") or sc.model.moe is not None):
            g = grid.group_arrays(k)[0][0]            # the first group of the kind (rank 0's)
            shapes[k] = group_shape([place[int(r)] for r in g], topo)
    net = sc.network

    def comm(c: Comm) -> float:
        if c.kind not in shapes:
            return 0.0
        if c.collective == "send_recv":
            from simtrain.collectives import p2p_time
            return p2p_time(c.size_bytes, shapes[c.kind].span or "scale_up", topo)
        return choose(c.collective, c.size_bytes, shapes[c.kind], topo, net.algorithm_for(c.collective), net.protocol).seconds

    def items(seq) -> float:
        t = 0.0
        for it in seq:
            if isinstance(it, Comm):
                t += comm(it)
            elif isinstance(it, Ring):
                c = sum(costs.duration(o) for o in it.segment)
                t += c + (it.steps - 1) * max(c, comm(it.comm))
            else:
                t += sum(costs.duration(o) for o in it)
        return t

    stage_t = []
    for w in work:
        progs = list(w.layers) + [x for x in (w.pre, w.post) if x is not None]
        f = sum(items(lp.forward) for lp in progs)
        b = sum(items(lp.recompute) + items(lp.backward) for lp in progs)
        stage_t.append(f + b)
    per_rank = [sum(stage_t[k] for k in sched.stage_of[r]) / len(sched.stage_of[r]) for r in range(p.pp)]
    v = sched.num_stages // p.pp if not sched.duplicated_stages else 1
    chunk = max(per_rank)
    pipeline = (m * v + (p.pp - 1)) * chunk / v
    params = max(sum(work[k].params for k in sched.stage_of[r]) for r in range(p.pp))
    local = params / (p.dp * p.cp if p.zero_stage >= 1 else 1)
    opt = costs.memory_time(OPT_BYTES_PER_PARAM * local)
    grad_bytes = 2.0 if sc.training.precision == "fp16" else 4.0
    dp_t = 0.0
    if "dp" in shapes:
        coll = "all_reduce" if p.zero_stage == 0 else "reduce_scatter"
        bucket = min(p.bucket_size_params, params) if p.overlap_grad_reduce else params
        dp_t = choose(coll, grad_bytes * bucket, shapes["dp"], topo, net.algorithm_for(coll), net.protocol).seconds
    step = pipeline + opt + dp_t
    return {"step_time_s": step, "pipeline_s": pipeline, "optimizer_s": opt, "dp_exposed_s": dp_t,
            "bubble_fraction": (p.pp - 1) / (m * v + p.pp - 1)}
