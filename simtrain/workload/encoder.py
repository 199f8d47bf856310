"""Multimodal encoder: the vision-to-language projector after a ViT encoder's blocks.

The encoder's blocks themselves are transformer layers: `LayerDims(sc, encoder=True)` sees the
encoder's tokens per sample, hidden size and heads, with LayerNorm, GeLU MLP, biases and
bidirectional attention, and builds them like any other layer. This module takes that view and
the language model's hidden size and returns the projector's layer program (LLaVA-1.5: two GEMMs
with a GeLU, or one linear map), its parameters and its stored activation bytes.
"""
from __future__ import annotations

from simtrain.workload.base import LayerDims
from simtrain.workload.ir import ACT_BYTES, LayerProgram, with_split


class EncoderProjector(LayerDims):
    """The projector from the encoder's hidden size to the language model's."""

    def projector(self, lm_hidden: int) -> LayerProgram:
        """Vision-to-language projector on the encoder's tokens (LLaVA-1.5: two GEMMs with a GeLU;
        or one linear map), run by every tensor-parallel rank (it is small)."""
        T, he = self.b * self.s, self.h
        enc = self.sc.model.encoder
        f, b = [], []
        g1 = self.gemm_fbw("projector.fc1", T, lm_hidden, he, replicated=True, te=False)
        f.append(g1[0])
        b = [g1[1], g1[2]]
        if enc.projector == "mlp":
            act = self.mem("projector.gelu", 2 * ACT_BYTES * T * lm_hidden)
            actb = self.mem("projector.gelu.bwd", 3 * ACT_BYTES * T * lm_hidden, "B")
            g2 = self.gemm_fbw("projector.fc2", T, lm_hidden, lm_hidden, replicated=True, te=False)
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
