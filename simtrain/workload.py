"""Workload (second pipeline stage): a dense decoder transformer as per-layer operator templates.

For one microbatch on one tensor-parallel rank, each layer is a sequence of compute segments and
tensor-parallel communication points (Megatron's column/row split). Every operator carries its
FLOPs, bytes moved and shape; the backward is split into input-gradient (B) and weight-gradient (W)
parts so schedules that defer W can use them.

FLOP accounting (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", SC'21, eq. 3): a GEMM of m x n x k costs 2mnk forward, the same again for the
input gradient and for the weight gradient; the attention core costs 4·b·s²·h forward (scores and
weighted values, full square). Model FLOPs per step = 3 x forward FLOPs, recompute excluded.
Worked example (GPT, f = 4h, MHA): per layer forward 24·b·s·h² + 4·b·s²·h, so the model total is
72·B·s·l·h²·(1 + s/(6h) + V/(12·h·l)), the paper's formula.

Hardware time uses what the kernels really do: causal flash attention computes half the square.

Activation memory follows Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models" (MLSys'23, arXiv:2205.05198), §4, generalised per stored tensor so GQA and
SwiGLU fit; for GPT it reproduces the paper: s·b·h·(34 + 5·a·s/h) bytes per layer without
parallelism, s·b·h·(10 + 24/t + 5·a·s/(h·t)) with TP, s·b·h/t·(34 + 5·a·s/h) with TP+SP, the
score term dropped by selective recompute (or flash attention), 2·s·b·h (/t with SP) for full
recompute.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from simtrain.spec import Scenario

ACT_BYTES = 2          # activations in 16-bit (fp8 GEMMs still keep 16-bit activations)


@dataclass(frozen=True)
class Op:
    name: str
    kind: str              # gemm | attention | memory
    phase: str             # F | B | W
    flops: float           # executed FLOPs on this rank
    bytes: float           # bytes read + written
    shape: tuple = ()      # gemm: (m, n, k); attention: (seq, causal)
    model_flops: float = 0.0   # FLOPs counted by the model-FLOP accounting (recompute excluded)


@dataclass(frozen=True)
class Comm:
    kind: str              # tp | dp | pp
    collective: str        # all_reduce | all_gather | reduce_scatter
    size_bytes: float      # nccl-tests convention: the full buffer (for AG/RS: per-rank count x group size)
    name: str = ""


@dataclass(frozen=True)
class LayerProgram:
    forward: tuple         # items: tuple[Op, ...] (a compute segment) or Comm
    backward: tuple        # items in execution order; segments hold B and W ops
    recompute: tuple       # items run before backward (full: the whole forward; selective: core attention)
    backward_input: tuple = ()    # the B part alone: `backward` without its W ops (communication kept)
    backward_weight: tuple = ()   # the W part alone: one segment of the weight-gradient ops
    weight_grad_inputs: float = 0.0   # bytes a deferred W keeps alive: each wgrad GEMM's input and output gradient


def with_split(lp: LayerProgram, hidden: int = 0, seq_shard: int = 1) -> LayerProgram:
    """Fills the B / W split of a layer program (for schedules that defer W, Qi et al. ICLR'24).

    A weight-gradient GEMM dW = X^T dY (shape k x n x m, m = tokens) needs the layer input X
    (m x k) and the output gradient dY (m x n), so deferring it keeps 2·m·(k + n) bytes alive.
    Worked example (GPT, no TP, T tokens): qkv T(h+3h) + attn_out T(h+h) + fc1 T(h+4h) +
    fc2 T(4h+h) = 16·T·h elements, 32·T·h bytes (the paper's M_W = 32sbh, Table 1).
    With sequence parallelism a hidden-size-wide tensor is kept sequence-sharded (1/seq_shard) and
    gathered again for the wgrad GEMM, as Megatron does, so those terms divide by tp."""
    b_items, w_ops = [], []
    for it in lp.backward:
        if isinstance(it, Comm):
            b_items.append(it)
            continue
        b = tuple(o for o in it if o.phase != "W")
        w_ops += [o for o in it if o.phase == "W"]
        if b:
            b_items.append(b)
    def width(d):
        return d / seq_shard if d == hidden else d
    kept = sum(ACT_BYTES * o.shape[2] * (width(o.shape[0]) + width(o.shape[1])) for o in w_ops if o.kind == "gemm")
    return LayerProgram(lp.forward, lp.backward, lp.recompute, tuple(b_items),
                        (tuple(w_ops),) if w_ops else (), kept)


@dataclass(frozen=True)
class StageWork:
    stage: int
    num_layers: int
    layer: LayerProgram
    pre: LayerProgram | None      # embedding on the first stage
    post: LayerProgram | None     # LM head + loss on the last stage
    params: float                 # parameters held by one rank of this stage (after TP sharding)
    layer_params: float           # parameters of one transformer layer on one rank
    act_bytes_per_layer: float    # stored per microbatch per layer
    act_bytes_pre: float
    act_bytes_post: float
    act_working_bytes: float      # transient peak while one layer's backward runs

    @property
    def act_bytes(self) -> float:
        """Activation bytes one microbatch leaves stored on this stage between its F and backward."""
        return self.act_bytes_per_layer * self.num_layers + self.act_bytes_pre + self.act_bytes_post

    @property
    def weight_grad_bytes(self) -> float:
        """Bytes a deferred W keeps alive after B (inputs and output gradients of the wgrad GEMMs)."""
        return self.num_layers * self.layer.weight_grad_inputs + sum(
            x.weight_grad_inputs for x in (self.pre, self.post) if x is not None)


def padded_vocab(vocab: int, tp: int, divisible_by: int) -> int:
    """Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by x tp."""
    m = divisible_by * tp
    return int(math.ceil(vocab / m) * m)


class _Builder:
    def __init__(self, sc: Scenario):
        self.sc = sc
        m, t, p = sc.model, sc.training, sc.parallel
        self.tp = p.tp
        self.sp = p.sequence_parallel and p.tp > 1
        self.b, self.s, self.h = t.micro_batch_size, m.seq_length, m.hidden_size
        self.a, self.g, self.d = m.num_attention_heads, m.num_key_value_heads, m.head_dim
        self.f = m.ffn_hidden_size
        self.T = self.b * self.s                   # tokens per microbatch
        self.gpt = m.architecture == "gpt"
        self.flash = t.flash_attention
        self.V = padded_vocab(m.vocab_size, p.tp, m.make_vocab_size_divisible_by)

    # -- operators -------------------------------------------------------------------------
    def gemm(self, name, m, n, k, phase="F"):
        fl = 2.0 * m * n * k
        by = ACT_BYTES * (m * k + k * n + m * n)
        return Op(name, "gemm", phase, fl, by, (m, n, k), fl)

    def mem(self, name, nbytes, phase="F"):
        return Op(name, "memory", phase, 0.0, nbytes)

    def gemm_fbw(self, name, m, n, k):
        """Forward, input-gradient (m x k x n) and weight-gradient (k x n x m) GEMMs."""
        return self.gemm(name, m, n, k), self.gemm(name + ".dgrad", m, k, n, "B"), self.gemm(name + ".wgrad", k, n, m, "W")

    def layer(self) -> LayerProgram:
        t, T, h, f = self.tp, self.T, self.h, self.f
        seq_e = T * h / t if self.sp else T * h        # elements of a sequence-region tensor
        heads = self.a / t
        kv = self.g * self.d / t
        qkv_n = (h / t) + 2 * kv
        act_b = ACT_BYTES
        norm = "layernorm" if self.gpt else "rmsnorm"
        # attention block
        n1 = self.mem(f"{norm}1", 2 * act_b * seq_e)
        n1b = self.mem(f"{norm}1.bwd", 3 * act_b * seq_e, "B")
        qkv, qkv_b, qkv_w = self.gemm_fbw("qkv", T, qkv_n, h)
        core_f, core_b = self.attention_core(heads)
        rope = ()
        if not self.gpt:
            e = T * (h / t + kv)
            rope = (self.mem("rotary", 2 * act_b * e),), (self.mem("rotary.bwd", 2 * act_b * e, "B"),)
        out, out_b, out_w = self.gemm_fbw("attn_out", T, h, h / t)
        resid_bytes = (3 if not self.gpt else 3.5) * act_b * seq_e   # read 2, write 1 (+ dropout mask)
        r1 = self.mem("dropout_add1" if self.gpt else "residual_add1", resid_bytes)
        r1b = self.mem(r1.name + ".bwd", 2 * act_b * seq_e, "B")
        # MLP block
        n2 = self.mem(f"{norm}2", 2 * act_b * seq_e)
        n2b = self.mem(f"{norm}2.bwd", 3 * act_b * seq_e, "B")
        if self.gpt:
            fc1, fc1_b, fc1_w = self.gemm_fbw("fc1", T, f / t, h)
            act = self.mem("gelu", 2 * act_b * T * f / t)
            actb = self.mem("gelu.bwd", 3 * act_b * T * f / t, "B")
        else:
            fc1, fc1_b, fc1_w = self.gemm_fbw("fc1_gate_up", T, 2 * f / t, h)
            act = self.mem("swiglu", 3 * act_b * T * f / t)
            actb = self.mem("swiglu.bwd", 5 * act_b * T * f / t, "B")
        fc2, fc2_b, fc2_w = self.gemm_fbw("fc2", T, h, f / t)
        r2 = self.mem("dropout_add2" if self.gpt else "residual_add2", resid_bytes)
        r2b = self.mem(r2.name + ".bwd", 2 * act_b * seq_e, "B")

        msg = act_b * T * h                             # full activation buffer of one TP collective
        def tp(fwd: bool, i: int):
            if t == 1:
                return None
            if not self.sp:
                return Comm("tp", "all_reduce", msg, f"tp_ar{i}")
            # SP: all-gather into a column-parallel GEMM, reduce-scatter out of a row-parallel one;
            # the backward swaps them.
            kind = ("all_gather" if i % 2 == 0 else "reduce_scatter") if fwd else ("reduce_scatter" if i % 2 == 0 else "all_gather")
            return Comm("tp", kind, msg, f"tp_{kind}{i}")

        attn_core = (qkv,) + (rope[0] if rope else ())
        fwd_items = []
        if self.sp:
            fwd_items += [(n1,), tp(True, 0), attn_core + core_f + (out,), tp(True, 1),
                          (r1, n2), tp(True, 2), (fc1, act, fc2), tp(True, 3), (r2,)]
        else:
            fwd_items += [(n1,) + attn_core + core_f + (out,), tp(True, 1),
                          (r1, n2, fc1, act, fc2), tp(True, 3), (r2,)]
        rope_b = rope[1] if rope else ()
        if self.sp:
            bwd_items = [(r2b,), tp(False, 3), (fc2_b, fc2_w, actb, fc1_b, fc1_w), tp(False, 2),
                         (n2b, r1b), tp(False, 1), (out_b, out_w) + core_b + rope_b + (qkv_b, qkv_w), tp(False, 0), (n1b,)]
        else:
            bwd_items = [(r2b, fc2_b, fc2_w, actb, fc1_b, fc1_w), tp(False, 2),
                         (n2b, r1b, out_b, out_w) + core_b + rope_b + (qkv_b, qkv_w), tp(False, 0), (n1b,)]
        fwd_items = tuple(x for x in fwd_items if x is not None)
        bwd_items = tuple(x for x in bwd_items if x is not None)
        rc = self.sc.training.recompute
        if rc == "full":
            recompute = tuple(_as_recompute(x) for x in fwd_items)
        elif rc == "selective":
            recompute = (tuple(_as_recompute(o) for o in core_f),)
        else:
            recompute = ()
        return with_split(LayerProgram(fwd_items, bwd_items, recompute), h, t if self.sp else 1)

    def attention_core(self, heads):
        b, s, d = self.b, self.s, self.d
        model_fwd = 4.0 * b * s * s * heads * d          # QK^T and AV over the full square
        if self.flash:
            real = model_fwd / 2                         # causal: half the square is computed
            f = Op("flash_attn", "attention", "F", real, ACT_BYTES * 4 * b * s * heads * d, (s, True), model_fwd)
            bw = Op("flash_attn.bwd", "attention", "B", 2.5 * real, ACT_BYTES * 8 * b * s * heads * d, (s, True), 2 * model_fwd)
            return (f,), (bw,)
        # unfused: two batched GEMMs plus scale/mask/softmax/dropout over b·heads·s² elements
        sq = b * heads * s * s
        qk = Op("attn_scores", "gemm", "F", 2.0 * b * heads * s * s * d, ACT_BYTES * (2 * b * heads * s * d + sq), (s, s, d), 2.0 * b * heads * s * s * d)
        drop = 1 if self.gpt else 0
        sm = self.mem("softmax" + ("_dropout" if drop else ""), ACT_BYTES * 2 * sq + drop * (ACT_BYTES * 2 * sq + sq))
        av = Op("attn_values", "gemm", "F", 2.0 * b * heads * s * s * d, ACT_BYTES * (sq + 2 * b * heads * s * d), (s, d, s), 2.0 * b * heads * s * s * d)
        qk_b = Op("attn_scores.bwd", "gemm", "B", 2 * qk.flops, 2 * qk.bytes, (s, s, d), 2 * qk.flops)
        smb = self.mem(sm.name + ".bwd", ACT_BYTES * 3 * sq + drop * (ACT_BYTES * 2 * sq + sq), "B")
        av_b = Op("attn_values.bwd", "gemm", "B", 2 * av.flops, 2 * av.bytes, (s, d, s), 2 * av.flops)
        return (qk, sm, av), (av_b, smb, qk_b)

    def embedding(self) -> LayerProgram:
        e = self.T * self.h
        f = (self.mem("embedding", ACT_BYTES * e * (2 if self.gpt else 1)),)   # word (+ position) lookup
        b = (self.mem("embedding.bwd", 4 * e * (2 if self.gpt else 1), "W"),)   # scatter-add into fp32 grads
        return with_split(LayerProgram((f,), (b,), ()), self.h, self.tp if self.sp else 1)

    def head(self) -> LayerProgram:
        t, T, h, V = self.tp, self.T, self.h, self.V
        seq_e = T * h / t if self.sp else T * h
        norm = self.mem("final_norm", 2 * ACT_BYTES * seq_e)
        normb = self.mem("final_norm.bwd", 3 * ACT_BYTES * seq_e, "B")
        lm, lm_b, lm_w = self.gemm_fbw("lm_head", T, V / t, h)
        ce = self.mem("cross_entropy", 3 * 4 * T * V / t)        # fp32 logits: max, exp-sum, loss
        ceb = self.mem("cross_entropy.bwd", 2 * 4 * T * V / t, "B")
        msg = ACT_BYTES * T * h
        # vocab-parallel LM head: with SP the sequence-sharded input is all-gathered (forward) and its
        # gradient reduce-scattered (backward); without SP the input is replicated and only the
        # input gradient needs an all-reduce.
        items_f, items_b = [(norm,)], [(ceb, lm_b, lm_w)]
        if t > 1 and self.sp:
            items_f.append(Comm("tp", "all_gather", msg, "tp_head_in"))
        if t > 1:
            items_b.append(Comm("tp", "reduce_scatter" if self.sp else "all_reduce", msg, "tp_head_grad"))
        items_f.append((lm, ce))
        items_b.append((normb,))
        return with_split(LayerProgram(tuple(items_f), tuple(items_b), ()), h, t if self.sp else 1)

    # -- parameters and activations -----------------------------------------------------------
    def layer_params(self) -> float:
        h, f, t, kv = self.h, self.f, self.tp, self.g * self.d
        attn = h * (h + 2 * kv) + h * h
        mlp = (2 if self.gpt else 3) * h * f
        sharded = (attn + mlp) / t
        if self.gpt:
            sharded += (h + 2 * kv + f) / t                   # column-parallel biases
            replicated = 4 * h + 2 * h                         # 2 LayerNorms (weight+bias) + row biases
        else:
            replicated = 2 * h                                 # 2 RMSNorm weights
        return sharded + replicated

    def act_per_layer(self, recompute: str) -> float:
        """Stored bytes per layer per microbatch (see module docstring for the derivation)."""
        s, b, h, t, f, a = self.s, self.b, self.h, self.tp, self.f, self.a
        kv = self.g * self.d
        seq_div = t if self.sp else 1
        if recompute == "full":
            return 2 * s * b * h / seq_div
        drop = 1 if self.gpt else 0
        # sequence-region tensors: norm inputs (2x 2h), QKV input 2h, MLP input 2h, dropout masks (2x h)
        seq = (2 * h + 2 * h + 2 * h + 2 * h + 2 * drop * h) / seq_div
        # tensor-parallel region: Q (2h), K and V (2 kv each), attention output 2h, MLP internals
        mlp = 4 * f if self.gpt else 6 * f
        tpr = (2 * h + 4 * kv + 2 * h + mlp) / t
        if self.flash:
            scores = 4 * a / t                                 # fp32 log-sum-exp per (head, query): 4·a·s·b/t bytes
        elif recompute == "selective":
            scores = 0.0
        else:
            scores = (5 if drop else 2) * a * s / t           # s·b·5·a·s = 5·a·s²·b bytes (Korthikanti)
        return s * b * (seq + tpr + scores)

    def act_pre(self) -> float:
        return (self.s * self.b * self.h / (self.tp if self.sp else 1)) if self.gpt else 0.0   # embedding dropout mask

    def act_post(self) -> float:
        return 4.0 * self.s * self.b * self.V / self.tp      # Korthikanti §4.1: output layer + loss, 4sbv/t


def _as_recompute(item):
    if isinstance(item, Comm):
        return item
    if isinstance(item, Op):
        return Op(item.name + ".recompute", item.kind, "B", item.flops, item.bytes, item.shape, 0.0)
    return tuple(_as_recompute(o) for o in item)


def stage_layer_counts(sc: Scenario, num_stages: int) -> tuple:
    """Layers of each model stage: `parallel.layers_per_stage` as given, else Megatron's
    first/last-stage counts with the rest spread evenly, else an even split (validated on load)."""
    p = sc.parallel
    if p.layers_per_stage is not None:
        return tuple(p.layers_per_stage)
    L, S = sc.model.num_layers, num_stages
    first, last = p.first_stage_layers, p.last_stage_layers
    fixed = [x for x in (first, last) if x is not None]
    rest = S - len(fixed)
    each = (L - sum(fixed)) // rest if rest else 0
    counts = [each] * S
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return tuple(counts)


def build_workload(sc: Scenario, num_stages: int | None = None) -> tuple:
    """One StageWork per model stage (pp of them, or pp x chunks for multi-chunk schedules)."""
    bld = _Builder(sc)
    layer = bld.layer()
    S = num_stages or sc.parallel.pp
    counts = stage_layer_counts(sc, S)
    lp = bld.layer_params()
    emb_params = bld.V * bld.h / bld.tp + (sc.model.seq_length * bld.h if bld.gpt else 0)
    head_params = bld.V * bld.h / bld.tp + (2 if bld.gpt else 1) * bld.h
    act = bld.act_per_layer(sc.training.recompute)
    working = bld.act_per_layer("none") if sc.training.recompute == "full" else 0.0
    out = []
    for s, n in enumerate(counts):
        params = n * lp
        if s == 0:
            params += emb_params
        if s == S - 1:
            # Megatron keeps a copy of tied word embeddings on the last stage when it is a different one
            params += head_params if (not sc.model.tie_embeddings or S > 1) else (2 if bld.gpt else 1) * bld.h
        out.append(StageWork(
            stage=s, num_layers=n, layer=layer,
            pre=bld.embedding() if s == 0 else None, post=bld.head() if s == S - 1 else None,
            params=params, layer_params=lp, act_bytes_per_layer=act,
            act_bytes_pre=bld.act_pre() if s == 0 else 0.0,
            act_bytes_post=bld.act_post() if s == S - 1 else 0.0,
            act_working_bytes=working,
        ))
    return tuple(out)


def _items_model_flops(items) -> float:
    tot = 0.0
    for it in items:
        if isinstance(it, tuple):
            tot += sum(o.model_flops for o in it)
    return tot


def model_flops_per_step(sc: Scenario, work: tuple) -> float:
    """3 x forward FLOPs of the whole model for the global batch (Narayanan et al. 2021 accounting)."""
    per_mb_rank = 0.0
    for w in work:
        prog = [w.layer] * w.num_layers + [x for x in (w.pre, w.post) if x]
        for lp in prog:
            per_mb_rank += _items_model_flops(lp.forward) + _items_model_flops(lp.backward)
    # per-rank FLOPs are already divided by tp; multiply back, and by the microbatches of the batch
    return per_mb_rank * sc.parallel.tp * sc.training.global_batch_size / sc.training.micro_batch_size


def hardware_flops_per_step(sc: Scenario, work: tuple) -> float:
    """Model FLOPs plus recomputed forward FLOPs (same accounting: attention counted full-square)."""
    extra = 0.0
    for w in work:
        for it in w.layer.recompute:
            ops = (it,) if isinstance(it, Op) else (it if isinstance(it, tuple) else ())
            for o in ops:
                extra += _fwd_model_flops_of(o) * w.num_layers
    return model_flops_per_step(sc, work) + extra * sc.parallel.tp * sc.training.global_batch_size / sc.training.micro_batch_size


def _fwd_model_flops_of(o: Op) -> float:
    if o.kind == "memory":
        return 0.0
    if o.kind == "attention":
        return o.flops * 2      # recomputed causal flash kernel; model accounting counts the full square
    return o.flops
