"""Device memory per rank and the one rule for "does the plan fit".

    static   weights + gradients + optimizer state of the model stages a pipeline rank holds
             (weights alone for a forward-only pass)
    buffers  communication buffers (pipeline, tensor-parallel, ZeRO-3 gathers, MoE dispatch)
    total    static + buffers + activations (the simulated peak, or a bound of it)
    fits     every rank's total <= the usable memory of the device it runs on: its capacity
             (cluster.memory_capacity, else the preset's) less cluster.memory_reserve (CUDA
             context, NCCL buffers, allocator fragmentation: what the model does not count)

`simulate` reports fits_in_memory with the simulated activation peak, `simtrain check` with the
static part alone (no activations yet), the plan search prunes with the lower bound of one
microbatch-chunk's activations: all three apply `memory_fit` to totals built by `rank_static`.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from simtrain.spec.scenario import Scenario
from simtrain.workload import fp8
from simtrain.workload.ir import ACT_BYTES, grad_bytes


def static_memory(sc: Scenario, params: float, expert_params: float = 0.0, fp8_dense: float = 0.0,
                  fp8_expert: float = 0.0) -> dict:
    """Per-rank bytes of weights, gradients and optimizer state (Megatron distributed-optimizer table,
    Megatron-LM docs/source/api-guide/dist_optimizer.md: bf16 params with fp32 grads = 2 + 4 + 12
    bytes per parameter, fp16 = 2 + 2 + 16; grad_reduce_in_bf16 takes the gradients to 2; optimizer_moments bf16 takes 4 off the optimizer's; ZeRO-1 shards the optimizer over dp, ZeRO-2 also the
    gradients, ZeRO-3 also the weights). With training.optimizer_offload: cpu the optimizer state
    is in host memory (ZeRO-Offload, Ren et al. 2021): none on the device. A forward-only pass (training.forward_only) has no gradients
    and no optimizer state: weights alone. Dense weights shard over the dp x cp ranks that hold them,
    expert weights (`expert_params` of `params`) over the expert-data-parallel group.

    FP8 (Transformer Engine recipes): `fp8_dense` / `fp8_expert` of the parameters are weights of
    FP8 GEMMs (`StageWork.fp8_weight_elements`), `fp8.weight_bytes` per element instead of 2."""
    p = sc.parallel
    fp16 = sc.training.precision == "fp16"
    wb, gb, ob = 2.0, grad_bytes(sc.training), (16.0 if fp16 else 12.0)
    if sc.training.optimizer_moments == "bf16":
        ob -= 4.0               # Adam's two moments in 2 bytes each instead of 4 (DeepSeek-V3 §3.3.3)
    if sc.training.optimizer_offload == "cpu":
        ob = 0.0                # ZeRO-Offload: master weights and moments in host memory
    if sc.training.forward_only:
        gb = ob = 0.0           # a forward-only pass holds the 16-bit weights alone
    dense = params - expert_params
    dp, edp = p.dp * p.cp, sc.expert_dp
    z = p.zero_stage

    def part(nbytes, stage, d=dense, e=expert_params):
        return d * nbytes / (dp if z >= stage else 1) + e * nbytes / (edp if z >= stage else 1)
    weights = part(wb, 3)
    if sc.training.precision == "fp8" and (fp8_dense or fp8_expert):
        per = fp8.weight_bytes(sc.training.fp8_recipe, sc.training.fp8_param_gather, z >= 3)
        weights += part(per - wb, 3, fp8_dense, fp8_expert)
    return {"weights": weights, "gradients": part(gb, 2), "optimizer": part(ob, 1)}


def comm_buffers(sc: Scenario, layer_params: float, layer_fp8: float = 0.0) -> float:
    """Estimate: pipeline send + receive buffers (2 activation messages), one tensor-parallel
    collective buffer, under ZeRO-3 two gathered layers (current + prefetched; `layer_fp8` of the
    layer's parameters are FP8 GEMMs' weights, gathered at 1 byte under fp8_param_gather,
    `fp8.gathered_bytes`), and for MoE the dispatch send and receive buffers."""
    p, t = sc.parallel, sc.training
    tokens = t.micro_batch_size * sc.model.seq_length / p.cp
    msg = ACT_BYTES * tokens * sc.model.hidden_size
    out = 0.0
    if p.pp > 1:
        out += 2 * msg / (p.tp if p.sequence_parallel and p.tp > 1 else 1)
    if p.tp > 1:
        out += msg
    if p.zero_stage == 3 and p.dp > 1:
        out += 2 * fp8.gathered_bytes(t, layer_params, layer_fp8)
    moe = sc.model.moe
    if moe is not None and p.ep > 1:
        # routing buffers: the dispatch's send and receive buffers of T·k tokens (uniform routing)
        local = tokens / (p.tp if p.sequence_parallel and p.tp > 1 else 1)
        out += 2 * ACT_BYTES * local * moe.top_k * sc.model.hidden_size
    return out


def largest_layer(work: Sequence) -> tuple[float, float]:
    """(parameters, FP8 GEMM weight elements) of the largest layer of any model stage (dense +
    expert): what a ZeRO-3 gather holds."""
    return max(((d + e, sum(f)) for w in work for d, e, f in zip(w.layer_dense, w.layer_expert, w.layer_fp8)),
               default=(0.0, 0.0))


@dataclass(frozen=True)
class StaticMemory:
    """Bytes of one pipeline rank before activations."""
    weights: float
    gradients: float
    optimizer: float
    buffers: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.buffers


def rank_static(sc: Scenario, work: Sequence, held: Sequence[int], buffers: float | None = None) -> StaticMemory:
    """Static memory of the pipeline rank holding model stages `held` of `work` (build_workload).
    `buffers` is the step's communication buffers (comm_buffers over the largest layer), the same
    for every rank: a caller looping over ranks computes it once and passes it in."""
    st = static_memory(sc, sum(work[k].params for k in held), sum(work[k].expert_params for k in held),
                       sum(work[k].fp8_weight_elements[0] for k in held), sum(work[k].fp8_weight_elements[1] for k in held))
    if buffers is None:
        buffers = comm_buffers(sc, *largest_layer(work))
    return StaticMemory(st["weights"], st["gradients"], st["optimizer"], buffers)


@dataclass(frozen=True)
class MemoryFit:
    fits: bool
    shortfall_bytes: float          # the largest excess of a rank over its device's usable memory; 0 when it fits


def memory_fit(totals: Iterable[tuple[float, float]], reserve: Callable[[float], float] | None = None) -> MemoryFit:
    """(bytes a rank needs, bytes its device has) for every rank -> whether all fit in what the
    reserve leaves (capacity - reserve(capacity); `reserve` is ClusterSpec.reserve_of, None holds
    nothing back) and by how much the worst misses. Examples: (70, 80) and (90, 80) GiB -> does
    not fit, 10 GiB short; (80, 80) fits; (78, 80) with a 4 GiB reserve -> 2 GiB short."""
    short = 0.0
    for need, capacity in totals:
        short = max(short, need - (capacity - (reserve(capacity) if reserve is not None else 0.0)))
    return MemoryFit(short <= 0.0, short)


def capacity_of(cluster: Any, preset_bytes: float, main: bool = True) -> float:
    """The memory of a device of the cluster: cluster.memory_capacity for the cluster's own device
    type (`main`) when given, else the preset's (or profile's) `preset_bytes`. Blocks of another
    type in `mixed` keep their presets'."""
    cap = getattr(cluster, "memory_capacity", None)
    return cap if cap is not None and main else preset_bytes


@dataclass(frozen=True)
class MemoryBudget:
    """What a device offers a run: capacity, the reserve held back, and the rest (usable)."""
    capacity: float
    reserve: float

    @property
    def usable(self) -> float:
        return self.capacity - self.reserve


def budget_of(cluster: Any, preset_bytes: float, main: bool = True) -> MemoryBudget:
    """The cluster's memory budget on a device. Example: an A100 80GB (80 GiB) with the default
    reserve (0.05) -> 80 GiB capacity, 4 GiB reserve, 76 GiB usable."""
    cap = capacity_of(cluster, preset_bytes, main)
    return MemoryBudget(cap, cluster.reserve_of(cap))
