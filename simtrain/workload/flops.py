"""FLOPs and parameter totals of a training step.

Takes a Scenario and its workload (`build.build_workload`, with nominal routing for MoE); returns
model FLOPs per step, hardware FLOPs per step (model FLOPs plus recomputed forwards) and the
whole model's parameter counts (total, active per token, embedding, encoder).

FLOP accounting (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", SC'21, eq. 3): a GEMM of m x n x k costs 2mnk forward, the same again for the
input gradient and for the weight gradient; the attention core costs 4·b·s²·h forward (scores and
weighted values, full square). Model FLOPs per step = 3 x forward FLOPs, recompute excluded
(a forward-only pass, `training.forward_only`: the forward FLOPs alone).
Worked example (GPT, f = 4h, MHA): per layer forward 24·b·s·h² + 4·b·s²·h, so the model total is
72·B·s·l·h²·(1 + s/(6h) + V/(12·h·l)), the paper's formula.
"""
from __future__ import annotations

from dataclasses import replace

from simtrain.spec.scenario import ParallelSpec, Scenario
from simtrain.workload.ir import Op, Ring
from simtrain.workload.moe import layer_kinds
from simtrain.workload.transformer import LayerBuilder


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
    from a workload built with nominal routing (`build_workload(..., uniform=True)` for MoE); the
    forward FLOPs alone for a forward-only pass (training.forward_only)."""
    fwd_only = sc.training.forward_only
    per_mb_rank = 0.0
    for w in work:
        prog = list(w.layers) + [x for x in (w.pre, w.post) if x]
        for lp in prog:
            per_mb_rank += _items_model_flops(lp.forward) + (0.0 if fwd_only else _items_model_flops(lp.backward))
    # per-rank FLOPs are divided by tp and cp (tokens); multiply back, and by the microbatches
    return per_mb_rank * sc.parallel.tp * sc.parallel.cp * sc.training.global_batch_size / sc.training.micro_batch_size


def hardware_flops_per_step(sc: Scenario, work: tuple) -> float:
    """Model FLOPs plus recomputed forward FLOPs (same accounting: attention counted full-square).
    A forward-only pass recomputes nothing: its hardware FLOPs are its model FLOPs."""
    if sc.training.forward_only:
        return model_flops_per_step(sc, work)
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
    one = replace(sc, parallel=ParallelSpec())
    bld = LayerBuilder(one)
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
        eb = LayerBuilder(one, encoder=True)
        enc = m.encoder.num_layers * eb.layer_params() + eb.projector_params(bld.h)
        out.update(total=total + enc, active=active + enc, encoder=enc)
    return out
