"""Contention between communication ops that overlap in time (engine.FluidNetwork): rates are
max-min fair over the links' capacities and recomputed whenever an op starts or ends. Expected
times are derived by hand in each docstring."""
import random

import pytest
from conftest import small_scenario, write

from simtrain.engine import core as engine
from simtrain.program.ir import EOp
from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario


def op(i, duration, load=(), deps=(), stream=None, kind="coll"):
    return EOp(id=i, cls=0, stream=stream or f"s{i}", kind=kind, category="dp", duration=duration,
               label=f"op{i}", deps=list(deps), load=tuple(load), order=float(i))


def run(ops):
    tl = engine.run(ops, [0])
    return tl.start, tl.end


def test_a_later_op_slows_the_running_one_and_both_recover():
    """A (1 s alone, uses all of link e) starts at 0; B (the same) starts at 0.5 behind a 0.5 s
    compute op. A runs alone to 0.5 (0.5 s of work left), then both at half speed: A's 0.5 s of
    work takes 1 s, so A ends at 1.5; B has done 0.5 s of work by then and finishes alone at 2.0."""
    ops = [op(0, 1.0, [("e", 1.0)]), op(1, 0.5, kind="compute", stream="c"), op(2, 1.0, [("e", 1.0)], deps=[1])]
    _, end = run(ops)
    assert end[0] == pytest.approx(1.5, rel=1e-12)
    assert end[2] == pytest.approx(2.0, rel=1e-12)


def test_ops_that_fit_together_are_not_slowed():
    """Two ops each using half of link e: the sum is exactly its capacity, no one waits."""
    _, end = run([op(0, 1.0, [("e", 0.5)]), op(1, 2.0, [("e", 0.5)])])
    assert end == pytest.approx([1.0, 2.0], rel=1e-12)


def test_max_min_rates_across_two_links():
    """A uses e1 fully; B uses half of e1 and all of e2; C uses all of e2; all 1 s alone.
    Progressive filling: e2 (demand 2) fills first at rate 1/2, freezing B and C; e1 then has
    1 - 0.5 x 0.5 = 0.75 left for A, so A runs at 0.75 and ends at 4/3. B and C keep rate 1/2
    (e2 still carries both) and end at 2."""
    _, end = run([op(0, 1.0, [("e1", 1.0)]), op(1, 1.0, [("e1", 0.5), ("e2", 1.0)]), op(2, 1.0, [("e2", 1.0)])])
    assert end[0] == pytest.approx(4 / 3, rel=1e-12)
    assert end[1] == pytest.approx(2.0, rel=1e-12)
    assert end[2] == pytest.approx(2.0, rel=1e-12)


def test_ops_without_load_ignore_the_network():
    """An op without a load (compute, or scale-up only traffic) takes its duration whatever runs."""
    _, end = run([op(0, 1.0, [("e", 1.0)]), op(1, 1.0, [("e", 1.0)]), op(2, 1.0, kind="compute")])
    assert end == pytest.approx([2.0, 2.0, 1.0], rel=1e-12)


def test_same_input_gives_the_same_times():
    ops = lambda: [op(i, 0.1 * (i + 1), [("e", 0.7), (f"x{i % 3}", 0.9)]) for i in range(12)]
    assert run(ops()) == run(ops())


SHARED_NIC = """
    name: shared-nic
    kind: two_tier
    devices_per_node: 4
    scale_up: {bandwidth: "100 GB/s", latency: "2 us"}
    scale_out: {nics_per_node: 1, nic_bandwidth: "80 Gb/s", latency: "5 us", nodes_per_leaf: 2, oversubscription: 2}
"""


@pytest.mark.parametrize("placement,slower", [("pp-tp-cp-dp", True), ("megatron", False)])
def test_gradient_reductions_of_two_stages_share_a_nic(tmp_path, monkeypatch, placement, slower):
    """pp 2, dp 8 on 4 nodes of 4 GPUs behind one NIC each. With pp varying fastest over the
    devices, every node holds two ranks of each stage, so both stages' data-parallel rings leave
    through the same NIC; the last microbatches' backward passes end close together, so the two
    stages' gradient all-reduces overlap and each gets about half the NIC. Each stage's all-reduce
    timed alone (loads dropped) knows nothing of the other: the exposed dp time must come out
    clearly longer with contention (> 1.5x). With Megatron order each node holds one stage only,
    the rings never share a NIC, and contention changes nothing (< 2 %)."""

    topo = write(tmp_path / "n.yaml", SHARED_NIC)
    path = small_scenario(tmp_path, topo, parallel={"tp": 1, "pp": 2, "dp": 8, "placement": placement}, nodes=4,
                          training={"global_batch_size": 32}, network={"backend": "flow"})
    sc, t = load_scenario(path)
    shared = simulate(sc, t).result.breakdown.exposed_comm_s["dp"]
    monkeypatch.setattr(engine.FluidNetwork, "start", lambda self, op: self.env.timeout(op.duration))
    alone = simulate(sc, t).result.breakdown.exposed_comm_s["dp"]
    if slower:
        assert shared > 1.5 * alone
    else:
        assert shared == pytest.approx(alone, rel=0.02)


def test_short_ops_late_in_a_long_step_always_finish():
    """Regression: an op of a microsecond starting hundreds of seconds into the step must end at
    start + duration, although the float time left after subtracting elapsed time is rounding
    noise (the timer that was set for it ends it)."""
    rng = random.Random(1)
    for _ in range(300):
        t0, d = rng.uniform(5, 500), rng.uniform(0.1e-6, 50e-6)
        ops = [op(0, t0, kind="compute", stream="c"), op(1, d, [("e", 0.5)], deps=[0])]
        _, end = run(ops)
        assert end[1] == pytest.approx(t0 + d, abs=1e-9)
