"""Pipeline closed forms with uniform costs and free communication.

With per-stage forward time f and backward time b per microbatch, GPipe and 1F1B both take
(m + p - 1)(f + b): the last microbatch's forward reaches the last stage after (p-1) f, and the
backward wave needs (p-1) b to drain, around m(f + b) of work per stage. Each stage idles
(p - 1)(f + b), so the bubble is (p-1)/(m+p-1) of the step (Narayanan et al. SC'21 §2.2).
"""
import json

import pytest
from conftest import small_scenario

from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario
from simtrain.workload.build import build_workload

EDGE = {"embedding", "embedding.bwd", "final_norm", "final_norm.bwd", "lm_head", "lm_head.dgrad",
        "lm_head.wgrad", "cross_entropy", "cross_entropy.bwd"}


class UniformCosts:
    """Every layer operator of a forward costs uf / n_f, of a backward ub / n_b; edges and optimizer are free."""

    def __init__(self, sc, uf=1e-3, ub=2e-3):
        lay = build_workload(sc)[0].layer
        self.nf = sum(len(x) for x in lay.forward if isinstance(x, tuple))
        self.nb = sum(len(x) for x in lay.backward if isinstance(x, tuple))
        self.uf, self.ub = uf, ub
        self.coverage = set()

    def duration(self, op):
        if op.name.split("/")[0] in EDGE:   # unfused edge ops run as "name/kernel"
            return 0.0
        return self.uf / self.nf if op.phase == "F" else self.ub / self.nb

    def memory_time(self, nbytes):
        return 0.0


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("m", [4, 8, 13])
def test_step_and_bubble_closed_form(tmp_path, fast_topology, schedule, m):
    path = small_scenario(tmp_path, fast_topology, parallel={"schedule": schedule},
                          training={"global_batch_size": m})
    sc, topo = load_scenario(path)
    p, layers = 4, 2                       # 8 layers over 4 stages
    f, b = layers * 1e-3, layers * 2e-3
    r = simulate(sc, topo, costs=UniformCosts(sc)).result
    assert r.step_time_s == pytest.approx((m + p - 1) * (f + b), rel=1e-6)
    assert r.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), rel=1e-6)
    for st in r.stages:
        assert st.bubble_s == pytest.approx((p - 1) * (f + b), rel=1e-6)
        assert st.compute_s + st.bubble_s + sum(st.exposed_comm_s.values()) == pytest.approx(r.step_time_s, rel=1e-9)


def test_inflight_activations_follow_the_schedule(tmp_path, fast_topology):
    """1F1B's first stage holds p microbatches at its peak, GPipe's holds all m (Narayanan et al. 2021)."""
    m, p = 8, 4
    for schedule, expect in (("1f1b", [4, 3, 2, 1]), ("gpipe", [m] * p)):
        path = small_scenario(tmp_path, fast_topology, parallel={"schedule": schedule}, training={"global_batch_size": m})
        sc, topo = load_scenario(path)
        r = simulate(sc, topo, costs=UniformCosts(sc)).result
        assert [x.inflight_microbatches_peak for x in r.memory] == expect


def test_same_input_gives_byte_identical_result(tmp_path, plain_topology):
    from simtrain.results.io import to_json
    path = small_scenario(tmp_path, plain_topology, parallel={"tp": 2, "pp": 2, "dp": 2, "sequence_parallel": True, "zero_stage": 1},
                          nodes=2)
    outs = []
    for _ in range(2):
        sc, topo = load_scenario(path)
        outs.append(to_json(simulate(sc, topo).result))
    assert outs[0] == outs[1]
    json.loads(outs[0])


def test_overlapped_grad_reduce_hides_communication(tmp_path, plain_topology):
    """With overlap the dp buckets run during the last backward, so exposed dp time can only shrink."""
    res = {}
    for ov in (True, False):
        path = small_scenario(tmp_path, plain_topology, parallel={"tp": 1, "pp": 1, "dp": 8, "overlap_grad_reduce": ov,
                                                                   "bucket_size_params": 1_000_000},
                              training={"global_batch_size": 16}, nodes=2)
        sc, topo = load_scenario(path)
        res[ov] = simulate(sc, topo).result
    assert res[True].breakdown.exposed_comm_s["dp"] < res[False].breakdown.exposed_comm_s["dp"]
    assert res[True].step_time_s < res[False].step_time_s


def test_plan_that_does_not_fit_is_simulated_and_says_by_how_much(tmp_path, fast_topology):
    # a 40 GB A100 cannot hold 175B-class weights on 4 ranks: still simulated, shortfall reported
    path = small_scenario(tmp_path, fast_topology)
    import yaml
    d = yaml.safe_load(path.read_text())
    d["model"] = {"preset": "gpt3-175b", "num_layers": 8}
    d["cluster"]["device"] = "a100-sxm4-40gb"
    path.write_text(yaml.safe_dump(d))
    sc, topo = load_scenario(path)
    r = simulate(sc, topo).result
    assert r.fits_in_memory is False
    # A100 40GB: 40960 MiB = 40 GiB; the default reserve 0.05 holds back 2 GiB -> 38 GiB usable
    assert r.memory_capacity_bytes == 40 * 2**30 and r.memory_reserve_bytes == pytest.approx(2 * 2**30)
    assert r.memory_shortfall_bytes == pytest.approx(r.peak_memory_bytes - 38 * 2**30)
    assert r.step_time_s > 0


def test_engine_reports_deadlock_with_the_blocked_ops():
    from simtrain.engine.core import run
    from simtrain.errors import DeadlockError
    from simtrain.program.ir import EOp
    a = EOp(id=0, cls=0, stream="compute", kind="compute", category="F", duration=1.0, label="F0", deps=[1])
    b = EOp(id=1, cls=1, stream="compute", kind="compute", category="F", duration=1.0, label="F1", deps=[0])
    with pytest.raises(DeadlockError, match="F0 waits on F1"):
        run([a, b], [0, 1])


def test_zero3_moves_the_fsdp_volume(tmp_path, fast_topology):
    """FSDP without no_sync: per microbatch and layer, gather the 16-bit layer twice (forward and
    backward) and reduce-scatter its fp32 gradient: m · L · (2 + 2 + 4) · P_layer bytes of buffers;
    the embedding and LM head (P_edge, the rest of the stage's parameters) move the same way,
    m · 8 · P_edge."""
    path = small_scenario(tmp_path, fast_topology, parallel={"tp": 1, "pp": 1, "dp": 4, "zero_stage": 3},
                          training={"global_batch_size": 8})
    sc, topo = load_scenario(path)
    run = simulate(sc, topo)
    w = build_workload(sc)[0]
    fsdp = sum(o.bytes for o in run.ops if o.label.split(":")[-1].startswith("fsdp_"))
    m, L = sc.num_microbatches, 8
    edge = w.params - L * w.layer_params
    assert edge > 0
    assert fsdp == pytest.approx(m * L * 8 * w.layer_params + m * 8 * edge)
