"""Vision encoder in front of the language model: parameters, the first-stage imbalance and the
encoder on its own pipeline stage, against hand-derived FLOPs."""
import pytest
import yaml
from conftest import FlopCost

from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario
from simtrain.workload.flops import parameter_counts

H, L, S, V = 256, 4, 128, 1024             # language model
he, Le, Te, fe = 128, 2, 64, 512           # encoder: 2 ViT blocks of width 128 (MLP 4x) on 64 patches




def vlm(tmp_path, topo, stages=0, pp=2, dp=2, name="vlm.yaml"):
    doc = {"name": "vlm",
           "model": {"architecture": "llama", "num_layers": L, "hidden_size": H, "num_attention_heads": 8,
                     "num_key_value_heads": 8, "ffn_hidden_size": 512, "vocab_size": V, "seq_length": S,
                     "encoder": {"num_layers": Le, "hidden_size": he, "num_attention_heads": 4, "ffn_hidden_size": fe,
                                 "tokens_per_sample": Te, "projector": "mlp", "pipeline_stages": stages}},
           "training": {"micro_batch_size": 1, "global_batch_size": 8, "precision": "bf16"},
           "parallel": {"tp": 1, "pp": pp, "dp": dp},
           "cluster": {"device": "h100-sxm5-80gb", "topology": str(topo), "nodes": 1, "variability": "none"}}
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc))
    return load_scenario(p)


def encoder_flops():
    """One microbatch through the encoder and projector, forward + backward, as executed:
    GEMMs 3 x 2·T·(4h² + 2hf) per block (QKV, out, fc1, fc2; dgrad and wgrad double the forward),
    bidirectional flash attention 2·T²·heads·2d = 4·T²·h forward, 2.5x that backward,
    projector 3 x (2·T·H·h + 2·T·H·H)."""
    gemm = 3 * 2 * Te * (4 * he * he + 2 * he * fe)
    attn = 3.5 * 4 * Te * Te * he
    proj = 3 * (2 * Te * H * he + 2 * Te * H * H)
    return Le * (gemm + attn) + proj


def test_encoder_parameters_by_hand(tmp_path, fast_topology):
    sc, _ = vlm(tmp_path, fast_topology)
    c = parameter_counts(sc)
    block = 12 * he * he + 13 * he                    # a GPT-style block with biases (MLP 4h)
    proj = he * H + H + H * H + H
    assert c["encoder"] == Le * block + proj


def test_encoder_on_the_first_stage_makes_it_the_slow_one(tmp_path, fast_topology):
    """pp 2, 2 LM layers per stage: stage 0 adds the encoder, stage 1 the LM head GEMMs
    (3 x 2·S·V·H per microbatch); with 4 microbatches per rank the difference is exact."""
    sc, t = vlm(tmp_path, fast_topology)
    r = simulate(sc, t, FlopCost()).result
    st = {x.stage: x.compute_s for x in r.stages}
    m = sc.num_microbatches
    head = 3 * 2 * S * V * H
    assert st[0] - st[1] == pytest.approx(m * (encoder_flops() - head) / FlopCost.P, rel=1e-9)


def test_encoder_on_its_own_stage(tmp_path, fast_topology):
    """pipeline_stages 1: stage 0 holds only the encoder and projector; it sends the projected
    visual tokens (T·H 16-bit values) to the first language-model stage."""
    sc, t = vlm(tmp_path, fast_topology, stages=1)
    run = simulate(sc, t, FlopCost())
    st = {x.stage: x for x in run.result.stages}
    assert st[0].layers == Le + 1 and st[1].layers == L
    assert st[0].compute_s == pytest.approx(sc.num_microbatches * encoder_flops() / FlopCost.P, rel=1e-9)
    sends = {o.bytes for o in run.ops if o.category == "pp" and o.label.startswith("send_act")}
    assert sends == {2 * Te * H}
    mem0 = run.result.memory[0]
    assert mem0.weights == pytest.approx(2 * parameter_counts(sc)["encoder"])
