"""Flow-level backend: max-min sharing, contended completion times, collective phases against
their closed forms, and oversubscription."""
import json
import math

import pytest
from conftest import small_scenario, write

from simtrain.cli.main import main
from simtrain.hardware.topology import find_topology_file, load_topology
from simtrain.network.collectives import choose, collective_time
from simtrain.network.flows import (
    FlowNetwork,
    double_binary_tree_edges,
    halving_doubling_phases,
    maxmin,
    run_flows,
    tree_network_transfers,
)
from simtrain.plan.grid import group_shape
from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario

US = 1e-6


def simple(up: int, net: int, ring_ar_multinode: bool = False) -> float:
    """Simple protocol latency, NCCL's table (simtrain.network.collectives.LATENCY_US): 8.4 us base,
    3.4 us per NVLink step, 14 us per network step; x1.4 for a multi-node ring all-reduce."""
    return (8.4 + 3.4 * up + 14.0 * net) * US * (1.4 if ring_ar_multinode else 1.0)


def test_two_flows_on_one_link_get_half_each():
    assert maxmin([("a",), ("a",)], {"a": 10.0}) == [5.0, 5.0]


def test_max_min_share_across_two_links():
    """Link A (10) carries f1, f2; link B (10) carries f2, f3, f4: B is the bottleneck of f2, f3,
    f4 at 10/3 each; f1 takes what is left of A, 10 - 10/3."""
    r = maxmin([("A",), ("A", "B"), ("B",), ("B",)], {"A": 10.0, "B": 10.0})
    assert r == pytest.approx([20 / 3, 10 / 3, 10 / 3, 10 / 3])


def test_contended_completion_times_by_hand():
    """1 B and 3 B on a 1 B/s link: both at 0.5 B/s until the first ends at t = 2; the second then
    has 2 B left at 1 B/s and ends at t = 4. Latencies add at the end (here 0.1 and 0.2 s)."""
    assert run_flows([("l",), ("l",)], [1.0, 3.0], {"l": 1.0}, [0.1, 0.2]) == pytest.approx([2.1, 4.2])
    # a third flow on a second link, sharing with the long one: rates re-divide when flows end
    # f0 (2 B, link x), f1 (2 B, links x and y), f2 (1 B, link y); all links 1 B/s.
    # t in [0, 2]: each 0.5 -> f2 done at 2 (1 B); f0 and f1 have 1 B left; then x shared by f0, f1
    # at 0.5 each: both end at t = 4.
    assert run_flows([("x",), ("x", "y"), ("y",)], [2.0, 2.0, 1.0], {"x": 1.0, "y": 1.0}) == pytest.approx([4.0, 4.0, 2.0])


IDEAL = """
    name: ideal
    kind: two_tier
    devices_per_node: 8
    scale_up: {bandwidth: "100 GB/s", latency: "2 us"}
    scale_out: {nics_per_node: 8, nic_bandwidth: "80 Gb/s", latency: "5 us", nodes_per_leaf: 4, oversubscription: OVER}
"""


def _net(tmp_path, nodes, over=1):
    return FlowNetwork(load_topology(write(tmp_path / f"t{over}.yaml", IDEAL.replace("OVER", str(over))), nodes))


@pytest.mark.parametrize("coll", ["all_reduce", "reduce_scatter", "all_gather"])
def test_ring_in_one_node_matches_its_closed_form(tmp_path, coll):
    """Ring over 8 devices of one NVSwitch node (nothing contends: each device sends one flow and
    receives one): the protocol's latency for `steps` NVLink steps + steps·n/(p·B), i.e.
    2(p-1)/p·n/B of transfer for all-reduce."""
    net = _net(tmp_path, 1)
    n, p, B = 64e6, 8, 100e9
    steps = 2 * (p - 1) if coll == "all_reduce" else p - 1
    assert net.collective_time(coll, n, [list(range(8))]) == pytest.approx(simple(steps, 0) + steps * n / p / B, rel=1e-12)


def test_halving_doubling_matches_its_closed_form(tmp_path):
    """Recursive halving-doubling all-reduce: 2·log2(p) steps of latency + 2(p-1)/p·n/B."""
    net = _net(tmp_path, 1)
    n, p, B = 64e6, 8, 100e9
    t = net.collective_time("all_reduce", n, [list(range(8))], "halving_doubling")
    assert t == pytest.approx(simple(2 * int(math.log2(p)), 0) + 2 * (p - 1) / p * n / B, rel=1e-12)
    assert sum(b for ph in halving_doubling_phases("reduce_scatter", 8, 1.0) for _, _, b in ph[:1]) == pytest.approx(7 / 8)


def test_flow_backend_agrees_with_the_analytical_one_when_nothing_contends(tmp_path):
    """One ring of one device per node under one leaf: NIC-limited, 10 GB/s, exactly the
    closed-form ring over the 'leaf' link class, for every protocol and algorithm with phases."""
    net = _net(tmp_path, 4)
    group = [0, 8, 16, 24]
    for algo in ("ring", "halving_doubling"):
        for proto in ("LL", "LL128", "Simple"):
            flow = net.collective_time("all_reduce", 1e8, [group], algo, proto)
            closed = collective_time("all_reduce", 1e8, group_shape(group, net.topo), net.topo, algo, proto)
            assert flow == pytest.approx(closed, rel=1e-12)
    # halving-doubling, Simple: 2 network steps each way, 2(p-1)/p·n at 10 GB/s
    assert flow == pytest.approx(simple(0, 4) + 2 * 3 / 4 * 1e8 / 10e9, rel=1e-12)


ONE_SPINE = """
    name: one-spine
    kind: two_tier
    devices_per_node: 8
    scale_up: {bandwidth: "100 GB/s", latency: "2 us"}
    scale_out: {nics_per_node: 1, nic_bandwidth: "400 Gb/s", latency: "5 us", nodes_per_leaf: 4, oversubscription: OVER}
"""


def test_oversubscribed_spine_slows_a_ring_that_crosses_it(tmp_path):
    """8 nodes of 8 GPUs sharing one 50 GB/s NIC, 4 nodes per leaf, one spine (so routes are
    unique). Eight concurrent rings, one per local GPU index (the dp groups of a tp-8 plan), each
    over one GPU of every node. Under full load a GPU's NIC share is 50/8 = 6.25 GB/s.
    Ring order alternating leaves (0,4,1,5,...): every hop crosses the spine, so each leaf's
    uplink carries 4 nodes x 8 rings = 32 flows. At 2:1 the uplink has 4 x 50 / 2 = 100 GB/s,
    3.125 GB/s per flow, half the NIC share; at 1:1 it has 200 GB/s and the NIC (6.25) limits.
    Rings kept inside a leaf never touch the spine: 6.25 GB/s even at 2:1. Each ring step moves
    n/p at the flow rate; latency: 2(N-1) network steps of a multi-node Simple ring."""
    n, p = 1e8, 8
    net1 = FlowNetwork(load_topology(write(tmp_path / "o1.yaml", ONE_SPINE.replace("OVER", "1")), 8))
    net2 = FlowNetwork(load_topology(write(tmp_path / "o2.yaml", ONE_SPINE.replace("OVER", "2")), 8))
    order = [0, 4, 1, 5, 2, 6, 3, 7]
    crossing = [[node * 8 + j for node in order] for j in range(8)]
    steps = 2 * (p - 1)
    lat = simple(0, steps, True)
    assert net1.collective_time("all_reduce", n, crossing) == pytest.approx(lat + steps * n / p / 6.25e9, rel=1e-9)
    assert net2.collective_time("all_reduce", n, crossing) == pytest.approx(lat + steps * n / p / 3.125e9, rel=1e-9)
    inside = [[node * 8 + j for node in range(4 * leaf, 4 * leaf + 4)] for leaf in range(2) for j in range(8)]
    assert net2.collective_time("all_reduce", n, inside) == pytest.approx(simple(0, 6, True) + 6 * n / 4 / 6.25e9, rel=1e-9)


def test_routes_are_deterministic_for_a_seed(tmp_path):
    a, b = _net(tmp_path, 8, 2), _net(tmp_path, 8, 2)
    assert a.route(0, 40, "f") == b.route(0, 40, "f")
    assert len(a.route(0, 40, "f")) == 6       # gpu -> nic -> leaf -> spine -> leaf -> nic -> gpu


def test_flow_backend_in_a_whole_step_matches_analytical_without_contention(tmp_path):
    """tp 4 inside each node, dp 4 across four nodes under one leaf (one dp member per node), no
    oversubscription: every flow is limited by its own NIC share, exactly what the closed form
    assumes, so the whole step comes out the same with `network.backend: flow`."""

    topo = write(tmp_path / "flat.yaml", """
        name: flat
        kind: two_tier
        devices_per_node: 4
        scale_up: {bandwidth: "100 GB/s", latency: "2 us"}
        scale_out: {nics_per_node: 4, nic_bandwidth: "80 Gb/s", latency: "5 us", nodes_per_leaf: 4}
    """)
    path = small_scenario(tmp_path, topo, parallel={"tp": 4, "pp": 1, "dp": 4, "zero_stage": 1}, nodes=4,
                          training={"global_batch_size": 8})
    res = {}
    for b in ("analytical", "flow"):
        sc, t = load_scenario(path, [f"network.backend={b}"])
        res[b] = simulate(sc, t).result
    assert res["flow"].step_time_s == pytest.approx(res["analytical"].step_time_s, rel=1e-12)
    assert res["flow"].breakdown.exposed_comm_s["dp"] > 0


def test_rings_with_several_members_per_node_stripe_over_their_nics(tmp_path):
    """dp 8 over four nodes with 2 members each (tp 2): the ring's node-to-node hop is striped
    over both members' rail NICs, k = 2 NIC shares, as the closed form's min(scale-up, k x NIC);
    both backends charge the closed form's latency (2(N-1) network steps, the rest NVLink)."""
    net = FlowNetwork(load_topology(write(tmp_path / "s.yaml", IDEAL.replace("OVER", "1")), 4))
    groups = [[node * 8 + j + 4 * h for node in range(4) for h in range(2)] for j in range(4)]
    flow = net.collective_time("all_reduce", 1e8, groups)
    closed = collective_time("all_reduce", 1e8, group_shape(groups[0], net.topo), net.topo, "ring", "Simple")
    assert flow == pytest.approx(closed, rel=1e-12)
    assert flow == pytest.approx(simple(14 - 6, 6, True) + 2 * 7 / 8 * 1e8 / 20e9, rel=1e-12)


RAIL = """
    name: rail
    kind: two_tier
    devices_per_node: 8
    scale_up: {bandwidth: "100 GB/s", latency: "2 us"}
    scale_out: {nics_per_node: 8, nic_bandwidth: "80 Gb/s", latency: "5 us", nodes_per_leaf: 8,
                oversubscription: 2, rail_optimized: true}
"""


def test_rail_aligned_rings_avoid_the_oversubscribed_spine(tmp_path):
    """Rail-optimized unit of 8 nodes: NIC k of every node on rail leaf k; 2:1 uplinks. Rings over
    GPU j of every node (rail-aligned, the dp groups of a tp-8 Megatron plan) stay on leaf j:
    NIC-limited, 10 GB/s, exactly the closed form. Rings over GPU (node + j) mod 8 change rail at
    every hop, so all 8 flows leaving a leaf cross the spine, whose uplinks total 8 x 10 / 2 =
    40 GB/s: some flow gets at most 5 GB/s, and a ring step lasts at least (n/p) / 5 GB/s."""
    topo = load_topology(write(tmp_path / "rail.yaml", RAIL), 8)
    net = FlowNetwork(topo)
    n, p = 1e8, 8
    aligned = [[node * 8 + j for node in range(8)] for j in range(8)]
    t_al = net.collective_time("all_reduce", n, aligned)
    assert t_al == pytest.approx(collective_time("all_reduce", n, group_shape(aligned[0], topo), topo, "ring", "Simple"), rel=1e-12)
    assert t_al == pytest.approx(simple(0, 14, True) + 14 * n / p / 10e9, rel=1e-12)
    diagonal = [[node * 8 + (node + j) % 8 for node in range(8)] for j in range(8)]
    t_diag = net.collective_time("all_reduce", n, diagonal)
    assert t_diag >= 14 * (n / p / 5e9)
    assert topo.link_class_name(0, 8) == "leaf" and topo.link_class_name(0, 9) == "spine"


def test_link_bytes_and_saturated_time_of_a_ring(tmp_path):
    """Ring all-reduce over 8 GPUs of one node: each GPU's uplink to the switch carries one n/p
    chunk per step, 2(p-1) steps: 2(p-1)/p·n bytes, and runs at full capacity for the transfer
    part of every step, 2(p-1)·(n/p)/B seconds (not during the latency)."""
    net = _net(tmp_path, 1)
    n, p, B = 64e6, 8, 100e9
    t, _, _, moved, sat = net.collective("all_reduce", n, [list(range(8))])
    up = ("node0.gpu3", "node0.switch")
    assert moved[up] == pytest.approx(2 * (p - 1) / p * n)
    assert sat[up] == pytest.approx(2 * (p - 1) * n / p / B, rel=1e-9)


def test_result_lists_the_busiest_links_with_the_flow_backend(tmp_path, plain_topology):

    path = small_scenario(tmp_path, plain_topology, parallel={"tp": 4, "pp": 1, "dp": 4}, nodes=4,
                          training={"global_batch_size": 8})
    sc, t = load_scenario(path, ["network.backend=flow"])
    links = simulate(sc, t).result.links
    assert links.by_bytes[0].nbytes >= links.by_bytes[-1].nbytes > 0
    assert "->" in links.by_saturated_time[0].link
    sc, t = load_scenario(path)
    assert simulate(sc, t).result.links is None


def test_trace_has_counter_tracks_of_the_busiest_links(tmp_path, plain_topology):
    """With the flow backend the trace gets one counter track per busy link; while a collective
    runs, its link carries the collective's bytes over its duration, so utilisation stays in
    (0, 1] for a single collective and is back at 0 at the end."""


    path = small_scenario(tmp_path, plain_topology, parallel={"tp": 4, "pp": 1, "dp": 4, "overlap_grad_reduce": False},
                          nodes=4, training={"global_batch_size": 8}, network={"backend": "flow"})
    assert main(["run", str(path), "--out", str(tmp_path / "o")]) == 0
    ev = json.loads((tmp_path / "o" / "trace.json").read_text())["traceEvents"]
    counters = [e for e in ev if e["ph"] == "C"]
    names = {e["name"] for e in counters}
    busiest = {x["link"] for x in json.loads((tmp_path / "o" / "result.json").read_text())["links"]["by_saturated_time"][:8]}
    assert names and names <= busiest | {x["link"] for x in json.loads((tmp_path / "o" / "result.json").read_text())["links"]["by_bytes"]}
    vals = [e["args"]["utilisation"] for e in counters]
    assert max(vals) > 0 and all(v >= 0 for v in vals)
    for n in names:
        assert [e for e in counters if e["name"] == n][-1]["args"]["utilisation"] == 0


def test_all_to_all_phases_match_their_closed_forms(tmp_path):
    """8 GPUs on one switch, n bytes per rank. Pairwise: p-1 steps, each one flow of n/p per GPU:
    p-1 steps of latency + (p-1)·n/(p·B). Direct: one phase, each GPU's uplink shared by its p-1
    flows of n/p: one step of latency + (p-1)·n/(p·B)."""
    net = _net(tmp_path, 1)
    n, p, B = 64e6, 8, 100e9
    g = [list(range(8))]
    assert net.collective_time("all_to_all", n, g, "pairwise") == pytest.approx(simple(p - 1, 0) + (p - 1) * n / p / B, rel=1e-12)
    assert net.collective_time("all_to_all", n, g, "direct") == pytest.approx(simple(1, 0) + (p - 1) * n / p / B, rel=1e-12)


def test_double_binary_tree_layout_by_hand():
    """Four nodes: tree one 0 <- 2 <- {1, 3}, tree two its mirror 3 <- 1 <- {2, 0}; every node is a
    leaf in one tree. Each tree edge carries n/2 up and n/2 down, so an inner node (a parent, two
    children) sends 1.5n in its inner tree and 0.5n in the other: 2n in all; on two nodes the
    two trees are one edge each way, n per node."""
    assert sorted(double_binary_tree_edges(4)) == sorted([(2, 1), (2, 3), (0, 2), (1, 2), (1, 0), (3, 1)])
    assert double_binary_tree_edges(2) == [(0, 1), (1, 0)]
    for nodes, per_node in ((2, 1.0), (4, 2.0), (8, 2.0)):
        sent: dict = {}
        got: dict = {}
        for a, b, nb in tree_network_transfers([[10 * i] for i in range(nodes)], 1.0):
            sent[a] = sent.get(a, 0.0) + nb
            got[b] = got.get(b, 0.0) + nb
        assert max(sent.values()) == pytest.approx(per_node) and max(got.values()) == pytest.approx(per_node)
    # without the two-node saving (collectives.two_node_tree_saving: false) two nodes send 2n
    sent = {}
    for a, b, nb in tree_network_transfers([[0], [10]], 1.0, two_node_saving=False):
        sent[a] = sent.get(a, 0.0) + nb
    assert sent == {0: pytest.approx(2.0), 10: pytest.approx(2.0)}


@pytest.mark.parametrize("nodes", [2, 4, 8])
def test_tree_flows_match_the_closed_form_when_nothing_contends(tmp_path, nodes):
    """A tree all-reduce of one device per node under one leaf, every protocol: the flows of both
    trees limited by each NIC (10 GB/s) give exactly the closed form's n (two nodes) or 2n (more)
    per node over its NIC, plus the same latency terms."""
    net = FlowNetwork(load_topology(write(tmp_path / "t.yaml", IDEAL.replace("OVER", "1").replace("nodes_per_leaf: 4", "nodes_per_leaf: 8")), nodes))
    group = [8 * i for i in range(nodes)]
    for proto in ("LL", "LL128", "Simple"):
        flow = net.select("all_reduce", 1e8, [group], "tree", proto)[0]
        closed = collective_time("all_reduce", 1e8, group_shape(group, net.topo), net.topo, "tree", proto)
        assert flow.algorithm == "tree" and flow.seconds == pytest.approx(closed, rel=1e-12)
    per_node = 1e8 if nodes == 2 else 2e8
    tree_simple = (8.4 + 14.0 * 2 * math.ceil(math.log2(nodes))) * US + per_node / 10e9 / 0.92
    assert net.select("all_reduce", 1e8, [group], "tree", "Simple")[0].seconds == pytest.approx(tree_simple, rel=1e-12)


def test_tree_flows_slow_down_on_an_oversubscribed_spine(tmp_path):
    """Eight nodes with one 50 GB/s NIC each, 4 per leaf, one spine; the eight tp-8 dp groups (one
    GPU of every node each) run a tree all-reduce at once, nodes in the order 0,4,1,5,2,6,3,7 so
    that tree positions alternate leaves. Each node sends 2n per group: 16n on its NIC, 32 ms
    for n = 100 MB. Four edges of each tree join the two leaves (positions 2-1, 2-3, 6-5, 6-7 and
    their mirrors), each carrying n/2 each way: 4n per group, 32n in all on each leaf uplink.
    At 1:1 that uplink has 200 GB/s (16 ms) and the NICs limit; at 4:1 it has 50 GB/s, 64 ms,
    twice the NIC time. Simple tree: 8.4 us + 6 network steps x 14 us, bandwidth share 0.92."""
    n = 1e8
    order = [0, 4, 1, 5, 2, 6, 3, 7]
    groups = [[node * 8 + j for node in order] for j in range(8)]
    t = {}
    for over in (1, 4):
        net = FlowNetwork(load_topology(write(tmp_path / f"o{over}.yaml", ONE_SPINE.replace("OVER", str(over))), 8))
        t[over] = net.select("all_reduce", n, groups, "tree", "Simple")[0].seconds
    lat = (8.4 + 14.0 * 2 * 3) * US
    assert t[1] == pytest.approx(lat + 16 * n / 50e9 / 0.92, rel=1e-9)
    assert t[4] == pytest.approx(lat + 32 * n / 50e9 / 0.92, rel=1e-9)


def test_nvls_in_one_node_is_the_closed_form_in_both_backends():
    """On a fabric with NVLink SHARP (dgx-h100) `auto` picks NVLS for a one-node all-reduce; the
    flow backend runs it too (in-switch reduction moves n up and n down each device link) rather
    than a ring, so both backends agree."""
    topo = load_topology(find_topology_file("dgx-h100", None), 1)
    net = FlowNetwork(topo)
    group = list(range(8))
    c, moved, _ = net.select("all_reduce", 256 * 2 ** 20, [group])
    closed = choose("all_reduce", 256 * 2 ** 20, group_shape(group, topo), topo)
    assert c.algorithm == closed.algorithm == "nvls" and c.seconds == closed.seconds
    dev0 = topo.device_id(0)
    assert sum(x for (a, b), x in moved.items() if a == dev0) == pytest.approx(256 * 2 ** 20)


def test_whole_step_on_an_nvls_fabric_agrees_across_backends(tmp_path):
    """tp 8 all-reduces inside each DGX H100 node (NVLS) and dp 2 gradient all-reduces across two
    nodes (a tree or NVLSTree where the closed form picks one): nothing contends, so the flow
    backend's step equals the closed form's."""

    path = small_scenario(tmp_path, find_topology_file("dgx-h100", None), parallel={"tp": 8, "pp": 1, "dp": 2},
                          nodes=2, model={"architecture": "gpt", "num_layers": 4, "hidden_size": 4096,
                                          "num_attention_heads": 32, "vocab_size": 32000, "seq_length": 2048})
    res = {}
    for b in ("analytical", "flow"):
        sc, t = load_scenario(path, [f"network.backend={b}"])
        res[b] = simulate(sc, t).result
    algos = {c.algorithm for c in res["analytical"].collectives}
    assert "nvls" in algos
    assert res["flow"].step_time_s == pytest.approx(res["analytical"].step_time_s, rel=1e-12)
