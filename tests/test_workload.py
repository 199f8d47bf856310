"""Memory and FLOP formulas on a small GPT, worked by hand.

Model: h = 256, a = 8 heads, f = 4h = 1024, s = 128, b = 1, L = 8, V = 1024 (already a multiple
of 128·tp, so no padding).
"""
import pytest
from conftest import small_scenario

from simtrain.simulate import static_memory
from simtrain.spec.loading import load_scenario
from simtrain.workload.base import padded_vocab
from simtrain.workload.build import build_workload
from simtrain.workload.flops import model_flops_per_step
from simtrain.workload.transformer import LayerBuilder

s, b, h, a, L, V = 128, 1, 256, 8, 8, 1024


def builder(tmp_path, topo, **kw):
    sc, _ = load_scenario(small_scenario(tmp_path, topo, **kw))
    return sc, LayerBuilder(sc)


@pytest.mark.parametrize("t,sp,expect", [
    # Korthikanti et al. 2022, §4: bytes per layer
    (1, False, s * b * h * (34 + 5 * a * s / h)),                    # no parallelism
    (2, False, s * b * h * (10 + 24 / 2 + 5 * a * s / (h * 2))),     # tensor parallel
    (2, True, s * b * h / 2 * (34 + 5 * a * s / h)),                 # tensor + sequence parallel
])
def test_korthikanti_activation_formulas(tmp_path, fast_topology, t, sp, expect):
    _, bld = builder(tmp_path, fast_topology, parallel={"tp": t, "pp": 4 // t, "sequence_parallel": sp},
                     training={"flash_attention": False})
    assert bld.act_per_layer("none") == pytest.approx(expect, rel=1e-12)


def test_recompute_activation_formulas(tmp_path, fast_topology):
    _, bld = builder(tmp_path, fast_topology, parallel={"tp": 2, "pp": 2, "sequence_parallel": True},
                     training={"flash_attention": False})
    assert bld.act_per_layer("selective") == pytest.approx(34 * s * b * h / 2)    # score term dropped
    assert bld.act_per_layer("full") == pytest.approx(2 * s * b * h / 2)          # layer input only (SP-sharded)


def test_flash_attention_keeps_only_logsumexp(tmp_path, fast_topology):
    _, bld = builder(tmp_path, fast_topology, parallel={"tp": 1, "pp": 4})
    # 34·sbh plus the fp32 log-sum-exp per head and query: 4·a·s·b
    assert bld.act_per_layer("none") == pytest.approx(34 * s * b * h + 4 * a * s * b)


def test_layer_parameters_by_hand(tmp_path, fast_topology):
    _, bld = builder(tmp_path, fast_topology, parallel={"tp": 1, "pp": 4})
    # QKV 3h² + 3h bias, out h² + h, fc1 h·4h + 4h, fc2 4h·h + h, two LayerNorms 4h = 12h² + 13h
    assert bld.layer_params() == 12 * h * h + 13 * h


def test_static_memory_megatron_table(tmp_path, fast_topology):
    """bf16 params with fp32 grads: 2 + 4 + 12 bytes per parameter; ZeRO-1 shards the 12 over dp."""
    sc, _ = load_scenario(small_scenario(tmp_path, fast_topology, parallel={"tp": 1, "pp": 1, "dp": 4},
                                         training={"global_batch_size": 8}))
    w = build_workload(sc)[0]
    st = static_memory(sc, w.params)
    assert (st["weights"], st["gradients"], st["optimizer"]) == pytest.approx((2 * w.params, 4 * w.params, 12 * w.params))
    sc1, _ = load_scenario(small_scenario(tmp_path, fast_topology, parallel={"tp": 1, "pp": 1, "dp": 4, "zero_stage": 1},
                                          training={"global_batch_size": 8}))
    st1 = static_memory(sc1, w.params)
    assert st1["optimizer"] == pytest.approx(12 * w.params / 4)
    sc3, _ = load_scenario(small_scenario(tmp_path, fast_topology, parallel={"tp": 1, "pp": 1, "dp": 4, "zero_stage": 3},
                                          training={"global_batch_size": 8}))
    st3 = static_memory(sc3, w.params)
    assert sum(st3.values()) == pytest.approx(18 * w.params / 4)


def test_model_flops_match_narayanan_formula(tmp_path, fast_topology):
    """72·B·s·l·h²·(1 + s/(6h) + V/(12·h·l)) (Narayanan et al. SC'21, eq. 3)."""
    B = 8
    sc, _ = load_scenario(small_scenario(tmp_path, fast_topology, parallel={"tp": 2, "pp": 2}))
    work = build_workload(sc)
    expect = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    assert model_flops_per_step(sc, work) == pytest.approx(expect, rel=1e-12)


def test_megatron_vocab_padding():
    assert padded_vocab(50257, 8, 128) == 51200
    assert padded_vocab(1024, 2, 128) == 1024
