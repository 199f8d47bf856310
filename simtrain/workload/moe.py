"""Mixture-of-experts layers (Megatron-core MoE): routing, capacity, dispatch and the experts.

Takes a Scenario's `moe` spec (and the per-rank dimensions, `base.LayerDims`); returns the
per-layer routing shares (`routing_shares`), which layers are MoE (`layer_kinds`), the network
share of node-limited routing (`node_limited_share`) and, per rank, the MoE half of a layer:
router GEMM, token permutation, dispatch over the expert-parallel group (all-to-all, or
all-gather / reduce-scatter), grouped GEMMs of the rank's local experts on the tokens routed to
them, combine, shared experts as a tensor-parallel MLP. The tokens a rank's experts receive
follow the routing distribution, so a hot expert makes its rank slower and the all-to-all as long
as its largest receive.

Worked example (uniform routing, no drops): a rank dispatching T tokens with top-k sends T·k·h
16-bit values and, over ep ranks holding E/ep experts each, receives ep·T·k·(1/ep) = T·k of them
(`rank_shares`: 1/ep each).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from simtrain.spec.scenario import Scenario
from simtrain.workload import fp8
from simtrain.workload.base import LayerDims
from simtrain.workload.ir import ACT_BYTES, Comm, Op


def node_limited_share(nodes: int, top_k: int, max_nodes: int) -> float:
    """Fraction of a dispatch's k copies per token that cross the network when routing is
    node-limited (DeepSeek-V3 report §2.1.2 and §3.2.2: each token goes to at most M nodes and
    crosses InfiniBand once per node, then NVLink forwards it to its experts there). With the k
    experts spread evenly over N nodes a token touches N·(1 - (1 - 1/N)^k) distinct nodes on
    average, at most M: the share is min(M, that) / k.

    Worked example (N 8, k 8, M 4): 8·(1 - (7/8)^8) = 5.25 > 4, so 4/8 = 0.5; with M 8 the
    5.25 distinct nodes give 5.25/8.

    >>> node_limited_share(8, 8, 4)
    0.5
    >>> round(node_limited_share(8, 8, 8), 4)
    0.6564
    >>> node_limited_share(1, 8, 4)      # one node: every copy stays on its scale-up fabric
    1.0
    """
    if nodes <= 1 or not max_nodes:
        return 1.0
    distinct = nodes * (1.0 - (1.0 - 1.0 / nodes) ** top_k)
    return min(max_nodes, distinct) / top_k


def routing_shares(sc: Scenario) -> tuple:
    """Per MoE layer (in model order): (kept share of every expert, dropped fraction).

    Shares are fractions of a rank's T·k token-to-expert assignments. uniform: 1/E each; zipf:
    share of the i-th hottest expert ~ 1/(i+1)^skew, the hot experts permuted per layer with the
    scenario seed (`per_layer`), then capped at 1/k (a token picks k distinct experts; the excess is
    spread over the others in proportion, repeated until nothing exceeds the cap); explicit: as
    given. A capacity factor c caps every expert at c/E of the assignments (Megatron's per-rank
    capacity c·T·k/E); the excess is dropped (`apply_capacity`)."""
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
            p, dropped = apply_capacity(p, moe.capacity_factor / E)
        out.append((tuple(float(x) for x in p), dropped))
    return tuple(out)


def apply_capacity(p: np.ndarray, cap: float) -> tuple:
    """(kept shares, dropped fraction) when every expert takes at most `cap` of the assignments.

    Worked example (E 4, k 1, shares [0.4, 0.3, 0.2, 0.1], capacity factor 1.0): cap 1/4, kept
    [0.25, 0.25, 0.2, 0.1], dropped 0.15 + 0.05 = 0.2.

    >>> kept, dropped = apply_capacity(np.array([0.4, 0.3, 0.2, 0.1]), 1.0 / 4)
    >>> [float(x) for x in kept], round(dropped, 12)
    ([0.25, 0.25, 0.2, 0.1], 0.2)
    """
    return np.minimum(p, cap), float(np.clip(p - cap, 0, None).sum())


def _cap(p: np.ndarray, cap: float) -> np.ndarray:
    """Shares capped at `cap`, each round's excess spread over the uncapped ones in proportion.

    >>> [round(float(x), 6) for x in _cap(np.array([0.6, 0.3, 0.1]), 0.5)]   # 0.1 over 0.3 : 0.1
    [0.5, 0.375, 0.125]
    """
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


def layer_kinds(sc: Scenario) -> tuple:
    """`dense` or `moe` for every language-model layer."""
    moe = sc.model.moe
    return tuple("moe" if moe is not None and moe.is_moe_layer(i) else "dense" for i in range(sc.model.num_layers))


def rank_shares(shares: tuple, ep: int) -> list:
    """Share of the assignments each expert-parallel rank's experts receive: rank j holds the
    E/ep consecutive experts j·E/ep .. (j+1)·E/ep - 1.

    >>> rank_shares((0.375, 0.125, 0.25, 0.125, 0.0625, 0.0625, 0.0, 0.0), 4)   # a hot rank 0
    [0.5, 0.375, 0.125, 0.0]
    >>> rank_shares((1 / 8,) * 8, 2)     # uniform: 1/ep each
    [0.5, 0.5]
    """
    per = len(shares) // ep
    return [sum(shares[j * per:(j + 1) * per]) for j in range(ep)]


def _grouped(o: Op, experts: int) -> Op:
    """A grouped GEMM over `experts` local experts: the total FLOPs, the shape of one expert's
    share (m split evenly) for the efficiency lookup, and every expert's weight in the bytes. The
    GEMM came from `ffn` over all rows with one expert's weight, so the other experts' weights
    (forward, input gradient: n x k) or weight gradients (wgrad: m x n) are added."""
    if o.kind != "gemm" or experts <= 1:
        return o
    m, n, k = o.shape
    if o.phase == "W":
        shape = (m, n, k / experts)       # wgrad: k x n x rows
        extra = ACT_BYTES * m * n
    else:
        shape = (m / experts, n, k)
        extra = fp8.operand_bytes(o.dtype) * n * k
    return replace(o, shape=shape, bytes=o.bytes + (experts - 1) * extra, group=experts)


class MoELayers(LayerDims):
    """The MoE half of a layer on one expert-parallel rank."""

    def moe_tokens(self, shares: tuple, ep_rank: int) -> dict:
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
        rank_share = rank_shares(p, ep)
        send = Tl * k * sum(p)
        recv = ep * Tl * k * rank_share[ep_rank]
        worst = ep * Tl * k * max(rank_share)
        return {"Tl": Tl, "send": send, "recv": recv, "worst": worst, "rows": recv * self.etp,
                "local_experts": per, "dropped": dropped}

    def moe_block(self, shares: tuple, ep_rank: int) -> tuple[list, list]:
        """Router, dispatch, local experts' grouped GEMMs, combine, shared experts, residual."""
        moe, h, act_b = self.moe, self.h, ACT_BYTES
        t = self.tp
        T = self.T
        seq_e = T * h / t if self.sp else T * h
        norm = "layernorm" if self.gpt else "rmsnorm"
        n2 = self.nongemm(norm, f"{norm}2", seq_e)
        n2b = self.nongemm(norm, f"{norm}2.bwd", seq_e, "B")
        tk = self.moe_tokens(shares, ep_rank)
        Tl, E, k = tk["Tl"], moe.num_experts, moe.top_k
        router, router_b, router_w = self.gemm_fbw("router", Tl, E, h, te=False)
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
        fwd = [n2 + (router, topk, perm)] + disp + gat + [ex_f] + sca + comb + [(unperm,)]
        # backward: each communication's transpose, in reverse order
        bwd = [(unpermb,)] + comb_b + sca_b + [ex_b] + gat_b + disp_b + [(permb, topkb, router_b, router_w) + n2b]
        if moe.shared_expert_ffn_hidden_size:
            sh_f, sh_b = self.ffn(T, moe.shared_expert_ffn_hidden_size / t, "shared.")
            if moe.shared_expert_gate:
                g = self.gemm_fbw("shared.gate", T, 1, h, te=False)
                sh_f, sh_b = sh_f + (g[0],), (g[1], g[2]) + sh_b
            msg = act_b * T * h
            sf = [self.tp_comm(True, 2, msg), sh_f, self.tp_comm(True, 3, msg)]
            if self.sp and not self.ub:
                # a column-parallel fc1 like the dense MLP's (`column_backward`)
                *rest, fc1_b, fc1_w = sh_b
                sb = [self.tp_comm(False, 3, msg), tuple(rest), *self.column_backward(2, fc1_b, fc1_w, msg)]
            else:
                sb = [self.tp_comm(False, 3, msg), sh_b, self.tp_comm(False, 2, msg)]
            fwd += [x for x in sf if x is not None]
            bwd = [bwd[0]] + [x for x in sb if x is not None] + bwd[1:]
        r2, r2b = self.residual(2, seq_e)
        fwd.append(r2)
        bwd = [r2b] + bwd
        return fwd, bwd
