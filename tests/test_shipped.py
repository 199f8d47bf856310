"""Every shipped scenario and topology loads and runs; the JSON a run writes keeps its keys."""
import json
from pathlib import Path

import pytest
from conftest import ROOT, shipped_run, training_scenarios

from simtrain.cli.main import main
from simtrain.hardware.topology import load_topology, shipped_topologies
from simtrain.spec.loading import load_scenario

SCENARIOS = training_scenarios()


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_shipped_scenario_runs(path):
    sc, topo, run = shipped_run(path.stem)
    r = run.result
    assert r.step_time_s > 0
    assert 0 < r.mfu < 1
    assert r.num_devices == sc.world_size == topo.num_devices
    b = r.breakdown
    total = b.compute_s + b.bubble_s + sum(b.exposed_comm_s.values())
    assert total == pytest.approx(r.step_time_s, rel=1e-9)


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


# The JSON contract of `simtrain run --json` and result.json: every key path, in order, that the
# shipped scenarios produced before the result became a dataclass (lists: the union over their
# entries, "[]" marks one). A change here changes the files users parse.
COMMON_KEYS = [
    'scenario', 'step_time_s', 'tokens_per_s', 'mfu', 'hfu', 'model_flops_per_step', 'hardware_flops_per_step',
    'bubble_fraction', 'peak_memory_bytes', 'memory_capacity_bytes', 'memory_reserve_bytes', 'usable_memory_bytes',
    'fits_in_memory', 'memory_shortfall_bytes',
    'num_devices', 'num_microbatches', 'schedule', 'model_stages', 'device', 'precision', 'breakdown', 'breakdown.rank',
    'breakdown.stage', 'breakdown.compute_s', 'breakdown.bubble_s', 'breakdown.exposed_comm_s',
    'breakdown.exposed_comm_s.tp', 'breakdown.exposed_comm_s.cp', 'breakdown.exposed_comm_s.ep',
    'breakdown.exposed_comm_s.pp', 'breakdown.exposed_comm_s.dp',
    'breakdown.compute_by_kind_s', 'breakdown.compute_by_kind_s.gemm', 'breakdown.compute_by_kind_s.attention', 'breakdown.compute_by_kind_s.recompute', 'breakdown.compute_by_kind_s.norm', 'breakdown.compute_by_kind_s.activation', 'breakdown.compute_by_kind_s.rotary', 'breakdown.compute_by_kind_s.fp8_cast', 'breakdown.compute_by_kind_s.loss', 'breakdown.compute_by_kind_s.moe_routing', 'breakdown.compute_by_kind_s.other_memory', 'breakdown.compute_by_kind_s.optimizer',
    'breakdown.device_time_by_kind_s', 'breakdown.device_time_by_kind_s.gemm', 'breakdown.device_time_by_kind_s.attention', 'breakdown.device_time_by_kind_s.recompute', 'breakdown.device_time_by_kind_s.norm', 'breakdown.device_time_by_kind_s.activation', 'breakdown.device_time_by_kind_s.rotary', 'breakdown.device_time_by_kind_s.fp8_cast', 'breakdown.device_time_by_kind_s.loss', 'breakdown.device_time_by_kind_s.moe_routing', 'breakdown.device_time_by_kind_s.other_memory',
    'stages', 'stages[].class', 'stages[].stage',
    'stages[].model_stages', 'stages[].layers', 'stages[].ranks', 'stages[].representative_rank', 'stages[].device',
    'stages[].compute_s', 'stages[].bubble_s', 'stages[].exposed_comm_s', 'stages[].exposed_comm_s.tp',
    'stages[].exposed_comm_s.cp', 'stages[].exposed_comm_s.ep', 'stages[].exposed_comm_s.pp', 'stages[].exposed_comm_s.dp',
    'memory', 'memory[].stage', 'memory[].weights', 'memory[].gradients', 'memory[].optimizer', 'memory[].activations',
    'memory[].communication_buffers', 'memory[].total', 'memory[].inflight_peak', 'memory[].inflight_microbatches_peak',
    'simulated_classes', 'simulated_ops', 'coverage', 'calibration_warnings', 'collectives', 'collectives[].kind',
    'collectives[].collective', 'collectives[].bytes', 'collectives[].group_size', 'collectives[].algorithm',
    'collectives[].protocol', 'collectives[].seconds', 'collectives[].latency_s', 'collectives[].transfer_s',
]
SECTION_KEYS = {
    "mixtral-8x7b-h100-64": [
        'moe', 'moe.num_experts', 'moe.top_k', 'moe.ep', 'moe.etp', 'moe.expert_dp', 'moe.routing', 'moe.capacity_factor',
        'moe.dropped_fraction_mean', 'moe.imbalance_max', 'moe.ep_bytes_per_rank_per_microbatch', 'moe.slowest_ep_rank',
        'moe.slowest_rank', 'moe.layers', 'moe.layers[].layer', 'moe.layers[].imbalance', 'moe.layers[].dropped_fraction',
        'moe.layers[].hottest_ep_rank',
    ],
    "llama3-70b-h100-512-stragglers": [
        'stragglers', 'stragglers.devices', 'stragglers.count', 'stragglers.step_time_without_s', 'stragglers.slowdown',
        'stragglers.critical_path', 'stragglers.critical_path[].class', 'stragglers.critical_path[].representative_rank',
        'stragglers.critical_path[].ranks', 'stragglers.critical_path[].stage', 'stragglers.critical_path[].device',
        'stragglers.critical_path[].seconds', 'stragglers.critical_path[].straggler',
        'stragglers.critical_path[].straggler_ranks', 'stragglers.critical_path[].factors',
        'stragglers.critical_path[].factors.compute', 'stragglers.critical_path[].factors.memory',
        'stragglers.critical_path[].factors.link',
    ],
    "llama3-70b-h100-128k-cp16": [
        'context_parallel', 'context_parallel.cp', 'context_parallel.cp_kind', 'context_parallel.tokens_per_rank',
        'context_parallel.bytes_sent_per_layer_forward', 'context_parallel.bytes_sent_per_layer_backward',
    ],
    "llama3-70b-a100-1024-placement": [
        'collectives[].stage', 'links', 'links.by_bytes', 'links.by_bytes[].link', 'links.by_bytes[].bytes',
        'links.by_bytes[].saturated_s', 'links.by_bytes[].capacity_bytes_per_s', 'links.by_saturated_time',
        'links.by_saturated_time[].link', 'links.by_saturated_time[].bytes', 'links.by_saturated_time[].saturated_s',
        'links.by_saturated_time[].capacity_bytes_per_s', 'links.scope',
    ],
}


def key_paths(d, pre: str = "") -> list:
    """Every key of a JSON value as a dotted path, in order; list entries merged under "[]"."""
    out = []
    if isinstance(d, dict):
        for k, v in d.items():
            p = f"{pre}.{k}" if pre else k
            out.append(p)
            out += [x for x in key_paths(v, p) if x not in out]
    elif isinstance(d, list):
        for v in d:
            out += [x for x in key_paths(v, pre + "[]") if x not in out]
    return out


@pytest.mark.parametrize("stem", ["gpt3-175b-a100-1024"] + sorted(SECTION_KEYS))
def test_run_json_keys_are_the_contract(stem, tmp_path, capsys):
    path = ROOT / "scenarios" / f"{stem}.yaml"
    want = COMMON_KEYS + SECTION_KEYS.get(stem, [])
    assert main(["run", str(path), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert key_paths(printed) == want + ["sim_wall_s"]
    if stem == "mixtral-8x7b-h100-64":           # result.json holds the same object (a fast scenario: --out draws too)
        assert main(["run", str(path), "--out", str(tmp_path / "o")]) == 0
        written = json.loads((tmp_path / "o" / "result.json").read_text())
        assert key_paths(written) == want
        printed.pop("sim_wall_s")
        assert written == printed
