"""Non-GEMM kernels of a training step, as the fused or unfused kernels actually run them.

Takes a kernel family (norm, bias-GeLU, SwiGLU, bias-dropout-add, masked softmax, attention
dropout, RoPE, cross-entropy), the element count of the tensor it works on, the phase and whether
the family's fusion is on (`training.fusions`); returns one memory-bound `Op` per kernel launch,
each with the HBM bytes that kernel reads and writes and its kernel class in `Op.shape`:

  norm         a fused row-normalisation kernel (apex FusedLayerNorm / persistent LayerNorm,
               Transformer Engine or Megatron-core fused RMSNorm)
  softmax      Megatron's fused scale-mask-softmax (scaled_upper_triang_masked_softmax)
  elementwise  one fused pointwise kernel (jit/nvFuser bias-GeLU, bias-SwiGLU, bias-dropout-add,
               fused RoPE, the jit-fused steps of the fused cross-entropy)
  eager        one eager PyTorch kernel of an unfused chain (a cast, add, mul, exp, a row reduction,
               torch's own dropout, LayerNorm and softmax kernels)

The cost model prices each kernel by its bytes at the class's achieved bandwidth for that size
(`simtrain.cost.roofline`), and every kernel is one launch for the host-issue cost. Unfused, a
family runs several kernels, each reading and writing the tensor again; fused, one pass.

Bytes per element with 16-bit activations (a = 2 bytes, a dropout mask 1 byte, fp32 4 bytes);
E is the element count of the family's tensor:

  family             fused F        fused B        unfused F               unfused B
  norm (LayerNorm)   2a  (1)        3a  (1)        2a (1, eager)           3a + 2a (2)
  norm (RMSNorm)     2a  (1)        3a  (1)        36 (6)                  68 (10)
  bias_gelu          2a  (1)        3a  (1)        4a (2)                  4a (2)
  bias_swiglu        3a  (1)        5a  (1)        5a (2)                  13a (4)
  bias_dropout_add   3a+1 (1)       2a+1 (1)       7a+1 (3)                3a+1 (2)
  masked_softmax     2a  (1)        3a  (1)        6a (3)                  7a (3)
  dropout (scores)   2a+1 (1, eager) always        2a+1 (1, eager)
  rope, per tensor   2a  (1)        2a  (1)        10a (5)                 10a (5)
  cross_entropy      26 (4)         14 (2)         38 (6)                  14 (2)

(kernels in brackets). SwiGLU's E is its output (the input is 2E); cross-entropy's E is the
logits of this rank (tokens x vocab / tp). The kernel chains:

- RMSNorm unfused (Megatron's torch RMSNorm, `x.float()`, `pow(2).mean(-1)`, `* rsqrt`,
  `.type_as(x) * weight`): cast 2+4, pow 4+4, mean 4, mul 4+4, cast 4+2, mul 2+2 = 36 bytes; its
  autograd: weight grad (dy * x̂) 6 + its row sum 2, dy * w 4, cast 6, dx̂ * rstd 8, the rstd
  branch's product 12 and row sum 4, the pow backward 8, the branch sum 12, the cast back 6 = 68.
- LayerNorm unfused is torch's native LayerNorm: one forward kernel, and a backward of two (dx;
  then dgamma/dbeta re-reading dy and x).
- bias-GeLU unfused: bias add, GeLU; backward GeLU's (dy, x -> dx) and the bias gradient's row sum.
- SwiGLU unfused (`silu(x1) * x2` on the chunked fc1 output): silu, mul; backward dy·x2,
  dy·silu(x1), silu's backward, and the cat of dx1, dx2 into the fc1 output gradient.
- bias-dropout-add unfused: bias add, dropout (torch's kernel writes the output and the mask),
  residual add; backward dropout's (dy, mask -> dx) and the bias gradient's row sum. Fused, the
  backward reads dy and the mask and writes dx; the residual's gradient is dy itself.
- masked softmax unfused (Megatron's FusedScaleMaskSoftmax falling back to torch): scale,
  masked_fill, softmax; backward the three in reverse (softmax's reads y and dy).
- RoPE (Megatron `_apply_rotary_pos_emb_bshd`, run once on Q and once on K, fused or not):
  unfused t·cos, rotate_half's neg (half the tensor) and cat, ·sin, add; the backward runs the
  same five kinds of kernel on the gradient.
- cross-entropy unfused (Megatron's vocab-parallel cross-entropy on `logits.float()`): cast
  2+4, row max 4, subtract max 4+4, exp 4+4, row sum 4, divide 4+4 = 38; backward scale by the
  loss gradient 4+4 and the cast back to 16-bit 4+2 = 14. Fused (`--cross-entropy-loss-fusion`,
  megatron/core/fusions/fused_cross_entropy.py): upcast + max 2+4, in-place exp(x - max) 4+4,
  row sum 4, divide 4+4 = 26; backward the in-place scaling 4+4 and the cast 4+2 = 14.
Row-sized tensors (means, maxima, a bias) and the all-reduces between the cross-entropy steps
are left out: they are a row's worth of bytes per row.
"""
from __future__ import annotations

from simtrain.workload.ir import ACT_BYTES, Op

KERNEL_CLASSES = ("norm", "softmax", "elementwise", "eager")
"""Kernel classes a device profile can give an achieved-bandwidth curve for (`nongemm`)."""

FAMILIES = ("norm", "bias_gelu", "bias_swiglu", "bias_dropout_add", "masked_softmax", "rope", "cross_entropy")
"""The families `training.fusions` switches; attention dropout has no fused form without flash attention."""

_A, _M, _F = ACT_BYTES, 1, 4         # activation, dropout mask and fp32 bytes per element

# family -> (fused?, phase) -> ((step, class, bytes per element), ...)
KERNELS: dict = {
    "layernorm": {
        (True, "F"): (("", "norm", 2 * _A),),
        (True, "B"): (("", "norm", 3 * _A),),
        (False, "F"): (("", "eager", 2 * _A),),
        (False, "B"): (("dx", "eager", 3 * _A), ("dgamma_dbeta", "eager", 2 * _A)),
    },
    "rmsnorm": {
        (True, "F"): (("", "norm", 2 * _A),),
        (True, "B"): (("", "norm", 3 * _A),),
        (False, "F"): (("cast", "eager", _A + _F), ("pow", "eager", 2 * _F), ("mean", "eager", _F),
                       ("mul_rstd", "eager", 2 * _F), ("cast_back", "eager", _F + _A), ("mul_weight", "eager", 2 * _A)),
        (False, "B"): (("dweight_mul", "eager", 3 * _A), ("dweight_sum", "eager", _A), ("dy_weight", "eager", 2 * _A),
                       ("cast", "eager", _A + _F), ("mul_rstd", "eager", 2 * _F), ("rstd_mul", "eager", 3 * _F),
                       ("rstd_sum", "eager", _F), ("pow", "eager", 2 * _F), ("add", "eager", 3 * _F),
                       ("cast_back", "eager", _F + _A)),
    },
    "bias_gelu": {
        (True, "F"): (("", "elementwise", 2 * _A),),
        (True, "B"): (("", "elementwise", 3 * _A),),
        (False, "F"): (("bias", "eager", 2 * _A), ("gelu", "eager", 2 * _A)),
        (False, "B"): (("gelu", "eager", 3 * _A), ("dbias", "eager", _A)),
    },
    "bias_swiglu": {
        (True, "F"): (("", "elementwise", 3 * _A),),
        (True, "B"): (("", "elementwise", 5 * _A),),
        (False, "F"): (("silu", "eager", 2 * _A), ("mul", "eager", 3 * _A)),
        (False, "B"): (("dsilu_out", "eager", 3 * _A), ("dx2", "eager", 3 * _A), ("silu", "eager", 3 * _A),
                       ("cat", "eager", 4 * _A)),
    },
    "bias_dropout_add": {
        (True, "F"): (("", "elementwise", 3 * _A + _M),),
        (True, "B"): (("", "elementwise", 2 * _A + _M),),
        (False, "F"): (("bias", "eager", 2 * _A), ("dropout", "eager", 2 * _A + _M), ("add", "eager", 3 * _A)),
        (False, "B"): (("dropout", "eager", 2 * _A + _M), ("dbias", "eager", _A)),
    },
    "masked_softmax": {
        (True, "F"): (("", "softmax", 2 * _A),),
        (True, "B"): (("", "softmax", 3 * _A),),
        (False, "F"): (("scale", "eager", 2 * _A), ("mask", "eager", 2 * _A), ("softmax", "eager", 2 * _A)),
        (False, "B"): (("softmax", "eager", 3 * _A), ("mask", "eager", 2 * _A), ("scale", "eager", 2 * _A)),
    },
    "dropout": {
        (True, "F"): (("", "eager", 2 * _A + _M),),
        (True, "B"): (("", "eager", 2 * _A + _M),),
        (False, "F"): (("", "eager", 2 * _A + _M),),
        (False, "B"): (("", "eager", 2 * _A + _M),),
    },
    "rope": {
        (True, "F"): (("", "elementwise", 2 * _A),),
        (True, "B"): (("", "elementwise", 2 * _A),),
        (False, "F"): (("mul_cos", "eager", 2 * _A), ("neg", "eager", _A), ("cat", "eager", 2 * _A),
                       ("mul_sin", "eager", 2 * _A), ("add", "eager", 3 * _A)),
        (False, "B"): (("mul_cos", "eager", 2 * _A), ("mul_sin", "eager", 2 * _A), ("neg", "eager", _A),
                       ("cat", "eager", 2 * _A), ("add", "eager", 3 * _A)),
    },
    "cross_entropy": {
        (True, "F"): (("max", "elementwise", _A + _F), ("exp", "elementwise", 2 * _F), ("sum", "eager", _F),
                      ("div", "elementwise", 2 * _F)),
        (True, "B"): (("scale", "elementwise", 2 * _F), ("cast", "eager", _F + _A)),
        (False, "F"): (("cast", "eager", _A + _F), ("max", "eager", _F), ("sub_max", "eager", 2 * _F),
                       ("exp", "eager", 2 * _F), ("sum", "eager", _F), ("div", "eager", 2 * _F)),
        (False, "B"): (("scale", "eager", 2 * _F), ("cast", "eager", _F + _A)),
    },
}

_FLAG = {"layernorm": "norm", "rmsnorm": "norm", "dropout": None}


def flag_of(kernel: str) -> str | None:
    """The `training.fusions` key that switches a kernel family (None: no fused form)."""
    return _FLAG.get(kernel, kernel)


def kernels(kernel: str, name: str, elements: float, phase: str, fused: bool, parts: int = 1) -> tuple:
    """The kernels of one family on a tensor of `elements` elements, one Op per launch.

    `name` names the family's op (`layernorm1`, `gelu`); an unfused chain's kernels are named
    `name/step`. `phase` F or B (the backward's kernels run in phase B). `parts` > 1 splits the
    tensor into that many equal launches of the same chain (RoPE on Q and on K use `rope_ops`)."""
    chain = KERNELS[kernel][(bool(fused), "F" if phase == "F" else "B")]
    out = []
    for _ in range(parts):
        for step, cls, per_elem in chain:
            label = name if not step or len(chain) == 1 else f"{name}/{step}"
            out.append(Op(label, "memory", phase, 0.0, per_elem * elements / parts, (cls,)))
    return tuple(out)


def rope_ops(name: str, q_elements: float, k_elements: float, phase: str, fused: bool) -> tuple:
    """RoPE on Q, then on K: Megatron applies the rotary to each tensor with its own call."""
    return kernels("rope", name, q_elements, phase, fused) + kernels("rope", name, k_elements, phase, fused)


def family_bytes(kernel: str, elements: float, phase: str, fused: bool) -> float:
    """Total bytes one family moves (the sum over its kernels)."""
    return sum(o.bytes for o in kernels(kernel, "x", elements, phase, fused))
