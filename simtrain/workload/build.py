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

Mixture-of-experts layers (Megatron-core MoE): router GEMM, token permutation, dispatch over the
expert-parallel group (all-to-all, or all-gather / reduce-scatter), grouped GEMMs of the rank's
local experts on the tokens routed to them, combine, shared experts as a tensor-parallel MLP. The
tokens a rank's experts receive follow the routing distribution (`routing_shares`), so a hot
expert makes its rank slower and the all-to-all as long as its largest receive.
Worked example (uniform routing, no drops): a rank dispatching T tokens with top-k sends T·k·h
16-bit values and, over ep ranks holding E/ep experts each, receives ep·T·k·(1/ep) = T·k of them.

Context parallelism divides every token-wise cost by cp (each rank holds s/cp tokens, split in 2·cp
chunks for causal balance) and adds the KV exchange: ring (cp rounds, each one block's attention
while the next KV block moves: `Ring`), allgather (K, V gathered before attention, dK, dV
reduce-scattered after) or ulysses (all-to-all from sequence- to head-sharding and back).

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

from simtrain.spec.scenario import Scenario

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
    kind: str              # tp | cp | ep | etp | dp | edp
    collective: str        # all_reduce | all_gather | reduce_scatter | all_to_all | send_recv (one ring round)
    size_bytes: float      # nccl-tests convention: the full buffer (for AG/RS: per-rank count x group size)
    name: str = ""
    node_limit: tuple = () # (top_k, max nodes per token): node-limited MoE routing, see `node_limited_share`


def node_limited_share(nodes: int, top_k: int, max_nodes: int) -> float:
    """Fraction of a dispatch's k copies per token that cross the network when routing is
    node-limited (DeepSeek-V3 report §2.1.2 and §3.2.2: each token goes to at most M nodes and
    crosses InfiniBand once per node, then NVLink forwards it to its experts there). With the k
    experts spread evenly over N nodes a token touches N·(1 - (1 - 1/N)^k) distinct nodes on
    average, at most M: the share is min(M, that) / k.
    Worked example (N 8, k 8, M 4): 8·(1 - (7/8)^8) = 5.25 > 4, so 4/8 = 0.5."""
    if nodes <= 1 or not max_nodes:
        return 1.0
    distinct = nodes * (1.0 - (1.0 - 1.0 / nodes) ** top_k)
    return min(max_nodes, distinct) / top_k


@dataclass(frozen=True)
class Ring:
    """Ring attention over the cp group (Liu et al., "Ring Attention", 2023; Megatron-core CP):
    `steps` = cp rounds; round i computes `segment` (the local queries against one KV block)
    while the KV block for round i+1 moves one hop round the ring (`comm`, cp - 1 transfers).
    With c per round and x per transfer the rounds take c + (cp - 1)·max(c, x)."""
    steps: int
    segment: tuple
    comm: Comm

    @property
    def model_flops(self) -> float:
        return self.steps * sum(o.model_flops for o in self.segment)


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
        if isinstance(it, (Comm, Ring)):
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

    @property
    def weight_grad_bytes(self) -> float:
        """Bytes a deferred W keeps alive after B (inputs and output gradients of the wgrad GEMMs)."""
        return sum(lp.weight_grad_inputs for lp in self.layers) + sum(
            x.weight_grad_inputs for x in (self.pre, self.post) if x is not None)


def padded_vocab(vocab: int, tp: int, divisible_by: int) -> int:
    """Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by x tp."""
    m = divisible_by * tp
    return int(math.ceil(vocab / m) * m)


def routing_shares(sc: Scenario) -> tuple:
    """Per MoE layer (in model order): (kept share of every expert, dropped fraction).

    Shares are fractions of a rank's T·k token-to-expert assignments. uniform: 1/E each; zipf:
    share of the i-th hottest expert ~ 1/(i+1)^skew, the hot experts permuted per layer with the
    scenario seed (`per_layer`), then capped at 1/k (a token picks k distinct experts; the excess is
    spread over the others in proportion, repeated until nothing exceeds the cap); explicit: as
    given. A capacity factor c caps every expert at c/E of the assignments (Megatron's per-rank
    capacity c·T·k/E); the excess is dropped.
    Worked example (E 4, k 1, explicit [0.4, 0.3, 0.2, 0.1], c 1.0): cap 0.25, kept
    [0.25, 0.25, 0.2, 0.1], dropped 0.15 + 0.05 = 0.2."""
    import numpy as np
    moe = sc.model.moe
    E, k = moe.num_experts, moe.top_k
    r = moe.routing
    n_moe = sum(1 for i in range(sc.model.num_layers) if moe.is_moe_layer(i))
    if r.distribution == "uniform":
        base = np.full(E, 1.0 / E)
    elif r.distribution == "explicit":
        base = np.array(r.loads, dtype=float)
    else:
        w = 1.0 / np.arange(1, E + 1) ** r.skew
        base = _cap(w / w.sum(), 1.0 / k)
    rng = np.random.default_rng(sc.seed)
    out = []
    for _ in range(n_moe):
        p = base[rng.permutation(E)] if (r.distribution == "zipf" and r.per_layer) else base
        dropped = 0.0
        if moe.capacity_factor is not None:
            cap = moe.capacity_factor / E
            dropped = float(np.clip(p - cap, 0, None).sum())
            p = np.minimum(p, cap)
        out.append((tuple(float(x) for x in p), dropped))
    return tuple(out)


def _cap(p, cap: float):
    p = p.copy()
    for _ in range(len(p)):
        over = p > cap + 1e-15
        if not over.any():
            break
        excess = float((p[over] - cap).sum())
        p[over] = cap
        free = ~over & (p < cap)
        p[free] += excess * p[free] / p[free].sum()
    return p


class _Builder:
    def __init__(self, sc: Scenario, encoder: bool = False):
        self.sc = sc
        m, t, p = sc.model, sc.training, sc.parallel
        self.tp = p.tp
        self.sp = p.sequence_parallel and p.tp > 1
        self.cp = 1 if encoder else p.cp
        self.cp_kind = p.cp_kind
        self.b = t.micro_batch_size
        self.flash = t.flash_attention
        self.causal = True
        if encoder:
            e = m.encoder
            self.s, self.h, self.a, self.g = e.tokens_per_sample, e.hidden_size, e.num_attention_heads, e.num_attention_heads
            self.d, self.f = e.hidden_size // e.num_attention_heads, e.ffn_hidden_size
            self.gpt = True                    # ViT blocks: LayerNorm, GeLU MLP, biases
            self.causal = False                # bidirectional attention over the patches
            self.mla = None
            self.V = 0
        else:
            self.s, self.h = m.seq_length, m.hidden_size
            self.a, self.g, self.d = m.num_attention_heads, m.num_key_value_heads, m.head_dim
            self.f = m.ffn_hidden_size
            self.gpt = m.architecture == "gpt"
            self.mla = m.mla
            self.V = padded_vocab(m.vocab_size, p.tp, m.make_vocab_size_divisible_by)
        self.T = self.b * self.s // self.cp         # tokens per microbatch on this rank
        self.moe = None if encoder else m.moe
        self.ep, self.etp = p.ep, p.etp
        self._layers: dict = {}

    # -- operators -------------------------------------------------------------------------
    def gemm(self, name, m, n, k, phase="F", replicated=False):
        """`replicated`: every tensor-parallel rank runs the same GEMM, so the model-FLOP count
        takes it once (1/tp per rank)."""
        fl = 2.0 * m * n * k
        by = ACT_BYTES * (m * k + k * n + m * n)
        return Op(name, "gemm", phase, fl, by, (m, n, k), fl / self.tp if replicated else fl)

    def mem(self, name, nbytes, phase="F"):
        return Op(name, "memory", phase, 0.0, nbytes)

    def gemm_fbw(self, name, m, n, k, replicated=False):
        """Forward, input-gradient (m x k x n) and weight-gradient (k x n x m) GEMMs."""
        return (self.gemm(name, m, n, k, replicated=replicated), self.gemm(name + ".dgrad", m, k, n, "B", replicated),
                self.gemm(name + ".wgrad", k, n, m, "W", replicated))

    def tp_comm(self, fwd: bool, i: int, msg: float):
        """Megatron's tensor-parallel communication point i (0: into attention, 1: out of it, 2:
        into the MLP, 3: out of it): all-reduce, or with SP all-gather into a column-parallel GEMM
        and reduce-scatter out of a row-parallel one; the backward swaps them."""
        if self.tp == 1:
            return None
        if not self.sp:
            return Comm("tp", "all_reduce", msg, f"tp_ar{i}")
        kind = ("all_gather" if i % 2 == 0 else "reduce_scatter") if fwd else ("reduce_scatter" if i % 2 == 0 else "all_gather")
        return Comm("tp", kind, msg, f"tp_{kind}{i}")

    def layer(self, kind: str = "dense", shares=None, ep_rank: int = 0) -> LayerProgram:
        """A layer's program: `dense` (attention + MLP), or `moe` with the layer's expert shares
        (see `routing_shares`) seen from expert-parallel rank `ep_rank`. Cached per distinct layer."""
        key = (kind, shares, ep_rank if kind == "moe" else 0)
        hit = self._layers.get(key)
        if hit is None:
            hit = self._layers[key] = self._layer(kind, shares, ep_rank)
        return hit

    def _layer(self, kind, shares, ep_rank) -> LayerProgram:
        attn_f, attn_b, core_f = self.attention_block()
        if kind == "moe":
            mlp_f, mlp_b = self.moe_block(shares, ep_rank)
        else:
            mlp_f, mlp_b = self.mlp_block(self.f)
        fwd_items = _join_segments(attn_f + mlp_f)
        bwd_items = _join_segments(mlp_b + attn_b)
        rc = self.sc.training.recompute
        if rc == "full":
            recompute = tuple(_as_recompute(x) for x in fwd_items)
        elif rc == "selective":
            recompute = tuple(_as_recompute(x) for x in core_f)
        else:
            recompute = ()
        t = self.tp
        return with_split(LayerProgram(fwd_items, bwd_items, recompute), self.h, t if self.sp else 1)

    def attention_block(self):
        """(forward items, backward items, core items for selective recompute) of the attention
        half: norm, QKV (or MLA projections), rotary, core, output projection, residual."""
        t, T, h = self.tp, self.T, self.h
        seq_e = T * h / t if self.sp else T * h        # elements of a sequence-region tensor
        heads = self.a / t
        act_b = ACT_BYTES
        norm = "layernorm" if self.gpt else "rmsnorm"
        n1 = self.mem(f"{norm}1", 2 * act_b * seq_e)
        n1b = self.mem(f"{norm}1.bwd", 3 * act_b * seq_e, "B")
        if self.mla is not None:
            proj_f, proj_b, qk_dim, v_dim = self.mla_projections(heads)
        else:
            kv = self.g * self.d / t
            qkv_n = (h / t) + 2 * kv
            qkv, qkv_b, qkv_w = self.gemm_fbw("qkv", T, qkv_n, h)
            proj_f, proj_b = (qkv,), (qkv_b, qkv_w)
            qk_dim = v_dim = self.d
        rope = ()
        if not self.gpt:
            # rotary on Q and K (MLA: on the per-head rotary query part and the one shared rotary key)
            e = T * ((h / t + self.g * self.d / t) if self.mla is None else (heads + 1) * self.mla.qk_rope_head_dim)
            rope = (self.mem("rotary", 2 * act_b * e),), (self.mem("rotary.bwd", 2 * act_b * e, "B"),)
        out, out_b, out_w = self.gemm_fbw("attn_out", T, h, heads * v_dim)
        resid_bytes = (3 if not self.gpt else 3.5) * act_b * seq_e   # read 2, write 1 (+ dropout mask)
        r1 = self.mem("dropout_add1" if self.gpt else "residual_add1", resid_bytes)
        r1b = self.mem(r1.name + ".bwd", 2 * act_b * seq_e, "B")
        msg = act_b * T * h                             # full activation buffer of one TP collective
        attn_core = proj_f + (rope[0] if rope else ())
        rope_b = rope[1] if rope else ()
        core_f, core_b = self.attention_core(heads, qk_dim, v_dim)
        fwd = [(n1,), self.tp_comm(True, 0, msg), attn_core, *core_f, (out,), self.tp_comm(True, 1, msg), (r1,)]
        bwd = [(r1b,), self.tp_comm(False, 1, msg), (out_b, out_w), *core_b, rope_b + proj_b, self.tp_comm(False, 0, msg), (n1b,)]
        if not self.sp:
            # without SP, the all-reduce into attention is the backward's (the forward input is replicated)
            fwd = [(n1,), attn_core, *core_f, (out,), self.tp_comm(True, 1, msg), (r1,)]
            bwd = [(r1b,), (out_b, out_w), *core_b, rope_b + proj_b, self.tp_comm(False, 0, msg), (n1b,)]
        cores = tuple(x for x in core_f if not isinstance(x, Comm))
        return [x for x in fwd if x is not None], [x for x in bwd if x is not None], cores

    def mla_projections(self, heads):
        """DeepSeek MLA (DeepSeek-V2 report §2.1.2): queries through a low-rank down/up pair (or
        directly), keys and values from one compressed latent of kv_lora_rank plus a shared rotary
        key of qk_rope_head_dim. The down projections are not split by tensor parallelism (every
        tp rank runs them); the up projections are split by heads."""
        m, T, h = self.mla, self.T, self.h
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        f, b = [], []
        if m.q_lora_rank:
            qa = self.gemm_fbw("q_down", T, m.q_lora_rank, h, replicated=True)
            qn = (self.mem("q_norm", 2 * ACT_BYTES * T * m.q_lora_rank), self.mem("q_norm.bwd", 3 * ACT_BYTES * T * m.q_lora_rank, "B"))
            qb = self.gemm_fbw("q_up", T, heads * qk, m.q_lora_rank)
            f += [qa[0], qn[0], qb[0]]
            b = [qb[1], qb[2], qn[1], qa[1], qa[2]] + b
        else:
            qb = self.gemm_fbw("q_proj", T, heads * qk, h)
            f += [qb[0]]
            b = [qb[1], qb[2]] + b
        ka = self.gemm_fbw("kv_down", T, m.kv_lora_rank + m.qk_rope_head_dim, h, replicated=True)
        kn = (self.mem("kv_norm", 2 * ACT_BYTES * T * m.kv_lora_rank), self.mem("kv_norm.bwd", 3 * ACT_BYTES * T * m.kv_lora_rank, "B"))
        kb = self.gemm_fbw("kv_up", T, heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank)
        f += [ka[0], kn[0], kb[0]]
        b = [kb[1], kb[2], kn[1], ka[1], ka[2]] + b
        return tuple(f), tuple(b), qk, m.v_head_dim

    def mlp_block(self, width):
        """Dense (or shared-expert) MLP of `width`, tensor-parallel: fc1 column-, fc2 row-split."""
        t, T, h = self.tp, self.T, self.h
        seq_e = T * h / t if self.sp else T * h
        act_b = ACT_BYTES
        norm = "layernorm" if self.gpt else "rmsnorm"
        n2 = self.mem(f"{norm}2", 2 * act_b * seq_e)
        n2b = self.mem(f"{norm}2.bwd", 3 * act_b * seq_e, "B")
        core_f, core_b = self.ffn(T, width / t, "")
        resid_bytes = (3 if not self.gpt else 3.5) * act_b * seq_e
        r2 = self.mem("dropout_add2" if self.gpt else "residual_add2", resid_bytes)
        r2b = self.mem(r2.name + ".bwd", 2 * act_b * seq_e, "B")
        msg = act_b * T * h
        if self.sp:
            fwd = [(n2,), self.tp_comm(True, 2, msg), core_f, self.tp_comm(True, 3, msg), (r2,)]
            bwd = [(r2b,), self.tp_comm(False, 3, msg), core_b, self.tp_comm(False, 2, msg), (n2b,)]
        else:
            fwd = [(n2,) + core_f, self.tp_comm(True, 3, msg), (r2,)]
            bwd = [(r2b,) + core_b, self.tp_comm(False, 2, msg), (n2b,)]
        return [x for x in fwd if x is not None], [x for x in bwd if x is not None]

    def ffn(self, tokens, width, prefix):
        """(forward ops, backward ops) of one feed-forward network on `tokens` rows with `width`
        local columns: GeLU (fc1, fc2) or SwiGLU (fused gate/up, down)."""
        T, h, act_b = tokens, self.h, ACT_BYTES
        if self.gpt:
            fc1, fc1_b, fc1_w = self.gemm_fbw(prefix + "fc1", T, width, h)
            act = self.mem(prefix + "gelu", 2 * act_b * T * width)
            actb = self.mem(prefix + "gelu.bwd", 3 * act_b * T * width, "B")
        else:
            fc1, fc1_b, fc1_w = self.gemm_fbw(prefix + "fc1_gate_up", T, 2 * width, h)
            act = self.mem(prefix + "swiglu", 3 * act_b * T * width)
            actb = self.mem(prefix + "swiglu.bwd", 5 * act_b * T * width, "B")
        fc2, fc2_b, fc2_w = self.gemm_fbw(prefix + "fc2", T, h, width)
        return (fc1, act, fc2), (fc2_b, fc2_w, actb, fc1_b, fc1_w)

    # -- mixture of experts -------------------------------------------------------------------
    def moe_tokens(self, shares, ep_rank: int) -> dict:
        """Token counts of one MoE layer on one rank (see the module docstring):
          Tl     tokens this rank dispatches (sequence-sharded over tp)
          send   assignments it sends (T·k less the dropped ones)
          recv   assignments its local experts receive from the ep group: ep·Tl·k·(its experts' share)
          worst  the largest recv in the group (the all-to-all lasts as long as its busiest rank)
          rows   rows of its grouped GEMMs: recv x etp (the etp group gathers its members' tokens)"""
        moe, ep = self.moe, self.ep
        Tl = self.T / self.tp if self.sp else self.T
        k, E = moe.top_k, moe.num_experts
        p, dropped = shares
        per = E // ep
        rank_share = [sum(p[j * per:(j + 1) * per]) for j in range(ep)]
        send = Tl * k * sum(p)
        recv = ep * Tl * k * rank_share[ep_rank]
        worst = ep * Tl * k * max(rank_share)
        return {"Tl": Tl, "send": send, "recv": recv, "worst": worst, "rows": recv * self.etp,
                "local_experts": per, "dropped": dropped}

    def moe_block(self, shares, ep_rank):
        """Router, dispatch, local experts' grouped GEMMs, combine, shared experts, residual."""
        moe, h, act_b = self.moe, self.h, ACT_BYTES
        t = self.tp
        T = self.T
        seq_e = T * h / t if self.sp else T * h
        norm = "layernorm" if self.gpt else "rmsnorm"
        n2 = self.mem(f"{norm}2", 2 * act_b * seq_e)
        n2b = self.mem(f"{norm}2.bwd", 3 * act_b * seq_e, "B")
        tk = self.moe_tokens(shares, ep_rank)
        Tl, E, k = tk["Tl"], moe.num_experts, moe.top_k
        router, router_b, router_w = self.gemm_fbw("router", Tl, E, h)
        topk = self.mem("router_topk", 3 * 4 * Tl * E)              # fp32 logits: softmax, top-k, write probs
        topkb = self.mem("router_topk.bwd", 2 * 4 * Tl * E, "B")
        perm = self.mem("permute", 2 * act_b * tk["send"] * h)
        permb = self.mem("permute.bwd", 2 * act_b * tk["send"] * h, "B")
        width = moe.expert_ffn_hidden_size / self.etp
        rows = tk["rows"]
        ex_f, ex_b = self.ffn(rows, width, "experts.")
        # grouped GEMM of the local experts: one kernel; its shape is one expert's average rows
        per = max(tk["local_experts"], 1)
        ex_f = tuple(_grouped(o, per) for o in ex_f)
        ex_b = tuple(_grouped(o, per) for o in ex_b)
        unperm = self.mem("unpermute_combine", act_b * (2 * tk["send"] * h + Tl * h))
        unpermb = self.mem("unpermute_combine.bwd", act_b * (2 * tk["send"] * h + Tl * h), "B")
        # dispatch / combine volumes (nccl-tests convention: a rank's whole buffer). FP8 dispatch
        # (DeepSeek-V3 §3.3.2): 1 byte per value plus one fp32 scale per 1x128 tile, for the
        # forward dispatch and the gradient sent back to the experts (the combine's backward)
        a2a = act_b * h * max(tk["send"], tk["worst"])
        low = a2a / act_b * (1 + 4 / 128) if moe.dispatch_precision == "fp8" else a2a
        lim = (k, moe.max_nodes_per_token) if moe.max_nodes_per_token else ()
        disp, comb, disp_b, comb_b, gat, sca = [], [], [], [], [], []
        if self.ep > 1:
            if moe.dispatcher == "alltoall":
                disp = [Comm("ep", "all_to_all", low, "ep_dispatch", lim)]
                comb = [Comm("ep", "all_to_all", a2a, "ep_combine", lim)]
                disp_b = [Comm("ep", "all_to_all", a2a, "ep_dispatch.bwd", lim)]
                comb_b = [Comm("ep", "all_to_all", low, "ep_combine.bwd", lim)]
            else:
                # all-gather dispatcher: every rank gathers all tokens of the group (and their
                # routing), keeps its experts' ones; the combine reduce-scatters the outputs
                full = act_b * h * Tl * self.ep
                disp = [Comm("ep", "all_gather", full, "ep_dispatch_ag")]
                comb = [Comm("ep", "reduce_scatter", full, "ep_combine_rs")]
                disp_b = [Comm("ep", "reduce_scatter", full, "ep_dispatch_ag.bwd")]
                comb_b = [Comm("ep", "all_gather", full, "ep_combine_rs.bwd")]
        gat_b, sca_b = [], []
        if self.etp > 1:
            buf = act_b * h * tk["worst"] * self.etp
            gat = [Comm("etp", "all_gather", buf, "etp_ag")]
            sca = [Comm("etp", "reduce_scatter", buf, "etp_rs")]
            gat_b = [Comm("etp", "reduce_scatter", buf, "etp_ag.bwd")]
            sca_b = [Comm("etp", "all_gather", buf, "etp_rs.bwd")]
        fwd = [(n2, router, topk, perm)] + disp + gat + [ex_f] + sca + comb + [(unperm,)]
        # backward: each communication's transpose, in reverse order
        bwd = [(unpermb,)] + comb_b + sca_b + [ex_b] + gat_b + disp_b + [(permb, topkb, router_b, router_w, n2b)]
        if moe.shared_expert_ffn_hidden_size:
            sh_f, sh_b = self.ffn(T, moe.shared_expert_ffn_hidden_size / t, "shared.")
            if moe.shared_expert_gate:
                g = self.gemm_fbw("shared.gate", T, 1, h)
                sh_f, sh_b = sh_f + (g[0],), (g[1], g[2]) + sh_b
            msg = act_b * T * h
            sf = [self.tp_comm(True, 2, msg), sh_f, self.tp_comm(True, 3, msg)]
            sb = [self.tp_comm(False, 3, msg), sh_b, self.tp_comm(False, 2, msg)]
            fwd += [x for x in sf if x is not None]
            bwd = [bwd[0]] + [x for x in sb if x is not None] + bwd[1:]
        resid_bytes = (3 if not self.gpt else 3.5) * act_b * seq_e
        r2 = self.mem("dropout_add2" if self.gpt else "residual_add2", resid_bytes)
        r2b = self.mem(r2.name + ".bwd", 2 * act_b * seq_e, "B")
        fwd.append((r2,))
        bwd = [(r2b,)] + bwd
        return fwd, bwd

    # -- attention core ---------------------------------------------------------------------
    def attention_core(self, heads, qk_dim=None, v_dim=None):
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
        qk = Op("attn_scores", "gemm", "F", 2.0 * b * heads * s * s * d, ACT_BYTES * (2 * b * heads * s * d + sq_e), (s, s, d), 2.0 * b * heads * s * s * d)
        drop = 1 if self.gpt else 0
        sm = self.mem("softmax" + ("_dropout" if drop else ""), ACT_BYTES * 2 * sq_e + drop * (ACT_BYTES * 2 * sq_e + sq_e))
        av = Op("attn_values", "gemm", "F", 2.0 * b * heads * s * s * d, ACT_BYTES * (sq_e + 2 * b * heads * s * d), (s, d, s), 2.0 * b * heads * s * s * d)
        qk_b = Op("attn_scores.bwd", "gemm", "B", 2 * qk.flops, 2 * qk.bytes, (s, s, d), 2 * qk.flops)
        smb = self.mem(sm.name + ".bwd", ACT_BYTES * 3 * sq_e + drop * (ACT_BYTES * 2 * sq_e + sq_e), "B")
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

    def projector(self, lm_hidden: int) -> LayerProgram:
        """Vision-to-language projector on the encoder's tokens (LLaVA-1.5: two GEMMs with a GeLU;
        or one linear map), run by every tensor-parallel rank (it is small)."""
        T, he = self.b * self.s, self.h
        enc = self.sc.model.encoder
        f, b = [], []
        g1 = self.gemm_fbw("projector.fc1", T, lm_hidden, he, replicated=True)
        f.append(g1[0])
        b = [g1[1], g1[2]]
        if enc.projector == "mlp":
            act = self.mem("projector.gelu", 2 * ACT_BYTES * T * lm_hidden)
            actb = self.mem("projector.gelu.bwd", 3 * ACT_BYTES * T * lm_hidden, "B")
            g2 = self.gemm_fbw("projector.fc2", T, lm_hidden, lm_hidden, replicated=True)
            f += [act, g2[0]]
            b = [g2[1], g2[2], actb] + b
        return with_split(LayerProgram((tuple(f),), (tuple(b),), ()), 0, 1)

    def projector_params(self, lm_hidden: int) -> float:
        he = self.h
        if self.sc.model.encoder.projector == "mlp":
            return he * lm_hidden + lm_hidden + lm_hidden * lm_hidden + lm_hidden
        return he * lm_hidden + lm_hidden

    def projector_act(self, lm_hidden: int) -> float:
        T = self.b * self.s
        if self.sc.model.encoder.projector == "mlp":
            return ACT_BYTES * T * (self.h + 2 * lm_hidden)       # fc1 input, GeLU input, fc2 input
        return ACT_BYTES * T * self.h

    # -- parameters and activations -----------------------------------------------------------
    def attention_params(self) -> float:
        """Attention parameters on one tensor-parallel rank (with the layer's norms)."""
        h, t = self.h, self.tp
        if self.mla is not None:
            m, a = self.mla, self.a
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            rep = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank      # kv_down + kv norm
            sh = m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim) + a * m.v_head_dim * h
            if m.q_lora_rank:
                rep += h * m.q_lora_rank + m.q_lora_rank
                sh += m.q_lora_rank * a * qk
            else:
                sh += h * a * qk
            return sh / t + rep + 2 * h                                             # + 2 RMSNorm weights
        kv = self.g * self.d
        attn = h * (h + 2 * kv) + h * h
        if self.gpt:
            return attn / t + (h + 2 * kv) / t + 4 * h + h     # QKV bias; 2 LayerNorms; row bias (attn out)
        return attn / t + 2 * h

    def mlp_params(self, width) -> float:
        h, t = self.h, self.tp
        if self.gpt:
            return 2 * h * width / t + width / t + h          # column bias (fc1) and row bias (fc2)
        return 3 * h * width / t

    def layer_params(self) -> float:
        """A dense layer on one tensor-parallel rank."""
        return self.attention_params() + self.mlp_params(self.f)

    def moe_params(self) -> tuple:
        """(dense part, expert part) of an MoE layer on one rank: attention, router and shared
        experts are reduced over dp; the E/ep local experts, each split over etp, over edp."""
        moe, h = self.moe, self.h
        dense = self.attention_params() + moe.num_experts * h
        if moe.shared_expert_ffn_hidden_size:
            dense += self.mlp_params(moe.shared_expert_ffn_hidden_size)
            if moe.shared_expert_gate:
                dense += h
        per_expert = (2 * h * moe.expert_ffn_hidden_size + moe.expert_ffn_hidden_size + h) if self.gpt else 3 * h * moe.expert_ffn_hidden_size
        expert = moe.num_experts / self.ep * per_expert / self.etp
        return dense, expert

    def act_per_layer(self, recompute: str, kind: str = "dense", rows: float = 0.0, send: float = 0.0) -> float:
        """Stored bytes per layer per microbatch (see module docstring for the derivation). For an
        MoE layer, `rows` and `send` are `moe_tokens`' grouped-GEMM rows and dispatched assignments."""
        s, b, h, t, f, a = self.s // self.cp, self.b, self.h, self.tp, self.f, self.a
        kv = self.g * self.d
        if self.mla is not None:
            m = self.mla
            kv = a * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) / 2     # per-head K and V kept for the core
        seq_div = t if self.sp else 1
        if recompute == "full":
            return 2 * s * b * h / seq_div
        drop = 1 if self.gpt else 0
        # sequence-region tensors: norm inputs (2x 2h), QKV input 2h, MLP input 2h, dropout masks (2x h)
        seq = (2 * h + 2 * h + 2 * h + 2 * h + 2 * drop * h) / seq_div
        # tensor-parallel region: Q (2h), K and V (2 kv each), attention output 2h, MLP internals
        if kind == "moe":
            moe = self.moe
            fs = moe.shared_expert_ffn_hidden_size
            mlp = (4 * fs if self.gpt else 6 * fs)
        else:
            mlp = 4 * f if self.gpt else 6 * f
        tpr = (2 * h + 4 * kv + 2 * h + mlp) / t
        if self.flash:
            scores = 4 * a / t                                 # fp32 log-sum-exp per (head, query): 4·a·s·b/t bytes
        elif recompute == "selective":
            scores = 0.0
        else:
            scores = (5 if drop else 2) * a * s / t           # s·b·5·a·s = 5·a·s²·b bytes (Korthikanti)
        out = s * b * (seq + tpr + scores)
        if kind == "moe":
            moe = self.moe
            width = moe.expert_ffn_hidden_size / self.etp
            # routed experts: gathered input (2h), fc1 output and activation output per row; fp32
            # router probabilities; expert outputs awaiting the weighted combine
            out += rows * (2 * h + (4 if self.gpt else 6) * width) + 4 * (s * b / seq_div) * moe.num_experts + 2 * send * h
        return out

    def act_pre(self) -> float:
        return (self.T * self.h / (self.tp if self.sp else 1)) if self.gpt else 0.0   # embedding dropout mask

    def act_post(self) -> float:
        return 4.0 * self.T * self.V / self.tp      # Korthikanti §4.1: output layer + loss, 4sbv/t


def _grouped(o: Op, experts: int) -> Op:
    """A grouped GEMM over `experts` local experts: the total FLOPs and bytes, the shape of one
    expert's share (m split evenly) for the efficiency lookup."""
    if o.kind != "gemm":
        return o
    m, n, k = o.shape
    if o.phase == "W":
        shape = (m, n, k / experts)       # wgrad: k x n x rows
    else:
        shape = (m / experts, n, k)
    return Op(o.name, o.kind, o.phase, o.flops, o.bytes, shape, o.model_flops)


def _join_segments(items) -> tuple:
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


def _as_recompute(item):
    if isinstance(item, Comm):
        return item
    if isinstance(item, Ring):
        return Ring(item.steps, _as_recompute(item.segment), item.comm)
    if isinstance(item, Op):
        return Op(item.name + ".recompute", item.kind, "B", item.flops, item.bytes, item.shape, 0.0)
    return tuple(_as_recompute(o) for o in item)


def stage_layer_counts(sc: Scenario, num_stages: int) -> tuple:
    """Language-model layers of each model stage: `parallel.layers_per_stage` as given, else
    Megatron's first/last-stage counts with the rest spread evenly, else an even split (validated
    on load). An encoder on its own k pipeline stages takes the first k (0 LM layers there)."""
    p = sc.parallel
    k = sc.model.encoder.pipeline_stages if sc.model.encoder is not None else 0
    if p.layers_per_stage == "balanced":
        return (0,) * k + balanced_layers(sc, num_stages - k, k)
    if p.layers_per_stage is not None:
        return (0,) * k + tuple(p.layers_per_stage)
    L, S = sc.model.num_layers, num_stages - k
    first, last = p.first_stage_layers, p.last_stage_layers
    fixed = [x for x in (first, last) if x is not None]
    rest = S - len(fixed)
    each = (L - sum(fixed)) // rest if rest else 0
    counts = [each] * S
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return (0,) * k + tuple(counts)


def stage_speeds(sc: Scenario, stages: int, offset: int = 0) -> tuple:
    """Layers per second of the slowest device of each pipeline stage in Megatron placement (stage
    s on the s-th block of tp·cp·dp consecutive devices), from cluster.mixed: 1 / the compute time
    of one layer (forward, recompute, backward) under that device's calibrated costs. Peak FLOP/s
    would mislead where small or memory-bound operators dominate."""
    from simtrain.cost.roofline import CalibratedRoofline
    from simtrain.hardware.devices import get_device
    c, p = sc.cluster, sc.parallel
    lp = _Builder(sc).layer()
    segs = [it for items in (lp.forward, lp.recompute, lp.backward) for it in items if isinstance(it, tuple)]
    speed: dict = {}

    def layer_speed(dev: str) -> float:
        if dev not in speed:
            costs = CalibratedRoofline(get_device(dev), sc.training.precision)
            speed[dev] = 1.0 / sum(costs.sequence_time(seg) for seg in segs)
        return speed[dev]
    per = p.tp * p.cp * p.dp
    total_nodes = c.nodes
    dpn = max(1, sc.world_size // total_nodes)
    kinds = []
    for n, dev in c.mixed:
        kinds += [dev] * n
    kinds += [c.device] * (total_nodes - len(kinds))
    out = []
    for s in range(offset, offset + stages):
        lo, hi = s * per // dpn, ((s + 1) * per - 1) // dpn
        out.append(min(layer_speed(kinds[n]) for n in range(lo, hi + 1)))
    return tuple(out)


def balanced_layers(sc: Scenario, stages: int, offset: int = 0) -> tuple:
    """`layers_per_stage: balanced`: layers in proportion to each stage's speed (`stage_speeds`),
    at least one each, summing to num_layers (largest remainder). The same devices everywhere
    give the even split. Worked example (24 layers, 4 stages, speeds 2, 2, 1, 1): shares 8, 8, 4, 4.
    Assumes Megatron placement (stage s on the s-th block of devices)."""
    L = sc.model.num_layers
    v = stage_speeds(sc, stages, offset)
    tot = sum(v)
    raw = [L * x / tot for x in v]
    counts = [max(1, int(r)) for r in raw]
    order = sorted(range(stages), key=lambda i: (-(raw[i] - int(raw[i])), i))
    i = 0
    while sum(counts) < L:
        counts[order[i % stages]] += 1
        i += 1
    while sum(counts) > L:
        j = max((j for j in range(stages) if counts[j] > 1), key=lambda j: (counts[j] - raw[j], j))
        counts[j] -= 1
    return tuple(counts)


def layer_kinds(sc: Scenario) -> tuple:
    """`dense` or `moe` for every language-model layer."""
    moe = sc.model.moe
    return tuple("moe" if moe is not None and moe.is_moe_layer(i) else "dense" for i in range(sc.model.num_layers))


def build_workload(sc: Scenario, num_stages: int | None = None, ep_rank: int = 0, uniform: bool = False) -> tuple:
    """One StageWork per model stage (pp of them, or pp x chunks for multi-chunk schedules), as
    seen from expert-parallel rank `ep_rank` (only MoE layers depend on it). `uniform`: nominal
    routing (every expert 1/E, nothing dropped), for the model-FLOP count."""
    bld = _Builder(sc)
    S = num_stages or sc.parallel.pp
    counts = stage_layer_counts(sc, S)
    kinds = layer_kinds(sc)
    moe = sc.model.moe
    shares = iter(())
    if moe is not None:
        nominal = ((1.0 / moe.num_experts,) * moe.num_experts, 0.0)
        table = routing_shares(sc)
        shares = iter([nominal] * len(table) if uniform else table)
    dense_p = bld.layer_params()
    moe_p = bld.moe_params() if moe is not None else (0.0, 0.0)
    full_rc = sc.training.recompute == "full"
    emb_params = bld.V * bld.h / bld.tp + (sc.model.seq_length * bld.h if bld.gpt else 0)
    head_params = bld.V * bld.h / bld.tp + (2 if bld.gpt else 1) * bld.h
    enc = sc.model.encoder
    enc_k = enc.pipeline_stages if enc is not None else 0
    ebld = _Builder(sc, encoder=True) if enc is not None else None
    first_lm = enc_k
    tokens_lm = bld.T
    lm_msg = ACT_BYTES * tokens_lm * bld.h / (bld.tp if bld.sp else 1)
    # without sequence parallelism every tp rank holds the whole boundary activation; with
    # scatter-gather each sends its 1/tp slice and the receiver all-gathers the slices over tp
    # (Megatron-LM p2p_communication, scatter_gather_tensors_in_pipeline, default on; DeepSpeed
    # PipelineEngine partitions pipeline activations and gradients over the model-parallel group)
    split = sc.parallel.pp_scatter_gather and bld.tp > 1 and not bld.sp
    out = []
    pos = 0
    for s, n in enumerate(counts):
        layers, dense, expert, acts = [], [], [], []
        working = 0.0
        if ebld is not None and (s < enc_k or (enc_k == 0 and s == 0)):
            # the encoder's layers (split evenly over its stages), the projector after the last
            per = enc.num_layers // max(enc_k, 1)
            lp = ebld.layer()
            for _ in range(per):
                layers.append(lp)
                dense.append(ebld.layer_params())
                expert.append(0.0)
                acts.append(ebld.act_per_layer(sc.training.recompute))
            working = max(working, ebld.act_per_layer("none") if full_rc else 0.0)
            if s == max(enc_k - 1, 0):
                layers.append(ebld.projector(bld.h))
                dense.append(ebld.projector_params(bld.h))
                expert.append(0.0)
                acts.append(ebld.projector_act(bld.h))
        for _ in range(n):
            kind = kinds[pos]
            pos += 1
            if kind == "moe":
                sh = next(shares)
                tk = bld.moe_tokens(sh, ep_rank)
                layers.append(bld.layer("moe", sh, ep_rank))
                dense.append(moe_p[0])
                expert.append(moe_p[1])
                acts.append(bld.act_per_layer(sc.training.recompute, "moe", tk["rows"], tk["send"]))
                if full_rc:
                    working = max(working, bld.act_per_layer("none", "moe", tk["rows"], tk["send"]))
            else:
                layers.append(bld.layer())
                dense.append(dense_p)
                expert.append(0.0)
                acts.append(bld.act_per_layer(sc.training.recompute))
                if full_rc:
                    working = max(working, bld.act_per_layer("none"))
        params = sum(dense) + sum(expert)
        if s == first_lm:
            params += emb_params
        if s == S - 1:
            # Megatron keeps a copy of tied word embeddings on the last stage when it is a different one
            params += head_params if (not sc.model.tie_embeddings or S > 1) else (2 if bld.gpt else 1) * bld.h
        if s < enc_k:
            send = ACT_BYTES * ebld.b * ebld.s * (bld.h if s == enc_k - 1 else ebld.h)
        else:
            send = lm_msg
        gather = send if split else 0.0
        if split:
            send /= bld.tp
        out.append(StageWork(
            stage=s, layers=tuple(layers),
            pre=bld.embedding() if s == first_lm else None, post=bld.head() if s == S - 1 else None,
            params=params, layer_dense=tuple(dense), layer_expert=tuple(expert), act_layers=tuple(acts),
            act_bytes_pre=bld.act_pre() if s == first_lm else 0.0,
            act_bytes_post=bld.act_post() if s == S - 1 else 0.0,
            act_working_bytes=working, expert_params=sum(expert), send_bytes=send, recv_gather_bytes=gather,
        ))
    return tuple(out)


def _items_model_flops(items) -> float:
    tot = 0.0
    for it in items:
        if isinstance(it, tuple):
            tot += sum(o.model_flops for o in it)
        elif isinstance(it, Ring):
            tot += it.model_flops
    return tot


def model_flops_per_step(sc: Scenario, work: tuple) -> float:
    """3 x forward FLOPs of the whole model for the global batch (Narayanan et al. 2021 accounting),
    from a workload built with nominal routing (`build_workload(..., uniform=True)` for MoE)."""
    per_mb_rank = 0.0
    for w in work:
        prog = list(w.layers) + [x for x in (w.pre, w.post) if x]
        for lp in prog:
            per_mb_rank += _items_model_flops(lp.forward) + _items_model_flops(lp.backward)
    # per-rank FLOPs are divided by tp and cp (tokens); multiply back, and by the microbatches
    return per_mb_rank * sc.parallel.tp * sc.parallel.cp * sc.training.global_batch_size / sc.training.micro_batch_size


def hardware_flops_per_step(sc: Scenario, work: tuple) -> float:
    """Model FLOPs plus recomputed forward FLOPs (same accounting: attention counted full-square)."""
    extra = 0.0
    for w in work:
        for lp in w.layers:
            for it in lp.recompute:
                if isinstance(it, Ring):
                    extra += it.steps * sum(_fwd_model_flops_of(o) for o in it.segment)
                    continue
                ops = (it,) if isinstance(it, Op) else (it if isinstance(it, tuple) else ())
                for o in ops:
                    extra += _fwd_model_flops_of(o)
    return model_flops_per_step(sc, work) + extra * sc.parallel.tp * sc.parallel.cp * sc.training.global_batch_size / sc.training.micro_batch_size


def _fwd_model_flops_of(o: Op) -> float:
    if o.kind == "memory":
        return 0.0
    if o.kind == "attention":
        return o.flops * 2 if o.shape[1] else o.flops     # recomputed causal flash kernel; model accounting counts the full square
    return o.flops


def parameter_counts(sc: Scenario) -> dict:
    """Whole-model parameters (no parallelism): total, active per token (routed experts counted
    top_k of num_experts), and the parts. Used for the published totals of MoE models."""
    from dataclasses import replace

    from simtrain.spec.scenario import ParallelSpec
    one = replace(sc, parallel=ParallelSpec())
    bld = _Builder(one)
    m = sc.model
    V = m.vocab_size                      # published counts use the unpadded vocabulary
    emb = V * bld.h + (m.seq_length * bld.h if bld.gpt else 0)
    head = 0 if m.tie_embeddings else V * bld.h
    final_norm = (2 if bld.gpt else 1) * bld.h
    total = active = emb + head + final_norm
    for kind in layer_kinds(sc):
        if kind == "moe":
            dense, expert = bld.moe_params()
            total += dense + expert
            active += dense + expert * m.moe.top_k / m.moe.num_experts
        else:
            total += bld.layer_params()
            active += bld.layer_params()
    out = {"total": total, "active": active, "embedding": emb + head}
    if m.encoder is not None:
        eb = _Builder(one, encoder=True)
        enc = m.encoder.num_layers * eb.layer_params() + eb.projector_params(bld.h)
        out.update(total=total + enc, active=active + enc, encoder=enc)
    return out
