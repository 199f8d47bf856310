"""Partial recompute (training.recompute_method / recompute_num_layers, as Megatron-LM's
--recompute-method and --recompute-num-layers define them) on the small GPT of conftest: h 256,
8 heads, seq 128, micro batch 1, no tp, flash attention. Expected bytes by hand from Korthikanti
et al. 2022 (arXiv:2205.05198) §4.1: a layer keeps s·b·h·34 bytes plus, with flash attention, the
fp32 log-sum-exp 4·a·s·b; a fully recomputed layer keeps its input, 2·s·b·h."""
import pytest
import yaml
from conftest import small_scenario

from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario
from simtrain.workload.build import build_workload
from simtrain.workload.flops import hardware_flops_per_step, model_flops_per_step

S, H, A = 128, 256, 8
WHOLE = S * (34 * H + 4 * A)      # 1,118,208 B: a layer with nothing recomputed
INPUT = 2 * S * H                 # 65,536 B: the checkpointed input of a layer (or of a group)


def _work(tmp_path, topo, **training):
    path = small_scenario(tmp_path, topo, parallel={"pp": 2, "dp": 2}, training=training)
    sc, _ = load_scenario(path)
    return sc, build_workload(sc)


def test_whole_layer_matches_the_paper(tmp_path, plain_topology):
    """No recompute: 4 layers per stage (8 over pp 2), each s·b·(34h + 4a) = 1,118,208 B."""
    _, work = _work(tmp_path, plain_topology)
    assert WHOLE == 1_118_208
    assert work[0].act_layers == (WHOLE,) * 4 and work[0].act_working_bytes == 0.0


def test_uniform_groups_keep_one_input_per_group(tmp_path, plain_topology):
    """uniform, 2 layers per group, 4 layers: inputs kept by layers 0 and 2 (2 x 65,536 B), every
    layer recomputed, and a backward rematerialises a whole group: 2 x 1,118,208 B at once."""
    _, work = _work(tmp_path, plain_topology, recompute="full", recompute_num_layers=2)
    w = work[0]
    assert w.act_layers == (INPUT, 0.0, INPUT, 0.0)
    assert w.act_working_bytes == 2 * WHOLE
    assert all(lp.recompute for lp in w.layers)


def test_uniform_one_layer_is_plain_full_recompute(tmp_path, plain_topology):
    """The default (uniform, 1) is recompute: full as before: 2sbh per layer, one layer alive."""
    _, work = _work(tmp_path, plain_topology, recompute="full")
    assert work[0].act_layers == (INPUT,) * 4 and work[0].act_working_bytes == WHOLE


def test_block_recomputes_the_first_layers_of_each_stage(tmp_path, plain_topology):
    """block, 1 layer: per stage the first layer keeps its input and is recomputed, the other
    3 keep everything: 65,536 + 3 x 1,118,208 B; working set one layer."""
    sc, work = _work(tmp_path, plain_topology, recompute="full", recompute_method="block", recompute_num_layers=1)
    for w in work:
        assert w.act_layers == (INPUT, WHOLE, WHOLE, WHOLE)
        assert w.act_working_bytes == WHOLE
        assert [bool(lp.recompute) for lp in w.layers] == [True, False, False, False]


def test_block_recompute_costs_the_forward_of_its_layers_only(tmp_path, plain_topology):
    """Hardware FLOPs = model FLOPs + the recomputed layers' forward: with 2 of 8 layers
    recomputed (block 1 on each of 2 stages) the extra is a quarter of full recompute's."""
    def extra(**tr):
        sc, work = _work(tmp_path, plain_topology, **tr)
        return hardware_flops_per_step(sc, work) - model_flops_per_step(sc, work)
    full = extra(recompute="full")
    assert full > 0
    assert extra(recompute="full", recompute_method="block", recompute_num_layers=1) == pytest.approx(full / 4)
    assert extra(recompute="full", recompute_num_layers=4) == pytest.approx(full)


def test_block_recompute_step_time_lies_between_none_and_full(tmp_path, plain_topology):
    def step(**tr):
        path = small_scenario(tmp_path, plain_topology, parallel={"pp": 2, "dp": 2}, training=tr)
        return simulate(*load_scenario(path)).result.step_time_s
    none, block, full = step(), step(recompute="full", recompute_method="block", recompute_num_layers=2), step(recompute="full")
    assert none < block < full


@pytest.mark.parametrize("key,value", [("recompute_method", "block"), ("recompute_num_layers", 2)])
def test_partial_recompute_needs_full(tmp_path, plain_topology, key, value):
    """Outside recompute: full the layer choice is unused (Megatron-LM ignores it): a warning, and
    the run is the selective one."""
    path = small_scenario(tmp_path, plain_topology, training={"recompute": "selective", key: value})
    with pytest.warns(UserWarning, match=f"training.{key} applies only with training.recompute: full"):
        sc, topo = load_scenario(path)
    plain = small_scenario(tmp_path, plain_topology, training={"recompute": "selective"})
    assert simulate(sc, topo).result.step_time_s == simulate(*load_scenario(plain)).result.step_time_s


def test_partial_recompute_round_trips(tmp_path, plain_topology):
    """The resolved scenario names the method and the layer count with recompute: full only."""

    sc, _ = _work(tmp_path, plain_topology, recompute="full", recompute_method="block", recompute_num_layers=3)
    d = sc.resolved()
    assert (d["training"]["recompute_method"], d["training"]["recompute_num_layers"]) == ("block", 3)
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(d, sort_keys=False))
    assert load_scenario(again)[0].resolved() == d
    plain, _ = _work(tmp_path, plain_topology)
    assert "recompute_method" not in plain.resolved()["training"]
