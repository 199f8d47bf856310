"""The end of one rank class's program: DualPipe's gradient exchange between the two ranks that
hold the same stages, the global gradient-norm all-reduce, and the optimizer step.

With optimizer post-validation (`training.optimizer_post_validation`; Qi et al., "Zero Bubble
Pipeline Parallelism", ICLR'24 §4) the optimizer steps optimistically: it does not wait for the
gradient-norm / NaN all-reduce, which still runs and validates the step afterwards (a failed
check rolls the step back and redoes it; clipping and overflow are rare in stable training, so
the rollback is not timed). Nothing then holds the ranks together at the step boundary: each
pipeline rank starts its next step when its own step ends, and the steady-state step time is the
longest span of one rank class from its first op to its last (`steady_step_time`), not the span
of the whole step from a common start.

Takes the class's schedule walk (`lowering.ClassLowering`), the op ids the step waits for (its
gradient reductions) and the class's dense and expert parameter counts; adds the exchange, the
gradient-norm all-reduce and the optimizer op to the step's op list and returns the optimizer op.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from simtrain.hardware.devices import get_device
from simtrain.program.ir import EOp
from simtrain.schedules import SCHEDULES

if TYPE_CHECKING:
    from simtrain.program.gradients import GradientTraffic
    from simtrain.program.lowering import ClassLowering
    from simtrain.spec.scenario import Scenario

OPT_BYTES_PER_PARAM = 34.0
"""Adam step with fp32 master weights, memory-bound: read grad, master, m, v (4 x 4 B), write
master, m, v (3 x 4 B) and the 16-bit weight (2 B), plus one 4 B read of the gradient for the
global-norm clip: 16 + 14 + 4 = 34 bytes per local parameter."""


GRAD_NORM_BYTES = 4.0
"""Bytes of the gradient-norm all-reduce: one fp32 value, the sum of squares of the local
gradients (Megatron-LM megatron/core/optimizer/clip_grads.py, get_grad_norm_fp32:
`total_norm` all-reduced with ReduceOp.SUM)."""


def post_validation(sc: Scenario) -> bool:
    """Whether the step validates the optimizer afterwards instead of waiting for the global
    all-reduce before it: `training.optimizer_post_validation`, or where the scenario leaves it
    out the schedule's default (on for the zero-bubble schedules, as the zero-bubble reference
    implementation runs them; off for a schedule read from CSV). A forward-only pass has no
    optimizer step."""
    t, p = sc.training, sc.parallel
    if t.forward_only:
        return False
    if t.optimizer_post_validation is not None:
        return t.optimizer_post_validation
    d = SCHEDULES.get(p.schedule)
    return bool(d is not None and not p.schedule_csv and d.post_validation)


def steady_step_time(ops: list[EOp], start: list, end: list, skip: Sequence[EOp]) -> float:
    """The step time when no rendezvous joins the ranks at the step boundary: every rank class
    starts its next step when its own last op ends, so steps follow each other at the longest
    span (last end minus first start) of one class; ops in `skip` (the post-step validation
    all-reduce, which overlaps the next step) are left out. With 1F1B-like schedules the last
    rank starts (p-1) forward hops after the first, so this is shorter than the whole step's span
    by up to that stagger: the 'parallelogram' of Qi et al. §4."""
    first: dict = {}
    last: dict = {}
    skipped = {op.id for op in skip}
    for op in ops:
        if op.id in skipped or end[op.id] is None:
            continue
        c = op.cls
        first[c] = min(first.get(c, start[op.id]), start[op.id])
        last[c] = max(last.get(c, end[op.id]), end[op.id])
    return max((last[c] - first[c] for c in last), default=0.0)


def grad_norm_barrier(prog: ClassLowering, deps: list[int]) -> list[int]:
    """The global gradient norm for clipping, after the gradient reduction and before the step.

    Megatron-LM all-reduces the squared norm over the optimizer's grad-stats group
    (megatron/core/optimizer/distrib_optimizer.py, get_grad_stats_parallel_group: "With the
    distributed optimizer, gradient statistics (num_zeros & norm) are reduced over all ranks in
    the distributed optimizer instance (versus only the model-parallel ranks with the
    non-distributed optimizer)"). simtrain models it as one all-reduce of GRAD_NORM_BYTES over
    every rank of the step, a rendezvous of every rank class: no rank's optimizer starts before
    the last rank has reduced its gradients. Without the distributed optimizer (ZeRO 0) the group
    is the model-parallel ranks, but each of them has first waited for its data-parallel gradient
    all-reduce, so the wait is the same; only the few-microsecond duration is that of the larger
    group. It is timed in closed form over the whole world's group shape (a few bytes: latency,
    no contention to share) and runs on the dp stream."""
    low, c = prog.low, prog.c
    ids = tuple(x.id for x in low.classes)
    op = low._new(c, stream="dp", kind="coll", category="dp", duration=low.grad_norm_time() * low.slowest_link(ids),
                  label="all_reduce:grad_norm", deps=list(deps), bytes=GRAD_NORM_BYTES,
                  rendezvous=("grad_norm", 0, ids) if len(ids) > 1 else None, peers=len(ids))
    return [op.id]


def twin_exchange(prog: ClassLowering, deps: list[int], shard: float) -> list[int]:
    """DualPipe: rank r and rank pp-1-r hold the same two stages, so their gradients are summed:
    a 2-rank all-reduce of the rank's gradients (both chunks; the local shard after the dp
    reduce-scatter under ZeRO >= 1, `shard` parameters). A 2-rank ring all-reduce of N bytes sends
    N/2 twice each way: N / B, one exchange of N. Returns what the optimizer waits for."""
    low, c = prog.low, prog.c
    if not (prog.sched.duplicated_stages and c.pp_mirror is not None):
        return deps
    n = low.grad_bytes * shard
    peers = tuple(sorted({c.id, c.pp_mirror}))
    ex = low._new(c, stream="dp", kind="coll", category="dp",
                  duration=low.network.transfer(n, c.link_mirror) * low.slowest_link(peers),
                  label="twin_grad_all_reduce", deps=list(deps), bytes=n,
                  rendezvous=("twin", 1, peers) if len(peers) > 1 else None, peers=len(peers))
    return [ex.id]


def optimizer_step(prog: ClassLowering, grads: GradientTraffic, deps: list[int], dense: float, expert: float) -> EOp:
    """The optimizer step over the class's local parameters (sharded over dp x cp for dense and
    over the expert-data-parallel group for expert weights under ZeRO >= 1), after `deps`, under
    DualPipe the twin exchange, and the global gradient-norm all-reduce (`grad_norm_barrier`),
    which under post-validation it does not wait for."""
    low, c, p = prog.low, prog.c, prog.p
    dpcp, edp, zero = p.dp * p.cp, prog.sc.expert_dp, grads.zero
    shard = (dense / (dpcp if zero >= 1 and grads.dp_on else 1)
             + expert / (edp if zero >= 1 and grads.edp_on else 1))
    deps = twin_exchange(prog, deps, shard)
    norm = grad_norm_barrier(prog, deps)
    if low.post_validation:
        # the all-reduce validates the step after it (and overlaps the next step): nothing waits for it
        low.validation_ops += [low.ops[i] for i in norm]      # the ops: merging renumbers ids
    else:
        deps = norm
    local = dense / (dpcp if zero >= 1 else 1) + expert / (edp if zero >= 1 else 1)
    t = prog.sc.training
    if t.optimizer_offload == "cpu":
        # ZeRO-Offload: the local shard's gradients to the host, the updated 16-bit weights back,
        # one direction each over the host link (the CPU's Adam itself is not timed)
        gb = low.grad_bytes
        bw = get_device(prog.sc.cluster.device).host_bandwidth
        return low._new(c, stream="compute", kind="compute", category="opt",
                        duration=(gb + 2.0) * local / bw, label="optimizer_step_offload", deps=deps)
    return low._new(c, stream="compute", kind="compute", category="opt",
                    duration=low.costs_of(c).memory_time(OPT_BYTES_PER_PARAM * local), label="optimizer_step", deps=deps)
