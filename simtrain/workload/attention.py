"""Attention: the attention half of a layer and its core, with context parallelism around it.

Takes the per-rank dimensions (`base.LayerDims`); returns items of a layer program (compute
segments and `Comm`s, or a `Ring`): norm, QKV (or MLA's projections, `mla`), rotary, core, output
projection, residual, and the tensor-parallel communication points between them.

The core is one fused flash kernel or the unfused GEMMs and softmax. Model FLOPs count the full
square (4·b·s²·h forward for MHA); the hardware time uses what the kernels do: causal flash
attention computes half of it.

Context parallelism divides every token-wise cost by cp (each rank holds s/cp tokens, split in
2·cp chunks for causal balance) and adds the KV exchange: ring (cp rounds, each one block's
attention while the next KV block moves: `Ring`), allgather (K, V gathered before attention,
dK, dV reduce-scattered after) or ulysses (all-to-all from sequence- to head-sharding and back).
"""
from __future__ import annotations

from simtrain.workload.ir import ACT_BYTES, Comm, Op, Ring
from simtrain.workload.mla import MLAProjections
from simtrain.workload.nongemm import rope_ops


class Attention(MLAProjections):
    """The attention half of a layer (multi-head, grouped-query or MLA) on one rank."""

    def attention_block(self) -> tuple[list, list, tuple]:
        """(forward items, backward items, core items for selective recompute) of the attention
        half: norm, QKV (or MLA projections), rotary, core, output projection, residual."""
        t, T, h = self.tp, self.T, self.h
        seq_e = T * h / t if self.sp else T * h        # elements of a sequence-region tensor
        heads = self.a / t
        act_b = ACT_BYTES
        norm = "layernorm" if self.gpt else "rmsnorm"
        n1 = self.nongemm(norm, f"{norm}1", seq_e)
        n1b = self.nongemm(norm, f"{norm}1.bwd", seq_e, "B")
        if self.mla is not None:
            proj_f, proj_b, qk_dim, v_dim = self.mla_projections(heads)
        else:
            kv = self.g * self.d / t
            qkv_n = self.a * self.d / t + 2 * kv        # Q of a·d (h unless head_dim is given), K and V of g·d
            qkv, qkv_b, qkv_w = self.gemm_fbw("qkv", T, qkv_n, h)
            proj_f, proj_b = (qkv,), (qkv_b, qkv_w)
            qk_dim = v_dim = self.d
        rope = ()
        if not self.gpt:
            # rotary on Q, then on K (MLA: on the per-head rotary query part and the one shared rotary key)
            if self.mla is None:
                eq, ek = T * self.a * self.d / t, T * self.g * self.d / t
            else:
                eq, ek = T * heads * self.mla.qk_rope_head_dim, T * self.mla.qk_rope_head_dim
            rope = (rope_ops("rotary", eq, ek, "F", self.fusions.rope),
                    rope_ops("rotary.bwd", eq, ek, "B", self.fusions.rope))
            if self.qk_norm:
                # Qwen3 / Megatron --qk-layernorm: RMSNorm over each head of Q, then of K, on the
                # QKV output before the rotary; their backward after the rotary's
                qn = (self.nongemm("rmsnorm", "q_layernorm", eq) + self.nongemm("rmsnorm", "k_layernorm", ek),
                      self.nongemm("rmsnorm", "k_layernorm.bwd", ek, "B") + self.nongemm("rmsnorm", "q_layernorm.bwd", eq, "B"))
                rope = (qn[0] + rope[0], rope[1] + qn[1])
        out, out_b, out_w = self.gemm_fbw("attn_out", T, h, heads * v_dim)
        r1, r1b = self.residual(1, seq_e)
        msg = act_b * T * h                             # full activation buffer of one TP collective
        attn_core = proj_f + (rope[0] if rope else ())
        rope_b = rope[1] if rope else ()
        core_f, core_b = self.attention_core(heads, qk_dim, v_dim)
        fwd = [n1, self.tp_comm(True, 0, msg), attn_core, *core_f, (out,), self.tp_comm(True, 1, msg), r1]
        if self.mla is None and self.sp:
            # QKV's input gathered again beside its dgrad, its dgrad reduce-scattered beside its wgrad
            into_b = ((rope_b,) if rope_b else ()) + tuple(self.column_backward(0, qkv_b, qkv_w, msg))
        else:
            into_b = (rope_b + proj_b, self.tp_comm(False, 0, msg))
        bwd = [r1b, self.tp_comm(False, 1, msg), (out_b, out_w), *core_b, *into_b, n1b]
        if self.ub == "async_tp":
            # PyTorch async TP (torchtitan): every all-gather-matmul and matmul-reduce-scatter
            # decomposed into tp pieces beside copy-engine transfers, forward and backward
            if self.mla is None:
                into, into_b = [self.ub_ring("atp_qkv_ag", qkv, msg), rope[0] if rope else ()], (
                    rope_b, self.ub_ring("atp_qkv_dgrad_rs", qkv_b, msg), (qkv_w,))
            else:
                into, into_b = [self.tp_comm(True, 0, msg), attn_core], (rope_b + proj_b, self.tp_comm(False, 0, msg))
            fwd = [n1, *into, *core_f, self.ub_ring("atp_proj_rs", out, msg), r1]
            bwd = [r1b, self.ub_ring("atp_proj_dgrad_ag", out_b, msg), (out_w,), *core_b, *into_b, n1b]
        elif self.ub:
            # TE userbuffers: the all-gathers run as ring exchanges into the QKV GEMM (MLA's
            # projections keep the plain all-gather) and the output projection's dgrad, the
            # reduce-scatter piecewise beside the output projection
            # (the backward's re-gather of QKV's input and its dgrad's reduce-scatter run as bulk
            # overlaps, `column_backward`)
            if self.mla is None:
                into = [self.ub_ring("ub_qkv_ag", qkv, msg), rope[0] if rope else ()]
            else:
                into = [self.tp_comm(True, 0, msg), attn_core]
            fwd = [n1, *into, *core_f, self.ub_rs("proj_fprop", "ub_proj_rs", out, msg), r1]
            bwd = [r1b, self.ub_ring("ub_proj_dgrad_ag", out_b, msg), (out_w,), *core_b, *into_b, n1b]
        if not self.sp:
            # without SP, the all-reduce into attention is the backward's (the forward input is replicated)
            fwd = [n1, attn_core, *core_f, (out,), self.tp_comm(True, 1, msg), r1]
            bwd = [r1b, (out_b, out_w), *core_b, rope_b + proj_b, self.tp_comm(False, 0, msg), n1b]
        cores = tuple(x for x in core_f if not isinstance(x, Comm))
        return [x for x in fwd if x is not None], [x for x in bwd if x is not None], cores

    def attention_core(self, heads: float, qk_dim: float | None = None, v_dim: float | None = None) -> tuple[list, list]:
        """(forward items, backward items) of the attention core: one fused flash kernel (or the
        unfused GEMMs + softmax), with context parallelism's KV exchange around it."""
        b, s, d = self.b, self.s, self.d
        qk_dim = qk_dim or d
        v_dim = v_dim or d
        cp = self.cp
        if cp == 1:
            f, bw = self._core_ops(heads, s, s, qk_dim, v_dim, self.causal)
            return [f], [bw]
        # per rank kv bytes: K and V of its s/cp tokens (GQA: kv heads; MLA: the expanded per-head K, V)
        if self.mla is not None:
            kv_bytes = ACT_BYTES * b * (s / cp) * heads * (qk_dim + v_dim)
        else:
            kv_bytes = ACT_BYTES * b * (s / cp) * 2 * (self.g * self.d / self.tp)
        if self.cp_kind == "ring":
            # causal balance: every round computes half of one (s/cp x s/cp) block pair of work
            fr, br = self._core_ops(heads, s / cp, s / cp, qk_dim, v_dim, True)
            ring_f = Ring(cp, fr, Comm("cp", "send_recv", kv_bytes, "cp_kv"))
            ring_b = Ring(cp, br, Comm("cp", "send_recv", 2 * kv_bytes, "cp_kv_dkv"))
            return [ring_f], [ring_b]
        if self.cp_kind == "allgather":
            # local queries (2 chunks) against the whole gathered K, V: 1/cp of the causal square
            fr, br = self._core_ops(heads, s / cp, s, qk_dim, v_dim, True)
            return ([Comm("cp", "all_gather", kv_bytes * cp, "cp_kv_ag"), fr],
                    [br, Comm("cp", "reduce_scatter", kv_bytes * cp, "cp_dkv_rs")])
        # ulysses: all-to-all to (full sequence, heads / cp), attention, all-to-all back
        q_bytes = ACT_BYTES * b * (s / cp) * heads * qk_dim
        o_bytes = ACT_BYTES * b * (s / cp) * heads * v_dim
        fr, br = self._core_ops(heads / cp, s, s, qk_dim, v_dim, True)
        return ([Comm("cp", "all_to_all", q_bytes + kv_bytes, "cp_a2a_qkv"), fr, Comm("cp", "all_to_all", o_bytes, "cp_a2a_out")],
                [Comm("cp", "all_to_all", o_bytes, "cp_a2a_dout"), br, Comm("cp", "all_to_all", q_bytes + kv_bytes, "cp_a2a_dqkv")])

    def _core_ops(self, heads, sq, sk, qk_dim, v_dim, causal):
        """One attention kernel: sq queries against sk keys (model FLOPs count the full square:
        2·b·sq·sk·heads·(qk_dim + v_dim), i.e. 4·b·s²·h for MHA)."""
        b = self.b
        model_fwd = 2.0 * b * sq * sk * heads * (qk_dim + v_dim)
        if self.flash:
            real = model_fwd / 2 if causal else model_fwd        # causal: half the square is computed
            io = ACT_BYTES * b * heads * (sq * (qk_dim + v_dim) + sk * (qk_dim + v_dim))
            f = Op("flash_attn", "attention", "F", real, io, (sk, causal), model_fwd)
            bw = Op("flash_attn.bwd", "attention", "B", 2.5 * real, 2 * io, (sk, causal), 2 * model_fwd)
            return (f,), (bw,)
        # unfused: two batched GEMMs plus scale/mask/softmax/dropout over b·heads·s² elements
        s, d = sq, qk_dim
        sq_e = b * heads * s * s
        qk = Op("attn_scores", "gemm", "F", 2.0 * b * heads * s * s * d, ACT_BYTES * (2 * b * heads * s * d + sq_e), (s, s, d), 2.0 * b * heads * s * s * d, self.half_dtype)
        # scale + causal mask + softmax (fused: Megatron's scaled_upper_triang_masked_softmax), then
        # attention dropout (GPT), always its own kernel
        drop = self.nongemm("dropout", "attn_dropout", sq_e) if self.gpt else ()
        sm = self.nongemm("masked_softmax", "softmax", sq_e) + drop
        av = Op("attn_values", "gemm", "F", 2.0 * b * heads * s * s * d, ACT_BYTES * (sq_e + 2 * b * heads * s * d), (s, d, s), 2.0 * b * heads * s * s * d, self.half_dtype)
        qk_b = Op("attn_scores.bwd", "gemm", "B", 2 * qk.flops, 2 * qk.bytes, (s, s, d), 2 * qk.flops, self.half_dtype)
        dropb = self.nongemm("dropout", "attn_dropout.bwd", sq_e, "B") if self.gpt else ()
        smb = dropb + self.nongemm("masked_softmax", "softmax.bwd", sq_e, "B")
        av_b = Op("attn_values.bwd", "gemm", "B", 2 * av.flops, 2 * av.bytes, (s, d, s), 2 * av.flops, self.half_dtype)
        return (qk, *sm, av), (av_b, *smb, qk_b)
