"""Predicted against measured nccl-tests bus bandwidth (../shared/data/calibration/nccl_busbw.yaml).

    python benchmarks/busbw.py            # every sweep with a matching shipped topology, both backends
    python benchmarks/busbw.py --fit-network-step nccl_vp_h100_4node_allreduce
                                          # the extra latency per network step that fits one sweep best

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

from simtrain.collectives import choose  # noqa: E402
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


def fit_network_step(sweep_id: str) -> int:
    """Grid search (0-60 us, 1 us steps) of `collectives.network_step_latency` on one multi-node
    sweep: the value with the smallest mean |busbw error| from 1 MiB up, every other fabric
    number as shipped. Fit on one collective, check on another of the same cluster."""
    import dataclasses
    e, tname = next((e, t) for e, t in sweeps() if e["id"] == sweep_id)
    n, nodes, coll = e["n_gpus"], e["n_nodes"], e["collective"]
    topo = load_topology(REPO_TOPOLOGIES / f"{tname}.yaml", nodes)
    shape = group_shape([node * topo.devices_per_node + j for node in range(nodes) for j in range(n // nodes)], topo)
    best = None
    for us in range(0, 61):
        c = dict(topo.collectives)
        c["network_step_latency"] = us * 1e-6
        t = dataclasses.replace(topo, collectives=tuple(sorted(c.items())))
        errs = [abs(r["bytes"] / choose(coll, r["bytes"], shape, t).seconds * FACTOR[coll](n) / 1e9 / r["busbw_GBps"] - 1)
                for r in e["data"] if r["bytes"] >= 2**20]
        m = sum(errs) / len(errs)
        if best is None or m < best[1]:
            best = (us, m)
    print(f"{sweep_id}: network_step_latency {best[0]} us gives mean |error| {100 * best[1]:.1f} %")
    return 0


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--fit-network-step":
        return fit_network_step(sys.argv[2])
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
            t_f = net.best(coll, size, [group], "ring")[0].seconds
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
    calibrated()
    return 0


# Sweeps measured on the same kind of fabric: a profile calibrated on one predicts the other
# (H100 and H200 share NVLink4 / NVSwitch gen 3). A100 and the multi-node clusters have no second
# sweep of the same collective on the same fabric, so they cannot be predicted out of sample.
SAME_FABRIC = {"nccl_vp_h100_1node_allreduce": "nccl_azure_ndh200v5_allreduce",
               "nccl_azure_ndh200v5_allreduce": "nccl_vp_h100_1node_allreduce"}


def table_of(e: dict) -> dict:
    """A profile's collective table built from one sweep, as simtrain calibrate builds it."""
    from simtrain.calibration.fit import fit_alpha_beta
    n = e["n_gpus"]
    f = FACTOR[e["collective"]](n)
    pts = [(r["bytes"], r["busbw_GBps"]) for r in e["data"] if r.get("busbw_GBps")]
    alpha, peak = fit_alpha_beta([(b * f, b * f / (bw * 1e9)) for b, bw in pts])
    return {"collective": e["collective"], "ranks": n, "nodes": e["n_nodes"], "alpha_us": alpha * 1e6,
            "peak_busbw_GBps": peak / 1e9,
            "points": [{"bytes": b, "busbw_GBps": bw, "time_us": b * f / (bw * 1e9) * 1e6} for b, bw in pts]}


def calibrated() -> None:
    """Out of sample: each sweep predicted from the profile table of the other sweep on the same fabric."""
    from simtrain.collectives import measured_cost
    by_id = {e["id"]: (e, t) for e, t in sweeps()}
    print("\ncalibrated, out of sample (table measured on the same fabric, another system):")
    for target, source in SAME_FABRIC.items():
        if target not in by_id or source not in by_id:
            continue
        e, tname = by_id[target]
        n, nodes, coll = e["n_gpus"], e["n_nodes"], e["collective"]
        topo = load_topology(REPO_TOPOLOGIES / f"{tname}.yaml", nodes)
        group = [node * topo.devices_per_node + j for node in range(nodes) for j in range(n // nodes)]
        shape = group_shape(group, topo)
        table = (table_of(by_id[source][0]),)
        errs = []
        line = []
        for row in e["data"]:
            if row["bytes"] < 2**20:
                continue
            cost, _ = measured_cost(coll, row["bytes"], shape, table)
            bw = row["bytes"] / cost.seconds * FACTOR[coll](n) / 1e9
            err = bw / row["busbw_GBps"] - 1
            errs.append(abs(err))
            line.append(f"{row['bytes'] / 2**20:.0f}Mi {100 * err:+.1f}%")
        print(f"  {target} from {source}: mean |error| {100 * sum(errs) / len(errs):.1f} %, worst {100 * max(errs):.1f} %, "
              f"{sum(1 for x in errs if x <= 0.15)} of {len(errs)} within 15 %")
        print("    " + ", ".join(line))


if __name__ == "__main__":
    sys.exit(main())
