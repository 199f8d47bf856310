"""Decode of a fine-grained MoE model (Qwen3-30B-A3B: 128 experts, top-8, expert width 768,
hidden 2048) reads only the experts its batch touches: E·(1 - (1 - k/E)^T) under uniform routing."""
import pytest

from simtrain.studies.validate_serving import model_spec
from simtrain.workload.generation import Batch, GenerationDims, touched_experts

M = model_spec("qwen3-30b-a3b")
H, FE = M.hidden_size, M.moe.expert_ffn_hidden_size


def gate_up_weight_bytes(dims: GenerationDims, T: int) -> float:
    """Weight bytes of the experts.gate_up GEMM of one MoE layer (activation bytes taken off)."""
    b = Batch(decode=T, decode_ctx=100.0 * T, sampled=T)
    for _, items in dims.step_items(b):
        for it in items:
            for o in (it if isinstance(it, tuple) else ()):
                if o.name == "experts.gate_up":
                    rows = T * M.moe.top_k / dims.ep
                    up_n = 2 * FE / (dims.tp // dims.ep)
                    return o.bytes - 2 * rows * (H + up_n)
    raise AssertionError("no experts.gate_up operator")


def test_touched_experts_closed_form_by_hand():
    # T = 1: exactly k experts; T = 16: 128·(1 - (15/16)^16) = 128·(1 - 0.35607) = 82.42
    # (ln 0.9375 = -0.064539, x16 = -1.03262, e^that = 0.35607); T = 256: 128·(1 - 6.8e-8)
    assert touched_experts(128, 8, 1) == pytest.approx(8.0)
    assert touched_experts(128, 8, 16) == pytest.approx(82.42, abs=0.01)
    assert touched_experts(128, 8, 256) == pytest.approx(128.0, rel=1e-6)


def test_decode_reads_touched_expert_weights_only():
    d = GenerationDims(M)
    one = 2 * H * 2 * FE                        # bf16 gate+up of one expert: 2 B x h x 2 f_e
    assert gate_up_weight_bytes(d, 1) == pytest.approx(8 * one)
    assert gate_up_weight_bytes(d, 16) == pytest.approx(82.42 * one, rel=1e-3)
    assert gate_up_weight_bytes(d, 256) == pytest.approx(128 * one, rel=1e-6)


def test_expert_parallel_rank_reads_its_share_of_touched_experts():
    # ep = tp = 4: each rank holds 32 whole experts and reads a quarter of the touched ones
    d = GenerationDims(M, tp=4, ep=4)
    one = 2 * H * 2 * FE
    assert gate_up_weight_bytes(d, 16) == pytest.approx(82.42 / 4 * one, rel=1e-3)
