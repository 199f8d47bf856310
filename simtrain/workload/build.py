"""Workload (second pipeline stage): the scenario's model as per-stage operator programs.

Takes a Scenario (and the number of model stages, the expert-parallel rank, and whether to use
nominal routing); returns one `StageWork` per model stage: for one microbatch on one
tensor-parallel rank, each layer is a sequence of compute segments and tensor-parallel
communication points (Megatron's column/row split), every operator carrying its FLOPs, bytes
moved and shape, the backward split into input-gradient (B) and weight-gradient (W) parts so
schedules that defer W can use them; plus the stage's parameters, stored activations and
pipeline message sizes.

The parts: `ir` (the operator IR), `base` (per-rank dimensions and operator factories),
`transformer` (dense layers, embedding, head; `LayerBuilder`), `attention` (incl. context
parallelism), `mla`, `moe`, `encoder`, `memory`, `flops`; the layer split over stages is
`simtrain.plan.layers`.
"""
from __future__ import annotations

from simtrain.plan.layers import stage_layer_counts
from simtrain.spec.scenario import Scenario
from simtrain.workload.ir import ACT_BYTES, StageWork
from simtrain.workload.memory import recompute_modes, recompute_working
from simtrain.workload.moe import layer_kinds, routing_shares
from simtrain.workload.transformer import LayerBuilder


def build_workload(sc: Scenario, num_stages: int | None = None, ep_rank: int = 0, uniform: bool = False) -> tuple:
    """One StageWork per model stage (pp of them, or pp x chunks for multi-chunk schedules), as
    seen from expert-parallel rank `ep_rank` (only MoE layers depend on it). `uniform`: nominal
    routing (every expert 1/E, nothing dropped), for the model-FLOP count."""
    bld = LayerBuilder(sc)
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
    emb_params = bld.V * bld.h / bld.tp + (sc.model.seq_length * bld.h if bld.gpt else 0)
    head_params = bld.V * bld.h / bld.tp + (2 if bld.gpt else 1) * bld.h
    enc = sc.model.encoder
    enc_k = enc.pipeline_stages if enc is not None else 0
    ebld = LayerBuilder(sc, encoder=True) if enc is not None else None
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
        whole = []          # per layer: (recompute mode, its activations with nothing recomputed)
        group = 0           # layers one recompute rematerialises at once (recompute_modes)
        fwd = 0.0           # a forward-only pass: one layer's activations alive at a time (nothing stored)
        if ebld is not None and (s < enc_k or (enc_k == 0 and s == 0)):
            # the encoder's layers (split evenly over its stages), the projector after the last;
            # the encoder is its own block, so its layers are counted apart for recompute_method
            per = enc.num_layers // max(enc_k, 1)
            modes, group = recompute_modes(sc, per)
            for mode in modes:
                layers.append(ebld.layer(recompute=mode))
                dense.append(ebld.layer_params())
                expert.append(0.0)
                acts.append(ebld.act_per_layer(mode))
                whole.append((mode, ebld.act_per_layer("none")))
            if s == max(enc_k - 1, 0):
                layers.append(ebld.projector(bld.h))
                dense.append(ebld.projector_params(bld.h))
                expert.append(0.0)
                acts.append(ebld.projector_act(bld.h))
                whole.append(("none", ebld.projector_act(bld.h)))
        modes, g = recompute_modes(sc, n)
        group = max(group, g)
        for mode in modes:
            kind = kinds[pos]
            pos += 1
            if kind == "moe":
                sh = next(shares)
                tk = bld.moe_tokens(sh, ep_rank)
                layers.append(bld.layer("moe", sh, ep_rank, recompute=mode))
                dense.append(moe_p[0])
                expert.append(moe_p[1])
                acts.append(bld.act_per_layer(mode, "moe", tk["rows"], tk["send"]))
                whole.append((mode, bld.act_per_layer("none", "moe", tk["rows"], tk["send"])))
            else:
                layers.append(bld.layer(recompute=mode))
                dense.append(dense_p)
                expert.append(0.0)
                acts.append(bld.act_per_layer(mode))
                whole.append((mode, bld.act_per_layer("none")))
        fwd = max((x for _, x in whole), default=0.0)
        working = recompute_working(whole, group)
        # op-level checkpointing rebuilds one layer at a time: what it did not keep
        working = max([working] + [w - a for (m, w), a in zip(whole, acts) if m == "op"])
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
            loss_working_bytes=bld.loss_working() if s == S - 1 else 0.0,
            act_working_bytes=working, expert_params=sum(expert), send_bytes=send, recv_gather_bytes=gather,
            act_forward_bytes=fwd + (bld.act_post() if s == S - 1 else 0.0),
        ))
    return tuple(out)
