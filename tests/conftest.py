import functools
import textwrap
from pathlib import Path

import pytest

from simtrain.simulate import StepRun, simulate
from simtrain.spec.loading import load_scenario

ROOT = Path(__file__).resolve().parent.parent


def training_scenarios() -> list:
    """The shipped scenarios that describe a training step (RL job files, `job: rl`, are run by
    simtrain.rl and tested in tests/test_rl_*.py), sorted by path."""
    import yaml

    from simtrain.rl.spec import is_rl_file
    return sorted(p for p in (ROOT / "scenarios").glob("*.yaml") if not is_rl_file(yaml.safe_load(p.read_text())))


@functools.lru_cache(maxsize=None)
def shipped_run(stem: str) -> tuple:
    """A shipped scenario loaded and simulated once per test run: (scenario, topology, StepRun).
    Several test files check the same runs (they run, they are pinned); a run is deterministic, so
    they share it instead of simulating it again."""
    sc, topo = load_scenario(ROOT / "scenarios" / f"{stem}.yaml")
    run: StepRun = simulate(sc, topo)
    return sc, topo, run


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def fast_topology(tmp_path):
    """A fabric with zero latency and enormous bandwidth: communication is (numerically) free."""
    return write(tmp_path / "free.yaml", """
        name: free
        kind: two_tier
        devices_per_node: 4
        scale_up: {bandwidth: "1000000000 GB/s", latency: "0 us"}
        scale_out: {nics_per_node: 4, nic_bandwidth: "1000000000 GB/s", latency: "0 us"}
        collectives: {latency_model: none}
    """)


@pytest.fixture
def plain_topology(tmp_path):
    """Round numbers for hand derivations: 100 GB/s / 2 us scale-up, 10 GB/s / 5 us NICs, efficiency 1."""
    return write(tmp_path / "plain.yaml", """
        name: plain
        kind: two_tier
        devices_per_node: 4
        scale_up: {bandwidth: "100 GB/s", latency: "2 us"}
        scale_out: {nics_per_node: 4, nic_bandwidth: "80 Gb/s", latency: "5 us", nodes_per_leaf: 2, oversubscription: 2}
    """)


def node_topology(tmp_path, devices: int, bandwidth: str = "100 GB/s", latency: str = "2 us",
                  nic: str = "100 Gb/s", ideal: bool = True) -> Path:
    """One-node fabric of `devices` devices on a scale-up switch (`ideal`: no protocol latencies)."""
    return write(tmp_path / f"node{devices}-{bandwidth.split()[0]}.yaml", f"""
        name: node{devices}
        kind: two_tier
        devices_per_node: {devices}
        scale_up: {{bandwidth: "{bandwidth}", latency: "{latency}"}}
        scale_out: {{nics_per_node: {min(devices, 2)}, nic_bandwidth: "{nic}", latency: "5 us"}}
        {"collectives: {latency_model: none}" if ideal else ""}
    """)


def small_scenario(tmp_path, topo: Path, **over) -> Path:
    """A small GPT (h 256, 8 layers, 8 heads, vocab 1024, seq 128) on 1 node of 4 devices, all of
    the same speed (`cluster.variability: none`, so closed forms over identical devices hold)."""
    par = {"tp": 1, "pp": 4, "dp": 1, "schedule": "1f1b"}
    par.update(over.pop("parallel", {}))
    tr = {"micro_batch_size": 1, "global_batch_size": 8, "precision": "bf16", "recompute": "none"}
    tr.update(over.pop("training", {}))
    nodes = over.pop("nodes", 1)
    import yaml
    doc = {
        "name": "small",
        "model": {"architecture": "gpt", "num_layers": 8, "hidden_size": 256, "num_attention_heads": 8,
                  "vocab_size": 1024, "seq_length": 128},
        "training": tr, "parallel": par,
        "cluster": {"device": "a100-sxm4-80gb", "topology": str(topo), "nodes": nodes, "variability": "none"},
    }
    doc.update(over)
    p = tmp_path / "small.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


class FlopCost:
    """Hand-derivable compute costs: GEMMs and attention at P FLOP/s, memory-bound operators free."""
    coverage: set = set()
    P = 1e15

    def __init__(self, P: float | None = None):
        if P is not None:
            self.P = P

    def duration(self, op):
        return op.flops / self.P

    def memory_time(self, nbytes):
        return 0.0

