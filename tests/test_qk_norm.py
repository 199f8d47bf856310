"""Per-head query/key RMSNorm (Qwen3's q_norm and k_norm, Megatron --qk-layernorm).

Model used throughout (as tests/test_head_dim.py): llama, h = 256, a = 8 heads of d = 64 (Q is
a·d = 512 wide, twice the hidden size), g = 2 KV heads (K is g·d = 128), 2 layers, f = 512,
s = 128, b = 1, V = 1024, untied embeddings, tp 1 unless said.
"""
import json

import yaml

from simtrain.spec.loading import load_scenario
from simtrain.workload.build import build_workload
from simtrain.workload.flops import parameter_counts
from simtrain.workload.generation import Batch, GenerationDims
from simtrain.workload.ir import Comm
from simtrain.workload.transformer import LayerBuilder

h, a, d, g, L, f, s, V = 256, 8, 64, 2, 2, 512, 128, 1024
MODEL = {"architecture": "llama", "num_layers": L, "hidden_size": h, "num_attention_heads": a, "num_key_value_heads": g,
         "head_dim": d, "ffn_hidden_size": f, "vocab_size": V, "seq_length": s}


def scenario(tmp_path, topo, qk_norm: bool, tp: int = 1, model: dict | None = None):
    doc = {"name": "qkn", "model": {**MODEL, "qk_norm": qk_norm, **(model or {})},
           "training": {"micro_batch_size": 1, "global_batch_size": 4, "precision": "bf16"},
           "parallel": {"tp": tp, "pp": 1, "dp": 4 // tp},
           "cluster": {"device": "h100-sxm5-80gb", "topology": str(topo), "nodes": 1}}
    p = tmp_path / f"qkn-{int(qk_norm)}-{tp}.yaml"
    p.write_text(yaml.safe_dump(doc))
    return load_scenario(p)[0]


def layer_ops(sc, half: str):
    lp = build_workload(sc)[0].layers[0]
    return [o for it in getattr(lp, half) if isinstance(it, tuple) for o in it]


def test_norm_kernels_sit_between_qkv_and_rotary_with_their_bytes(tmp_path, fast_topology):
    """Forward: qkv, q_layernorm, k_layernorm, rotary. The norms are the fused RMSNorm kernel of
    rmsnorm1 (which normalises the T x h layer input) on T x a·d = 2·T·h and T x g·d = T·h/2
    elements, so they move 2x and 0.5x rmsnorm1's bytes; the backward runs them after the
    rotary's, K first. Without qk_norm none of them exist."""
    on, off = scenario(tmp_path, fast_topology, True), scenario(tmp_path, fast_topology, False)
    fwd = [o.name for o in layer_ops(on, "forward")]
    i = fwd.index("qkv")
    assert fwd[i + 1:i + 3] == ["q_layernorm", "k_layernorm"] and fwd[i + 3].startswith("rotary")
    ops = {o.name: o for o in layer_ops(on, "forward")}
    assert ops["q_layernorm"].bytes == 2 * ops["rmsnorm1"].bytes
    assert ops["k_layernorm"].bytes == 0.5 * ops["rmsnorm1"].bytes
    bwd = [o.name for o in layer_ops(on, "backward")]
    assert bwd.index("k_layernorm.bwd") + 1 == bwd.index("q_layernorm.bwd")
    assert max(j for j, n in enumerate(bwd) if n.startswith("rotary")) < bwd.index("k_layernorm.bwd")
    assert not any("layernorm" in o.name for o in layer_ops(off, "forward") + layer_ops(off, "backward"))
    # tp 2 halves both heads' widths: a/2 query and g/2 key heads per rank
    ops2 = {o.name: o for o in layer_ops(scenario(tmp_path, fast_topology, True, tp=2), "forward")}
    assert ops2["q_layernorm"].bytes == ops["q_layernorm"].bytes / 2


def test_parameters_and_activations_by_hand(tmp_path, fast_topology):
    """Two weight vectors of d per layer: 2·64 = 128 parameters per layer, 256 in the model.
    Kept for the backward: Q and K before their norms, 16-bit: s·b·2·(a·d + g·d) =
    128·2·640 = 163,840 bytes per layer (tp 2: half)."""
    on, off = scenario(tmp_path, fast_topology, True), scenario(tmp_path, fast_topology, False)
    assert LayerBuilder(on).layer_params() - LayerBuilder(off).layer_params() == 2 * d == 128
    assert parameter_counts(on)["total"] - parameter_counts(off)["total"] == L * 2 * d
    assert LayerBuilder(on).act_per_layer("none") - LayerBuilder(off).act_per_layer("none") == 163_840
    on2, off2 = scenario(tmp_path, fast_topology, True, tp=2), scenario(tmp_path, fast_topology, False, tp=2)
    assert LayerBuilder(on2).act_per_layer("none") - LayerBuilder(off2).act_per_layer("none") == 163_840 / 2
    # full recompute keeps only the layer input: the norms add nothing
    assert LayerBuilder(on).act_per_layer("full") == LayerBuilder(off).act_per_layer("full")


def test_generation_runs_two_norm_kernels_per_layer(tmp_path, fast_topology):
    """A decode step of 4 tokens: one q_norm kernel over 4 x a·d and one k_norm over 4 x g·d
    16-bit values, each read and written: 2·2·4·512 = 8,192 and 2·2·4·128 = 2,048 bytes; two
    kernels more per layer than without."""
    on, off = scenario(tmp_path, fast_topology, True), scenario(tmp_path, fast_topology, False)
    b = Batch(decode=4, decode_ctx=40.0, sampled=4)

    def ops(model):
        return [o for count, items in GenerationDims(model).step_items(b) for it in items if not isinstance(it, Comm)
                for o in it for _ in range(count)]
    names = {o.name: o for o in ops(on.model)}
    assert names["q_norm"].bytes == 8_192 and names["k_norm"].bytes == 2_048
    assert len(ops(on.model)) - len(ops(off.model)) == 2 * L


def test_qwen3_configs_and_megatron_flag_turn_it_on(tmp_path, fast_topology):
    """A Qwen3 config.json (model_type qwen3 or qwen3_moe) has q_norm and k_norm; a Llama one
    does not. The shipped Qwen3 presets have it."""
    for mt, want in (("qwen3", True), ("qwen3_moe", True), ("llama", False)):
        cfg = {"model_type": mt, "num_hidden_layers": L, "hidden_size": h, "num_attention_heads": a,
               "num_key_value_heads": g, "head_dim": d, "intermediate_size": f, "vocab_size": V}
        if mt == "qwen3_moe":
            cfg.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128)
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        doc = {"name": "hf", "model": {"hf_config": "config.json", "seq_length": s},
               "training": {"micro_batch_size": 1, "global_batch_size": 4, "precision": "bf16"},
               "parallel": {"tp": 1, "pp": 1, "dp": 4},
               "cluster": {"device": "h100-sxm5-80gb", "topology": str(fast_topology), "nodes": 1}}
        p = tmp_path / "hf.yaml"
        p.write_text(yaml.safe_dump(doc))
        assert load_scenario(p)[0].model.qk_norm is want, mt
    for preset in ("qwen3-8b", "qwen3-30b-a3b"):
        doc = {"name": "p", "model": {"preset": preset}, "training": {"micro_batch_size": 1, "global_batch_size": 8},
               "parallel": {"tp": 1, "pp": 1, "dp": 4},
               "cluster": {"device": "h100-sxm5-80gb", "topology": str(fast_topology), "nodes": 1}}
        p = tmp_path / "p.yaml"
        p.write_text(yaml.safe_dump(doc))
        assert load_scenario(p)[0].model.qk_norm is True, preset
