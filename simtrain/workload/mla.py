"""Multi-head latent attention (DeepSeek-V2 §2.1.2): the projections into and out of the latent.

Takes the per-rank dimensions (`base.LayerDims`) and the model's `mla` spec; returns the forward
and backward operators of the query and key/value projections and the per-head query/key and
value widths the attention core (`attention`) runs with.
"""
from __future__ import annotations

from simtrain.workload.base import LayerDims


class MLAProjections(LayerDims):
    """MLA's low-rank query and key/value projections on one rank."""

    def mla_projections(self, heads: float) -> tuple[tuple, tuple, int, int]:
        """DeepSeek MLA (DeepSeek-V2 report §2.1.2): queries through a low-rank down/up pair (or
        directly), keys and values from one compressed latent of kv_lora_rank plus a shared rotary
        key of qk_rope_head_dim. The down projections are not split by tensor parallelism (every
        tp rank runs them); the up projections are split by heads."""
        m, T, h = self.mla, self.T, self.h
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        f, b = [], []
        if m.q_lora_rank:
            qa = self.gemm_fbw("q_down", T, m.q_lora_rank, h, replicated=True)
            qn = (self.nongemm("rmsnorm", "q_norm", T * m.q_lora_rank), self.nongemm("rmsnorm", "q_norm.bwd", T * m.q_lora_rank, "B"))
            qb = self.gemm_fbw("q_up", T, heads * qk, m.q_lora_rank)
            f += [qa[0], *qn[0], qb[0]]
            b = [qb[1], qb[2], *qn[1], qa[1], qa[2]] + b
        else:
            qb = self.gemm_fbw("q_proj", T, heads * qk, h)
            f += [qb[0]]
            b = [qb[1], qb[2]] + b
        ka = self.gemm_fbw("kv_down", T, m.kv_lora_rank + m.qk_rope_head_dim, h, replicated=True)
        kn = (self.nongemm("rmsnorm", "kv_norm", T * m.kv_lora_rank), self.nongemm("rmsnorm", "kv_norm.bwd", T * m.kv_lora_rank, "B"))
        kb = self.gemm_fbw("kv_up", T, heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank)
        f += [ka[0], *kn[0], kb[0]]
        b = [kb[1], kb[2], *kn[1], ka[1], ka[2]] + b
        return tuple(f), tuple(b), qk, m.v_head_dim
