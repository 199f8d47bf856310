"""Per-rank dimensions of a transformer stack and the operator factories every layer part uses.

Takes a Scenario (and whether to look at the language model or at its multimodal encoder);
`LayerDims` holds what one tensor-parallel rank sees of one microbatch (tokens T = b·s/cp, hidden
size, heads, kv heads, head and FFN widths, padded vocabulary, tp / sp / cp / ep / etp) and makes
`Op`s and `Comm`s from them: GEMMs (2mnk FLOPs forward, the same for each gradient), memory-bound
operators, Megatron's tensor-parallel communication points and the feed-forward network shared
by dense MLPs, routed and shared experts. The layer parts (attention, MLA, MoE, encoder
projector, memory counts) are mixins on top of it, composed in `transformer.LayerBuilder`.
"""
from __future__ import annotations

import math
from dataclasses import replace

from simtrain.hardware.devices import get_device
from simtrain.spec.scenario import Scenario
from simtrain.workload import fp8
from simtrain.workload.ir import ACT_BYTES, Comm, Op, Ring
from simtrain.workload.nongemm import flag_of, kernels

# Transformer Engine's userbuffers overlap as Megatron-LM's --tp-comm-overlap sets it up with no
# configuration file (transformer_engine/pytorch/module/base.py, initialize_ub's defaults): the
# pipelined overlap (proj_fprop, fc2_fprop) splits its GEMM in 4 and holds 16 SMs for the
# reduce-scatter kernels, the bulk overlap (qkv_wgrad, fc1_wgrad) holds 16; ring exchange
# (qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad) moves data with copy engines in tp pieces.
UB_PIPELINE_SPLITS = 4
UB_COMM_SMS = 16


def padded_vocab(vocab: int, tp: int, divisible_by: int) -> int:
    """Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by x tp.

    >>> padded_vocab(50257, 8, 128)      # GPT-2's vocabulary, tp 8: the next multiple of 1024
    51200
    >>> padded_vocab(1024, 2, 128)       # already a multiple of 256
    1024
    """
    m = divisible_by * tp
    return int(math.ceil(vocab / m) * m)



class LayerDims:
    """One rank's view of a transformer stack (the language model, or with `encoder` its vision
    encoder), and the operators built from it."""

    def __init__(self, sc: Scenario, encoder: bool = False):
        self.sc = sc
        m, t, p = sc.model, sc.training, sc.parallel
        self.tp = p.tp
        self.sp = p.sequence_parallel and p.tp > 1
        self.cp = 1 if encoder else p.cp
        self.cp_kind = p.cp_kind
        self.b = t.micro_batch_size
        self.flash = t.flash_attention
        self.fusions = t.fusions
        self.causal = True
        if encoder:
            e = m.encoder
            self.s, self.h, self.a, self.g = e.tokens_per_sample, e.hidden_size, e.num_attention_heads, e.num_attention_heads
            self.d, self.f = e.hidden_size // e.num_attention_heads, e.ffn_hidden_size
            self.gpt = True                    # ViT blocks: LayerNorm, GeLU MLP, biases
            self.causal = False                # bidirectional attention over the patches
            self.mla = None
            self.qk_norm = False
            self.V = 0
        else:
            self.s, self.h = m.seq_length, m.hidden_size
            self.a, self.g, self.d = m.num_attention_heads, m.num_key_value_heads, m.head_dim
            self.f = m.ffn_hidden_size
            self.gpt = m.architecture == "gpt"
            self.mla = m.mla
            self.qk_norm = m.qk_norm and m.mla is None     # per-head norms of Q and K (Qwen3)
            self.V = padded_vocab(m.vocab_size, p.tp, m.make_vocab_size_divisible_by)
        self.T = self.b * self.s // self.cp         # tokens per microbatch on this rank
        # tensor-parallel collectives overlapped with their GEMMs (needs sp; the loader checks the
        # device's SM count): the part of the SMs a pipelined or bulk overlap leaves its GEMM
        self.ub = p.tp_overlap
        self.ub_sms = get_device(sc.cluster.device).sms if self.ub == "userbuffers" else 0
        self.ub_cfg = p.tp_comm_overlap_cfg
        # FP8 as Transformer Engine runs it (`fp8`): TE linears in FP8, the rest 16-bit
        self.fp8 = t.precision == "fp8"
        self.fp8_recipe = t.fp8_recipe
        # bytes per element of each operand a deferred FP8 weight-gradient GEMM keeps (`with_split`)
        self.wgrad_kept = fp8.stored_bytes(t.fp8_recipe) if self.fp8 else ACT_BYTES
        self.moe = None if encoder else m.moe
        self.ep, self.etp = p.ep, p.etp
        self._layers: dict = {}

    def gemm(self, name: str, m: float, n: float, k: float, phase: str = "F", replicated: bool = False,
             dtype: str = "") -> Op:
        """`replicated`: every tensor-parallel rank runs the same GEMM, so the model-FLOP count
        takes it once (1/tp per rank). `dtype` fp8: FP8 operands (1 byte), 16-bit output."""
        fl = 2.0 * m * n * k
        by = fp8.gemm_bytes(m, n, k, dtype)
        return Op(name, "gemm", phase, fl, by, (m, n, k), fl / self.tp if replicated else fl, dtype)

    @property
    def half_dtype(self) -> str:
        """The tag of a GEMM kept 16-bit: bf16 in an FP8 run, else the run's own precision ("")."""
        return "bf16" if self.fp8 else ""

    def mem(self, name: str, nbytes: float, phase: str = "F") -> Op:
        return Op(name, "memory", phase, 0.0, nbytes)

    def nongemm(self, kernel: str, name: str, elements: float, phase: str = "F") -> tuple:
        """The kernels of a non-GEMM family (`nongemm.KERNELS`) on `elements` elements, fused or
        not as `training.fusions` says: one memory-bound Op per kernel launch."""
        flag = flag_of(kernel)
        return kernels(kernel, name, elements, phase, flag is not None and getattr(self.fusions, flag))

    def residual(self, i: int, elements: float) -> tuple[tuple, tuple]:
        """(forward, backward) kernels of a layer half's residual: GPT's bias-dropout-add
        (`dropout_add{i}`), or a plain residual add (`residual_add{i}`: read 2, write 1; its
        backward 2 passes)."""
        if self.gpt:
            name = f"dropout_add{i}"
            return self.nongemm("bias_dropout_add", name, elements), self.nongemm("bias_dropout_add", name + ".bwd", elements, "B")
        name = f"residual_add{i}"
        return (self.mem(name, 3 * ACT_BYTES * elements),), (self.mem(name + ".bwd", 2 * ACT_BYTES * elements, "B"),)

    def gemm_fbw(self, name: str, m: float, n: float, k: float, replicated: bool = False,
                 te: bool = True) -> tuple[Op, Op, Op]:
        """Forward, input-gradient (m x k x n) and weight-gradient (k x n x m) GEMMs. `te`: a
        Transformer Engine linear inside a transformer layer (FP8 in an FP8 run); False for the
        LM head, the router, gates and the projector, which stay 16-bit."""
        dt = "fp8" if te and self.fp8 else self.half_dtype
        return (self.gemm(name, m, n, k, replicated=replicated, dtype=dt),
                self.gemm(name + ".dgrad", m, k, n, "B", replicated, dt),
                self.gemm(name + ".wgrad", k, n, m, "W", replicated, dt))

    def tp_comm(self, fwd: bool, i: int, msg: float) -> Comm | None:
        """Megatron's tensor-parallel communication point i (0: into attention, 1: out of it, 2:
        into the MLP, 3: out of it): all-reduce, or with SP all-gather into a column-parallel GEMM
        and reduce-scatter out of a row-parallel one; the backward swaps them."""
        if self.tp == 1:
            return None
        if not self.sp:
            return Comm("tp", "all_reduce", msg, f"tp_ar{i}")
        kind = ("all_gather" if i % 2 == 0 else "reduce_scatter") if fwd else ("reduce_scatter" if i % 2 == 0 else "all_gather")
        return Comm("tp", kind, msg, f"tp_{kind}{i}")

    def ub_ring(self, name: str, g: Op, msg: float) -> Ring:
        """Ring exchange (TE userbuffers; PyTorch async TP): the all-gather of a sequence-sharded
        tensor fed into GEMM `g` in tp pieces of T/tp rows, each computed while the next shard
        (msg/tp bytes) moves one hop; or (async TP's matmul-reduce-scatter) GEMM `g` in tp pieces,
        each piece's partial output sent to the rank that owns its rows while the next computes.
        Copy engines move the data, so the GEMM keeps every SM."""
        m, n, k = g.shape
        t = self.tp
        return Ring(t, (self.gemm(g.name + "/ring", m / t, n, k, g.phase, dtype=g.dtype),), Comm("tp", "send_recv", msg / t, name))

    def ub_setting(self, te: str) -> tuple[str, float, int]:
        """(method, share of the SMs the GEMM keeps, pipeline pieces) of TE GEMM `te`
        (`UB_GEMMS`): parallel.tp_comm_overlap_cfg's entry, TE's initialize_ub defaults where it
        says nothing (ring exchange for the all-gathers, pipeline for the forward reduce-scatters,
        bulk for QKV's and fc1's dgrad and wgrad; 16 SMs, 4 pieces)."""
        g = getattr(self.ub_cfg, te)
        if te in ("proj_fprop", "fc2_fprop"):
            default = "pipeline"
        elif te in ("qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad"):
            default = "bulk"
        else:
            default = "ring_exchange"
        method = default if g.method == "default" else g.method
        sms = self.ub_sms
        share = (sms - (g.num_sm or UB_COMM_SMS)) / sms if sms else 1.0
        return method, share, g.num_splits or UB_PIPELINE_SPLITS

    def ub_rs(self, te: str, name: str, g: Op, msg: float) -> Ring:
        """The reduce-scatter out of row-parallel GEMM `g` (TE's proj_fprop, fc2_fprop) as its
        userbuffers setting says: pipelined (`ub_pipeline`) or a ring exchange (`ub_ring`:
        copy-engine transfers of each piece's partial output, every SM kept)."""
        method, share, splits = self.ub_setting(te)
        if method == "ring_exchange":
            return self.ub_ring(name, g, msg)
        return self.ub_pipeline(name, g, msg, splits, share)

    def ub_pipeline(self, name: str, g: Op, msg: float, splits: int = UB_PIPELINE_SPLITS, share: float = 1.0) -> Ring:
        """Pipelined overlap (TE userbuffers): GEMM `g` in `splits` row pieces, each piece's output
        reduce-scattered while the next computes, on the `share` of the SMs the reduce-scatter
        kernels leave."""
        m, n, k = g.shape
        s = splits
        return Ring(s, (self.gemm(g.name + "/chunk", m / s, n, k, g.phase, dtype=g.dtype),),
                    Comm("tp", "reduce_scatter", msg / s, name), "pipeline", share)

    def ub_bulk(self, te: str, name: str, g: Op, comm: Comm) -> Ring:
        """Bulk overlap (TE userbuffers): collective `comm` beside the independent GEMM `g` (TE's
        `te`), on the SMs its kernels leave."""
        return Ring(1, (g,), replace(comm, name=name), "bulk", self.ub_setting(te)[1])

    def column_backward(self, i: int, dgrad: Op, wgrad: Op, msg: float) -> list:
        """The backward of a column-parallel linear fed by sequence-parallel all-gather point i
        (0: QKV, 2: fc1), as Megatron's linear layers and TE's LayerNormLinear run it: the forward
        kept its input sequence-sharded, so the backward gathers it again (an asynchronous
        all-gather of msg bytes beside the input-gradient GEMM), then reduce-scatters the input
        gradient beside the weight-gradient GEMM, which needs the gathered input. TE userbuffers
        run both as bulk overlaps on the SMs their kernels leave (`ub_bulk`); NCCL's run beside
        the GEMMs, which the measured compute-under-communication slowdown prices."""
        gather = Comm("tp", "all_gather", msg, f"tp_regather{i}")
        scatter = self.tp_comm(False, i, msg)
        part = "qkv" if i == 0 else "fc1"
        if self.ub:
            return [self.ub_bulk(f"{part}_dgrad", f"ub_{part}_dgrad_ag", dgrad, gather),
                    self.ub_bulk(f"{part}_wgrad", f"ub_{part}_wgrad_rs", wgrad, scatter)]
        return [Ring(1, (dgrad,), gather, "bulk"), Ring(1, (wgrad,), scatter, "bulk")]

    def ffn(self, tokens: float, width: float, prefix: str) -> tuple[tuple, tuple]:
        """(forward ops, backward ops) of one feed-forward network on `tokens` rows with `width`
        local columns: GeLU (fc1, fc2) or SwiGLU (fused gate/up, down)."""
        T, h = tokens, self.h
        if self.gpt:
            fc1, fc1_b, fc1_w = self.gemm_fbw(prefix + "fc1", T, width, h)
            act = self.nongemm("bias_gelu", prefix + "gelu", T * width)
            actb = self.nongemm("bias_gelu", prefix + "gelu.bwd", T * width, "B")
        else:
            fc1, fc1_b, fc1_w = self.gemm_fbw(prefix + "fc1_gate_up", T, 2 * width, h)
            act = self.nongemm("bias_swiglu", prefix + "swiglu", T * width)
            actb = self.nongemm("bias_swiglu", prefix + "swiglu.bwd", T * width, "B")
        fc2, fc2_b, fc2_w = self.gemm_fbw(prefix + "fc2", T, h, width)
        return (fc1, *act, fc2), (fc2_b, fc2_w, *actb, fc1_b, fc1_w)
