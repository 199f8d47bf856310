"""FP8 training as Transformer Engine (or torchao, `torchao_casts`) runs it: which GEMMs run in
FP8, and the quantize kernels a scaling recipe adds around them.

With `training.precision: fp8`, the GEMMs of Transformer Engine's linear modules (QKV, the
attention output projection, fc1 / gate-up, fc2, the experts' grouped GEMMs, MLA's projections,
the vision encoder's blocks) read FP8 operands and write 16-bit outputs; the rest stays 16-bit:
the LM head and the MoE router (Megatron-core builds them outside TE), the attention core
(without `--fp8-dot-product-attention`), the norms and the elementwise kernels.

Every FP8 GEMM needs its operands quantized from 16 bits. Per GEMM of a TE linear layer
(x: m x k input, W: n x k weight, dY: m x n output gradient):

  forward   x quantized into both layouts (rowwise for this GEMM, columnwise for the weight
            gradient): one cast-transpose kernel, read 2 bytes, write 1 + 1 per element. A
            LayerNorm/RMSNorm fused with its linear (TE's LayerNormLinear: Megatron's QKV and
            fc1 of a dense layer) writes the FP8 rows itself under delayed scaling, and only the
            transpose is added (read 1, write 1).
            W quantized the same way once per step: Megatron-core marks the first microbatch of a
            step (`set_is_first_microbatch` in its pipeline schedules) and TE caches the FP8
            weight for the others; simtrain spreads that one cast over the step's microbatches.
  backward  dY quantized into both layouts before the input-gradient GEMM (cast-transpose, read
            2, write 1 + 1); the weight-gradient GEMM reads the columnwise copies made before.

Recipes (TE's `transformer_engine.common.recipe` classes; Megatron-LM `--fp8-recipe`):
  delayed    DelayedScaling: the scale comes from an amax history, the amax of this cast is a
             by-product of the cast kernel (no extra pass)
  current    Float8CurrentScaling: the scale comes from this tensor's own amax, so an amax
             kernel reads the tensor (2 bytes per element) before the cast, and no norm writes
             FP8 itself (TE's `nvte_compute_amax`, then the cast)
  blockwise  Float8BlockScaling (DeepSeek-V3's 1 x 128 / 128 x 128 tiles): one kernel quantizes
             both layouts with an fp32 scale per 128 values in each (2 + 2 x (1 + 4/128) bytes)
  mxfp8      MXFP8BlockScaling (Blackwell only): 32-element blocks with one-byte E8M0 scales,
             both layouts (2 + 2 x (1 + 1/32) bytes)
A grouped expert GEMM (one kernel over the local experts, `Op.group`) quantizes every row it
runs and every local expert's weight. Under sequence parallelism the gathered inputs and output
gradients are quantized on their shards and gathered in FP8 (`with_casts`).
Current scaling under sequence parallelism all-reduces the amax of each tensor quantized on its
shard over the tp group before the cast (`_amax_reduced`). Not counted: the amax all-reduce of
delayed scaling (a few kilobytes per microbatch over the amax-reduction group) and the norm's
narrower FP8 write under delayed scaling (1 byte per element less than simtrain's 16-bit norm).
"""
from __future__ import annotations

from dataclasses import replace

from simtrain.spec.scenario import FP8_RECIPES as RECIPES  # noqa: F401  (TE's DelayedScaling, Float8CurrentScaling, Float8BlockScaling, MXFP8BlockScaling)
from simtrain.spec.scenario import TrainingSpec
from simtrain.workload.ir import ACT_BYTES, Comm, Op, Ring

Q = 1.0                  # FP8 bytes per element, per layout
# the block recipes' scale bytes per element: an fp32 scale per 128 values (blockwise), a one-byte
# E8M0 scale per 32 (mxfp8)
SCALE = {"blockwise": 4 / 128, "mxfp8": 1 / 32}
# recipe -> kernels of one quantize of a 16-bit tensor into both FP8 layouts:
# ((step, kernel class, bytes per element), ...)
QUANTIZE: dict = {
    "delayed": (("cast_transpose", "elementwise", ACT_BYTES + 2 * Q),),
    "current": (("amax", "elementwise", ACT_BYTES), ("cast_transpose", "elementwise", ACT_BYTES + 2 * Q)),
    **{r: (("quantize", "elementwise", ACT_BYTES + 2 * (Q + s)),) for r, s in SCALE.items()},
}
# the per-tensor recipes into the rowwise layout alone (a shard quantized before its all-gather)
ROWWISE: dict = {
    "delayed": (("cast", "elementwise", ACT_BYTES + Q),),
    "current": (("amax", "elementwise", ACT_BYTES), ("cast", "elementwise", ACT_BYTES + Q)),
}
# the columnwise copy made from FP8 rows (a gathered tensor, or a norm's FP8 output): read 1, write 1
TRANSPOSE = (("transpose", "elementwise", 2 * Q),)
BLOCK = tuple(SCALE)
TORCHAO = ("torchao_tensorwise", "torchao_rowwise")
# torchao float8: each operand cast for each GEMM that reads it, from the 16-bit tensor autograd
# kept: its amax (read 2), then the cast into the one layout that GEMM needs (read 2, write 1),
# the same kernels as current scaling's rowwise quantize
TORCHAO_CAST = ROWWISE["current"]

NORM_FED = ("qkv", "fc1", "fc1_gate_up")
"""GEMMs Megatron-core builds as TE LayerNormLinear (a dense layer's QKV and fc1); MLA's and the
experts' linears take a separate norm's (or the dispatch's) output."""
GATHERED_INPUT = ("qkv", "fc1", "fc1_gate_up", "shared.fc1", "shared.fc1_gate_up")
"""Column-parallel GEMMs whose input a sequence-parallel all-gather brings (MLA's projections
excepted: their gathered input feeds several linears)."""
GATHERED_GRAD = ("attn_out", "fc2", "shared.fc2")
"""Row-parallel GEMMs whose output gradient a sequence-parallel all-gather brings."""
GATHERS = ("tp_all_gather0", "tp_all_gather2", "tp_all_gather1", "tp_all_gather3",
           "tp_regather0", "tp_regather2", "ub_qkv_dgrad_ag", "ub_fc1_dgrad_ag",
           "ub_qkv_ag", "ub_fc1_ag", "ub_proj_dgrad_ag", "ub_fc2_dgrad_ag",
           "atp_qkv_ag", "atp_fc1_ag", "atp_proj_dgrad_ag", "atp_fc2_dgrad_ag")
"""The tensor-parallel all-gathers (plain or overlapped) of those inputs and output gradients,
the backward's re-gathers of the inputs included (TE gathers the FP8 copy it kept)."""


def gather_factor(recipe: str) -> float:
    """Bytes an FP8 all-gather of a sequence-parallel tensor moves per byte of the 16-bit one: the
    per-tensor recipes gather the FP8 rows (1 of 2 bytes); the block recipes both layouts with
    their scales (their columnwise blocks cannot be made from the gathered rows)."""
    if recipe in TORCHAO:
        return 1.0           # simtrain keeps torchao's tensor-parallel gathers 16-bit
    return (2 * stored_bytes(recipe) if recipe in BLOCK else Q) / ACT_BYTES


def stored_bytes(recipe: str) -> float:
    """Bytes per element of a linear layer's input kept for the weight gradient: TE's FP8
    columnwise copy with its scales; torchao's 16-bit input."""
    if recipe in TORCHAO:
        return ACT_BYTES
    return Q + SCALE.get(recipe, 0.0)


# a weight's scale bytes per element: an fp32 scale per 128 x 128 tile (blockwise), a one-byte
# E8M0 scale per 32 values (mxfp8); one scale per tensor otherwise
WEIGHT_SCALE = {"blockwise": 4 / (128 * 128), "mxfp8": 1 / 32}


def weight_bytes(recipe: str, param_gather: bool, sharded: bool) -> float:
    """Device bytes per element of an FP8 GEMM's weight, as Transformer Engine keeps it:

      16-bit weight   2 bytes, plus the FP8 copy TE caches for the step's later microbatches
                      (`get_weight_workspace` under Megatron-core's is_first_microbatch): both
                      layouts, rowwise for the forward and columnwise for the input gradient,
                      2·(1 + scale) bytes
      fp8_param_gather  the weight itself is TE's FP8 tensor (Megatron-LM --fp8-param-gather,
                      `fp8_model_init`) with its columnwise copy: 2·(1 + scale), no 16-bit copy
      sharded (ZeRO-3 / FSDP)  the shard alone persists, 16-bit or FP8 (1 + scale); the gathered
                      layer is a transient buffer
    torchao's float8 keeps the 16-bit weight and casts it for each GEMM (and, with the FP8 all-gather
    of FSDP2, casts the shard before gathering it): 2 bytes, nothing cached."""
    if recipe in TORCHAO:
        return ACT_BYTES
    one = Q + WEIGHT_SCALE.get(recipe, 0.0)      # (the loader allows param_gather with the per-tensor recipes only)
    if sharded:
        return one if param_gather else ACT_BYTES
    return 2 * one if param_gather else ACT_BYTES + 2 * one


GATHERED = Q
"""Bytes per element an FP8 all-gather of a weight moves (per-tensor recipes: the rowwise FP8 data;
the scale is one number per weight, and the columnwise copy is transposed from the gathered rows)."""


def gathered_bytes(training: TrainingSpec, params: float, fp8_params: float) -> float:
    """Bytes of `params` parameters as a data-parallel all-gather moves them and a ZeRO-3 gather
    buffer holds them, `fp8_params` of them FP8 GEMMs' weights: 16-bit, or with FP8 weights
    gathered (`training.fp8_param_gather`, on an FP8 run) those at GATHERED bytes. torchao's
    FSDP float8 all-gather wraps the gathered FP8 data as the layer's weight
    (`fsdp_post_all_gather`), so the unsharded layer is held at that size too."""
    if training.precision == "fp8" and training.fp8_param_gather:
        return ACT_BYTES * (params - fp8_params) + GATHERED * fp8_params
    return ACT_BYTES * params


def operand_bytes(dtype: str) -> float:
    """Bytes per element of a GEMM's input operand: 1 for FP8, else 16-bit."""
    return Q if dtype == "fp8" else ACT_BYTES


def gemm_bytes(m: float, n: float, k: float, dtype: str = "fp8") -> float:
    """HBM bytes of a GEMM (m x n x k): its two operands at `dtype`, its 16-bit output."""
    return operand_bytes(dtype) * (m * k + k * n) + ACT_BYTES * m * n


def quantize_ops(recipe: str, name: str, elements: float, phase: str, norm_fused: bool = False,
                 shards: int = 1) -> tuple:
    """The kernels quantizing a 16-bit tensor of `elements` elements into both FP8 layouts, one Op
    per launch (named `name/step`). `norm_fused`: the rows come FP8 out of the norm (delayed
    scaling only). `shards` > 1: each rank quantizes its 1/shards of the tensor before an
    all-gather in FP8; the per-tensor recipes then transpose the gathered rows."""
    fused = norm_fused and recipe == "delayed"
    if recipe in BLOCK:
        return _launches(name, QUANTIZE[recipe], elements / shards, phase)
    if shards > 1:
        rows = () if fused else _launches(name, ROWWISE[recipe], elements / shards, phase)
        return rows + _launches(name, TRANSPOSE, elements, phase)
    return _launches(name, TRANSPOSE if fused else QUANTIZE[recipe], elements, phase)


def _launches(name: str, chain: tuple, elements: float, phase: str) -> tuple:
    """One memory-bound Op per kernel of `chain` ((step, class, bytes per element), ...) on
    `elements` elements, named `name/step`."""
    return tuple(Op(f"{name}/{step}", "memory", phase, 0.0, per * elements, (cls,)) for step, cls, per in chain)


def casts_for(op: Op, recipe: str, microbatches: int, rows: float | None = None, tp_sp: int = 1) -> tuple:
    """The quantize kernels an FP8 GEMM needs before it runs (see the module docstring):
    forward GEMMs their input and 1/`microbatches` of their weight's cast, input-gradient GEMMs
    the output gradient; weight-gradient GEMMs nothing. `rows`: the whole GEMM's m where `op` is
    one piece of it. `tp_sp`: the tensor-parallel size under sequence parallelism (a gathered
    input or output gradient is quantized on its shard)."""
    if op.kind != "gemm" or op.dtype != "fp8":
        return ()
    m, n, k = op.shape
    m = m if rows is None else rows
    g = op.group                  # a grouped GEMM's shape is one expert's: its operands are g times that
    base = op.name.split("/")[0]
    if recipe in TORCHAO:
        return torchao_casts(base, op.phase, m, n, k, g)
    if op.phase == "W":
        return ()
    shards = tp_sp if sharded(base, op.phase) else 1
    if op.phase == "F":
        return (quantize_ops(recipe, base + ".quantize_input", g * m * k, "F", base in NORM_FED, shards)
                + quantize_ops(recipe, base + ".quantize_weight", g * n * k / microbatches, "F"))
    return quantize_ops(recipe, base + ".quantize_grad", g * m * k, "B", shards=shards)


def sharded(base: str, phase: str) -> bool:
    """Whether GEMM `base`'s quantized operand (its input in the forward, its output gradient in
    the backward) comes by a sequence-parallel all-gather, so it is quantized on its shard."""
    return base in GATHERED_INPUT if phase == "F" else base.removesuffix(".dgrad") in GATHERED_GRAD


def torchao_casts(base: str, phase: str, m: float, n: float, k: float, group: int = 1) -> tuple:
    """torchao float8 (`Float8Linear`): autograd keeps the 16-bit input and weight, and each GEMM
    casts its own FP8 operands (amax, then cast; `TORCHAO_CAST`): the forward its input (m x k)
    and weight (n x k), the input-gradient GEMM (m x k x n) the output gradient and the weight
    again, the weight-gradient GEMM (k x n x m) the output gradient's transpose and the input
    again. Nothing is cached across microbatches. `group`: the experts of a grouped GEMM whose
    shape is one expert's (every operand is `group` times as large)."""
    def ops(name, elements, ph):
        return _launches(name, TORCHAO_CAST, group * elements, ph)
    if phase == "F":
        return ops(base + ".quantize_input", m * k, "F") + ops(base + ".quantize_weight", n * k, "F")
    if phase == "B":                       # shape (m, k_in, n_out)
        return ops(base + ".quantize_grad", m * k, "B") + ops(base + ".quantize_weight", n * k, "B")
    # W: shape (k_in, n_out, m)
    return ops(base + ".quantize_grad", n * k, "W") + ops(base + ".quantize_input", m * k, "W")


AMAX_BYTES = 4.0
"""One fp32 amax: what a current-scaling amax all-reduce moves."""

DELAYED_AMAX_TENSORS = {"F": 3, "B": 2}
"""Delayed scaling's scaling state per FP8 GEMM: the forward tracks the input, the weight and the
output, the backward the output gradient and the input gradient (Transformer Engine's
`FP8GlobalStateManager` / `get_fp8_meta_tensors`: num_gemms x 3 forward, x 2 backward)."""


def delayed_amax_bytes(gemms: int, phase: str) -> float:
    """Bytes of delayed scaling's amax all-reduce at the end of one autocast region's forward
    (phase "F") or backward ("B"): every FP8 GEMM's current amaxes of that pass, in one fp32
    buffer (Transformer Engine `reduce_and_update_fp8_tensors` concatenates them). Megatron-core
    wraps a whole TransformerBlock's forward in one `fp8_autocast` under the delayed recipe
    (`use_outer_quantization_context`, megatron/core/transformer/transformer_block.py), so that
    is one region per model chunk and microbatch; its group is the amax reduction group, the
    stage's tp x cp x dp ranks (`get_amax_reduction_group(with_context_parallel=True)`).
    Worked example: Llama's 4 FP8 linears (QKV, proj, fc1, fc2) x 10 layers: 480 B forward,
    320 B backward."""
    return DELAYED_AMAX_TENSORS[phase] * gemms * AMAX_BYTES


def _amax_reduced(ops: list, recipe: str, tp_sp: int) -> list:
    """A compute segment's ops as items, with current scaling's amax all-reduce over the tp group
    after the amax of each sequence-sharded tensor quantized before its FP8 all-gather: its shards
    must share one scale. Transformer Engine sets it for a column-parallel linear's input and a
    row-parallel linear's output gradient under sequence parallelism (`with_amax_reduction`,
    `amax_reduction_group = tp_group`, in Linear's and LayerNormLinear's current-scaling quantizer
    setup, transformer_engine/pytorch/module/linear.py)."""
    if recipe != "current" or tp_sp <= 1:
        return [tuple(ops)]
    out, seg = [], []
    for o in ops:
        seg.append(o)
        name, _, step = o.name.partition("/")
        base, _, what = name.rpartition(".")
        if step == "amax" and what in ("quantize_input", "quantize_grad") and sharded(base, o.phase):
            out += [tuple(seg), Comm("tp", "all_reduce", AMAX_BYTES, f"amax_{base}")]
            seg = []
    return out + ([tuple(seg)] if seg else [])


def with_casts(items: list, recipe: str, microbatches: int, tp_sp: int = 1) -> list:
    """Layer-program items with the quantize kernels inserted before each FP8 GEMM: inside a
    compute segment, in front of the GEMM; for a GEMM run in pieces (`Ring`), once for the whole
    GEMM as a segment before it. Under sequence parallelism (`tp_sp` > 1) the all-gathers of the
    FP8 GEMMs' inputs and output gradients move FP8 (`gather_factor`), and current scaling
    all-reduces those tensors' amaxes over the tp group first (`_amax_reduced`)."""
    out = []
    g = gather_factor(recipe)
    for it in items:
        if isinstance(it, tuple):
            seg = []
            for o in it:
                seg.extend(casts_for(o, recipe, microbatches, tp_sp=tp_sp))
                seg.append(o)
            out += _amax_reduced(seg, recipe, tp_sp)
        elif isinstance(it, Ring):
            pre = [c for o in it.segment for c in casts_for(o, recipe, microbatches, o.shape[0] * it.steps, tp_sp)]
            if pre:
                out += _amax_reduced(pre, recipe, tp_sp)
            if tp_sp > 1 and it.comm.name in GATHERS:
                it = replace(it, comm=replace(it.comm, size_bytes=it.comm.size_bytes * g))
            out.append(it)
        elif isinstance(it, Comm) and tp_sp > 1 and it.kind == "tp" and it.name in GATHERS:
            out.append(replace(it, size_bytes=it.size_bytes * g))
        else:
            out.append(it)
    return out

