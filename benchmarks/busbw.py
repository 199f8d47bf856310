"""Predicted against measured nccl-tests bus bandwidth: the same as `simtrain validate busbw`
(simtrain/studies/validate.py; data in validation/data/nccl-tests).

    python benchmarks/busbw.py                      # every sweep with a shipped topology, both backends
    python benchmarks/busbw.py --fit network_step_latency nccl_vp_h100_4node_allreduce
    python benchmarks/busbw.py --fit nvls_chunk_cost nccl_vp_h100_1node_allreduce
    python benchmarks/busbw.py --nccl               # each sweep with its own NCCL release and environment

`--nccl` lets NCCL's tuner (simtrain.network.nccl_tuning) choose the algorithm and protocol of
every size, with the release and the NCCL_ALGO / NCCL_PROTO each sweep ran with (SWEEP_ENV), and
prints the signed error per size of the analytical and flow backends (docs/network-busbw.md).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simtrain.cli.main import main as simtrain  # noqa: E402
from simtrain.network.collectives import choose  # noqa: E402
from simtrain.network.flows import FlowNetwork  # noqa: E402
from simtrain.network.nccl_tuning import LATEST, MODELLED, NCCL_ALGOS, NCCL_PROTOS, Policy, parse_list  # noqa: E402
from simtrain.studies.validate import MIN_SIZE, busbw, layout, summary, sweeps  # noqa: E402

# Each sweep's NCCL release and environment, as its source states them
# (validation/data/nccl-tests/nccl_busbw.yaml `hardware.nccl`; shared/data/calibration/nccl-algorithms/).
# known: whether the environment that chose the algorithm is known: yes, no, or partly (the GCP
# profile also loads a tuner plugin whose decisions are not public: Ring,Tree / Simple is what is known).
SWEEP_ENV = {
    "nccl_vp_h100_1node_allreduce": {"release": "2.24.3", "version": "2.23", "env": {}, "known": "yes",
                                     "note": "NCCL 2.24.3, no NCCL_ALGO / NCCL_PROTO in the log; tuned with 2.23, the latest release tabulated"},
    "nccl_vp_h100_4node_allreduce": {"release": "2.24.3", "version": "2.23", "env": {}, "known": "yes",
                                     "note": "as the one-node sweep"},
    "nccl_vp_h100_4node_allgather": {"release": "2.24.3", "version": "2.23", "env": {}, "known": "yes",
                                     "note": "as the one-node sweep"},
    "nccl_gcp_h100_2node_allreduce": {"release": "2.21.5", "version": "2.21",
                                      "env": {"NCCL_ALGO": "Ring,Tree", "NCCL_PROTO": "Simple"}, "known": "partly",
                                      "note": "Google's TCPXO profile (NCCL_ALGO=Ring,Tree, NCCL_PROTO=Simple, NVLS off) and a tuner plugin "
                                              "whose choice between Ring and Tree is not public; NCCL 2.21.5 per the plugin's release notes"},
    "nccl_azure_nda100v4_allreduce": {"release": "2.18.5", "version": "2.18", "env": {}, "known": "no",
                                      "note": "labelled NVLS, which A100 cannot run: what ran is unknown; stock choice shown"},
    "nccl_azure_ndh200v5_allreduce": {"release": "2.20.5", "version": "2.20", "env": {"NCCL_ALGO": "NVLS"}, "known": "yes",
                                      "note": "the results page: NVLS algorithm"},
}


def policy(sweep_id: str, overrides: dict | None = None) -> Policy:
    e = SWEEP_ENV.get(sweep_id, {"version": LATEST, "env": {}})
    env = {**e["env"], **((overrides or {}).get(sweep_id) or {})}
    algos = tuple(a for a in parse_list(env.get("NCCL_ALGO"), NCCL_ALGOS, "NCCL_ALGO") if a in MODELLED)
    return Policy(e["version"], algos, parse_list(env.get("NCCL_PROTO"), NCCL_PROTOS, "NCCL_PROTO"))


def nccl_report(overrides: dict | None = None) -> int:
    """Every sweep with NCCL's tuner in the sweep's environment; `overrides` {sweep id: {NCCL_ALGO:
    ..., NCCL_PROTO: ...}} replaces what SWEEP_ENV says (a what-if, printed as such)."""
    table = []
    for e, tname in sweeps():
        topo, group, shape = layout(e, tname)
        pol = policy(e["id"], overrides)
        if overrides and e["id"] in overrides:
            print(f"\n(what-if: {e['id']} with {overrides[e['id']]} in place of its recorded environment)")
        flow = FlowNetwork(topo)
        info = SWEEP_ENV.get(e["id"], {"note": "environment not recorded", "known": "no"})
        print(f"\n{e['id']} ({e['collective']}, {e['n_gpus']} GPUs on {e['n_nodes']} node(s), {tname}); "
              f"NCCL {pol.version} tuner, NCCL_ALGO {','.join(pol.algos)}, NCCL_PROTO {','.join(pol.protos)}")
        print(f"  {info['note']}")
        print(f"  {'size':>8} {'measured':>9} {'analytical':>10} {'err':>7} {'flow':>8} {'err':>7}   NCCL's choice")
        ea, ef = [], []
        for r in e["data"]:
            size = r["bytes"]
            if size < MIN_SIZE:
                continue
            pick = choose(e["collective"], size, shape, topo, nccl=pol)
            bw_a = busbw(e, size, pick.seconds)
            bw_f = busbw(e, size, flow.select(e["collective"], size, [group], nccl=pol)[0].seconds)
            a, f = bw_a / r["busbw_GBps"] - 1, bw_f / r["busbw_GBps"] - 1
            ea.append(a)
            ef.append(f)
            mark = lambda x: " " if abs(x) <= 0.15 else "*"
            print(f"  {size / 2**20:6.0f}Mi {r['busbw_GBps']:9.1f} {bw_a:10.1f} {100 * a:+6.1f}%{mark(a)}"
                  f"{bw_f:8.1f} {100 * f:+6.1f}%{mark(f)}  {pick.algorithm}/{pick.protocol}")
        sa, sf = summary(ea), summary(ef)
        table.append((e["id"], info["known"], sa, sf))
    print("\nsummary, sizes from 1 MiB up within 15 % (NCCL's tuner, each sweep's environment):")
    for i, known, sa, sf in table:
        print(f"  {i:34s} env known: {known:6s} analytical {sa[0]:2d} of {sa[1]}, mean |err| "
              f"{100 * sa[2]:5.1f} %   flow {sf[0]:2d} of {sf[1]}, {100 * sf[2]:5.1f} %")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--nccl"]:
        # --nccl [SWEEP_ID:NCCL_ALGO=Tree ...]: what-if environments for named sweeps
        over: dict = {}
        for a in args[1:]:
            sid, kv = a.split(":", 1)
            k, v = kv.split("=", 1)
            over.setdefault(sid, {})[k] = v
        sys.exit(nccl_report(over))
    if len(args) == 2 and args[0] == "--fit-network-step":
        args = ["--fit", "network_step_latency", args[1]]
    sys.exit(simtrain(["validate", "busbw", *args]))
