"""torchtitan's op-level selective activation checkpointing (`training.recompute: op`) and
Megatron-core's pipeline split that counts the embedding and the loss as layers.

The op policy (torchtitan/parallelisms/parallelize_llama.py at 9dec370, `_save_list` and
`_custom_policy`) keeps the outputs of matmuls, of the attention kernel and of reduce-scatters,
except every second matmul of a layer; the recompute re-runs the layer's forward until the down
projection's input is back. torchtitan's Llama layer runs wq, wk, wv, wo, w1, w3, w2, so wk, wo
and w3 are re-run with every non-matmul kernel before the down projection. Expected values are
counted by hand from that rule on a small Llama layer (h 256, 8 heads of 32, 2 KV heads, FFN
512, sequence 128, micro batch 1: T = 128 tokens)."""
from __future__ import annotations

import pytest
import yaml
from conftest import node_topology

from simtrain.errors import ConfigError
from simtrain.plan.layers import accounted_split, stage_layer_counts
from simtrain.spec.loading import load_scenario
from simtrain.workload.build import build_workload
from simtrain.workload.ir import Comm
from simtrain.workload.transformer import LayerBuilder

H, HEADS, KV, D, F, S = 256, 8, 2, 32, 512, 128


def scenario(tmp_path, tp=1, sp=False, model=None, **training):
    m = {"architecture": "llama", "num_layers": 2, "hidden_size": H, "num_attention_heads": HEADS,
         "num_key_value_heads": KV, "ffn_hidden_size": F, "vocab_size": 1024, "seq_length": S}
    m.update(model or {})
    tr = {"micro_batch_size": 1, "global_batch_size": 1, "precision": "bf16", "recompute": "op"}
    tr.update(training)
    doc = {"name": "op", "model": m, "training": tr,
           "parallel": {"tp": tp, "pp": 1, "dp": 1, "sequence_parallel": sp},
           "cluster": {"device": "h100-sxm5-80gb", "topology": str(node_topology(tmp_path, tp)), "nodes": 1}}
    p = tmp_path / f"op-{len(list(tmp_path.glob('op-*.yaml')))}.yaml"
    p.write_text(yaml.safe_dump(doc))
    return load_scenario(p)[0]


def ops(items):
    return [o for it in items if isinstance(it, tuple) for o in it]


def test_the_recompute_reruns_wk_wo_w3_and_the_kernels_before_the_down_projection(tmp_path):
    """tp 1: the recomputed GEMMs are wk (T x g·d x h = 128 x 64 x 256), wo (128 x 256 x 256) and
    w3 (128 x 512 x 256); no attention kernel and no down projection (fc2); the norms, the
    rotary, the first residual and the SwiGLU kernels are there, the second residual is not."""
    lp = LayerBuilder(scenario(tmp_path)).layer()
    rec = ops(lp.recompute)
    gemms = [(o.name, o.shape) for o in rec if o.kind == "gemm"]
    assert gemms == [("qkv.recompute", (128, 64, 256)), ("attn_out.recompute", (128, 256, 256)),
                     ("fc1_gate_up.recompute", (128, 512, 256))]
    assert sum(o.flops for o in rec if o.kind == "gemm") == 2 * 128 * 256 * (64 + 256 + 512)
    assert not any(o.kind == "attention" for o in rec)
    bases = {o.name.split("/")[0].removesuffix(".recompute") for o in rec if o.kind == "memory"}
    assert {"rmsnorm1", "rmsnorm2", "rotary", "residual_add1", "swiglu"} <= bases
    assert not any(b.startswith("residual_add2") for b in bases)
    assert all(o.phase == "B" and o.model_flops == 0 for o in rec)


def test_with_sequence_parallelism_the_all_gathers_are_rerun_and_the_reduce_scatters_kept(tmp_path):
    """tp 2 with SP: the all-gathers into QKV and into the MLP are not kept (recomputed), the
    reduce-scatter out of attention is (torch's reduce_scatter_tensor is in the save list); the
    GEMMs are the tp rank's columns: wk 128 x 32 x 256, w3 128 x 256 x 256."""
    lp = LayerBuilder(scenario(tmp_path, tp=2, sp=True)).layer()
    comms = [(c.collective, c.name) for c in lp.recompute if isinstance(c, Comm)]
    assert comms == [("all_gather", "tp_all_gather0"), ("all_gather", "tp_all_gather2")]
    gemms = [o.shape for o in ops(lp.recompute) if o.kind == "gemm"]
    assert gemms == [(128, 32, 256), (128, 256, 128), (128, 256, 256)]


def test_kept_activations_by_hand(tmp_path):
    """Kept per token, 16-bit: the layer input h, wq a·d = 256, wv g·d = 64, the attention output
    256, w1 f = 512, the down projection's output h; fp32 log-sum-exp 4 bytes per head:
    2·(256 + 256 + 64 + 256 + 512 + 256) + 4·8 = 3232 bytes, x 128 tokens = 413,696 bytes."""
    work = build_workload(scenario(tmp_path))
    assert work[0].act_layers == (413_696.0, 413_696.0)
    # the backward rebuilds one layer at a time: the working set is what the layer did not keep
    whole = LayerBuilder(scenario(tmp_path, recompute="none")).act_per_layer("none")
    assert work[0].act_working_bytes == pytest.approx(whole - 413_696.0)
    assert whole > 413_696.0


def test_op_sits_between_selective_and_full_in_compute(tmp_path):
    """Recomputed FLOPs: full re-runs every forward GEMM, op three of them, none nothing."""
    def rec_flops(mode):
        return sum(o.flops for o in ops(LayerBuilder(scenario(tmp_path, recompute=mode)).layer().recompute))
    assert rec_flops("none") == 0 < rec_flops("op") < rec_flops("full")


@pytest.mark.parametrize("extra,needle", [
    ({"model": {"moe": {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 128}}}, "MoE"),
    ({"flash_attention": False}, "flash_attention: true"),
    ({"model": {"architecture": "gpt"}}, "GPT layer"),
])
def test_op_is_refused_where_it_is_not_modelled(tmp_path, extra, needle):
    with pytest.raises(ConfigError, match="training.recompute") as e:
        scenario(tmp_path, **extra)
    assert needle in str(e.value)


def test_op_with_userbuffers_is_refused(tmp_path):
    doc = {"name": "op", "model": {"preset": "llama3-8b", "seq_length": 1024},
           "training": {"micro_batch_size": 1, "global_batch_size": 1, "recompute": "op"},
           "parallel": {"tp": 8, "pp": 1, "dp": 1, "sequence_parallel": True, "tp_comm_overlap": "userbuffers"},
           "cluster": {"device": "h100-sxm5-80gb", "topology": "dgx-h100", "nodes": 1}}
    p = tmp_path / "ub.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="tp_comm_overlap userbuffers"):
        load_scenario(p)


# -- the embedding and the loss counted in the pipeline split ------------------------------------

def test_accounted_split_by_hand():
    """Megatron-core (transformer_block.py, layers to build per virtual stage): (L + 1 + 1) / stages
    per stage, one fewer on the first and on the last. Llama 3.1 405B on pp 8 x vpp 8: 128 / 64 = 2."""
    c = accounted_split(126, 64, 1, 1)
    assert c[0] == c[-1] == 1 and set(c[1:-1]) == {2} and sum(c) == 126
    assert accounted_split(31, 4, 0, 1) == (8, 8, 8, 7)
    assert accounted_split(7, 2, 1, 0) == (3, 4)


def _pp_doc(tmp_path, layers, pp, vpp, **par):
    doc = {"name": "acc", "model": {"architecture": "llama", "num_layers": layers, "hidden_size": H,
                                    "num_attention_heads": HEADS, "ffn_hidden_size": F, "vocab_size": 1024,
                                    "seq_length": S},
           "training": {"micro_batch_size": 1, "global_batch_size": 2 * pp},
           "parallel": {"tp": 1, "pp": pp, "dp": 1, "schedule": "interleaved_1f1b" if vpp > 1 else "1f1b", **par},
           "cluster": {"device": "h100-sxm5-80gb", "topology": str(node_topology(tmp_path, pp)), "nodes": 1}}
    if vpp > 1:
        doc["parallel"]["vpp"] = vpp
    p = tmp_path / f"acc-{len(list(tmp_path.glob('acc-*.yaml')))}.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_the_split_flags_shape_the_stages(tmp_path):
    """14 layers on pp 4 x vpp 2 = 8 stages do not split evenly; with both flags 16 / 8 = 2 per stage:
    1, 2, 2, 2, 2, 2, 2, 1."""
    with pytest.raises(ConfigError, match="14 layers does not divide|num_layers=14"):
        load_scenario(_pp_doc(tmp_path, 14, 4, 2))
    sc = load_scenario(_pp_doc(tmp_path, 14, 4, 2, account_for_embedding_in_pipeline_split=True,
                               account_for_loss_in_pipeline_split=True))[0]
    assert stage_layer_counts(sc, 8) == (1, 2, 2, 2, 2, 2, 2, 1)
    work = build_workload(sc, 8)
    assert [w.num_layers for w in work] == [1, 2, 2, 2, 2, 2, 2, 1]
    assert work[0].pre is not None and work[-1].post is not None


@pytest.mark.parametrize("layers,par,needle", [
    (15, {"account_for_loss_in_pipeline_split": True}, "make 16"),       # 15 + 1 = 16: fine, see below
    (14, {"account_for_loss_in_pipeline_split": True}, "make 15"),
    (6, {"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}, "no transformer layer"),
    (16, {"account_for_loss_in_pipeline_split": True, "first_stage_layers": 4}, "together with parallel.first_stage_layers"),
])
def test_the_split_flags_are_checked(tmp_path, layers, par, needle):
    p = _pp_doc(tmp_path, layers, 4, 2, **par)
    if needle == "make 16":
        assert stage_layer_counts(load_scenario(p)[0], 8) == (2, 2, 2, 2, 2, 2, 2, 1)
        return
    with pytest.raises(ConfigError, match="parallel.account_for") as e:
        load_scenario(p)
    assert needle in str(e.value)


def test_one_flag_short_of_an_even_split_suggests_the_other(tmp_path):
    """14 layers on 8 stages: the embedding alone makes 15 (no split), both make 16 = 2 x 8, so the
    fix names the loss flag; a flag that is not true or false is the only problem reported."""
    with pytest.raises(ConfigError) as e:
        load_scenario(_pp_doc(tmp_path, 14, 4, 2, account_for_embedding_in_pipeline_split=True))
    msg = str(e.value)
    assert "plus 1 for the embedding make 15" in msg and "account_for_loss_in_pipeline_split: true as well (16 = 2 x 8)" in msg
    with pytest.raises(ConfigError) as e:
        load_scenario(_pp_doc(tmp_path, 14, 4, 2, account_for_embedding_in_pipeline_split=True,
                              account_for_loss_in_pipeline_split="yes"))
    assert len(e.value.problems) == 1 and "expected true or false" in str(e.value)


def test_split_flags_without_a_pipeline_warn(tmp_path):
    """At pp 1 there is no pipeline split for the flags to change: the run goes on, with a warning."""
    doc = {"name": "split", "model": {"preset": "llama3-8b", "seq_length": 1024},
           "training": {"micro_batch_size": 1, "global_batch_size": 8},
           "parallel": {"tp": 1, "pp": 1, "dp": 8, "account_for_embedding_in_pipeline_split": True},
           "cluster": {"device": "h100-sxm5-80gb", "topology": "dgx-h100", "nodes": 1}}
    p = tmp_path / "split.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.warns(UserWarning, match="account_for_embedding_in_pipeline_split has no effect with pp 1"):
        load_scenario(p)
