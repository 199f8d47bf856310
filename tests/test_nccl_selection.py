"""NCCL's algorithm / protocol choice per size (simtrain.network.nccl_tuning).

Expected values: NCCL 2.22.3's own log of its choice and predicted time on 3 x 8 H100 (posted at
github.com/NVIDIA/nccl/issues/1453; shared/data/calibration/nccl-algorithms/nccl-1453-h100-3n-algo-selection.yaml), the
single-node H100 selection map of an NCCL 2.30 TUNING log (rakshith-h100-1n-nccl2.30.yaml,
qualitative), and hand derivations from the constants in nccl-tuning-constants-2.18-2.23.yaml.
"""
from __future__ import annotations

import pytest

from simtrain import resources
from simtrain.errors import ConfigError
from simtrain.hardware.topology import load_topology
from simtrain.network import nccl_tuning as nt
from simtrain.network.collectives import choose
from simtrain.plan.grid import GroupShape, group_shape
from simtrain.studies.validate import MIN_SIZE, busbw, layout, sweeps

# 3 nodes x 8 H100, 8 x 200 Gb/s NICs per node (25 GB/s each), NVLink4 450 GB/s per GPU, Intel host
X_H100_3N = nt.inputs_for(3, 24, 450.0, 8 * 25.0, compcap=2, version="2.22")

# (bytes, algorithm, protocol, NCCL's predicted time in us) as NCCL 2.22.3 logged them
LOG_H100_3N = [
    (256, "Tree", "LL", 25.229528),
    (512, "Tree", "LL", 25.259054),
    (65536, "Tree", "LL", 37.798233),
    (131072, "Tree", "LL128", 51.603912),
    (1048576, "NVLSTree", "Simple", 66.107201),
    (2097152, "NVLSTree", "Simple", 79.214401),
    (8589934592, "Ring", "Simple", 86069.968750),
]


def test_inputs_h100_3n():
    """16 channels; 200 GB/s of NICs over 16 channels is 12.5, snapped down to NCCL's SM90 inter
    speed 12; 450 / 16 = 28.1 snapped to the intra speed 24."""
    assert (X_H100_3N.channels, X_H100_3N.bw_inter, X_H100_3N.bw_intra) == (16, 12.0, 24.0)


@pytest.mark.parametrize("nbytes,algo,proto,logged", LOG_H100_3N)
def test_reproduces_nccl_2_22_log_on_3x8_h100(nbytes: int, algo: str, proto: str, logged: float):
    """The choice at each logged size is NCCL's, and the predicted time matches the logged one
    (the log prints 6 decimals of a float; 8 GiB to 1e-6 relative)."""
    a, p, t = nt.select("2.22", "all_reduce", nbytes, X_H100_3N)
    assert (a, p) == (algo, proto)
    assert t == pytest.approx(logged, rel=1e-6)


def test_tree_ll_hand_derivation():
    """256 B Tree/LL: latency 6.8 + 2 (7 x 0.6 + log2i(3) x 5.0) = 25.2 us; bus bandwidth
    min(16 x 12 x 0.92, 16 x 36) = 176.64 -> LL min(176.64 / 3.8, llMaxBw 20.4) = 20.4 -> x 0.85
    (tree pattern) -> x 0.5 (tree ratio) = 8.67 GB/s."""
    assert nt.latency("2.22", "all_reduce", "Tree", "LL", X_H100_3N) == pytest.approx(25.2)
    assert nt.bandwidth("2.22", "all_reduce", "Tree", "LL", X_H100_3N) == pytest.approx(20.4 * 0.85 * 0.5)


def test_pinned_ring_gives_ring():
    """NCCL_ALGO=Ring: Ring at every size; the protocol still by size (LL small, Simple big)."""
    algos = nt.parse_list("Ring", nt.NCCL_ALGOS, "network.nccl_algo")
    for nbytes, *_ in LOG_H100_3N:
        assert nt.select("2.22", "all_reduce", nbytes, X_H100_3N, algos)[0] == "Ring"
    assert nt.select("2.22", "all_reduce", 256, X_H100_3N, algos)[1] == "LL"
    assert nt.select("2.22", "all_reduce", 2 ** 33, X_H100_3N, algos)[1] == "Simple"


def test_exclusion_syntax():
    """'^LL128' removes LL128; at 128 KiB (Tree/LL128 unpinned) the tuner then takes the next
    fastest: Tree/LL 6.8 + 18.4 = 25.2 us + 131072 B / (8.67 GB/s x 0.6 (LL correction at
    128 KiB: 0.5)) ... which the ranking gives; anything but LL128."""
    protos = nt.parse_list("^LL128", nt.NCCL_PROTOS, "network.nccl_proto")
    assert protos == ("LL", "Simple")
    assert nt.select("2.22", "all_reduce", 131072, X_H100_3N, protos=protos)[1] != "LL128"
    assert nt.parse_list("ring,TREE", nt.NCCL_ALGOS, "x") == ("Tree", "Ring")
    with pytest.raises(ConfigError, match="network.nccl_algo: unknown name 'Rnig'"):
        nt.parse_list("Rnig", nt.NCCL_ALGOS, "network.nccl_algo")


def test_tree_simple_latency_by_version():
    """Tree/Simple latency on 3 x 8: 2.19-2.22 baseLat 0, hwLat NVLINK 28, NET 28:
    2 (7 x 28 + 1 x 28) = 448 us; 2.23 baseLat 8.4, NVLINK 4, NET 14: 8.4 + 2 (28 + 14) = 92.4 us;
    2.18 (2.18.3+) baseLat 0, NVLINK 4, NET 14: 84 us."""
    assert nt.latency("2.22", "all_reduce", "Tree", "Simple", X_H100_3N) == pytest.approx(448.0)
    assert nt.latency("2.23", "all_reduce", "Tree", "Simple", X_H100_3N) == pytest.approx(92.4)
    assert nt.latency("2.18", "all_reduce", "Tree", "Simple", X_H100_3N) == pytest.approx(84.0)


def test_ring_network_steps_by_version():
    """Ring/Simple all-reduce latency on 3 x 8 (before the 1.4 plateau factor): 46 steps; 2.22
    counts 2 x 3 = 6 network steps: 8.4 + 40 x 3.4 + 6 x 14 = 228.4 us; 2.23 counts 2 x 2 = 4:
    8.4 + 42 x 3.4 + 4 x 14 = 207.2 us."""
    assert nt.latency("2.22", "all_reduce", "Ring", "Simple", X_H100_3N) == pytest.approx(228.4)
    assert nt.latency("2.23", "all_reduce", "Ring", "Simple", X_H100_3N) == pytest.approx(207.2)


def test_ring_ll_bandwidth_by_version():
    """One node of 8 H100 (bwIntra 24, 16 channels, bus 384 GB/s): 2.20 Ring LL min(llMaxBw 87.7,
    384 / 4) = 87.7; 2.21 min(141, 384 / 2) = 141; algBw x 8/14."""
    x = nt.inputs_for(1, 8, 450.0, 0.0, version="2.21")
    assert nt.bandwidth("2.20", "all_reduce", "Ring", "LL", x) == pytest.approx(87.7 * 8 / 14)
    assert nt.bandwidth("2.21", "all_reduce", "Ring", "LL", x) == pytest.approx(141.0 * 8 / 14)


def test_one_node_h100_ring_ll_then_nvls():
    """One node of 8 H100, 2.23: Ring/LL up to 1 MiB, NVLS/Simple from 2 MiB, no Tree or LL128
    (the selection map an NCCL 2.30 TUNING log shows on that node; a later release, so this
    checks the switch, not times). At 1 MiB: Ring/LL 6.6 + 14 x 0.6 + 1 MiB / 80.57 GB/s = 28.01
    us against NVLS 25 + 1 MiB / 320 GB/s = 28.28 us."""
    x = nt.inputs_for(1, 8, 450.0, 0.0)
    for nbytes in (4096, 65536, 2 ** 20):
        assert nt.select("2.23", "all_reduce", nbytes, x)[:2] == ("Ring", "LL")
    for nbytes in (2 ** 21, 2 ** 27, 2 ** 32):
        assert nt.select("2.23", "all_reduce", nbytes, x)[:2] == ("NVLS", "Simple")


def test_disabled_pairs():
    """NVLSTree is off on one node, NVLS off across nodes (no CollNet), Tree and NVLS only for
    all-reduce, NVLS only with Simple."""
    one = nt.inputs_for(1, 8, 450.0, 0.0)
    assert nt.predicted_us("2.23", "all_reduce", 2 ** 20, "NVLSTree", "Simple", one) is None
    assert nt.predicted_us("2.23", "all_reduce", 2 ** 20, "NVLS", "Simple", X_H100_3N) is None
    assert nt.predicted_us("2.23", "all_gather", 2 ** 20, "Tree", "LL", X_H100_3N) is None
    assert nt.predicted_us("2.23", "all_reduce", 2 ** 20, "NVLS", "LL", one) is None


class _Net:
    def __init__(self, **kw: object):
        self.__dict__.update(kw)


def test_policy_from_scenario_keys():
    """env: NCCL_ALGO / NCCL_PROTO as a profile sets them; the explicit keys win."""
    p = nt.policy_of(_Net(nccl_version="2.22", nccl_algo=None, nccl_proto=None,
                          env={"NCCL_ALGO": "Ring,Tree", "NCCL_PROTO": "Simple"}))
    assert (p.version, p.algos, p.protos) == ("2.22", ("Tree", "Ring"), ("Simple",))
    p = nt.policy_of(_Net(nccl_version=None, nccl_algo="^NVLS,NVLSTree", nccl_proto=None, env={"NCCL_ALGO": "Ring"}))
    assert (p.version, p.algos) == (nt.LATEST, ("Tree", "Ring"))
    with pytest.raises(ConfigError, match="network.env.NCCL_PROTO"):
        nt.policy_of(_Net(nccl_version=None, nccl_algo=None, nccl_proto=None, env={"NCCL_PROTO": "^LL,LL128,Simple"}))


def test_choose_runs_the_pinned_algorithm_on_a_shipped_fabric():
    """On dgx-h100 over 2 nodes, with NCCL_ALGO=Ring and NCCL_PROTO=Simple, every size runs
    ring/Simple (simtrain's fastest choice without the policy differs at 1 MiB or above)."""
    topo = load_topology(resources.TOPOLOGIES / "dgx-h100.yaml", 2)
    g: GroupShape = group_shape(list(range(16)), topo)
    pol = nt.Policy("2.23", ("Ring",), ("Simple",))
    for nbytes in (2 ** 10, 2 ** 20, 2 ** 30):
        c = choose("all_reduce", nbytes, g, topo, nccl=pol)
        assert (c.algorithm, c.protocol) == ("ring", "Simple")


def test_version_spellings():
    """A quoted release, a full tag, NCCL's git tag and YAML's float (2.20 reads as 2.2)."""
    assert [nt.version_of(v) for v in ("2.22", "2.22.3", "v2.21.5-1", 2.2, 2.19, None)] == \
        ["2.22", "2.22", "2.21", "2.20", "2.19", nt.LATEST]
    with pytest.raises(ConfigError, match="network.nccl_version"):
        nt.version_of("2.17")


def test_pinning_bypasses_measured_tables():
    """A measured table (nccl-tests under NCCL's free choice) times auto; once NCCL_ALGO pins Ring
    the model's ring/Simple is used. The table here says 1 s for any size, so the two differ."""
    topo = load_topology(resources.TOPOLOGIES / "dgx-h100.yaml", 2)
    g = group_shape(list(range(16)), topo)
    table = ({"collective": "all_reduce", "ranks": 16, "nodes": 2,
              "points": [{"bytes": 1024, "time_us": 1e6}, {"bytes": 2 ** 31, "time_us": 1e6}]},)
    free = choose("all_reduce", 2 ** 20, g, topo, measured=table, nccl=nt.Policy())
    assert free.algorithm == "measured" and free.seconds == pytest.approx(1.0)
    pinned = choose("all_reduce", 2 ** 20, g, topo, measured=table, nccl=nt.Policy("2.23", ("Ring",)))
    assert pinned.algorithm == "ring" and pinned.seconds < 0.01


@pytest.mark.parametrize("sweep_id,version,algos", [
    ("nccl_vp_h100_1node_allreduce", "2.23", nt.MODELLED),      # stock NCCL (2.24.3 ran; 2.23 tabulated)
    ("nccl_azure_ndh200v5_allreduce", "2.20", ("NVLS",)),       # NCCL_ALGO=NVLS, NCCL 2.20.5
])
def test_one_node_sweeps_within_15_percent_with_nccls_choice(sweep_id: str, version: str, algos: tuple):
    """Published nccl-tests sweeps whose environment is known (validation/data/nccl-tests): with
    NCCL's tuner in that environment choosing, every size from 1 MiB is within 15 % of the
    measured busbw (docs/network-busbw.md; neither sweep was used to choose anything here)."""
    e, tname = next((e, t) for e, t in sweeps() if e["id"] == sweep_id)
    topo, _, shape = layout(e, tname)
    pol = nt.Policy(version, algos)
    for r in e["data"]:
        if r["bytes"] >= MIN_SIZE:
            bw = busbw(e, r["bytes"], choose("all_reduce", r["bytes"], shape, topo, nccl=pol).seconds)
            assert abs(bw / r["busbw_GBps"] - 1) <= 0.15, r["bytes"]


def test_choice_changes_between_releases():
    """Where the constants differ the choice does. 3 x 8 H100, 1 MiB all-reduce: 2.18's NVLSTree
    latency 23 + 2 (3 - 1) 19 = 99 us loses to Tree/LL128; from 2.19 NVLSTree is 23 (2.21: 25)
    + 2 x 14 us and wins: 2.19 23 + 28 + 1 MiB / 80 GB/s = 64.107 us. 2 x 8 H100, 256 MiB: 2.22
    counts 2 x 2 network ring steps, 2.23 2 x 1, which moves Ring/LL128 to Ring/Simple."""
    x = {v: nt.inputs_for(3, 24, 450.0, 200.0, version=v) for v in ("2.18", "2.19", "2.21")}
    assert nt.select("2.18", "all_reduce", 2 ** 20, x["2.18"])[:2] == ("Tree", "LL128")
    a, p, t = nt.select("2.19", "all_reduce", 2 ** 20, x["2.19"])
    assert (a, p) == ("NVLSTree", "Simple") and t == pytest.approx(23 + 28 + 2 ** 20 / 80e3)
    assert nt.select("2.21", "all_reduce", 2 ** 20, x["2.21"])[2] == pytest.approx(25 + 28 + 2 ** 20 / 80e3)
    two = nt.inputs_for(2, 16, 450.0, 200.0)
    assert nt.select("2.22", "all_reduce", 2 ** 28, two)[:2] == ("Ring", "LL128")
    assert nt.select("2.23", "all_reduce", 2 ** 28, two)[:2] == ("Ring", "Simple")
