"""Every shipped scenario and topology loads and runs."""
from pathlib import Path

import pytest
from conftest import ROOT

from simtrain.hardware.topology import load_topology, shipped_topologies
from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario

SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_shipped_scenario_runs(path):
    sc, topo = load_scenario(path)
    r = simulate(sc, topo).result
    assert r["step_time_s"] > 0
    assert 0 < r["mfu"] < 1
    assert r["num_devices"] == sc.world_size == topo.num_devices
    b = r["breakdown"]
    total = b["compute_s"] + b["bubble_s"] + sum(b["exposed_comm_s"].values())
    assert total == pytest.approx(r["step_time_s"], rel=1e-9)


@pytest.mark.parametrize("path", shipped_topologies(), ids=lambda p: p.stem)
def test_shipped_topology_builds(path):
    topo = load_topology(path, nodes=4)
    g = topo.graph()
    assert sum(1 for _, k in g.nodes(data="kind") if k == "device") == 4 * topo.devices_per_node
    assert topo.link(0, topo.devices_per_node).bw > 0


def test_contract_scenario_shape():
    sc, topo = load_scenario(ROOT / "scenarios" / "gpt3-175b-a100-1024.yaml")
    assert sc.world_size == 1024 and sc.num_microbatches == 96


@pytest.mark.parametrize("name", sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "simtrain" / "data" / "profiles").glob("*.yaml")))
def test_shipped_profile_loads(name):
    """Every shipped device profile loads onto its base preset; measured collective tables carry
    their source."""
    from simtrain.hardware.devices import find_profile, load_profile
    dev = load_profile(str(find_profile(name, None)))
    assert dev.key == name
    for t in dev.collectives:
        assert t["source"] and t["points"]
