"""Model presets (simtrain/data/models.yaml) against their published parameter counts."""
import pytest
import yaml

from simtrain.spec.loading import load_scenario, model_presets
from simtrain.workload.flops import parameter_counts


def preset(tmp_path, name):
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump({"name": name, "model": {"preset": name},
                                 "training": {"micro_batch_size": 1, "global_batch_size": 8},
                                 "parallel": {"dp": 8}, "cluster": {"device": "h100-sxm5-80gb", "topology": "dgx-h100", "nodes": 1}}))
    return load_scenario(p)[0]


@pytest.mark.parametrize("name,total,non_embedding,rel", [
    # Qwen2.5-7B model card: 7.61B parameters, 6.53B non-embedding (Qwen2.5-Math-7B: the same architecture)
    ("qwen2.5-7b", 7.61e9, 6.53e9, 0.01),
    ("qwen2.5-math-7b", 7.61e9, 6.53e9, 0.01),
    # Qwen2.5-1.5B model card (the architecture of Qwen2.5-Math-1.5B): 1.54B, 1.31B non-embedding
    ("qwen2.5-math-1.5b", 1.54e9, 1.31e9, 0.01),
    # Qwen2.5-32B model card: 32.5B, 31.0B non-embedding; the config's shapes give 32.76B (+0.8 %)
    ("qwen2.5-32b", 32.5e9, 31.0e9, 0.01),
    # Qwen3-8B model card: 8.2B, 6.95B non-embedding
    ("qwen3-8b", 8.2e9, 6.95e9, 0.01),
    # Qwen3-30B-A3B model card: 30.5B total, 29.9B non-embedding
    ("qwen3-30b-a3b", 30.5e9, 29.9e9, 0.01),
])
def test_published_parameter_counts(tmp_path, name, total, non_embedding, rel):
    c = parameter_counts(preset(tmp_path, name))
    assert c["total"] == pytest.approx(total, rel=rel)
    assert c["total"] - c["embedding"] == pytest.approx(non_embedding, rel=rel)


def test_qwen3_30b_a3b_by_hand(tmp_path):
    """h 2048, 32 heads of 128 (Q 2048 -> 4096), 4 KV heads, 48 layers, 128 experts of 768, top-8,
    vocab 151936, untied. Per layer: attention 2048·4096 + 2·2048·512 + 4096·2048 = 18,874,368,
    norms 2·2048 and Qwen3's per-head q and k norms 2·128, router 128·2048 = 262,144, experts 128·3·2048·768 = 603,979,776; embedding and
    head 2·151936·2048 = 622,329,856, final norm 2048.
    Total 48·623,120,640 + 622,331,904 = 30,532,122,624 (model card: 30.5B). Active: 8 of 128
    experts, 48·(19,140,864 + 37,748,736) + 622,331,904 = 3,353,032,704: the card's "3.3B" is
    two significant figures, and this count is 1.6 % above it."""
    sc = preset(tmp_path, "qwen3-30b-a3b")
    m = sc.model
    assert (m.hidden_size, m.num_attention_heads, m.head_dim, m.num_key_value_heads) == (2048, 32, 128, 4)
    assert m.moe.num_shared_experts == 0 and m.moe.shared_expert_ffn_hidden_size == 0
    attn = 2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048
    assert attn == 18_874_368
    dense = attn + 2 * 2048 + 2 * 128 + 128 * 2048
    expert = 3 * 2048 * 768
    outer = 2 * 151936 * 2048 + 2048
    c = parameter_counts(sc)
    assert c["total"] == 48 * (dense + 128 * expert) + outer == 30_532_122_624
    assert c["active"] == 48 * (dense + 8 * expert) + outer == 3_353_032_704
    assert c["active"] == pytest.approx(3.3e9, rel=0.02)


def test_math_7b_is_qwen2_5_7b_with_a_4096_context():
    """Qwen/Qwen2.5-Math-7B's config.json differs from Qwen2.5-7B's in max_position_embeddings
    (4096) and rope_theta, not in shapes."""
    p = model_presets()
    shape = {k: v for k, v in p["qwen2.5-7b"].items() if k not in ("source", "seq_length")}
    assert shape == {k: v for k, v in p["qwen2.5-math-7b"].items() if k not in ("source", "seq_length")}
    assert p["qwen2.5-math-7b"]["seq_length"] == 4096
