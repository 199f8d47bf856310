"""Where a rank's compute time goes, by operator kind.

Takes the schedule, the workload and the compute cost model; returns, for one pipeline rank, the
device time of its operators summed per kind over the step's actions (forward, recompute,
backward, weight gradients), and the run's compute time split in those proportions. The
timeline's compute time also holds host issue gaps and the slowdown of overlapped collectives,
which belong to no kind: the split spreads them pro rata, and the JSON keeps the device times.

Kinds, by operator (`kind_of`): gemm (the linear layers, LM head, router, grouped experts),
attention (the attention kernels), recompute (whatever re-runs before a backward), norm,
activation (GeLU, SwiGLU and their backward), rotary, fp8_cast (Transformer Engine's and
torchao's quantize kernels), loss (the cross entropy), moe_routing (top-k, permute, combine) and
other_memory (residual adds, dropout, embedding, unfused softmax); and optimizer, the step's own op.
"""
from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from simtrain.workload.ir import Comm, Op, Ring

if TYPE_CHECKING:
    from simtrain.cost.roofline import ComputeCostModel
    from simtrain.schedules.registry import Schedule

KINDS = ("gemm", "attention", "recompute", "norm", "activation", "rotary", "fp8_cast", "loss", "moe_routing",
         "other_memory")
"""The kinds, as result.json names them (every kind is present, 0 where the step has none)."""

LABELS = {"gemm": "GEMMs", "attention": "attention", "recompute": "recompute", "norm": "norms",
          "activation": "activations", "rotary": "rotary", "fp8_cast": "FP8 casts", "loss": "loss",
          "moe_routing": "MoE routing", "other_memory": "other memory-bound", "optimizer": "optimizer"}
"""How the run summary names each kind."""


def kind_of(op: Op) -> str:
    """The kind an operator's time is reported under.

    >>> kind_of(Op("fc1", "gemm", "F", 1.0, 1.0)), kind_of(Op("rmsnorm1/cast.recompute", "memory", "B", 0.0, 1.0))
    ('gemm', 'recompute')
    """
    if op.name.endswith(".recompute"):
        return "recompute"
    if op.kind == "attention":
        return "attention"
    if op.kind == "gemm":
        return "gemm"
    base = op.name.split("/")[0]
    if ".quantize" in base:
        return "fp8_cast"
    if "norm" in base:
        return "norm"
    if "swiglu" in base or "gelu" in base:
        return "activation"
    if "rotary" in base:
        return "rotary"
    if "cross_entropy" in base:
        return "loss"
    if base.startswith(("router", "permute", "unpermute")):
        return "moe_routing"
    return "other_memory"


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
    """Seconds of device time per kind (every kind of KINDS) that pipeline rank `rank` spends in
    one step's actions."""
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
    return {k: out.get(k, 0.0) for k in KINDS}


def compute_by_kind(device: dict[str, float], compute_s: float, optimizer_s: float = 0.0) -> dict[str, float]:
    """The rank's compute time split by kind in proportion to the kinds' device times, with the
    optimizer step (its own op on the timeline) as a kind of its own; every kind of KINDS, then
    optimizer.

    Worked example: device times gemm 3 s, norm 1 s, a compute time of 10 s of which the
    optimizer is 2 s: the 8 s left split 3 : 1, gemm 6 s, norm 2 s.

    >>> d = compute_by_kind({"norm": 1.0, "gemm": 3.0}, 10.0, 2.0)
    >>> d["gemm"], d["norm"], d["attention"], d["optimizer"]
    (6.0, 2.0, 0.0, 2.0)
    """
    rest = max(compute_s - optimizer_s, 0.0)
    total = sum(device.values())
    out = {k: (rest * device.get(k, 0.0) / total if total > 0 else 0.0) for k in KINDS}
    out["optimizer"] = optimizer_s
    return out
