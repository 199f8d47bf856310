"""The topology library: every builder's element counts from its parameters (closed form), the
bandwidth and latency of a representative route, ECMP, PXN on multi-plane fabrics, torus and
dragonfly routing, explicit-form validation, flow-backend collectives against their closed form,
topology-aware placement, and a small scenario on every shipped topology with both backends.
Each expected value says how it was derived."""
import dataclasses
import math

import networkx as nx
import pytest
from conftest import ROOT, small_scenario, write

from simtrain.errors import ConfigError
from simtrain.hardware.topology import load_topology, shipped_topologies
from simtrain.network.flows import FlowNetwork
from simtrain.plan.grid import RankGrid, placement
from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario


def kinds(g):
    out = {}
    for _, k in g.nodes(data="kind"):
        out[k] = out.get(k, 0) + 1
    return out


def is_path(g, p):
    return all(g.has_edge(u, v) for u, v in zip(p, p[1:]))


# ---------------------------------------------------------------------------------------------
# fat-trees

FT3 = """
    name: ft3
    kind: fat_tree
    devices_per_node: 4
    scale_up: {bandwidth: "100 GB/s", latency: "2 us"}
    scale_out: {nics_per_node: 4, nic_bandwidth: "80 Gb/s", latency: "4 us", rail_optimized: true,
                nodes_per_leaf: 2, levels: 3, units_per_pod: 2, cores_per_spine: 2, oversubscription: 2,
                core_oversubscription: 2, spine_latency: "1 us", core_latency: "3 us"}
    collectives: {latency_model: none}
"""


def test_two_tier_counts_and_routes_by_hand(tmp_path):
    """Plain two-tier, 5 nodes of 4 GPUs, 2 NICs each, 2 nodes per leaf: ceil(5/2) = 3 leaves,
    2 spines (one per NIC); edges = leaf-spine 3 x 2 + NIC-leaf 5 x 2 + GPU-switch 20 + GPU-NIC 20
    = 56. A GPU's NIC share is 10 GB/s / 2 = 5 GB/s; a spine route adds 2 x 1 us to the 4 us."""
    t = load_topology(write(tmp_path / "t.yaml", """
        name: t
        kind: two_tier
        devices_per_node: 4
        scale_up: {bandwidth: "100 GB/s", latency: "2 us"}
        scale_out: {nics_per_node: 2, nic_bandwidth: "80 Gb/s", latency: "4 us", nodes_per_leaf: 2, spine_latency: "1 us"}
    """), 5)
    g = t.graph()
    assert kinds(g) == {"device": 20, "scale_up_switch": 5, "nic": 10, "leaf": 3, "spine": 2}
    assert g.number_of_edges() == 3 * 2 + 10 + 20 + 20
    spine = t.link(0, 8)
    assert (spine.name, spine.bw, spine.latency) == ("spine", pytest.approx(5e9), pytest.approx(6e-6))
    assert t.link(0, 1).bw == pytest.approx(100e9) and t.link(0, 1).latency == pytest.approx(2e-6)


def test_three_level_counts_link_widths_and_classes(tmp_path):
    """8 nodes, 2 per unit: 4 units, 2 per pod -> 2 pods. Rail-optimized with 4 NICs: 4 leaves per
    unit = 16 leaves; 4 spines per pod = 8; 4 spine indices x 2 cores = 8 cores, each linked to
    spine j of both pods. Edges: leaf-spine 16 x 4 + spine-core 8 x 2 + NIC-leaf 32 + GPU-switch 32
    + GPU-NIC 32 = 176.
    Widths: a leaf's downlinks carry 2 nodes x 10 GB/s = 20 GB/s, over 4 spines at least one NIC
    (10), at 2:1 -> 5 GB/s per leaf-spine link; a pod spine's downlinks 2 units x 4 leaves x 5 = 40
    GB/s over 2 cores = 20, at 2:1 -> 10 GB/s. Per flow under full load: NIC 10, uplink 10/2 = 5,
    core 5/2 = 2.5 GB/s.
    Classes from GPU 0: node 1 same leaf (4 us, 10 GB/s); node 2 other unit, same pod (4 + 2 x 1 =
    6 us, 5 GB/s); node 4 other pod (4 + 2 x 1 + 2 x 3 = 12 us, 2.5 GB/s)."""
    t = load_topology(write(tmp_path / "ft3.yaml", FT3), 8)
    g = t.graph()
    assert kinds(g) == {"device": 32, "scale_up_switch": 8, "nic": 32, "leaf": 16, "spine": 8, "core": 8}
    assert g.number_of_edges() == 16 * 4 + 8 * 2 + 32 + 32 + 32
    assert g.edges["leaf0", "pod0.spine0"]["bw"] == pytest.approx(5e9)
    assert g.edges["pod0.spine0", "core0"]["bw"] == pytest.approx(10e9)
    assert [t.link_class_name(0, 4 * n) for n in (1, 2, 4)] == ["leaf", "spine", "core"]
    for n, (bw, lat) in {1: (10e9, 4e-6), 2: (5e9, 6e-6), 4: (2.5e9, 12e-6)}.items():
        x = t.link(0, 4 * n)
        assert x.bw == pytest.approx(bw) and x.latency == pytest.approx(lat)
    assert t.span_class([0, 4]) == "leaf" and t.span_class([0, 8]) == "spine" and t.span_class([0, 16]) == "core"


def test_structural_core_paths_are_the_graphs_shortest_paths(tmp_path):
    """The fat-tree builder lays out core paths by structure (one per spine in a pod; one per
    (spine index, core) across pods: 4 x 2 = 8); they must be exactly networkx's shortest paths
    through the switch core."""
    t = load_topology(write(tmp_path / "ft3.yaml", FT3), 8)
    fab = t.fabric
    g = t.graph()
    core = g.subgraph([x for x, k in g.nodes(data="kind") if k in ("leaf", "spine", "core")])
    for la, lb in [(0, 1), (0, 4), (0, 8), (3, 15), (5, 5)]:
        mine = fab.core_paths(la, lb)
        ref = sorted(tuple(p) for p in nx.all_shortest_paths(core, fab.leaf_name(la), fab.leaf_name(lb)))
        assert mine == ref
    assert len(fab.core_paths(0, 8)) == 8 and len(fab.core_paths(0, 4)) == 4


def test_ecmp_spreads_flows_deterministically(tmp_path):
    """Between pods there are 8 equal-cost core paths; 64 flows with different ids use more than
    one, the same seed gives the same routes, another seed changes some choice."""
    t = load_topology(write(tmp_path / "ft3.yaml", FT3), 8)
    a, b, c = FlowNetwork(t, 0), FlowNetwork(t, 0), FlowNetwork(t, 1)
    ra = [a.route(0, 16, i) for i in range(64)]
    assert len({r[3][1] for r in ra}) > 1                 # the spine-core hop differs between flows
    assert ra == [b.route(0, 16, i) for i in range(64)]
    assert ra != [c.route(0, 16, i) for i in range(64)]
    assert all(is_path(t.graph(), [e[0] for e in r] + [r[-1][1]]) for r in ra)


MP = """
    name: mp
    kind: fat_tree
    devices_per_node: 4
    scale_up: {bandwidth: "100 GB/s", latency: "2 us"}
    scale_out: {nics_per_node: 4, nic_bandwidth: "80 Gb/s", latency: "4 us", planes: 4, nodes_per_leaf: 2, spines: 2}
"""


def test_multi_plane_counts_and_cross_plane_route_via_the_node_switch(tmp_path):
    """4 planes (NIC k on plane k), 4 nodes of 2 per leaf: 2 leaves and 2 spines per plane -> 8
    leaves, 8 spines, edges 8 x 2 leaf-spine + 16 NIC-leaf + 16 + 16 = 64.
    GPU 0 (plane 0) to node 2's GPU 3 (plane 3): PXN, over node 0's switch to its GPU 3, out of
    NIC 3 into plane 3: 1 + 1 us over NVLink, 2 us NIC-leaf, 2 us leaf-NIC = 6 us, NIC-limited
    10 GB/s; only the proxy GPU is a transit device."""
    t = load_topology(write(tmp_path / "mp.yaml", MP), 4)
    g = t.graph()
    assert kinds(g) == {"device": 16, "scale_up_switch": 4, "nic": 16, "leaf": 8, "spine": 8}
    assert g.number_of_edges() == 16 + 16 + 16 + 16
    p = t.route(0, 11, None)
    assert p[:5] == ("node0.gpu0", "node0.switch", "node0.gpu3", "node0.nic3", "plane3.leaf0")
    assert p[-3:] == ("plane3.leaf1", "node2.nic3", "node2.gpu3") and is_path(g, p)
    assert [x for x in p[1:-1] if g.nodes[x]["kind"] == "device"] == ["node0.gpu3"]
    x = t.link(0, 11)
    assert (x.name, x.bw, x.latency) == ("pxn_spine", pytest.approx(10e9), pytest.approx(6e-6))
    assert t.route(3, 11, None)[1] == "node0.nic3"        # same plane: straight out of its NIC


def test_nvl72_domain_hosts_names_and_link_classes():
    """gb200-nvl72: 72 GPUs per rack on one NVLink switch, 18 trays of 4, one NIC per GPU.
    Two racks fit one 8-rack unit: 4 rail leaves (the file's 4 rails), 16 spines (the file's
    count, present as there is more than one leaf). Device 13 is tray 3 (13 // 4), GPU 1 of rack 0;
    device 85 is rack 1. Scale-up class: 900 GB/s, 3 us (the file's NVLink 5 per GPU and
    direction); rack to rack: the 400G NIC, 50 GB/s."""
    t = load_topology(ROOT / "topologies" / "gb200-nvl72.yaml", 2)
    g = t.graph()
    assert kinds(g) == {"device": 144, "scale_up_switch": 2, "nic": 144, "leaf": 4, "spine": 16}
    assert (t.device_id(13), t.host_of(13), t.node_of(13)) == ("rack0.tray3.gpu1", 3, 0)
    assert t.device_id(85) == "rack1.tray3.gpu1" and t.hosts_per_node == 18
    assert t.route(0, 71, None) == ("rack0.tray0.gpu0", "rack0.switch", "rack0.tray17.gpu3")
    up = t._link_by_class("scale_up")
    assert up.bw == pytest.approx(900e9) and up.latency == pytest.approx(3e-6)
    assert t.link(0, 72).bw == pytest.approx(50e9)


def test_multi_host_domain_and_full_mesh(tmp_path):
    """mlu290-pod32: boxes of 4 chips on a box switch, the 8 boxes of a POD in a full mesh (28
    box pairs); a route between boxes goes chip -> box switch -> box switch -> chip. A full-mesh
    node of 8 (mlu590-mlulink) has 28 two-port link elements; a route is chip -> link -> chip, a
    link carries 300 / 7 GB/s."""
    pod = load_topology(ROOT / "topologies" / "mlu290-pod32.yaml", 1)
    g = pod.graph()
    assert kinds(g)["scale_up_switch"] == 8
    assert sum(1 for u, v in g.edges() if g.nodes[u]["kind"] == g.nodes[v]["kind"] == "scale_up_switch") == 28
    assert pod.route(0, 5, None) == ("pod0.xuansi0.mlu0", "pod0.xuansi0.switch", "pod0.xuansi1.switch", "pod0.xuansi1.mlu1")
    assert pod.link_class_name(0, 3) == "scale_up" and pod.link_class_name(0, 4) == "domain"
    assert pod._link_by_class("scale_up").bw == pytest.approx(200e9)
    mesh = load_topology(ROOT / "topologies" / "mlu590-mlulink.yaml", 1)
    g = mesh.graph()
    assert kinds(g) == {"device": 8, "scale_up_switch": 28, "nic": 8, "leaf": 1}
    assert mesh.route(6, 2, None) == ("node0.mlu6", "node0.link2-6", "node0.mlu2")
    assert mesh._link_by_class("scale_up").bw == pytest.approx(300e9 / 7)


# ---------------------------------------------------------------------------------------------
# torus and dragonfly

TORUS = """
    name: torus
    kind: torus
    dims: DIMS
    devices_per_router: DPR
    injection: {bandwidth: "200 GB/s", latency: "0.5 us"}
    links: {bandwidth: "50 GB/s", latency: "1 us"}
    collectives: {latency_model: none}
"""


def _torus(tmp_path, dims, dpr, nodes):
    return load_topology(write(tmp_path / "torus.yaml", TORUS.replace("DIMS", str(dims)).replace("DPR", str(dpr))), nodes)


def test_torus_counts_hops_and_classes(tmp_path):
    """4 x 3 x 2 torus with wrap-around, 2 devices per router, all 24 routers in use. Router links:
    x (k=4) 24, y (k=3) 24, z (k=2, one link per pair) 12 -> 60, plus 48 injection links.
    Hops = sum of per-dimension wrap-around distances: (0,0,0) -> (3,2,1) is 1 + 1 + 1 = 3,
    (0,0,0) -> (2,1,1) is 2 + 1 + 1 = 4. Classes: diameter 2 + 1 + 1 = 4 hops -> spine latency
    0.5 + 4 x 1 + 0.5 = 5 us; per-flow bandwidth 50 / 2 devices = 25 GB/s."""
    t = _torus(tmp_path, [4, 3, 2], 2, 24)
    g = t.graph()
    assert kinds(g) == {"router": 24, "device": 48}
    assert g.number_of_edges() == 60 + 48
    fab = t.fabric
    assert fab.hops(0, fab.index([3, 2, 1])) == 3 and fab.hops(0, fab.index([2, 1, 1])) == 4
    for r in range(24):
        p = t.route(0, 2 * r + 1, None)
        assert len(p) - 3 == fab.hops(0, r) and is_path(g, p)     # device, routers..., device
    assert [t.link_class_name(0, d) for d in (1, 2, 2 * fab.index([2, 1, 1]))] == ["scale_up", "leaf", "spine"]
    spine = t._link_by_class("spine")
    assert spine.bw == pytest.approx(25e9) and spine.latency == pytest.approx(5e-6)


def test_torus_ecmp_spreads_over_minimal_paths(tmp_path):
    """(0,0) -> (2,2) on a 4 x 4 torus: 2 + 2 hops, both directions of each dimension tie, so
    there are many minimal paths; flows spread over them, every one 4 hops long."""
    t = _torus(tmp_path, [4, 4], 1, 16)
    net = FlowNetwork(t, 0)
    routes = {net.route(0, 10, i) for i in range(40)}
    assert len(routes) > 4 and all(len(r) == 4 + 2 for r in routes)


def test_flow_all_reduce_on_a_torus_ring_matches_the_closed_form(tmp_path):
    """Ring all-reduce over the 8 routers of one x-ring of an 8 x 2 torus (one chip each, no
    protocol latency): every step each chip sends n/8 to its x-neighbour over its own one-hop link
    (the wrap link closes the ring), nothing contends: 2 (p-1) / p x n / 50 GB/s."""
    t = _torus(tmp_path, [8, 2], 1, 16)
    n, p = 64e6, 8
    ring = list(range(8))
    assert FlowNetwork(t).collective_time("all_reduce", n, [ring], "ring") == pytest.approx(2 * (p - 1) / p * n / 50e9, rel=1e-12)


def test_flow_all_reduce_in_an_nvl72_rack_matches_the_closed_form(tmp_path):
    """72 GPUs of one NVLink domain (18 trays x 4, one switch), 900 GB/s per GPU, efficiency 1, no
    protocol latency: each ring step is one flow out of and one into every GPU's switch link:
    2 x 71/72 x n / 900 GB/s."""
    t = load_topology(write(tmp_path / "nvl.yaml", """
        name: nvl
        kind: fat_tree
        devices_per_node: 72
        devices_per_host: 4
        node_label: rack
        host_label: tray
        scale_up: {bandwidth: "900 GB/s", latency: "3 us"}
        scale_out: {nics_per_node: 72, nic_bandwidth: "400 Gb/s", latency: "5 us", rail_optimized: true, rails: 4, nodes_per_leaf: 8}
        collectives: {latency_model: none}
    """), 1)
    n = 72e6
    assert FlowNetwork(t).collective_time("all_reduce", n, [list(range(72))], "ring") == pytest.approx(2 * 71 / 72 * n / 900e9, rel=1e-12)


DF = """
    name: df
    kind: dragonfly
    groups: 5
    routers_per_group: 4
    global_links_per_router: 1
    devices_per_router: 2
    injection: {bandwidth: "50 GB/s"}
    local_links: {bandwidth: "25 GB/s", latency: "0.5 us"}
    global_links: {bandwidth: "25 GB/s", latency: "2 us"}
"""


def test_dragonfly_counts_and_minimal_routes(tmp_path):
    """5 groups of 4 routers, 1 global link each: 4 global ports per group = 4 other groups, one
    link per group pair: 10 global links; local all-to-all 5 x 6 = 30; 20 routers x 2 devices.
    Every minimal route between groups crosses exactly one global link (at most 3 router hops);
    the spine class is the longest, local + global + local = 0.5 + 2 + 0.5 = 3 us."""
    t = load_topology(write(tmp_path / "df.yaml", DF), 20)
    g = t.graph()
    kinds_of_edges = {}
    for _, _, k in g.edges(data="kind"):
        kinds_of_edges[k] = kinds_of_edges.get(k, 0) + 1
    assert kinds(g) == {"router": 20, "device": 40}
    assert kinds_of_edges == {"local": 30, "global": 10, "injection": 40}
    for b in range(0, 40, 3):
        p = t.route(0, b, None)
        assert is_path(g, p)
        n_global = sum(g.edges[u, v]["kind"] == "global" for u, v in zip(p, p[1:]))
        assert n_global == (0 if t.leaf_of(b) == t.leaf_of(0) else 1) and len(p) - 2 <= 4
    assert t._link_by_class("spine").latency == pytest.approx(3e-6)
    assert t.link_class_name(0, 2) == "leaf" and t.link_class_name(0, 8) == "spine"


def test_dragonfly_with_too_few_global_ports_is_one_clear_error(tmp_path):
    """5 groups need 4 global ports per group; 1 router x 1 link is too few."""
    f = write(tmp_path / "bad.yaml", DF.replace("routers_per_group: 4", "routers_per_group: 1"))
    with pytest.raises(ConfigError, match=r"bad.yaml: global_links_per_router: a group has 1 x 1 = 1 global ports.*; use at least 4"):
        load_topology(f, 2)


# ---------------------------------------------------------------------------------------------
# explicit form and errors

def test_explicit_example_counts_and_classes():
    """explicit-example: 4 nodes x 2 GPUs, per node a switch and 2 NICs, 2 rail leaves, 1 spine:
    8 devices, 4 + 8 + 3 = 15 switches, 26 links. GPU 0 -> node 1 GPU 0 shares leaf0: 2.5 + 2.5 us;
    -> node 1 GPU 1 crosses the spine: + 2 x 0.5 us."""
    t = load_topology(ROOT / "topologies" / "explicit-example.yaml", 4)
    g = t.graph()
    assert kinds(g) == {"device": 8, "scale_up_switch": 4, "nic": 8, "leaf": 2, "spine": 1}
    assert g.number_of_edges() == 26
    assert [t.link_class_name(0, b) for b in (1, 2, 3)] == ["scale_up", "leaf", "spine"]
    assert t.link(0, 2).latency == pytest.approx(5e-6) and t.link(0, 3).latency == pytest.approx(6e-6)
    assert t.route(0, 1, None) == ("n0.gpu0", "n0.nvswitch", "n0.gpu1")


def test_explicit_bad_reference_names_its_key_path(tmp_path):
    text = (ROOT / "topologies" / "explicit-example.yaml").read_text().replace("b: leaf1, bandwidth", "b: leaf9, bandwidth", 1)
    f = tmp_path / "x.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=r"x.yaml: links\[\d+\]\.b: unknown element 'leaf9'; did you mean `leaf\d`\?"):
        load_topology(f, 4)


def _rail_only(tmp_path, transit: bool):
    """explicit-example without its spine: rail leaf k joins GPU k of every node, so GPU 0 of a
    node reaches GPU 1 of another only through a GPU (its node-mate over NVLink, or the peer's)."""
    text = "".join(line for line in (ROOT / "topologies" / "explicit-example.yaml").read_text().splitlines(True)
                   if "spine" not in line)
    return write(tmp_path / "rails.yaml", text + ("allow_device_transit: true\n" if transit else ""))


def test_explicit_pair_joined_only_through_a_device_is_refused(tmp_path):
    """Device 0 (n0.gpu0) reaches n0.gpu1 (NVSwitch) and n1.gpu0 (rail 0) directly, n1.gpu1 only
    through one of them: one error naming the pair, the device on the way and the fix."""
    f = _rail_only(tmp_path, False)
    with pytest.raises(ConfigError) as e:
        load_topology(f, 4)
    assert len(e.value.problems) == 1
    assert str(e.value) == (f"{f}: devices[3]: n0.gpu0 and n1.gpu1 are joined only through another device (n0.gpu1 "
                            "on the way), and a plan's communication group may need the pair; link both to a common "
                            "switch or NIC, or set `allow_device_transit: true` if the fabric forwards through devices "
                            "(e.g. PXN)")


def test_explicit_check_counts_only_the_domains_in_use(tmp_path):
    """On one node the rail-only fabric is fine: both GPUs share the node's NVSwitch."""
    assert load_topology(_rail_only(tmp_path, False), 1).num_devices == 2


@pytest.mark.parametrize("backend", ["analytical", "flow"])
def test_explicit_device_transit_when_allowed(tmp_path, backend):
    """With allow_device_transit the route n0.gpu0 -> n1.gpu1 is one of the two shortest paths
    through a GPU (6 hops: via rail 0 and n1.gpu0, or via n0.gpu1 and rail 1), and a dp 8 ring
    over every GPU runs under both backends (the flow backend routes its flows through the GPU)."""
    f = _rail_only(tmp_path, True)
    t = load_topology(f, 4)
    routes = t.fabric.paths("n0.gpu0", "n1.gpu1")
    assert routes == [("n0.gpu0", "n0.nic0", "leaf0", "n1.nic0", "n1.gpu0", "n1.nvswitch", "n1.gpu1"),
                      ("n0.gpu0", "n0.nvswitch", "n0.gpu1", "n0.nic1", "leaf1", "n1.nic1", "n1.gpu1")]
    assert t.route(0, 2) == ("n0.gpu0", "n0.nic0", "leaf0", "n1.nic0", "n1.gpu0")   # no transit where none is needed
    sc, topo = load_scenario(small_scenario(tmp_path, f, nodes=4, parallel={"tp": 1, "pp": 1, "dp": 8},
                                            network={"backend": backend}))
    r = simulate(sc, topo).result
    assert math.isfinite(r.step_time_s) and r.step_time_s > 0


@pytest.mark.parametrize("text, match", [
    (MP.replace("planes: 4", "planes: 3"), r"scale_out.planes: 3 planes do not divide the 4 NICs of a node.*; use a divisor of nics_per_node"),
    (FT3.replace("units_per_pod: 2, ", ""), r"scale_out.units_per_pod: a three-level fat-tree needs the number of leaf units per pod; add e.g."),
    (FT3.replace("core_oversubscription: 2", "core_oversubscription: 0.5"), r"scale_out.core_oversubscription: must be >= 1"),
    (TORUS.replace("DIMS", "[4, 0]").replace("DPR", "1"), r"dims: expected a list of 1 to 3 whole numbers >= 1, got \[4, 0\]; write e.g."),
    (TORUS.replace("DIMS", "[2, 2]").replace("DPR", "1"), r"dims: the 2 x 2 torus has 4 routers, but the scenario asks for 9 nodes.*; enlarge dims or set cluster.nodes to at most 4"),
    (MP.replace("devices_per_node: 4", "devices_per_node: 4\n    devices_per_host: 3"), r"devices_per_host: 3 devices per host do not divide"),
])
def test_bad_topology_input_is_one_clear_error(tmp_path, text, match):
    f = write(tmp_path / "bad.yaml", text)
    with pytest.raises(ConfigError, match=match) as e:
        load_topology(f, 9)
    assert str(e.value).startswith(f"{f}: ")


# ---------------------------------------------------------------------------------------------
# topology-aware placement

def _dp_crossings(grid, topo, place, classes):
    """dp ring hops (member i -> i+1, the last back to the first) whose link class is in `classes`."""
    n = 0
    for g in grid.groups("dp"):
        d = [place[r] for r in g]
        n += sum(topo.link_class_name(a, b) in classes for a, b in zip(d, d[1:] + d[:1]))
    return n


def _tp_crossing(grid, topo, place):
    return sum(len({topo.node_of(place[r]) for r in g}) > 1 for g in grid.groups("tp"))


def test_topology_aware_on_an_oversubscribed_two_tier_fabric():
    """dgx-a100-2to1 (16-node leaf units, 2:1), 48 nodes, tp 8, pp 4, dp 12: stage groups of 12
    nodes. Megatron puts stages 1 and 2 across two units each: 2 + 2 = 4 spine-crossing hops per
    dp ring set (one ring per GPU index, 8 of them): 32. Topology-aware (first fit) puts stages 0-2
    in units 0-2 and splits stage 3 over the three 4-node leftovers: 3 hops per index, 24. A seeded
    random placement crosses far more, and breaks tp groups."""
    t = load_topology(ROOT / "topologies" / "dgx-a100-2to1.yaml", 48)
    g = RankGrid(8, 1, 12, 4)
    ta = placement(g, t, "topology_aware")
    assert sorted(ta) == list(range(g.world)) and ta == placement(g, t, "topology_aware")
    rnd = placement(g, t, "random", 1)
    assert _dp_crossings(g, t, placement(g, t), {"spine"}) == 32
    assert _dp_crossings(g, t, ta, {"spine"}) == 24 < _dp_crossings(g, t, rnd, {"spine"})
    assert _tp_crossing(g, t, ta) == 0 < _tp_crossing(g, t, rnd)


def test_topology_aware_on_a_three_level_fabric(tmp_path):
    """FT3 with 12 nodes (3 pods of 4 nodes), tp 4 = one node, pp 4, dp 3: stage groups of 3 nodes.
    Pods first: stages 0, 1, 2 whole into pods 0, 1, 2 (1 node left in each), stage 3 split 1 + 1
    + 1 over them: its rings cross the core 3 times per GPU index (4 indices): 12. Megatron (stage
    s on nodes 3s..3s+2) puts stages 1 and 2 across two pods, 2 core hops each: 16. Random: more.
    dp peers keep their local GPU index, so every dp ring stays on one rail."""
    t = load_topology(write(tmp_path / "ft3.yaml", FT3), 12)
    g = RankGrid(4, 1, 3, 4)
    ta = placement(g, t, "topology_aware")
    assert sorted(ta) == list(range(g.world))
    assert _dp_crossings(g, t, placement(g, t), {"core"}) == 16
    assert _dp_crossings(g, t, ta, {"core"}) == 12
    rnd = placement(g, t, "random", 3)
    assert _dp_crossings(g, t, ta, {"spine", "core"}) < _dp_crossings(g, t, rnd, {"spine", "core"})
    assert _tp_crossing(g, t, ta) == 0
    assert all(len({ta[r] % 4 for r in grp}) == 1 for grp in g.groups("dp"))


def test_topology_aware_keeps_tp_in_an_nvl72_rack_and_dp_on_a_rail():
    """2 racks of 72, tp 8, dp 18, pp 1: 72 / 8 = 9 tp groups per rack, tp group j of a rack on
    GPUs 8j..8j+7, so no tp group leaves its rack; the stage's 18 tp groups fill both racks. A dp
    member with tp_rank t sits at local GPU 8j + t, whose NIC is on rail (8j + t) mod 4 = t mod 4:
    every dp ring stays on one rail, also on its hop from rack 0 to rack 1."""
    t = load_topology(ROOT / "topologies" / "gb200-nvl72.yaml", 2)
    g = RankGrid(8, 1, 18, 1)
    ta = placement(g, t, "topology_aware")
    assert sorted(ta) == list(range(g.world)) and _tp_crossing(g, t, ta) == 0
    assert all(len({t.fabric.nic_of(ta[r]) % 4 for r in grp}) == 1 for grp in g.groups("dp"))
    assert all(len({t.node_of(ta[r]) for r in grp}) == 2 for grp in g.groups("dp"))


def test_check_warns_when_tp_crosses_an_nvl72_rack(tmp_path, capsys):
    from simtrain.cli.main import main
    path = small_scenario(tmp_path, ROOT / "topologies" / "gb200-nvl72.yaml", nodes=2,
                          parallel={"tp": 8, "pp": 2, "dp": 9}, training={"global_batch_size": 36})
    assert main(["check", str(path), "--set", "parallel.placement=dp-pp-tp-cp"]) == 0
    out = capsys.readouterr().out
    assert "tensor-parallel groups cross a scale-up domain (rack of 18 trays x 4 = 72 gpus) boundary" in out
    assert "on racks 0, 1" in out


# ---------------------------------------------------------------------------------------------
# every shipped topology: real routes, no transit devices, and a scenario on both backends

@pytest.mark.parametrize("path", shipped_topologies(), ids=lambda p: p.stem)
def test_routes_are_real_paths_without_transit_devices(path):
    """From device 0 to a spread of devices (same domain, same leaf, other leaves), with ECMP: the
    route is a path of the graph, starts and ends at the two devices, and passes through no other
    device, except the PXN proxy of a multi-plane fabric, which is in the source's domain."""
    topo = load_topology(path, 4)
    g = topo.graph()
    net = FlowNetwork(topo, 5)
    D = topo.num_devices
    for b in sorted({1, topo.devices_per_node - 1, topo.devices_per_node, D // 2 + 1, D - 1} - {0}):
        links = net.route(0, b, ("probe", b))
        p = [links[0][0]] + [v for _, v in links]
        assert p[0] == topo.device_id(0) and p[-1] == topo.device_id(b) and is_path(g, p)
        inner = [x for x in p[1:-1] if g.nodes[x]["kind"] == "device"]
        assert all(topo.node_of(int_id(topo, x)) == 0 for x in inner) and len(inner) <= 1
        if inner:
            assert getattr(topo, "planes", 1) > 1


def int_id(topo, name):
    return next(d for d in range(topo.num_devices) if topo.device_id(d) == name)


def _plan(topo, nodes):
    world = nodes * topo.devices_per_node
    tp = max(x for x in (8, 4, 2, 1) if topo.devices_per_node % x == 0)
    pp = 2 if (world // tp) % 2 == 0 else 1
    dp = world // (tp * pp)
    return {"tp": tp, "pp": pp, "dp": dp}, {"global_batch_size": dp * 2 * pp}


@pytest.mark.parametrize("path", shipped_topologies(), ids=lambda p: p.stem)
def test_a_scenario_runs_on_every_shipped_topology_with_both_backends(tmp_path, path):
    from simtrain.simulate import simulate
    from simtrain.spec.loading import load_scenario
    par, tr = _plan(load_topology(path, 2), 2)
    f = small_scenario(tmp_path, path, nodes=2, parallel=par, training=tr)
    res = {}
    for backend in ("analytical", "flow"):
        sc, topo = load_scenario(f, [f"network.backend={backend}"])
        r = simulate(sc, topo).result
        assert r.step_time_s > 0 and r.num_devices == 2 * topo.devices_per_node
        res[backend] = r.step_time_s
    # placement: topology_aware gives a valid run too
    sc, topo = load_scenario(f)
    sc2 = dataclasses.replace(sc, parallel=dataclasses.replace(sc.parallel, placement="topology_aware"))
    assert simulate(sc2, topo).result.step_time_s > 0
    assert math.isfinite(res["flow"])
