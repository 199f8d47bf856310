"""Stragglers, jitter and mixed device types: exact against every rank simulated, the
counterfactual and the critical path, and hand-derived slowdowns."""
import pytest
import yaml
from conftest import FlopCost, small_scenario

from simtrain.errors import ConfigError
from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario


def scen(tmp_path, topo, cluster_extra, par=None, name="s.yaml", nodes=4, gbs=16):
    p = small_scenario(tmp_path, topo, parallel=par or {"tp": 2, "pp": 2, "dp": 4}, nodes=nodes,
                       training={"global_batch_size": gbs})
    doc = yaml.safe_load(p.read_text())
    doc["cluster"].update(cluster_extra)
    q = tmp_path / name
    q.write_text(yaml.safe_dump(doc))
    return load_scenario(q)


@pytest.mark.parametrize("extra", [
    {"stragglers": [{"devices": [5], "compute": 1.5}]},
    {"stragglers": [{"fraction": 0.2, "compute": 1.3, "link": 2.0}]},
    {"jitter": {"distribution": "lognormal", "sigma": 0.05}},
    {"mixed": [{"nodes": 2, "device": "h100-sxm5-80gb"}]},
])
def test_heterogeneous_grouping_matches_every_rank_simulated(tmp_path, plain_topology, extra):
    sc, topo = scen(tmp_path, plain_topology, extra)
    a = simulate(sc, topo).result
    b = simulate(sc, topo, every_rank=True).result
    assert b.simulated_classes == sc.world_size
    assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-12)
    assert a.bubble_fraction == pytest.approx(b.bubble_fraction, rel=1e-9)
    assert a.peak_memory_bytes == pytest.approx(b.peak_memory_bytes, rel=1e-12)


def test_a_compute_straggler_without_pipeline_stretches_the_step_by_its_factor(tmp_path, fast_topology):
    """pp 1, free communication, FLOP-only costs: every rank runs the same microbatches and meets
    the others at free collectives, so the step is the slowest rank's compute: x1.5 exactly,
    and the counterfactual is the clean step."""
    common = dict(par={"tp": 2, "pp": 1, "dp": 2}, nodes=1, gbs=4)
    sc0, t0 = scen(tmp_path, fast_topology, {}, name="a.yaml", **common)
    sc1, t1 = scen(tmp_path, fast_topology, {"stragglers": [{"devices": [3], "compute": 1.5}]}, name="b.yaml", **common)
    clean = simulate(sc0, t0, FlopCost()).result.step_time_s
    r = simulate(sc1, t1, FlopCost()).result
    # the free fabric still moves 1e18 B/s: its ~1e-12 s per collective is not scaled
    assert r.step_time_s == pytest.approx(1.5 * clean, abs=1e-10)
    st = r.stragglers
    assert st.count == 1 and st.devices == [t1.device_id(3)]
    assert st.slowdown == pytest.approx(1.5, rel=1e-5)
    # the straggler holds the critical path: it computes while everyone else waits
    assert st.critical_path[0].straggler and st.critical_path[0].straggler_ranks == [3]


def test_counterfactual_uses_the_calibrated_costs(tmp_path, plain_topology):
    sc, topo = scen(tmp_path, plain_topology, {"stragglers": [{"fraction": 0.1, "compute": 1.2}]})
    clean, _ = scen(tmp_path, plain_topology, {}, name="c.yaml")
    r = simulate(sc, topo).result
    assert r.stragglers.step_time_without_s == simulate(clean, topo).result.step_time_s
    assert r.step_time_s > r.stragglers.step_time_without_s


def test_straggler_draws_are_seeded(tmp_path, plain_topology):
    extra = {"stragglers": [{"fraction": 0.25, "compute": 1.2}]}
    a = simulate(*scen(tmp_path, plain_topology, extra, name="a.yaml")).result.stragglers.devices
    b = simulate(*scen(tmp_path, plain_topology, extra, name="b.yaml")).result.stragglers.devices
    assert a == b and len(a) == 4              # 25 % of 16 devices, the same ones for the same seed


def test_mixed_devices_use_their_own_costs_and_capacity(tmp_path, plain_topology):
    """The first two nodes H100, the rest A100: stage 0 (nodes 0-1 in Megatron order) computes on
    the faster device; memory entries name each stage's device and capacity."""
    sc, topo = scen(tmp_path, plain_topology, {"mixed": [{"nodes": 2, "device": "h100-sxm5-80gb"}]})
    r = simulate(sc, topo).result
    by = {m.stage: m for m in r.memory}
    assert by[0].device == "h100-sxm5-80gb" and by[1].device == "a100-sxm4-80gb"
    comp = {s.stage: s.compute_s for s in r.stages}
    assert comp[0] < comp[1]


def test_straggler_input_errors(tmp_path, plain_topology):
    with pytest.raises(ConfigError) as e:
        scen(tmp_path, plain_topology, {"stragglers": [{"devices": [99], "compute": 1.2}, {"fraction": 2.0}, {"compute": 0}]})
    msg = str(e.value)
    assert "cluster.stragglers[0].devices: device 99 does not exist" in msg
    assert "cluster.stragglers[1].fraction: must be in (0, 1]" in msg
    assert "cluster.stragglers[2]: give exactly one of `devices`" in msg


@pytest.mark.parametrize("par", [{"tp": 2, "pp": 2, "dp": 4}, {"tp": 4, "pp": 2, "dp": 2, "sequence_parallel": True}])
def test_lockstep_model_against_exact(tmp_path, plain_topology, par):
    """lockstep gives a tp group its slowest member's factors (stragglers module docstring): the
    step may only grow, by at most one compute segment per pipeline hand-over it delays; here
    (short norm segments) it stays within 0.5 % of the exact model, with far fewer classes."""
    extra = {"stragglers": [{"devices": [1, 9], "compute": 1.4}]}
    sc_l, t = scen(tmp_path, plain_topology, extra, par=par, name="l.yaml")
    sc_e, _ = scen(tmp_path, plain_topology, {**extra, "straggler_model": "exact"}, par=par, name="e.yaml")
    lock, exact = simulate(sc_l, t).result, simulate(sc_e, t).result
    assert exact.step_time_s * (1 - 1e-12) <= lock.step_time_s <= exact.step_time_s * 1.005
    assert lock.simulated_classes < exact.simulated_classes


def test_mixed_devices_warn_where_a_stage_mixes_types(tmp_path, plain_topology):
    """3 H100 nodes then A100: with pp 2 over 4 nodes (2 nodes a stage), stage 1 holds one node of
    each type and is flagged; stage 0 is all H100."""
    sc, topo = scen(tmp_path, plain_topology, {"mixed": [{"nodes": 3, "device": "h100-sxm5-80gb"}]})
    h = simulate(sc, topo).result.heterogeneity
    assert h.stages[0].devices == {"h100-sxm5-80gb": 8}
    assert h.stages[1].devices == {"a100-sxm4-80gb": 4, "h100-sxm5-80gb": 4}
    assert len(h.warnings) == 1 and h.warnings[0].startswith("stage 1 mixes")


def test_balanced_layers_follow_device_speed(tmp_path, plain_topology):
    """layers_per_stage: balanced with the first 2 nodes H100 and the last 2 A100: 8 layers over
    pp 2 in proportion to each device's time for one layer under its own calibrated costs
    (stage_speeds), largest remainder: the H100 stage gets more; the same devices everywhere
    give 4 + 4; and the split follows the ratio of the two layer times by hand."""
    from simtrain.plan.layers import balanced_layers, stage_speeds
    extra = {"mixed": [{"nodes": 2, "device": "h100-sxm5-80gb"}]}
    sc, topo = scen(tmp_path, plain_topology, extra, par={"tp": 2, "pp": 2, "dp": 4, "layers_per_stage": "balanced"})
    v = stage_speeds(sc, 2)
    share = 8 * v[0] / (v[0] + v[1])
    counts = balanced_layers(sc, 2)
    assert counts[0] > counts[1] and sum(counts) == 8 and abs(counts[0] - share) < 1
    same, _ = scen(tmp_path, plain_topology, {"mixed": [{"nodes": 4, "device": "h100-sxm5-80gb"}]},
                   par={"tp": 2, "pp": 2, "dp": 4, "layers_per_stage": "balanced"}, name="same.yaml")
    assert balanced_layers(same, 2) == (4, 4)
    assert simulate(sc, topo).result.step_time_s > 0


def test_a_slow_device_does_not_slow_the_host():
    """ScaledCosts scales the device time of each operator, not the profile's host issue cost c:
    one operator takes factor x device time + c, and a host-bound run of short operators is
    still n·c + the last one's (slowed) device time."""
    from simtrain.cost.roofline import CalibratedRoofline
    from simtrain.cost.scaled import ScaledCosts
    from simtrain.hardware.devices import find_profile, load_profile
    from simtrain.workload.ir import Op
    dev = load_profile(str(find_profile("a100-megatron-deepspeed", None)))
    base = CalibratedRoofline(dev, "fp16")
    slow = ScaledCosts(base, 2.0, 3.0)
    add = Op("add", "memory", "F", 0.0, 3 * 2 * 4096.0, ())
    c = dev.op_overhead
    assert slow.duration(add) == pytest.approx(3.0 * base.device_time(add) + c)
    assert slow.sequence_time([add] * 4) == pytest.approx(4 * c + 3.0 * base.device_time(add))
