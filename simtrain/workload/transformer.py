"""Transformer layers: the dense layer (attention + MLP), the embedding, the LM head, and
`LayerBuilder`, which composes every layer part into one per-rank builder.

Takes a Scenario (and whether to build the multimodal encoder's blocks); returns `LayerProgram`s:
a layer of kind `dense` or `moe` (attention from `attention`, the MLP here or the experts from
`moe`), with its recompute items (full: the whole forward; selective: the attention core) and
its B / W split, cached per distinct layer; the embedding; the LM head with the loss. Parameter
and activation counts come from `memory`, the projector from `encoder`.
"""
from __future__ import annotations

from simtrain.workload import fp8
from simtrain.workload.attention import Attention
from simtrain.workload.encoder import EncoderProjector
from simtrain.workload.ir import ACT_BYTES, Comm, LayerProgram, Ring, as_recompute, join_segments, with_split
from simtrain.workload.memory import Memory
from simtrain.workload.moe import MoELayers


class LayerBuilder(Attention, MoELayers, EncoderProjector, Memory):
    """Every layer program of one rank: `LayerDims` gives the dimensions and operators, the
    mixins the layer parts; this class assembles them into layers."""

    def layer(self, kind: str = "dense", shares: tuple | None = None, ep_rank: int = 0,
              recompute: str | None = None) -> LayerProgram:
        """A layer's program: `dense` (attention + MLP), or `moe` with the layer's expert shares
        (see `routing_shares`) seen from expert-parallel rank `ep_rank`; `recompute` is the layer's
        mode (`memory.recompute_modes`; None: training.recompute). Cached per distinct layer."""
        rc = self.sc.training.recompute if recompute is None else ("full" if recompute == "inner" else recompute)
        key = (kind, shares, ep_rank if kind == "moe" else 0, rc)
        hit = self._layers.get(key)
        if hit is None:
            hit = self._layers[key] = self._layer(kind, shares, ep_rank, rc)
        return hit

    def _layer(self, kind: str, shares: tuple | None, ep_rank: int, rc: str) -> LayerProgram:
        attn_f, attn_b, core_f = self.attention_block()
        if kind == "moe":
            mlp_f, mlp_b = self.moe_block(shares, ep_rank)
        else:
            mlp_f, mlp_b = self.mlp_block(self.f)
        if self.fp8:
            # Transformer Engine's quantize kernels before each FP8 GEMM (`fp8`)
            # (under sequence parallelism, gathered inputs quantized on their shards and gathered
            # in FP8; MLA's projections share one gathered input and keep the plain rule)
            q = (self.fp8_recipe, self.sc.num_microbatches)
            sp = self.tp if self.sp else 1
            qa = q + (sp if self.mla is None else 1,)
            attn_f, attn_b = fp8.with_casts(attn_f, *qa), fp8.with_casts(attn_b, *qa)
            mlp_f, mlp_b = fp8.with_casts(mlp_f, *q, sp), fp8.with_casts(mlp_b, *q, sp)
        fwd_items = join_segments(attn_f + mlp_f)
        bwd_items = join_segments(mlp_b + attn_b)
        if rc == "full":
            recompute = tuple(as_recompute(x) for x in fwd_items)
        elif rc == "selective":
            # Megatron-core recompute_modules: the attention core, and the named operators
            # re-run before the backward (norms, MLA up-projections with the rotary, expert activation)
            mods = set(self.sc.training.recompute_modules)
            names = set()
            if "layernorm" in mods:
                names |= {"layernorm1", "layernorm2", "rmsnorm1", "rmsnorm2", "q_norm", "kv_norm"}
            if "mla_up_proj" in mods and self.mla is not None:
                names |= {"q_up", "kv_up", "rotary"}
            if "moe_act" in mods:
                names |= {"experts.swiglu", "experts.gelu"}
            # an unfused family's kernels are named `name/step`
            ops = tuple(as_recompute(o) for it in fwd_items if isinstance(it, tuple) for o in it
                        if o.name.split("/")[0] in names)
            recompute = ((ops,) if ops else ()) + (tuple(as_recompute(x) for x in core_f) if "core_attn" in mods else ())
        elif rc == "op":
            recompute = self.op_recompute(fwd_items)
        else:
            recompute = ()
        t = self.tp
        return with_split(LayerProgram(fwd_items, bwd_items, recompute), self.h, t if self.sp else 1, self.wgrad_kept)

    def op_recompute(self, fwd_items: tuple) -> tuple:
        """What torchtitan's op-level selective checkpointing re-runs before a layer's backward
        (`selective_ac_option = "op"`, torchtitan/parallelisms/parallelize_llama.py at 9dec370:
        the outputs of matmuls, of the attention kernel and of reduce-scatters are kept, except
        every second matmul of the layer; everything else is recomputed).

        torchtitan's layer runs the matmuls wq, wk, wv, wo, then w1, w3, w2 (SwiGLU) or fc1, fc2
        (GeLU), so wk, wo and w3 are the recomputed ones; the recompute re-runs the layer's
        forward in order until the last tensor the backward needs (the input of the down
        projection) is back, so it covers: the norms, the K share of the fused QKV GEMM, the
        rotary, the output projection, the first residual, the gate-up GEMM's w3 half (SwiGLU),
        the activation, and the tensor-parallel all-gathers / all-reduces between them (their
        outputs are not kept). The down projection and what follows it are not re-run. With
        FP8 (torchao's float8 linears) every linear is a scaled matmul, which torchtitan's
        current policy (torchtitan/distributed/activation_checkpoint.py: the compute-intensive
        op list) keeps without counting it: only the non-matmul kernels are re-run."""
        out, done = [], False
        for it in fwd_items:
            if done:
                break
            if isinstance(it, Comm):
                if it.name.startswith("tp_") and it.collective in ("all_gather", "all_reduce"):
                    out.append(it)
                continue
            if isinstance(it, Ring):
                continue          # ring attention: the attention kernels' outputs are kept
            seg = []
            for o in it:
                base = o.name.split("/")[0]
                if o.kind == "gemm" and base.endswith("fc2"):
                    done = True          # the down projection: the recompute stops before it
                    break
                if o.kind == "attention":
                    continue             # the attention kernel's output is kept
                if o.kind == "gemm":
                    m, n, k = o.shape
                    if self.fp8:
                        continue         # float8 (torch._scaled_mm) outputs: all kept
                    if base == "qkv":    # the K projection: g·d columns of this rank
                        o = self.gemm("qkv", m, self.g * self.d / self.tp, k, dtype=o.dtype)
                    elif base == "fc1_gate_up":
                        o = self.gemm("fc1_gate_up", m, n / 2, k, dtype=o.dtype)    # w3, the up half
                    elif base != "attn_out":
                        continue         # kept (GeLU's fc1)
                seg.append(as_recompute(o))
            if seg:
                out.append(tuple(seg))
        return tuple(out)

    def mlp_block(self, width: float) -> tuple[list, list]:
        """Dense (or shared-expert) MLP of `width`, tensor-parallel: fc1 column-, fc2 row-split."""
        t, T, h = self.tp, self.T, self.h
        seq_e = T * h / t if self.sp else T * h
        act_b = ACT_BYTES
        norm = "layernorm" if self.gpt else "rmsnorm"
        n2 = self.nongemm(norm, f"{norm}2", seq_e)
        n2b = self.nongemm(norm, f"{norm}2.bwd", seq_e, "B")
        core_f, core_b = self.ffn(T, width / t, "")
        r2, r2b = self.residual(2, seq_e)
        msg = act_b * T * h
        if self.ub == "async_tp":
            fc1, *act, fc2 = core_f
            fc2_b, fc2_w, *actb, fc1_b, fc1_w = core_b
            fwd = [n2, self.ub_ring("atp_fc1_ag", fc1, msg), tuple(act), self.ub_ring("atp_fc2_rs", fc2, msg), r2]
            bwd = [r2b, self.ub_ring("atp_fc2_dgrad_ag", fc2_b, msg), (fc2_w, *actb),
                   self.ub_ring("atp_fc1_dgrad_rs", fc1_b, msg), (fc1_w,), n2b]
        elif self.ub:
            # TE userbuffers: fc1's all-gather as a ring exchange, fc2's reduce-scatter piecewise;
            # backward: fc2's dgrad fed by a ring exchange, fc1's input gathered again beside its
            # dgrad and its dgrad reduce-scattered beside its wgrad (bulk overlaps)
            fc1, *act, fc2 = core_f
            fc2_b, fc2_w, *actb, fc1_b, fc1_w = core_b
            fwd = [n2, self.ub_ring("ub_fc1_ag", fc1, msg), tuple(act), self.ub_rs("fc2_fprop", "ub_fc2_rs", fc2, msg), r2]
            bwd = [r2b, self.ub_ring("ub_fc2_dgrad_ag", fc2_b, msg), (fc2_w, *actb),
                   *self.column_backward(2, fc1_b, fc1_w, msg), n2b]
        elif self.sp:
            *rest, fc1_b, fc1_w = core_b
            fwd = [n2, self.tp_comm(True, 2, msg), core_f, self.tp_comm(True, 3, msg), r2]
            bwd = [r2b, self.tp_comm(False, 3, msg), tuple(rest), *self.column_backward(2, fc1_b, fc1_w, msg), n2b]
        else:
            fwd = [n2 + core_f, self.tp_comm(True, 3, msg), r2]
            bwd = [r2b + core_b, self.tp_comm(False, 2, msg), n2b]
        return [x for x in fwd if x is not None], [x for x in bwd if x is not None]

    def embedding(self) -> LayerProgram:
        e = self.T * self.h
        f = (self.mem("embedding", ACT_BYTES * e * (2 if self.gpt else 1)),)   # word (+ position) lookup
        b = (self.mem("embedding.bwd", 4 * e * (2 if self.gpt else 1), "W"),)   # scatter-add into fp32 grads
        return with_split(LayerProgram((f,), (b,), ()), self.h, self.tp if self.sp else 1)

    def head(self) -> LayerProgram:
        t, T, h, V = self.tp, self.T, self.h, self.V
        seq_e = T * h / t if self.sp else T * h
        kind = "layernorm" if self.gpt else "rmsnorm"
        norm = self.nongemm(kind, "final_norm", seq_e)
        normb = self.nongemm(kind, "final_norm.bwd", seq_e, "B")
        lm, lm_b, lm_w = self.gemm_fbw("lm_head", T, V / t, h, te=False)
        ce = self.nongemm("cross_entropy", "cross_entropy", T * V / t)      # over this rank's vocabulary shard
        ceb = self.nongemm("cross_entropy", "cross_entropy.bwd", T * V / t, "B")
        msg = ACT_BYTES * T * h
        # vocab-parallel LM head: with SP the sequence-sharded input is all-gathered (forward) and its
        # gradient reduce-scattered (backward); without SP the input is replicated and only the
        # input gradient needs an all-reduce.
        items_f, items_b = [norm], [ceb + (lm_b, lm_w)]
        if t > 1 and self.sp:
            items_f.append(Comm("tp", "all_gather", msg, "tp_head_in"))
        if t > 1:
            items_b.append(Comm("tp", "reduce_scatter" if self.sp else "all_reduce", msg, "tp_head_grad"))
        items_f.append((lm,) + ce)
        items_b.append(normb)
        return with_split(LayerProgram(tuple(items_f), tuple(items_b), ()), h, t if self.sp else 1)
