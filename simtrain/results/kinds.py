"""Where a rank's compute time goes, by operator kind.

Takes the schedule, the workload and the compute cost model; returns, for one pipeline rank, the
device time of its operators summed per kind over the step's actions (forward, recompute,
backward, weight gradients), and the run's compute time split in those proportions. The
timeline's compute time also holds host issue gaps and the slowdown of overlapped collectives,
which belong to no kind: the split spreads them pro rata, and the JSON keeps the device times.

Kinds, by operator (`kind_of`): GEMMs (the linear layers, LM head, router, grouped experts),
attention (the attention kernels), recompute (whatever re-runs before a backward), norms,
activations (GeLU, SwiGLU and their backward), rotary, FP8 casts (Transformer Engine's and
torchao's quantize kernels), loss (the cross entropy), MoE routing (top-k, permute, combine) and
other memory-bound kernels (residual adds, dropout, embedding, unfused softmax).
"""
from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from simtrain.workload.ir import Comm, Op, Ring

if TYPE_CHECKING:
    from simtrain.cost.roofline import ComputeCostModel
    from simtrain.schedules.registry import Schedule

KINDS = ("GEMMs", "attention", "recompute", "norms", "activations", "rotary", "FP8 casts", "loss", "MoE routing",
         "other memory-bound")


def kind_of(op: Op) -> str:
    """The kind an operator's time is reported under.

    >>> kind_of(Op("fc1", "gemm", "F", 1.0, 1.0)), kind_of(Op("rmsnorm1/cast.recompute", "memory", "B", 0.0, 1.0))
    ('GEMMs', 'recompute')
    """
    if op.name.endswith(".recompute"):
        return "recompute"
    if op.kind == "attention":
        return "attention"
    if op.kind == "gemm":
        return "GEMMs"
    base = op.name.split("/")[0]
    if ".quantize" in base:
        return "FP8 casts"
    if "norm" in base:
        return "norms"
    if "swiglu" in base or "gelu" in base:
        return "activations"
    if "rotary" in base:
        return "rotary"
    if "cross_entropy" in base:
        return "loss"
    if base.startswith(("router", "permute", "unpermute")):
        return "MoE routing"
    return "other memory-bound"


def _items_time(items: tuple, device_time, out: dict) -> None:
    for it in items:
        if isinstance(it, Comm):
            continue
        if isinstance(it, Ring):
            for o in it.segment:
                out[kind_of(o)] += it.steps * device_time(o) / it.share
            continue
        for o in it:
            out[kind_of(o)] += device_time(o)


def device_time_by_kind(sched: Schedule, rank: int, work: tuple, costs: ComputeCostModel) -> dict[str, float]:
    """Seconds of device time per kind that pipeline rank `rank` spends in one step's actions."""
    device_time = getattr(costs, "device_time", None) or costs.duration
    out: dict[str, float] = defaultdict(float)
    for a in sched.actions[rank]:
        w = work[sched.stage_of[rank][a.chunk]]
        for lp in (x for x in (w.pre, *w.layers, w.post) if x is not None):
            if a.kind == "F":
                seqs = (lp.forward,)
            elif a.kind == "B":
                seqs = (lp.recompute, lp.backward_input or lp.backward)
            elif a.kind == "W":
                seqs = (lp.backward_weight,)
            else:
                seqs = (lp.recompute, lp.backward)
            for seq in seqs:
                _items_time(seq, device_time, out)
    return dict(out)


def compute_by_kind(device: dict[str, float], compute_s: float, optimizer_s: float = 0.0) -> dict[str, float]:
    """The rank's compute time split by kind in proportion to the kinds' device times, with the
    optimizer step (its own op on the timeline) as a kind of its own; kinds in KINDS order, those
    with no time left out.

    Worked example: device times GEMMs 3 s, norms 1 s, a compute time of 10 s of which the
    optimizer is 2 s: the 8 s left split 3 : 1, GEMMs 6 s, norms 2 s.

    >>> compute_by_kind({"norms": 1.0, "GEMMs": 3.0}, 10.0, 2.0)
    {'GEMMs': 6.0, 'norms': 2.0, 'optimizer': 2.0}
    """
    rest = max(compute_s - optimizer_s, 0.0)
    total = sum(device.values())
    out = {k: rest * device[k] / total for k in KINDS if device.get(k, 0.0) > 0} if total > 0 else {}
    if optimizer_s > 0:
        out["optimizer"] = optimizer_s
    return out
