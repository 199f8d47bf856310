"""Mixture-of-experts: parameter counts, routing, expert-parallel groups, dispatch volumes and the
hot-expert straggler, each against a hand derivation or a published total."""
import itertools
import json

import pytest
import yaml
from conftest import FlopCost, node_topology

from simtrain.errors import ConfigError
from simtrain.plan.grid import RankGrid
from simtrain.simulate import simulate, static_memory
from simtrain.spec.loading import load_scenario
from simtrain.workload.build import build_workload
from simtrain.workload.flops import parameter_counts
from simtrain.workload.ir import Comm
from simtrain.workload.moe import routing_shares

h, f, s, V = 256, 512, 128, 1024


def moe_scenario(tmp_path, topo, moe=None, parallel=None, training=None, model=None, name="moe.yaml", nodes=1):
    """A small llama-style MoE: h 256, 8 heads, 2 layers, seq 128, vocab 1024, 4 experts of 512, top-2."""
    m = {"architecture": "llama", "num_layers": 2, "hidden_size": h, "num_attention_heads": 8, "num_key_value_heads": 8,
         "ffn_hidden_size": f, "vocab_size": V, "seq_length": s,
         "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": f, **(moe or {})}}
    m.update(model or {})
    doc = {"name": "moe", "model": m,
           "training": {"micro_batch_size": 1, "global_batch_size": 4, "precision": "bf16", **(training or {})},
           "parallel": {"tp": 1, "pp": 1, "dp": 4, "ep": 4, **(parallel or {})},
           "cluster": {"device": "h100-sxm5-80gb", "topology": str(topo), "nodes": nodes, "variability": "none"}}
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc))
    return p




def preset(tmp_path, name):
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump({"name": name, "model": {"preset": name},
                                 "training": {"micro_batch_size": 1, "global_batch_size": 8},
                                 "parallel": {"dp": 8}, "cluster": {"device": "h100-sxm5-80gb", "topology": "dgx-h100", "nodes": 1}}))
    return load_scenario(p)[0]


# -- parameters ------------------------------------------------------------------------------------

def test_small_moe_parameters_by_hand(tmp_path, fast_topology):
    sc, _ = load_scenario(moe_scenario(tmp_path, fast_topology))
    c = parameter_counts(sc)
    attn = 4 * h * h + 2 * h                      # q, k, v, o (MHA, no bias) + 2 RMSNorm weights
    experts = 4 * 3 * h * f                       # 4 SwiGLU experts (gate, up, down)
    router = 4 * h
    emb = 2 * V * h + h                           # untied embedding and head, final norm
    assert c["total"] == 2 * (attn + experts + router) + emb
    assert c["active"] == 2 * (attn + experts * 2 / 4 + router) + emb     # top-2 of 4


@pytest.mark.parametrize("name,total,active", [
    # Jiang et al., "Mixtral of Experts" (arXiv:2401.04088) §2.1: 46.7B total, 12.9B active
    ("mixtral-8x7b", 46.7e9, 12.9e9),
    # Mistral AI announcement of Mixtral 8x22B: 141B total, 39B active
    ("mixtral-8x22b", 141e9, 39e9),
    # Qwen blog "Qwen1.5-MoE": 14.3B total, 2.7B activated
    ("qwen1.5-moe-a2.7b", 14.3e9, 2.7e9),
])
def test_published_moe_parameter_totals(tmp_path, name, total, active):
    c = parameter_counts(preset(tmp_path, name))
    assert c["total"] == pytest.approx(total, rel=0.01)
    assert c["active"] == pytest.approx(active, rel=0.01)


def test_deepseek_v3_parameter_totals(tmp_path):
    """DeepSeek-V3 report (arXiv:2412.19437): 671B total, 37B activated, MTP module excluded.
    The total is checked to 1 %. "37B" is published to two significant figures; counting
    embedding and head as Mixtral's 12.9B does, MLA + 3 dense + 58 MoE layers give 37.55B
    (+1.5 %), so the activated count is checked to the published precision: 37B <= x < 38B."""
    c = parameter_counts(preset(tmp_path, "deepseek-v3"))
    assert c["total"] == pytest.approx(671e9, rel=0.01)
    assert 37e9 <= c["active"] < 38e9


def test_hf_configs_of_moe_models(tmp_path, fast_topology):
    cfgs = {
        "mixtral": {"model_type": "mixtral", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 8,
                    "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1024, "max_position_embeddings": 128,
                    "num_local_experts": 8, "num_experts_per_tok": 2},
        "qwen": {"model_type": "qwen2_moe", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 8,
                 "num_key_value_heads": 8, "intermediate_size": 1024, "vocab_size": 1024, "max_position_embeddings": 128,
                 "num_experts": 8, "num_experts_per_tok": 4, "moe_intermediate_size": 128, "shared_expert_intermediate_size": 512},
        "deepseek": {"model_type": "deepseek_v3", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
                     "num_key_value_heads": 8, "intermediate_size": 1024, "vocab_size": 1024, "max_position_embeddings": 128,
                     "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 4, "moe_intermediate_size": 128,
                     "first_k_dense_replace": 1, "q_lora_rank": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 32,
                     "qk_rope_head_dim": 16, "v_head_dim": 32},
    }
    got = {}
    for name, cfg in cfgs.items():
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        p = d / "s.yaml"
        p.write_text(yaml.safe_dump({"name": name, "model": {"hf_config": "config.json", "seq_length": 128},
                                     "training": {"micro_batch_size": 1, "global_batch_size": 4},
                                     "parallel": {"dp": 4}, "cluster": {"device": "h100-sxm5-80gb", "topology": str(fast_topology), "nodes": 1}}))
        got[name] = load_scenario(p)[0].model
    mx, qw, ds = got["mixtral"].moe, got["qwen"].moe, got["deepseek"]
    assert (mx.num_experts, mx.top_k, mx.expert_ffn_hidden_size, mx.num_shared_experts) == (8, 2, 512, 0)
    assert (qw.num_experts, qw.top_k, qw.expert_ffn_hidden_size, qw.shared_expert_ffn_hidden_size, qw.shared_expert_gate) == (8, 4, 128, 512, True)
    assert (ds.moe.num_experts, ds.moe.first_dense_layers, ds.moe.shared_expert_ffn_hidden_size, ds.ffn_hidden_size) == (16, 1, 128, 1024)
    assert (ds.mla.kv_lora_rank, ds.mla.q_lora_rank, ds.mla.v_head_dim) == (32, 64, 32)


# -- routing -----------------------------------------------------------------------------------------

def test_capacity_factor_drops_the_worked_example(tmp_path, fast_topology):
    """routing_shares docstring: E 4, k 1, shares [0.4, 0.3, 0.2, 0.1], capacity 1.0 -> cap 1/4,
    kept [0.25, 0.25, 0.2, 0.1], dropped 0.15 + 0.05 = 0.2."""
    sc, _ = load_scenario(moe_scenario(tmp_path, fast_topology, moe={"top_k": 1, "capacity_factor": 1.0,
                                                                     "routing": {"distribution": "explicit", "loads": [4, 3, 2, 1]}}))
    (kept, dropped), _ = routing_shares(sc)
    assert kept == pytest.approx((0.25, 0.25, 0.2, 0.1))
    assert dropped == pytest.approx(0.2)


def test_zipf_routing_is_seeded_capped_and_normalised(tmp_path, fast_topology):
    sc, _ = load_scenario(moe_scenario(tmp_path, fast_topology, moe={"num_experts": 8, "routing": {"distribution": "zipf", "skew": 2.0}}))
    table = routing_shares(sc)
    for kept, dropped in table:
        assert sum(kept) == pytest.approx(1.0) and dropped == 0.0
        assert max(kept) <= 0.5 + 1e-12          # top-2: no expert can take more than half the assignments
    assert table == routing_shares(sc)           # same seed, same draw
    assert table[0] != table[1]                  # a fresh permutation per layer


def test_explicit_loads_beyond_one_over_k_are_refused(tmp_path, fast_topology):
    with pytest.raises(ConfigError, match="model.moe.routing.loads: .* no expert can take more than 1/2"):
        load_scenario(moe_scenario(tmp_path, fast_topology, moe={"routing": {"distribution": "explicit", "loads": [1, 0, 0, 0]}}))


def test_plan_rules_for_ep(tmp_path, fast_topology):
    with pytest.raises(ConfigError) as e:
        load_scenario(moe_scenario(tmp_path, fast_topology, moe={"num_experts": 6}, parallel={"ep": 4, "tp": 2, "dp": 2}))
    msg = str(e.value)
    assert "parallel.ep: ep=4 does not divide num_experts=6" in msg
    assert "parallel.sequence_parallel: MoE layers with tp > 1 need sequence parallelism" in msg


# -- groups ------------------------------------------------------------------------------------------

def test_expert_grid_matches_brute_force():
    """Megatron-core's expert grid: the tp·cp·dp ranks of a stage as etp x ep x edp, etp fastest."""
    tp, cp, dp, pp, ep, etp = 2, 1, 4, 2, 2, 2
    g = RankGrid(tp, cp, dp, pp, ep, etp)
    W = tp * cp * dp
    edp = W // (ep * etp)
    expect = {}
    for stage, e, x, t in itertools.product(range(pp), range(edp), range(ep), range(etp)):
        r = stage * W + t + etp * (x + ep * e)
        expect[r] = (t, x, e)
    assert all((g.coords(r)["etp_rank"], g.coords(r)["ep_rank"], g.coords(r)["edp_rank"]) == expect[r] for r in range(g.world))
    assert g.groups("ep")[0] == (0, 2) and g.groups("etp")[0] == (0, 1) and g.groups("edp")[0] == (0, 4)
    assert len(g.groups("edp")[0]) == edp == 2


# -- volumes and the hot expert ----------------------------------------------------------------------

def dispatch(work):
    return [it for it in work[0].layers[0].forward if isinstance(it, Comm) and it.kind == "ep"]


def test_uniform_dispatch_volume_closed_form(tmp_path, fast_topology):
    """Uniform routing: a rank sends T·k·h 16-bit values and its experts receive the same:
    dispatch and combine all-to-alls of T·k·h·2 bytes each (nccl-tests size: a rank's buffer)."""
    sc, _ = load_scenario(moe_scenario(tmp_path, fast_topology))
    d = dispatch(build_workload(sc))
    assert [c.collective for c in d] == ["all_to_all", "all_to_all"]
    assert all(c.size_bytes == s * 2 * h * 2 for c in d)


def test_skewed_dispatch_is_as_long_as_the_busiest_receiver(tmp_path, fast_topology):
    """Shares [1/2, 1/2, 0, 0] with top-2 over ep 4 (one expert per rank): ranks 0 and 1 each
    receive ep·T·k/2 = 4T assignments, so the all-to-all moves 4·T·h·2 bytes at its busiest rank
    (twice the uniform T·k)."""
    sc, _ = load_scenario(moe_scenario(tmp_path, fast_topology, moe={"routing": {"distribution": "explicit", "loads": [1, 1, 0, 0]}}))
    assert all(c.size_bytes == 4 * s * h * 2 for c in dispatch(build_workload(sc)))


def test_hot_expert_makes_its_rank_the_critical_path(tmp_path, fast_topology):
    """top-1 over 2 experts on ep 2, communication free, GEMMs at 1 PFLOP/s, memory ops free.
    Uniform: each rank's expert gets ep·T·(1/2) = T rows; all tokens to expert 0: rank 0 gets 2T,
    rank 1 none. A SwiGLU expert on r rows costs 6·r·h·f forward + 12·r·h·f backward = 18·r·h·f
    FLOPs, so rank 0 computes 18·T·h·f more per MoE layer and microbatch, and everyone waits for
    it at the combine: the step grows by 18·T·h·f x 2 layers x 1 microbatch / 1e15 s."""
    common = dict(moe={"num_experts": 2, "top_k": 1}, parallel={"dp": 2, "ep": 2}, training={"global_batch_size": 2})
    topo = node_topology(tmp_path, 2, bandwidth="1000000000 GB/s", latency="0 us", nic="1000000000 GB/s")
    sc_u, t = load_scenario(moe_scenario(tmp_path, topo, **common, name="u.yaml"))
    hot = dict(common, moe={**common["moe"], "routing": {"distribution": "explicit", "loads": [1, 0]}})
    sc_h, _ = load_scenario(moe_scenario(tmp_path, topo, **hot, name="h.yaml"))
    u = simulate(sc_u, t, FlopCost()).result
    r = simulate(sc_h, t, FlopCost()).result
    T = s
    assert r.step_time_s - u.step_time_s == pytest.approx(18 * T * h * f * 2 * 1 / 1e15, rel=1e-9)
    assert r.moe.slowest_ep_rank == 0 and r.moe.imbalance_max == pytest.approx(2.0)
    assert u.simulated_classes == 1 and r.simulated_classes == 2     # the skew splits the ep ranks
    assert r.model_flops_per_step == u.model_flops_per_step            # model FLOPs use nominal routing


def test_expert_optimizer_state_shards_over_expert_dp(tmp_path, fast_topology):
    """ZeRO-1 with dp 4, ep 2 (edp 2): dense optimizer bytes /4, expert optimizer bytes /2."""
    sc, _ = load_scenario(moe_scenario(tmp_path, fast_topology, parallel={"ep": 2, "zero_stage": 1}))
    w = build_workload(sc)[0]
    st = static_memory(sc, w.params, w.expert_params)
    dense = w.params - w.expert_params
    assert w.expert_params == 2 * (4 / 2) * 3 * h * f             # 2 layers x 2 local experts x SwiGLU
    assert st["optimizer"] == pytest.approx(12 * dense / 4 + 12 * w.expert_params / 2)
    assert st["weights"] == pytest.approx(2 * w.params)


def test_expert_gradients_reduce_over_expert_dp(tmp_path, fast_topology):
    sc, t = load_scenario(moe_scenario(tmp_path, fast_topology, parallel={"ep": 2}))
    run = simulate(sc, t)
    w = build_workload(sc)[0]
    edp = [o for o in run.ops if o.stream == "edp" and o.cls == 0]
    assert sum(o.bytes for o in edp) == pytest.approx(4 * w.expert_params)     # fp32 gradients, once per step


def _ep_hidden_by_compute(run) -> float:
    """Seconds of expert-parallel communication that run while the same rank computes."""
    tl = run.timeline
    hidden = 0.0
    for c in run.classes:
        comp = sorted((tl.start[o.id], tl.end[o.id]) for o in run.ops if o.cls == c.id and o.stream == "compute")
        for o in run.ops:
            if o.cls != c.id or o.stream != "ep":
                continue
            a, b = tl.start[o.id], tl.end[o.id]
            hidden += sum(max(0.0, min(b, e) - max(a, s0)) for s0, e in comp)
    return hidden


def test_dualpipe_hides_dispatch_under_the_paired_chain(tmp_path, plain_topology):
    """In 1F1B a chain's compute waits for each of its own all-to-alls, so none of them runs
    under computation; DualPipe's overlapped forward/backward pairs run one chain's dispatch and
    combine while the other computes (DeepSeek-V3 §3.2.1), so part of it is hidden."""
    runs = {}
    for sched in ("1f1b", "dualpipe"):
        sc, t = load_scenario(moe_scenario(tmp_path, plain_topology, parallel={"pp": 2, "dp": 2, "ep": 2, "schedule": sched},
                                           training={"global_batch_size": 8}, name=f"{sched}.yaml"))
        runs[sched] = simulate(sc, t)
    assert _ep_hidden_by_compute(runs["1f1b"]) == 0.0
    assert _ep_hidden_by_compute(runs["dualpipe"]) > 0.0


def test_layer_frequency_and_dense_first_layers(tmp_path, fast_topology):
    """4 layers, first 1 dense, then MoE every 2nd: layers 1 and 3 are MoE (Megatron's
    moe_layer_freq / DeepSeek's first_k_dense_replace)."""
    sc, _ = load_scenario(moe_scenario(tmp_path, fast_topology, moe={"layer_freq": 2, "first_dense_layers": 1},
                                       model={"num_layers": 4}, parallel={"pp": 1}))
    from simtrain.workload.moe import layer_kinds
    assert layer_kinds(sc) == ("dense", "moe", "dense", "moe")
    c = parameter_counts(sc)
    attn, dense_mlp, moe_mlp = 4 * h * h + 2 * h, 3 * h * f, 4 * 3 * h * f + 4 * h
    assert c["total"] == 4 * attn + 2 * dense_mlp + 2 * moe_mlp + 2 * V * h + h


def test_expert_tensor_parallel_splits_the_expert_width(tmp_path, fast_topology):
    """etp 2 (ep 2, dp 4): each expert's FFN is split in two; the etp pair gathers its members'
    tokens (2 x the T·k received per rank) before the experts and reduce-scatters after, so a
    rank's grouped GEMMs have twice the rows and half the width: the same FLOPs, half the
    expert weights."""
    sc1, _ = load_scenario(moe_scenario(tmp_path, fast_topology, parallel={"ep": 2}, name="a.yaml"))
    sc2, _ = load_scenario(moe_scenario(tmp_path, fast_topology, parallel={"ep": 2, "etp": 2}, name="b.yaml"))
    w1, w2 = build_workload(sc1)[0], build_workload(sc2)[0]
    assert w2.expert_params == pytest.approx(w1.expert_params / 2)

    def expert_flops(w):
        return sum(o.flops for it in w.layers[0].forward if isinstance(it, tuple) for o in it if o.name.startswith("experts."))
    assert expert_flops(w2) == pytest.approx(expert_flops(w1))
    etp = [it for it in w2.layers[0].forward if isinstance(it, Comm) and it.kind == "etp"]
    assert [(c.collective, c.size_bytes) for c in etp] == [("all_gather", 2 * s * 2 * h * 2), ("reduce_scatter", 2 * s * 2 * h * 2)]
