"""An explicit head_dim (Qwen3, Gemma): heads wider than hidden_size / num_attention_heads.

Model used throughout: llama, h = 256, a = 8 heads of d = 64 (so the query projection is
256 -> a·d = 512, twice the hidden size), g = 2 KV heads, 2 layers, f = 512, s = 128, b = 1,
V = 1024 (a multiple of 128, no padding), untied embeddings.
"""
import json

import pytest
import yaml

from simtrain.calibration.bench import scenario_shapes
from simtrain.errors import ConfigError
from simtrain.spec.loading import load_scenario
from simtrain.workload.build import build_workload
from simtrain.workload.flops import parameter_counts
from simtrain.workload.generation import GenerationDims
from simtrain.workload.transformer import LayerBuilder

h, a, d, g, L, f, s, V = 256, 8, 64, 2, 2, 512, 128, 1024
MODEL = {"architecture": "llama", "num_layers": L, "hidden_size": h, "num_attention_heads": a, "num_key_value_heads": g,
         "head_dim": d, "ffn_hidden_size": f, "vocab_size": V, "seq_length": s}


def scenario(tmp_path, topo, model=None, tp=1):
    doc = {"name": "wide-heads", "model": {**MODEL, **(model or {})},
           "training": {"micro_batch_size": 1, "global_batch_size": 4, "precision": "bf16"},
           "parallel": {"tp": tp, "pp": 1, "dp": 4 // tp},
           "cluster": {"device": "h100-sxm5-80gb", "topology": str(topo), "nodes": 1}}
    p = tmp_path / "wide.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def forward_ops(sc):
    lp = build_workload(sc)[0].layers[0]
    return {o.name: o for it in lp.forward if isinstance(it, tuple) for o in it}


def test_parameters_by_hand(tmp_path, fast_topology):
    """Per layer: Q h·a·d, K and V h·g·d each, output a·d·h, two RMSNorms 2h, SwiGLU 3·h·f;
    = 256·512 + 2·256·128 + 512·256 + 512 + 3·256·512 = 721,408. Plus untied embedding and
    head 2·V·h and the final norm h."""
    sc, _ = load_scenario(scenario(tmp_path, fast_topology))
    assert sc.model.head_dim == d
    layer = h * a * d + 2 * h * g * d + a * d * h + 2 * h + 3 * h * f
    assert layer == 721_408
    assert LayerBuilder(sc).layer_params() == layer
    assert parameter_counts(sc)["total"] == L * layer + 2 * V * h + h


def test_projection_and_attention_flops_by_hand(tmp_path, fast_topology):
    """QKV GEMM: T x (a·d + 2·g·d) x h = 128 x 768 x 256, 2·128·768·256 FLOPs; the output
    projection T x h x a·d = 128 x 256 x 512; the core's model FLOPs 2·b·s²·a·(d + d) =
    4·b·s²·a·d = 33,554,432 (with tp 2: heads and the QKV columns halve)."""
    sc, _ = load_scenario(scenario(tmp_path, fast_topology))
    ops = forward_ops(sc)
    assert ops["qkv"].shape == (s, a * d + 2 * g * d, h) and ops["qkv"].flops == 2 * s * 768 * h
    assert ops["attn_out"].shape == (s, h, a * d) and ops["attn_out"].flops == 2 * s * h * 512
    assert ops["flash_attn"].model_flops == 4 * 1 * s * s * a * d == 33_554_432
    sc2, _ = load_scenario(scenario(tmp_path, fast_topology, tp=2))
    ops2 = forward_ops(sc2)
    assert ops2["qkv"].shape == (s, (a * d + 2 * g * d) / 2, h)
    assert ops2["flash_attn"].model_flops == 33_554_432 / 2


def test_activation_bytes_by_hand(tmp_path, fast_topology):
    """Stored bytes per layer (flash attention, no recompute, llama so no dropout masks): the
    sequence-region tensors 8·h, the tensor-parallel region 2·a·d (Q) + 4·g·d (K, V) + 2·a·d
    (attention output) + 6·f (SwiGLU), the fp32 log-sum-exp 4·a; per token 2048 + 5632 + 32."""
    sc, _ = load_scenario(scenario(tmp_path, fast_topology))
    per_token = 8 * h + (2 * a * d + 4 * g * d + 2 * a * d + 6 * f) + 4 * a
    assert per_token == 2048 + 5632 + 32
    assert LayerBuilder(sc).act_per_layer("none") == s * per_token


def test_kv_cache_bytes_per_token_by_hand(tmp_path, fast_topology):
    """2 (K and V) x layers x kv heads x head_dim x 2 bytes (bf16) = 2·2·2·64·2 = 1024 B; the
    published shapes: Qwen3-30B-A3B 2·48·4·128·2 = 98,304 B, Qwen3-8B 2·36·8·128·2 = 147,456 B."""
    sc, _ = load_scenario(scenario(tmp_path, fast_topology))
    assert GenerationDims(sc.model).kv_bytes_per_token() == 2 * L * g * d * 2 == 1024
    for preset, kv in (("qwen3-30b-a3b", 98_304), ("qwen3-8b", 147_456)):
        p = tmp_path / f"{preset}.yaml"
        p.write_text(yaml.safe_dump({"name": preset, "model": {"preset": preset},
                                     "training": {"micro_batch_size": 1, "global_batch_size": 8}, "parallel": {"dp": 8},
                                     "cluster": {"device": "h100-sxm5-80gb", "topology": "dgx-h100", "nodes": 1}}))
        m = load_scenario(p)[0].model
        assert GenerationDims(m).kv_bytes_per_token() == kv


def test_calibration_shapes_use_head_dim(tmp_path, fast_topology):
    _, attn = scenario_shapes(str(scenario(tmp_path, fast_topology)))
    assert attn == [(1, a, s, d, True)]


def test_divisibility_is_not_required_with_head_dim(tmp_path, fast_topology):
    """hidden 250 over 8 heads is refused without head_dim, accepted with it (Q: 250 -> 8·64)."""
    sc, _ = load_scenario(scenario(tmp_path, fast_topology, model={"hidden_size": 250}))
    assert (sc.model.hidden_size, sc.model.head_dim) == (250, 64)
    m = {k: v for k, v in MODEL.items() if k != "head_dim"}
    p = tmp_path / "no-head-dim.yaml"
    p.write_text(yaml.safe_dump({"name": "x", "model": {**m, "hidden_size": 250},
                                 "training": {"micro_batch_size": 1, "global_batch_size": 4},
                                 "parallel": {"dp": 4}, "cluster": {"device": "h100-sxm5-80gb", "topology": str(fast_topology), "nodes": 1}}))
    with pytest.raises(ConfigError) as e:
        load_scenario(p)
    assert "model.hidden_size: 250 is not divisible by num_attention_heads 8" in str(e.value)
    assert "give `head_dim:`" in str(e.value)


def test_derived_head_dim_and_bad_values(tmp_path, fast_topology):
    sc, _ = load_scenario(scenario(tmp_path, fast_topology, model={"head_dim": None}))
    assert sc.model.head_dim == h // a == 32
    with pytest.raises(ConfigError) as e:
        load_scenario(scenario(tmp_path, fast_topology, model={"head_dim": 0}))
    assert "model.head_dim:" in str(e.value)


def test_hf_config_head_dim(tmp_path, fast_topology):
    """A Qwen3 config.json gives head_dim; a Qwen2 one does not (derived: hidden / heads)."""
    cfg = {"model_type": "qwen3", "num_hidden_layers": L, "hidden_size": h, "num_attention_heads": a,
           "num_key_value_heads": g, "head_dim": d, "intermediate_size": f, "vocab_size": V}
    for given, expect in ((True, d), (False, h // a)):
        (tmp_path / "config.json").write_text(json.dumps(cfg if given else {k: v for k, v in cfg.items() if k != "head_dim"}))
        p = tmp_path / "hf.yaml"
        p.write_text(yaml.safe_dump({"name": "hf", "model": {"hf_config": "config.json", "seq_length": s},
                                     "training": {"micro_batch_size": 1, "global_batch_size": 4}, "parallel": {"dp": 4},
                                     "cluster": {"device": "h100-sxm5-80gb", "topology": str(fast_topology), "nodes": 1}}))
        assert load_scenario(p)[0].model.head_dim == expect
