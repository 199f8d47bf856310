"""Predicted against measured nccl-tests bus bandwidth (../shared/data/calibration/nccl_busbw.yaml).

    python benchmarks/busbw.py            # every sweep with a matching shipped topology, both backends

For each measured sweep (collective, GPU count, nodes) the group is laid out one node after the
other on the shipped topology of that GPU; the predicted time of the collective gives
busbw = size / time x (2(n-1)/n for all-reduce, (n-1)/n for all-gather), nccl-tests' formula
(doc/PERFORMANCE.md). Prints the error per size from 1 MiB up, and the mean absolute error.
The measurements only report error here; nothing is fitted to them.
"""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simtrain.collectives import PROTOCOLS, choose  # noqa: E402
from simtrain.flows import FlowNetwork  # noqa: E402
from simtrain.parallel import group_shape  # noqa: E402
from simtrain.topology import REPO_TOPOLOGIES, load_topology  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "calibration" / "nccl_busbw.yaml"
TOPOLOGY_OF = {"A100": "dgx-a100", "H100": "dgx-h100", "H200": "hgx-h200"}
FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n}


def sweeps():
    for e in yaml.safe_load(DATA.read_text()):
        if e.get("kind") != "sweep" or e.get("collective") not in FACTOR:
            continue
        gpu = (e.get("hardware") or {}).get("gpu", "")
        topo = next((t for k, t in TOPOLOGY_OF.items() if k in gpu), None)
        if topo:
            yield e, topo


def main() -> int:
    if not DATA.exists():
        print(f"{DATA} is absent; nothing to compare")
        return 0
    worst = []
    for e, tname in sweeps():
        n, nodes, coll = e["n_gpus"], e["n_nodes"], e["collective"]
        topo = load_topology(REPO_TOPOLOGIES / f"{tname}.yaml", nodes)
        per = n // nodes
        group = [node * topo.devices_per_node + j for node in range(nodes) for j in range(per)]
        shape = group_shape(group, topo)
        net = FlowNetwork(topo)
        print(f"\n{e['id']} ({coll}, {n} GPUs on {nodes} node(s), topology {tname}; confidence {e.get('confidence', '?')})")
        print(f"  {'size':>10} {'measured':>9} {'analytical':>10} {'err':>7} {'flow':>8} {'err':>7}   GB/s busbw; tuner's choice")
        errs = []
        for row in e["data"]:
            size = row["bytes"]
            if size < 2**20:
                continue
            meas = row["busbw_GBps"]
            pick = choose(coll, size, shape, topo)
            t_a = pick.seconds
            t_f = min(net.collective_time(coll, size, [group], "ring", pr) for pr in PROTOCOLS)
            bw_a = size / t_a * FACTOR[coll](n) / 1e9
            bw_f = size / t_f * FACTOR[coll](n) / 1e9
            ea, ef = bw_a / meas - 1, bw_f / meas - 1
            errs.append(abs(ea))
            print(f"  {size / 2**20:8.0f}Mi {meas:9.1f} {bw_a:10.1f} {100 * ea:+6.1f}% {bw_f:8.1f} {100 * ef:+6.1f}%"
                  f"   {pick.algorithm}/{pick.protocol}")
        mean = sum(errs) / len(errs)
        within = sum(1 for x in errs if x <= 0.15)
        print(f"  mean |error| {100 * mean:.1f} %, {within} of {len(errs)} sizes within 15 %")
        worst.append((e["id"], mean))
    print("\nmean |error| per sweep: " + ", ".join(f"{i} {100 * m:.1f} %" for i, m in worst))
    return 0


if __name__ == "__main__":
    sys.exit(main())
