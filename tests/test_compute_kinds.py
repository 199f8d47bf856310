"""The compute line split by operator kind (`simtrain.results.kinds`).

Expected values: hand counts on the small GPT of conftest.small_scenario (h 256, 8 layers, 8
heads, vocabulary 1024, sequence 128, micro batch 1), one stage, two microbatches per rank, with
GEMMs and attention at a fixed rate P and memory-bound kernels free (conftest.FlopCost):

- GEMMs per layer and microbatch: forward 2·T·(3h·h + h·h + 4h·h + 4h·h) = 24·T·h², each backward
  GEMM the same again twice: 72·T·h²; the LM head 3 x 2·T·h·V. T = 128 tokens.
- attention (causal flash): the forward computes half of the 4·b·s²·h square, the backward 2.5x
  that: 3.5 x 2·s²·h per layer and microbatch."""
import pytest
from conftest import FlopCost, small_scenario

from simtrain.results.kinds import KINDS, compute_by_kind, kind_of
from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario
from simtrain.workload.ir import Op

T, H, L, V, M = 128, 256, 8, 1024, 2


def test_device_time_by_kind_by_hand(tmp_path, plain_topology):
    sc, topo = load_scenario(small_scenario(tmp_path, plain_topology, parallel={"pp": 1, "dp": 4}))
    cost = FlopCost()
    b = simulate(sc, topo, cost).result.breakdown
    gemm = M * (L * 72 * T * H * H + 6 * T * H * V) / cost.P
    attn = M * L * 3.5 * 2 * T * T * H / cost.P
    assert b.device_time_by_kind_s["gemm"] == pytest.approx(gemm, rel=1e-12)
    assert b.device_time_by_kind_s["attention"] == pytest.approx(attn, rel=1e-12)
    # memory-bound kernels are free under FlopCost: every other kind is zero or absent
    assert all(v == 0 for k, v in b.device_time_by_kind_s.items() if k not in ("gemm", "attention"))
    assert list(b.device_time_by_kind_s) == list(KINDS) and list(b.compute_by_kind_s) == [*KINDS, "optimizer"]
    # without a host cost the compute line is the device time plus the optimizer step
    parts = b.compute_by_kind_s
    assert sum(parts.values()) == pytest.approx(b.compute_s, rel=1e-9)
    assert parts["gemm"] / parts["attention"] == pytest.approx(gemm / attn, rel=1e-9)


def test_full_recompute_is_its_own_kind(tmp_path, plain_topology):
    """recompute: full re-runs each layer's forward before its backward: its GEMMs and attention
    count as recompute, 24·T·h² + 2·s²·h (the causal half) per layer and microbatch."""
    sc, topo = load_scenario(small_scenario(tmp_path, plain_topology, parallel={"pp": 1, "dp": 4},
                                            training={"recompute": "full"}))
    cost = FlopCost()
    b = simulate(sc, topo, cost).result.breakdown
    assert b.device_time_by_kind_s["recompute"] == pytest.approx(M * L * (24 * T * H * H + 2 * T * T * H) / cost.P, rel=1e-12)


def test_split_in_proportion_and_kinds():
    """compute_by_kind: the compute time less the optimizer split by device time, in KINDS order."""
    d = compute_by_kind({"norm": 1.0, "gemm": 3.0}, 10.0, 2.0)
    assert (d["gemm"], d["norm"], d["optimizer"]) == (6.0, 2.0, 2.0) and sum(d.values()) == 10.0
    assert set(compute_by_kind({}, 1.0).values()) == {0.0}
    assert [kind_of(Op(n, k, "F", 0.0, 0.0)) for n, k in [
        ("qkv.quantize_input/amax", "memory"), ("swiglu/silu", "memory"), ("rotary/mul_cos", "memory"),
        ("cross_entropy/exp", "memory"), ("permute", "memory"), ("residual_add1", "memory"), ("flash_attn", "attention")]] == [
        "fp8_cast", "activation", "rotary", "loss", "moe_routing", "other_memory", "attention"]
    assert len(set(KINDS)) == len(KINDS)
