"""Predicted against measured nccl-tests bus bandwidth (../shared/data/calibration/nccl_busbw.yaml).

    python benchmarks/busbw.py            # every sweep with a matching shipped topology, both backends:
                                          # the error per size from 1 MiB up and a summary per sweep
    python benchmarks/busbw.py --fit network_step_latency nccl_vp_h100_4node_allreduce
    python benchmarks/busbw.py --fit nvls_chunk_cost nccl_vp_h100_1node_allreduce
                                          # the values of one or two `collectives` keys that fit one
                                          # sweep best, and the error they give on the other sweeps
                                          # (out of sample)

For each measured sweep (collective, GPU count, nodes) the group is laid out one node after the
other on the shipped topology of that system; the predicted time of the collective gives
busbw = size / time x (2(n-1)/n for all-reduce, (n-1)/n for all-gather), nccl-tests' formula
(doc/PERFORMANCE.md). The criterion of issue 4 is |error| <= 15 % at every size from 1 MiB up.
Where a topology number was fitted on a sweep, the topology file says which; the fits are
reproduced by --fit, which also prints the out-of-sample errors.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simtrain.hardware.topology import REPO_TOPOLOGIES, load_topology  # noqa: E402
from simtrain.network.collectives import choose  # noqa: E402
from simtrain.network.flows import FlowNetwork  # noqa: E402
from simtrain.plan.grid import group_shape  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "calibration" / "nccl_busbw.yaml"
TOPOLOGY_OF = {"A100": "dgx-a100", "H100": "dgx-h100", "H200": "hgx-h200"}
# sweeps whose system is not the GPU's default fabric: the GCP A3 Mega (8 x 200 Gb/s
# GPUDirect-TCPXO NICs per VM, the sweep's `hardware.inter_node`)
TOPOLOGY_OF_SWEEP = {"nccl_gcp_h100_2node_allreduce": "gcp-a3-mega"}
FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n}
MIN_SIZE = 2 ** 20
TOLERANCE = 0.15
# the keys --fit may fit, with their grid in microseconds (start, stop, step)
FIT_GRID = {"network_step_latency": (0.0, 60.0, 1.0), "nvls_chunk_cost": (0.0, 12.0, 0.1)}


def sweeps():
    """(sweep entry, topology name) of every usable sweep: all-reduce / all-gather, with a topology."""
    for e in yaml.safe_load(DATA.read_text()):
        if e.get("kind") != "sweep" or e.get("collective") not in FACTOR:
            continue
        gpu = (e.get("hardware") or {}).get("gpu", "")
        topo = TOPOLOGY_OF_SWEEP.get(e["id"]) or next((t for k, t in TOPOLOGY_OF.items() if k in gpu), None)
        if topo:
            yield e, topo


_TOPOLOGIES: dict = {}


def layout(e: dict, tname: str, collectives: dict | None = None):
    """(topology, device group, group shape) of a sweep, with `collectives` keys overridden."""
    n, nodes = e["n_gpus"], e["n_nodes"]
    key = (tname, nodes)
    if key not in _TOPOLOGIES:
        _TOPOLOGIES[key] = load_topology(REPO_TOPOLOGIES / f"{tname}.yaml", nodes)
    topo = _TOPOLOGIES[key]
    if collectives:
        c = dict(topo.collectives)
        c.update(collectives)
        topo = dataclasses.replace(topo, collectives=tuple(sorted(c.items())))
    group = [node * topo.devices_per_node + j for node in range(nodes) for j in range(n // nodes)]
    return topo, group, group_shape(group, topo)


def busbw(e: dict, size: float, seconds: float) -> float:
    return size / seconds * FACTOR[e["collective"]](e["n_gpus"]) / 1e9


@dataclasses.dataclass
class Row:
    size: int
    measured: float
    analytical: float
    flow: float | None
    choice: str

    @property
    def err_a(self) -> float:
        return self.analytical / self.measured - 1

    @property
    def err_f(self) -> float | None:
        return None if self.flow is None else self.flow / self.measured - 1


def predict(e: dict, tname: str, flow: bool = True, collectives: dict | None = None) -> list:
    """Rows of predicted against measured busbw from 1 MiB up."""
    topo, group, shape = layout(e, tname, collectives)
    net = FlowNetwork(topo) if flow else None
    rows = []
    for r in e["data"]:
        size = r["bytes"]
        if size < MIN_SIZE:
            continue
        pick = choose(e["collective"], size, shape, topo)
        bw_f = busbw(e, size, net.select(e["collective"], size, [group])[0].seconds) if flow else None
        rows.append(Row(size, r["busbw_GBps"], busbw(e, size, pick.seconds), bw_f, f"{pick.algorithm}/{pick.protocol}"))
    return rows


def summary(errs: list) -> tuple:
    """(sizes within the tolerance, sizes, mean |error|)."""
    return sum(1 for x in errs if abs(x) <= TOLERANCE), len(errs), sum(abs(x) for x in errs) / len(errs)


def fit(keys: list, sweep_id: str) -> int:
    """Grid search of one or two `collectives` keys on one sweep (every other fabric number as
    shipped): the values with the smallest mean |busbw error| from 1 MiB up. In-sample on that
    sweep; every other sweep, on its own topology with the same values, is printed as an
    out-of-sample check beside its error as shipped."""
    import itertools
    bad = [k for k in keys if k not in FIT_GRID]
    if bad or not 1 <= len(keys) <= 2:
        print(f"--fit: one or two keys (comma-separated) among {', '.join(FIT_GRID)}")
        return 2
    by_id = {e["id"]: (e, t) for e, t in sweeps()}
    if sweep_id not in by_id:
        print(f"--fit: unknown sweep {sweep_id!r}; one of {', '.join(by_id)}")
        return 2
    e, tname = by_id[sweep_id]
    grids = []
    for k in keys:
        lo, hi, step = FIT_GRID[k]
        grids.append([lo + i * step for i in range(int(round((hi - lo) / step)) + 1)])
    best = None
    for values in itertools.product(*grids):
        over = {k: v * 1e-6 for k, v in zip(keys, values)}
        _, _, m = summary([r.err_a for r in predict(e, tname, False, over)])
        if best is None or m < best[1] - 1e-12:
            best = (values, m)
    over = {k: v * 1e-6 for k, v in zip(keys, best[0])}
    what = ", ".join(f"{k} {v:g} us" for k, v in zip(keys, best[0]))
    w0, k0, m0 = summary([r.err_a for r in predict(e, tname, False)])
    w1, k1, _ = summary([r.err_a for r in predict(e, tname, False, over)])
    print(f"{sweep_id} on {tname} (in sample): {what} gives {w1} of {k1} within 15 %, mean |error| "
          f"{100 * best[1]:.1f} % (as shipped: {w0} of {k0}, {100 * m0:.1f} %)")
    for other, (o, t) in by_id.items():
        if other == sweep_id:
            continue
        w0, k0, m0 = summary([r.err_a for r in predict(o, t, False)])
        w1, k1, m1 = summary([r.err_a for r in predict(o, t, False, over)])
        print(f"  {other} on {t} with these values in place of its own (out of sample): {w1} of {k1} "
              f"within 15 %, mean |error| {100 * m1:.1f} % (as shipped: {w0} of {k0}, {100 * m0:.1f} %)")
    return 0


def main() -> int:
    args = sys.argv[1:]
    if not DATA.exists():
        print(f"{DATA} is absent; nothing to compare")
        return 0
    if len(args) == 2 and args[0] == "--fit-network-step":
        return fit(["network_step_latency"], args[1])
    if len(args) == 3 and args[0] == "--fit":
        return fit(args[1].split(","), args[2])
    if args:
        print(__doc__)
        return 2
    table = []
    for e, tname in sweeps():
        n, nodes, coll = e["n_gpus"], e["n_nodes"], e["collective"]
        rows = predict(e, tname)
        print(f"\n{e['id']} ({coll}, {n} GPUs on {nodes} node(s), topology {tname}; confidence {e.get('confidence', '?')})")
        print(f"  {'size':>10} {'measured':>9} {'analytical':>10} {'err':>7} {'flow':>8} {'err':>7}   GB/s busbw; tuner's choice")
        for r in rows:
            mark = lambda x: " " if abs(x) <= TOLERANCE else "*"
            print(f"  {r.size / 2**20:8.0f}Mi {r.measured:9.1f} {r.analytical:10.1f} {100 * r.err_a:+6.1f}%{mark(r.err_a)}"
                  f"{r.flow:8.1f} {100 * r.err_f:+6.1f}%{mark(r.err_f)}  {r.choice}")
        sa, sf = summary([r.err_a for r in rows]), summary([r.err_f for r in rows])
        print(f"  analytical: {sa[0]} of {sa[1]} sizes within 15 %, mean |error| {100 * sa[2]:.1f} %;  "
              f"flow: {sf[0]} of {sf[1]}, {100 * sf[2]:.1f} %   (* outside 15 %)")
        table.append((e["id"], tname, sa, sf))
    print("\nsummary, sizes from 1 MiB up within 15 % of the measured busbw (criterion of issue 4):")
    print(f"  {'sweep':34s} {'topology':12s} {'analytical':>12s} {'mean':>7s} {'flow':>12s} {'mean':>7s}")
    for i, t, sa, sf in table:
        print(f"  {i:34s} {t:12s} {sa[0]:>5d} of {sa[1]:<3d} {100 * sa[2]:6.1f}% {sf[0]:>5d} of {sf[1]:<3d} {100 * sf[2]:6.1f}%")
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
    from simtrain.network.collectives import measured_cost
    by_id = {e["id"]: (e, t) for e, t in sweeps()}
    print("\ncalibrated, out of sample (table measured on the same fabric, another system):")
    for target, source in SAME_FABRIC.items():
        if target not in by_id or source not in by_id:
            continue
        e, tname = by_id[target]
        coll = e["collective"]
        _, _, shape = layout(e, tname)
        table = (table_of(by_id[source][0]),)
        errs = []
        line = []
        for row in e["data"]:
            if row["bytes"] < MIN_SIZE:
                continue
            cost, _ = measured_cost(coll, row["bytes"], shape, table)
            err = busbw(e, row["bytes"], cost.seconds) / row["busbw_GBps"] - 1
            errs.append(err)
            line.append(f"{row['bytes'] / 2**20:.0f}Mi {100 * err:+.1f}%")
        w, k, m = summary(errs)
        print(f"  {target} from {source}: mean |error| {100 * m:.1f} %, worst {100 * max(map(abs, errs)):.1f} %, "
              f"{w} of {k} within 15 %")
        print("    " + ", ".join(line))


if __name__ == "__main__":
    sys.exit(main())
