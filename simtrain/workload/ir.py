"""Operator IR of the workload: what one microbatch's layers are made of on one rank.

Takes nothing from the rest of simtrain. Defines the items a layer program is a sequence of:
`Op` (a compute operator with its FLOPs, bytes and shape), `Comm` (a collective of a parallel
group), `Ring` (a segment in pieces beside a chain of transfers: ring attention, TE's overlapped
tensor-parallel GEMMs); `LayerProgram` (forward, backward, recompute, and the
backward's input-gradient (B) and weight-gradient (W) parts); `StageWork` (everything one model
stage holds: its layer programs, parameters and stored activations). A compute segment is a
tuple of Ops with no communication point between them.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

ACT_BYTES = 2          # activations in 16-bit (fp8 GEMMs still keep 16-bit activations)


def grad_bytes(training: Any) -> float:
    """Bytes per parameter of the gradient buffer and of its data-parallel reduction: fp32, or
    16-bit in fp16 training and with `grad_reduce_in_bf16` (Megatron-LM --grad-reduce-in-bf16)."""
    return 2.0 if training.precision == "fp16" or training.grad_reduce_in_bf16 else 4.0


@dataclass(frozen=True)
class Op:
    name: str
    kind: str              # gemm | attention | memory
    phase: str             # F | B | W
    flops: float           # executed FLOPs on this rank
    bytes: float           # bytes read + written
    shape: tuple = ()      # gemm: (m, n, k); attention: (seq, causal)
    model_flops: float = 0.0   # FLOPs counted by the model-FLOP accounting (recompute excluded)
    dtype: str = ""            # gemm: its input precision (fp8, bf16); "" for the cost model's own
    group: int = 1             # gemm: experts sharing one grouped-GEMM kernel (`shape` is one expert's share)


@dataclass(frozen=True)
class Comm:
    kind: str              # tp | cp | ep | etp | dp | edp
    collective: str        # all_reduce | all_gather | reduce_scatter | all_to_all | send_recv (one ring round)
    size_bytes: float      # nccl-tests convention: the full buffer (for AG/RS: per-rank count x group size)
    name: str = ""
    node_limit: tuple = () # (top_k, max nodes per token): node-limited MoE routing, see `node_limited_share`


# collective names of the tensor-parallel transfers overlapped with their GEMMs (TE userbuffers,
# PyTorch async TP): their cost to the GEMM is the Ring's SM share, not the measured
# compute-under-NCCL interference
OVERLAP_PREFIXES = ("ub_", "atp_")


def overlapped_tp(name: str) -> bool:
    """Whether a collective (by `Comm.name`, or an op label `collective:name`) is an overlapped
    tensor-parallel transfer."""
    return name.split(":", 1)[-1].startswith(OVERLAP_PREFIXES)


@dataclass(frozen=True)
class Ring:
    """A compute segment run in `steps` pieces beside a chain of transfers, c per piece and x
    per transfer (`comm`); `mode` says how they chain:

    ring      ring attention over the cp group (Liu et al., "Ring Attention", 2023; Megatron-core
              CP), or a tensor-parallel all-gather fed piece by piece into its GEMM (Transformer
              Engine's ring-exchange userbuffers overlap): piece i computes on the block that
              arrived with transfer i-1 while the next block moves one hop (steps - 1 transfers):
              c + (steps - 1)·max(c, x)
    pipeline  a GEMM whose output is reduce-scattered piece by piece (TE's pipelined overlap):
              transfer i starts when piece i and transfer i-1 are done (steps transfers):
              c + (steps - 1)·max(c, x) + x
    bulk      one collective beside an independent GEMM (TE's bulk overlap; Megatron's and TE's
              asynchronous sequence-parallel collectives in a column-parallel linear's backward):
              max(steps·c, x), or with a compute-under-communication slowdown s (the GEMM runs at
              1 - s while the collective does) max(x, steps·c + s·x)

    `share`: the part of the device's SMs the compute keeps (TE's pipelined and bulk overlaps hold
    some SMs for their communication kernels; ring exchange moves data with copy engines and holds
    none): each piece takes c / share."""
    steps: int
    segment: tuple
    comm: Comm
    mode: str = "ring"     # ring | pipeline | bulk
    share: float = 1.0

    @property
    def model_flops(self) -> float:
        return self.steps * sum(o.model_flops for o in self.segment)

    @property
    def transfers(self) -> int:
        return self.steps - 1 if self.mode == "ring" else self.steps

    def time(self, c: float, x: float, s: float = 0.0) -> float:
        """Closed form of the chain for one piece's compute time `c` (at full share) and one
        transfer's time `x`; `s` (bulk only): the compute's slowdown while the collective runs.
        Bulk with s: work W = steps·c at rate 1 - s for the collective's x, then at full rate, so
        it ends at W / (1 - s) when that is within x, else at x + (W - (1 - s)·x) = W + s·x."""
        c = c / self.share
        if self.mode == "bulk":
            return max(x, self.steps * c + s * x)
        tail = x if self.mode == "pipeline" else 0.0
        return c + (self.steps - 1) * max(c, x) + tail


@dataclass(frozen=True)
class LayerProgram:
    forward: tuple         # items: tuple[Op, ...] (a compute segment) or Comm
    backward: tuple        # items in execution order; segments hold B and W ops
    recompute: tuple       # items run before backward (full: the whole forward; selective: core attention)
    backward_input: tuple = ()    # the B part alone: `backward` without its W ops (communication kept)
    backward_weight: tuple = ()   # the W part alone: one segment of the weight-gradient ops
    weight_grad_inputs: float = 0.0   # bytes a deferred W keeps alive: each wgrad GEMM's input and output gradient


def with_split(lp: LayerProgram, hidden: int = 0, seq_shard: int = 1, fp8_kept: float = ACT_BYTES) -> LayerProgram:
    """Fills the B / W split of a layer program (for schedules that defer W, Qi et al. ICLR'24).

    A weight-gradient GEMM dW = X^T dY (shape k x n x m, m = tokens) needs the layer input X
    (m x k) and the output gradient dY (m x n), so deferring it keeps 2·m·(k + n) bytes alive.
    Worked example (GPT, no TP, T tokens): qkv T(h+3h) + attn_out T(h+h) + fc1 T(h+4h) +
    fc2 T(4h+h) = 16·T·h elements, 32·T·h bytes (the paper's M_W = 32sbh, Table 1).
    With sequence parallelism a hidden-size-wide tensor is kept sequence-sharded (1/seq_shard) and
    gathered again for the wgrad GEMM, as Megatron does, so those terms divide by tp.
    A grouped expert GEMM (`Op.group` experts, `shape` one expert's share) keeps every local
    expert's X and dY. An FP8 wgrad GEMM reads the columnwise FP8 copies of X and dY that the
    forward and the input-gradient GEMM made, so deferring it keeps those: `fp8_kept` bytes per
    element (Transformer Engine's copy with its scales; 2 where the recipe keeps 16-bit operands)."""
    b_items, w_ops = [], []
    for it in lp.backward:
        if isinstance(it, Ring) and it.mode == "bulk" and all(o.phase == "W" for o in it.segment):
            # a collective beside a weight-gradient GEMM: deferring W leaves the collective alone in B
            b_items.append(it.comm)
            w_ops += list(it.segment)
            continue
        if isinstance(it, (Comm, Ring)):
            b_items.append(it)
            continue
        b = tuple(o for o in it if o.phase != "W")
        w_ops += [o for o in it if o.phase == "W"]
        if b:
            b_items.append(b)
    def width(d):
        return d / seq_shard if d == hidden else d
    def per_element(o):
        return fp8_kept if o.dtype == "fp8" else ACT_BYTES
    kept = sum(per_element(o) * o.group * o.shape[2] * (width(o.shape[0]) + width(o.shape[1]))
               for o in w_ops if o.kind == "gemm")
    return LayerProgram(lp.forward, lp.backward, lp.recompute, tuple(b_items),
                        (tuple(w_ops),) if w_ops else (), kept)


def _fp8_forward_gemms(lp: LayerProgram):
    """The layer's forward FP8 GEMM ops; a GEMM run in pieces (`Ring`) once."""
    for it in lp.forward:
        ops = it.segment if isinstance(it, Ring) else it if isinstance(it, tuple) else ()
        for o in ops:
            if o.kind == "gemm" and o.dtype == "fp8" and o.phase == "F":
                yield o


def fp8_weights(lp: LayerProgram) -> tuple[float, float]:
    """(dense, expert) weight elements of the layer's FP8 GEMMs on this rank: every forward FP8
    GEMM's n x k, times the experts of a grouped GEMM; a GEMM run in pieces (`Ring`) shares one
    weight over them. The experts' GEMMs are named `experts.*`."""
    dense = expert = 0.0
    for o in _fp8_forward_gemms(lp):
        w = o.group * o.shape[1] * o.shape[2]
        if o.name.startswith("experts."):
            expert += w
        else:
            dense += w
    return dense, expert


def fp8_gemm_count(lp: LayerProgram) -> int:
    """The layer's FP8 GEMMs as Transformer Engine counts them for its scaling state: one per
    linear, one per expert of a grouped GEMM (`GroupedLinear`'s num_gemms)."""
    return sum(int(o.group) for o in _fp8_forward_gemms(lp))


@dataclass(frozen=True)
class StageWork:
    stage: int
    layers: tuple                 # LayerProgram per layer held by this model stage, in forward order
    pre: LayerProgram | None      # embedding on the first language-model stage
    post: LayerProgram | None     # LM head + loss on the last stage
    params: float                 # parameters held by one rank of this stage (after TP / EP sharding)
    layer_dense: tuple            # per layer: parameters reduced over the data-parallel group
    layer_expert: tuple           # per layer: expert parameters, reduced over the expert-data-parallel group
    act_layers: tuple             # per layer: bytes stored per microbatch
    act_bytes_pre: float
    act_bytes_post: float
    act_working_bytes: float      # transient peak while one layer's backward runs
    expert_params: float = 0.0    # the part of `params` that is expert weights
    send_bytes: float = 0.0       # activation (and gradient) bytes exchanged with a neighbour stage per microbatch
    recv_gather_bytes: float = 0.0   # bytes the receiver all-gathers over tp after a split pipeline message (0: not split)
    loss_working_bytes: float = 0.0  # transient beside the kept logits while the loss's backward runs (last stage)
    act_forward_bytes: float = 0.0   # transient peak of one microbatch's forward without autograd (forward-only pass):
                                     # the largest layer's activations with nothing recomputed, plus the logits on the last stage

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def layer(self) -> LayerProgram:
        """The first layer's program (every layer of a dense model is the same)."""
        return self.layers[0]

    @property
    def layer_params(self) -> float:
        return self.layer_dense[0] + self.layer_expert[0] if self.layers else 0.0

    @property
    def act_bytes(self) -> float:
        """Activation bytes one microbatch leaves stored on this stage between its F and backward."""
        return sum(self.act_layers) + self.act_bytes_pre + self.act_bytes_post

    @cached_property
    def layer_fp8(self) -> tuple:
        """Per layer, (dense, expert) weight elements of its FP8 GEMMs on one rank (`fp8_weights`)."""
        return tuple(fp8_weights(lp) for lp in self.layers)

    @cached_property
    def fp8_gemms(self) -> int:
        """FP8 GEMMs of this stage's layers on one rank (`fp8_gemm_count`)."""
        return sum(fp8_gemm_count(lp) for lp in self.layers)

    @property
    def fp8_weight_elements(self) -> tuple[float, float]:
        """(dense, expert) weight elements of this stage's FP8 GEMMs on one rank."""
        return sum(d for d, _ in self.layer_fp8), sum(e for _, e in self.layer_fp8)

    @property
    def weight_grad_bytes(self) -> float:
        """Bytes a deferred W keeps alive after B (inputs and output gradients of the wgrad GEMMs)."""
        return sum(lp.weight_grad_inputs for lp in self.layers) + sum(
            x.weight_grad_inputs for x in (self.pre, self.post) if x is not None)


def join_segments(items: list) -> tuple:
    """Adjacent compute segments fuse into one (no communication point between them)."""
    out = []
    for it in items:
        if isinstance(it, tuple) and out and isinstance(out[-1], tuple):
            out[-1] = out[-1] + it
        elif isinstance(it, tuple) and not it:
            continue
        else:
            out.append(it)
    return tuple(out)


def as_recompute(item: Op | Comm | Ring | tuple) -> Op | Comm | Ring | tuple:
    if isinstance(item, Comm):
        return item
    if isinstance(item, Ring):
        return replace(item, segment=as_recompute(item.segment))
    if isinstance(item, Op):
        return Op(item.name + ".recompute", item.kind, "B", item.flops, item.bytes, item.shape, 0.0)
    return tuple(as_recompute(o) for o in item)
