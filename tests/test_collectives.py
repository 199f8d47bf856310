"""Closed forms of the analytical network backend, derived by hand from the topology numbers."""
import pytest

from simtrain.collectives import collective_time, p2p_time
from simtrain.parallel import GroupShape
from simtrain.topology import load_topology


def test_p2p_is_latency_plus_size_over_bandwidth(plain_topology):
    topo = load_topology(plain_topology, nodes=4)
    n = 64e6
    # same node: 2 us + 64 MB / 100 GB/s = 2e-6 + 6.4e-4
    assert p2p_time(n, topo.link_class_name(0, 1), topo) == pytest.approx(2e-6 + 6.4e-4, rel=1e-12)
    # other node, same leaf: 5 us + 64 MB / 10 GB/s
    assert p2p_time(n, topo.link_class_name(0, 4), topo) == pytest.approx(5e-6 + 6.4e-3, rel=1e-12)
    # other leaf (nodes_per_leaf 2, oversubscription 2): 5 us + 64 MB / 5 GB/s
    assert p2p_time(n, topo.link_class_name(0, 8), topo) == pytest.approx(5e-6 + 12.8e-3, rel=1e-12)


def test_ring_all_reduce_closed_form(plain_topology):
    topo = load_topology(plain_topology, nodes=1)
    p, n, a, B = 4, 1e9, 2e-6, 100e9
    g = GroupShape(size=p, nodes=1, per_node=p, uniform=True, leaves=1)
    # 2(p-1)α + 2(p-1)/p · n/B
    assert collective_time("all_reduce", n, g, topo, "ring") == pytest.approx(2 * (p - 1) * a + 2 * (p - 1) / p * n / B, rel=1e-12)
    assert collective_time("reduce_scatter", n, g, topo, "ring") == pytest.approx((p - 1) * a + (p - 1) / p * n / B, rel=1e-12)
    assert collective_time("all_gather", n, g, topo, "ring") == pytest.approx((p - 1) * a + (p - 1) / p * n / B, rel=1e-12)


def test_hierarchical_all_reduce_closed_form(plain_topology):
    topo = load_topology(plain_topology, nodes=2)
    # 2 nodes x 4 members: intra RS(4) + inter AR(2) of n/4 + intra AG(4)
    k, N, n = 4, 2, 1e9
    g = GroupShape(size=8, nodes=2, per_node=4, uniform=True, leaves=1)
    intra = (k - 1) * 2e-6 + (k - 1) / k * n / 100e9
    inter = 2 * (N - 1) * 5e-6 + 2 * (N - 1) / N * (n / k) / 10e9
    assert collective_time("all_reduce", n, g, topo, "hierarchical") == pytest.approx(2 * intra + inter, rel=1e-12)
    # flat ring: per-rank bandwidth min(100, 4 x 10) = 40 GB/s; 2(N-1) = 2 network steps, 12 scale-up steps
    ring = 12 * 2e-6 + 2 * 5e-6 + 2 * 7 / 8 * n / 40e9
    assert collective_time("all_reduce", n, g, topo, "ring") == pytest.approx(ring, rel=1e-12)
    assert collective_time("all_reduce", n, g, topo, "auto") == pytest.approx(min(ring, 2 * intra + inter), rel=1e-12)


def test_efficiency_scales_bandwidth_term(tmp_path):
    f = tmp_path / "e.yaml"
    f.write_text('name: e\nkind: two_tier\ndevices_per_node: 2\n'
                 'scale_up: {bandwidth: "100 GB/s", latency: "0 us", efficiency: 0.5}\n'
                 'scale_out: {nics_per_node: 2, nic_bandwidth: "100 Gb/s", latency: "0 us"}\n')
    topo = load_topology(f, nodes=1)
    g = GroupShape(2, 1, 2, True, 1)
    # 2(p-1)/p · n / (B·eff) = 1 · 1e9 / 50e9
    assert collective_time("all_reduce", 1e9, g, topo) == pytest.approx(0.02, rel=1e-12)
