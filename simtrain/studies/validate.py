"""`simtrain validate`: the simulator against published measurements kept in the project
(resources.VALIDATION; sources and licences in the README beside each data set).

vtrain  Megatron-DeepSpeed iteration times on A100 clusters from the vTrain artifact (MICRO'24,
        MIT licence): 109 runs on 64-512 GPUs and 1,440 runs on one node. Every run is simulated
        with the settings the artifact states (GPT, vocabulary 50,257, fp16, full activation
        recompute, 1F1B, gradient all-reduce after the backward pass, 8 A100 per node, 800 Gb/s
        per node) on the shipped A100 profile; the report is MAPE, median and worst case, and with
        --table every run. Nothing is fitted to the multi-node runs: the device and fabric
        numbers come from operator and collective microbenchmarks, the profile's per-operator
        overhead from the single-node runs.

h100    Published H100 pre-training throughput (torchtitan benchmark tables, Megatron-Bridge's
        performance summary; validation/data/h100): each row that states every key the
        simulator needs is run as a user would, on the shipped H100 preset and profile
        (h100-sxm5-80gb, h100-public) and the shipped DGX H100 fabric. Rows the simulator cannot
        express (torch.compile, async TP, a key the source does not state) are listed as skipped
        with the reason. A development set: small, and nothing is fitted to it.

Every set's report gives MAPE, mean signed error (predicted - measured, over measured) and the
error against GPU count (a line per count, and the error at the largest count).

busbw   nccl-tests bus bandwidth of all-reduce and all-gather sweeps, each laid out one node after
        the other on the shipped topology of its system; predicted busbw = size / time x
        (2(n-1)/n all-reduce, (n-1)/n all-gather), nccl-tests' formula (doc/PERFORMANCE.md). The
        criterion is |error| <= 15 % at every size from 1 MiB up. Where a topology number was
        fitted on a sweep, the topology file says which; `--fit` reproduces such a fit and prints
        the out-of-sample errors on the other sweeps.
"""
from __future__ import annotations

import argparse
import copy
import csv
import dataclasses
import itertools
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple, TextIO

import yaml

from simtrain import progress, resources
from simtrain.calibration.fit import fit_alpha_beta
from simtrain.calibration.nccl_tests import bus_factor
from simtrain.errors import Collector, SimtrainError
from simtrain.hardware.topology import Topology, load_topology
from simtrain.network.collectives import choose, measured_cost
from simtrain.network.flows import FlowNetwork
from simtrain.plan.grid import GroupShape, group_shape
from simtrain.results.io import write_atomic
from simtrain.simulate import simulate
from simtrain.spec.loading import apply_overrides, build_scenario

VTRAIN = resources.VALIDATION / "vtrain"
NCCL_TESTS = resources.VALIDATION / "nccl-tests" / "nccl_busbw.yaml"
VTRAIN_PROFILE = "a100-megatron-deepspeed"
VTRAIN_TOPOLOGY = resources.TOPOLOGIES / "vtrain-a100.yaml"
VTRAIN_RUNS = {"multi": 109, "single": 1440}
VTRAIN_SETS = ("multi", "single", "both")
H100 = resources.VALIDATION / "h100" / "h100_training.yaml"
H100_DEVICE = "h100-sxm5-80gb"
H100_PROFILE = "h100-public"
H100_TOPOLOGY = "dgx-h100"
# the keys every row of the H100 set carries (None where the source does not state it: then the row says `skip`)
H100_KEYS = ("id", "source", "model", "gpus", "tp", "pp", "cp", "dp", "vpp", "zero_stage", "micro_batch", "global_batch",
             "seq_length", "precision", "recompute", "flash_attention", "tokens_per_s_per_gpu")


# --- vTrain iteration times --------------------------------------------------------------------

class Run(NamedTuple):
    name: str
    gpus: int
    measured_s: float
    predicted_s: float
    error: float            # |predicted - measured| / measured
    wall_s: float           # simulator wall time


def vtrain_rows(name: str) -> Iterator[dict]:
    """The rows of ground_truth_<name>.csv (name: multi or single), keys stripped."""
    with open(VTRAIN / f"ground_truth_{name}.csv", encoding="utf-8-sig") as f:
        for r in csv.DictReader(f):
            yield {k.strip(): v for k, v in r.items()}


def vtrain_scenario(r: dict) -> tuple[dict, float, int]:
    """(scenario document, measured step time in s, GPUs) of one vTrain run."""
    gpus = int(r["# GPUs"])
    doc = {
        "name": f"vtrain-{gpus}g-h{r['hidden size']}-l{r['# layers']}-t{r['tensor parallelism']}"
                f"d{r['data parallelism']}p{r['pipeline parallelism']}-mb{r['micro batch']}",
        "model": {"architecture": "gpt", "num_layers": int(r["# layers"]), "hidden_size": int(r["hidden size"]),
                  "num_attention_heads": int(r["attention heads"]), "vocab_size": 50257,
                  "seq_length": int(r["sequence length"]), "tie_embeddings": True},
        "training": {"micro_batch_size": int(r["micro batch"]), "global_batch_size": int(r["global batch"]),
                     "precision": "fp16", "recompute": "full", "flash_attention": False},
        "parallel": {"tp": int(r["tensor parallelism"]), "dp": int(r["data parallelism"]),
                     "pp": int(r["pipeline parallelism"]), "schedule": "1f1b", "overlap_grad_reduce": False,
                     "zero_stage": 0},
        "cluster": {"device": "a100-sxm4-80gb", "topology": str(VTRAIN_TOPOLOGY), "nodes": max(1, gpus // 8)},
    }
    return doc, float(r["iteration time (ms)"]) / 1e3, gpus


_partials: dict = {}
_partial_dir: tempfile.TemporaryDirectory | None = None


def _partial_node(gpus: int) -> str:
    """A one-node fabric of `gpus` A100s (the single-node set uses 2-8 GPUs of a DGX A100)."""
    global _partial_dir
    if gpus not in _partials:
        if _partial_dir is None:
            _partial_dir = tempfile.TemporaryDirectory(prefix="simtrain-vtrain-")
        text = VTRAIN_TOPOLOGY.read_text().replace("devices_per_node: 8", f"devices_per_node: {gpus}")
        text = text.replace("nics_per_node: 4", f"nics_per_node: {min(gpus, 4)}")
        f = Path(_partial_dir.name) / f"vtrain-a100-{gpus}.yaml"
        f.write_text(text)
        _partials[gpus] = str(f)
    return _partials[gpus]


def evaluate_vtrain(name: str, limit: int | None = None, profile: str | None = VTRAIN_PROFILE,
                   overrides: Sequence[str] = ()) -> list[Run]:
    """Simulates the runs of one set (multi or single; the first `limit` of them) with `profile`
    (a shipped profile name or a file; None: the bare device preset) and `--set` `overrides`
    applied to every run's scenario (a malformed one raises before anything is simulated)."""
    out = []
    total = min(limit or VTRAIN_RUNS[name], VTRAIN_RUNS[name])
    for i, r in enumerate(progress.track(vtrain_rows(name), total, f"vtrain {name}", "run")):
        if limit and i >= limit:
            break
        raw, measured, gpus = vtrain_scenario(r)
        if profile:
            raw["cluster"]["device_profile"] = profile
        if gpus < 8:
            raw["cluster"]["nodes"] = 1
            raw["cluster"]["topology"] = _partial_node(gpus)
        if overrides:
            errs = Collector("--set")
            raw = apply_overrides(raw, overrides, errs)
            errs.raise_if_any()
            if i == 0:     # an override the scenario rejects fails every run: say so once
                build_scenario(copy.deepcopy(raw), Path.cwd() / f"{raw['name']}.yaml", Collector(raw["name"]))
        try:
            sc, topo = build_scenario(raw, Path.cwd() / f"{raw['name']}.yaml", Collector(raw["name"]))
            t0 = time.perf_counter()
            pred = simulate(sc, topo).result.step_time_s
            wall = time.perf_counter() - t0
        except SimtrainError as e:
            print(f"skip {raw['name']}: {e}", file=sys.stderr)
            continue
        out.append(Run(raw["name"], gpus, measured, pred, abs(pred - measured) / measured, wall))
    return out


def mape(runs: list[Run]) -> float:
    """Mean absolute percentage error, as a fraction: mean of |predicted - measured| / measured."""
    return sum(r.error for r in runs) / len(runs)


def signed_error(r: Run) -> float:
    """(predicted - measured) / measured: positive when the simulator is slower than the run."""
    return (r.predicted_s - r.measured_s) / r.measured_s


def mean_signed(runs: list[Run]) -> float:
    """Mean signed error, as a fraction: the bias (positive: predicted step times too long)."""
    return sum(signed_error(r) for r in runs) / len(runs)


class Scale(NamedTuple):
    gpus: int
    runs: int
    mape: float
    mean_signed: float


def by_scale(runs: list[Run]) -> list[Scale]:
    """MAPE and mean signed error per GPU count, sorted by GPU count."""
    out = []
    for g in sorted({r.gpus for r in runs}):
        at = [r for r in runs if r.gpus == g]
        out.append(Scale(g, len(at), mape(at), mean_signed(at)))
    return out


def scale_lines(runs: list[Run]) -> list[str]:
    """The error-against-scale lines of a report: one per GPU count, then the largest count."""
    rows = by_scale(runs)
    lines = [f"  {'GPUs':>6} {'runs':>5} {'MAPE':>8} {'signed':>8}"]
    lines += [f"  {s.gpus:6d} {s.runs:5d} {100 * s.mape:7.2f}% {100 * s.mean_signed:+7.2f}%" for s in rows]
    top = rows[-1]
    lines.append(f"  largest count, {top.gpus} GPUs ({top.runs} run{'s' if top.runs != 1 else ''}): "
                 f"MAPE {100 * top.mape:.2f} %, mean signed {100 * top.mean_signed:+.2f} %")
    return lines


def vtrain_summary(name: str, runs: list[Run]) -> str:
    errs = sorted(r.error for r in runs)
    worst = max(runs, key=lambda r: r.error)
    return (f"{name}: {len(runs)} runs, MAPE {100 * mape(runs):.2f} %, median APE {100 * errs[len(errs) // 2]:.2f} %, "
            f"worst {100 * worst.error:.1f} % ({worst.name}: measured {worst.measured_s:.3f} s, predicted "
            f"{worst.predicted_s:.3f} s); mean signed error {100 * mean_signed(runs):+.2f} %; "
            f"simulator wall {sum(r.wall_s for r in runs):.1f} s")


def vtrain_report(sets: str = "multi", table: bool = False, profile: str | None = VTRAIN_PROFILE,
                  limit: int | None = None, csv_out: str | None = None, out: TextIO | None = None,
                  overrides: Sequence[str] = ()) -> dict:
    """Prints the report of `sets` (multi, single or both) on `out`; returns {set: runs}."""
    out = out or sys.stdout
    results = {}
    for s in (("multi", "single") if sets == "both" else (sets,)):
        runs = evaluate_vtrain(s, limit, profile, overrides)
        results[s] = runs
        if table:
            print(f"{'run':48s} {'measured':>10} {'predicted':>10} {'error':>8}", file=out)
            for r in runs:
                print(f"{r.name:48s} {r.measured_s:9.3f}s {r.predicted_s:9.3f}s "
                      f"{100 * (r.predicted_s - r.measured_s) / r.measured_s:+7.1f}%", file=out)
        print(vtrain_summary(s, runs), file=out)
        print("\n".join(scale_lines(runs)), file=out, flush=True)
    if csv_out:
        lines = ["set,run,gpus,measured_s,predicted_s,abs_pct_error,sim_wall_s"]
        lines += [f"{s},{r.name},{r.gpus},{r.measured_s:.4f},{r.predicted_s:.4f},{100 * r.error:.2f},{r.wall_s:.3f}"
                  for s, runs in results.items() for r in runs]
        write_atomic(Path(csv_out), ("\n".join(lines) + "\n").encode())
    return results


# --- H100 development set ----------------------------------------------------------------------

class Skipped(NamedTuple):
    name: str
    gpus: int
    reason: str


def h100_data(path: Path = H100) -> dict:
    """The H100 data file: {sources: {key: ...}, rows: [...]}."""
    return yaml.safe_load(Path(path).read_text(encoding="utf-8"))


def h100_measured_s(r: dict) -> float:
    """The measured step time of a row: global batch x sequence / (tokens/s/GPU x GPUs)."""
    return r["global_batch"] * r["seq_length"] / (r["tokens_per_s_per_gpu"] * r["gpus"])


def h100_scenario(r: dict, profile: str | None = H100_PROFILE, fusions: dict | None = None,
                  loss_kernel: str | None = None, device: str = H100_DEVICE) -> dict:
    """The scenario document a user writes for one row: the shipped model preset at the row's
    sequence length, the shipped preset of the H100 part the source ran on (`device`; its
    `profile`, if any) on the shipped DGX H100 fabric; `fusions`, the row's source's
    `eager_fusions` (the kernels its framework runs unfused without torch.compile),
    `loss_kernel` the source's cross-entropy implementation."""
    parallel = {"tp": r["tp"], "pp": r["pp"], "cp": r["cp"], "dp": r["dp"], "zero_stage": r["zero_stage"],
                "schedule": r.get("schedule", "1f1b"), "sequence_parallel": bool(r.get("sequence_parallel", False))}
    if r.get("vpp", 1) != 1:
        parallel["vpp"] = r["vpp"]
    if r.get("async_tp"):
        parallel["tp_comm_overlap"] = "async_tp"           # torchtitan's enable_async_tensor_parallel
    for key in ("tp_comm_overlap", "tp_comm_overlap_cfg", "account_for_embedding_in_pipeline_split",
                "account_for_loss_in_pipeline_split", "overlap_param_gather", "bucket_size_params"):
        if r.get(key):
            parallel[key] = r[key]
    cluster = {"device": device, "topology": H100_TOPOLOGY, "nodes": max(1, r["gpus"] // 8)}
    if profile:
        cluster["device_profile"] = profile
    training = {"micro_batch_size": r["micro_batch"], "global_batch_size": r["global_batch"],
                "precision": r["precision"], "recompute": r["recompute"], "flash_attention": bool(r["flash_attention"])}
    if r.get("fp8_recipe"):
        training["fp8_recipe"] = r["fp8_recipe"]
    if r.get("fp8_param_gather"):
        training["fp8_param_gather"] = True
    if fusions and not r.get("compile"):
        training["fusions"] = dict(fusions)     # the source's eager kernels (torch.compile off)
    if loss_kernel:
        training["loss_kernel"] = loss_kernel
    return {"name": f"h100-{r['id']}", "model": {"preset": r["model"], "seq_length": r["seq_length"]},
            "training": training, "parallel": parallel, "cluster": cluster}


def evaluate_h100(rows: Sequence[dict] | None = None, profile: str | None = H100_PROFILE,
                  overrides: Sequence[str] = ()) -> tuple[list[Run], list[Skipped]]:
    """Simulates every row of the H100 set (or `rows`) that the simulator can express; the
    others, and any the scenario checks reject, come back as Skipped with the reason. A row runs
    on its source's `device` preset (default the H100 SXM5's); `profile` applies to the rows on
    the H100 SXM5, the others take their source's `device_profile` (none: the preset alone)."""
    data = h100_data()
    rows = data["rows"] if rows is None else rows
    sources = data["sources"]
    runs, skipped = [], []
    for r in progress.track(rows, len(rows), "h100", "row"):
        if r.get("skip"):
            skipped.append(Skipped(r["id"], r["gpus"], r["skip"]))
            continue
        src = sources.get(r.get("source"), {})
        dev = src.get("device", H100_DEVICE)
        prof = profile if dev == H100_DEVICE else src.get("device_profile")
        raw = h100_scenario(r, prof, src.get("eager_fusions"), src.get("loss_kernel"), dev)
        try:
            if overrides:
                errs = Collector("--set")
                raw = apply_overrides(raw, overrides, errs)
                errs.raise_if_any()
            sc, topo = build_scenario(raw, Path.cwd() / f"{raw['name']}.yaml", Collector(raw["name"]))
            t0 = time.perf_counter()
            pred = simulate(sc, topo).result.step_time_s
            wall = time.perf_counter() - t0
        except SimtrainError as e:
            skipped.append(Skipped(r["id"], r["gpus"], f"the simulator rejects it: {e}"))
            continue
        measured = h100_measured_s(r)
        runs.append(Run(r["id"], r["gpus"], measured, pred, abs(pred - measured) / measured, wall))
    return runs, skipped


def h100_report(table: bool = False, profile: str | None = H100_PROFILE, csv_out: str | None = None,
                out: TextIO | None = None, overrides: Sequence[str] = ()) -> tuple[list[Run], list[Skipped]]:
    """Prints the H100 set's report on `out` (every run with --table, always the skipped rows)."""
    out = out or sys.stdout
    runs, skipped = evaluate_h100(None, profile, overrides)
    if table and runs:
        print(f"{'run':40s} {'GPUs':>5} {'measured':>10} {'predicted':>10} {'error':>8}", file=out)
        for r in runs:
            print(f"{r.name:40s} {r.gpus:5d} {r.measured_s:9.3f}s {r.predicted_s:9.3f}s {100 * signed_error(r):+7.1f}%", file=out)
    if runs:
        worst = max(runs, key=lambda r: r.error)
        print(f"h100 (development set): {len(runs)} runs, MAPE {100 * mape(runs):.2f} %, mean signed error "
              f"{100 * mean_signed(runs):+.2f} %, worst {100 * worst.error:.1f} % ({worst.name}: measured "
              f"{worst.measured_s:.3f} s, predicted {worst.predicted_s:.3f} s)", file=out)
        print("\n".join(scale_lines(runs)), file=out)
    else:
        print("h100 (development set): no run simulated", file=out)
    print(f"skipped {len(skipped)} rows:", file=out)
    for s in skipped:
        print(f"  {s.name} ({s.gpus} GPUs): {s.reason}", file=out)
    out.flush()
    if csv_out:
        lines = ["set,run,gpus,measured_s,predicted_s,signed_pct_error,sim_wall_s"]
        lines += [f"h100,{r.name},{r.gpus},{r.measured_s:.4f},{r.predicted_s:.4f},{100 * signed_error(r):.2f},{r.wall_s:.3f}"
                  for r in runs]
        write_atomic(Path(csv_out), ("\n".join(lines) + "\n").encode())
    return runs, skipped


# --- nccl-tests bus bandwidth ------------------------------------------------------------------

TOPOLOGY_OF = {"A100": "dgx-a100", "H100": "dgx-h100", "H200": "hgx-h200"}
# sweeps whose system is not the GPU's default fabric: the GCP A3 Mega (8 x 200 Gb/s
# GPUDirect-TCPXO NICs per VM, the sweep's `hardware.inter_node`)
TOPOLOGY_OF_SWEEP = {"nccl_gcp_h100_2node_allreduce": "gcp-a3-mega"}
COMPARED = ("all_reduce", "all_gather")      # the sweeps the busbw table compares
MIN_SIZE = 2 ** 20
TOLERANCE = 0.15
# the keys --fit may fit, with their grid in microseconds (start, stop, step)
FIT_GRID = {"network_step_latency": (0.0, 60.0, 1.0), "nvls_chunk_cost": (0.0, 12.0, 0.1)}
# Sweeps measured on the same kind of fabric: a profile calibrated on one predicts the other
# (H100 and H200 share NVLink4 / NVSwitch gen 3). A100 and the multi-node clusters have no second
# sweep of the same collective on the same fabric, so they cannot be predicted out of sample.
SAME_FABRIC = {"nccl_vp_h100_1node_allreduce": "nccl_azure_ndh200v5_allreduce",
               "nccl_azure_ndh200v5_allreduce": "nccl_vp_h100_1node_allreduce"}


def sweeps() -> Iterator[tuple[dict, str]]:
    """(sweep entry, topology name) of every usable sweep: all-reduce / all-gather, with a topology."""
    for e in yaml.safe_load(NCCL_TESTS.read_text()):
        if e.get("kind") != "sweep" or e.get("collective") not in COMPARED:
            continue
        gpu = (e.get("hardware") or {}).get("gpu", "")
        topo = TOPOLOGY_OF_SWEEP.get(e["id"]) or next((t for k, t in TOPOLOGY_OF.items() if k in gpu), None)
        if topo:
            yield e, topo


_topologies: dict = {}


def layout(e: dict, tname: str, collectives: dict | None = None) -> tuple[Topology, list[int], GroupShape]:
    """(topology, device group, group shape) of a sweep, with `collectives` keys overridden."""
    n, nodes = e["n_gpus"], e["n_nodes"]
    key = (tname, nodes)
    if key not in _topologies:
        _topologies[key] = load_topology(resources.TOPOLOGIES / f"{tname}.yaml", nodes)
    topo = _topologies[key]
    if collectives:
        c = dict(topo.collectives)
        c.update(collectives)
        topo = dataclasses.replace(topo, collectives=tuple(sorted(c.items())))
    group = [node * topo.devices_per_node + j for node in range(nodes) for j in range(n // nodes)]
    return topo, group, group_shape(group, topo)


def busbw(e: dict, size: float, seconds: float) -> float:
    return size / seconds * bus_factor(e["collective"], e["n_gpus"]) / 1e9


@dataclasses.dataclass
class Row:
    size: int
    measured: float
    analytical: float
    flow_backend: float | None     # busbw the flow backend predicts (None: not asked for)
    choice: str

    @property
    def err_a(self) -> float:
        return self.analytical / self.measured - 1

    @property
    def err_f(self) -> float | None:
        return None if self.flow_backend is None else self.flow_backend / self.measured - 1


def predict(e: dict, tname: str, flow: bool = True, collectives: dict | None = None) -> list[Row]:
    """Rows of predicted against measured busbw from 1 MiB up (flow: also the flow backend)."""
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


def fit(keys: list, sweep_id: str, out: TextIO | None = None) -> int:
    """Grid search of one or two `collectives` keys on one sweep (every other fabric number as
    shipped): the values with the smallest mean |busbw error| from 1 MiB up. In-sample on that
    sweep; every other sweep, on its own topology with the same values, is printed as an
    out-of-sample check beside its error as shipped."""
    out = out or sys.stdout
    bad = [k for k in keys if k not in FIT_GRID]
    if bad or not 1 <= len(keys) <= 2:
        print(f"--fit: one or two keys (comma-separated) among {', '.join(FIT_GRID)}", file=sys.stderr)
        return 2
    by_id = {e["id"]: (e, t) for e, t in sweeps()}
    if sweep_id not in by_id:
        print(f"--fit: unknown sweep {sweep_id!r}; one of {', '.join(by_id)}", file=sys.stderr)
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
          f"{100 * best[1]:.1f} % (as shipped: {w0} of {k0}, {100 * m0:.1f} %)", file=out)
    for other, (o, t) in by_id.items():
        if other == sweep_id:
            continue
        w0, k0, m0 = summary([r.err_a for r in predict(o, t, False)])
        w1, k1, m1 = summary([r.err_a for r in predict(o, t, False, over)])
        print(f"  {other} on {t} with these values in place of its own (out of sample): {w1} of {k1} "
              f"within 15 %, mean |error| {100 * m1:.1f} % (as shipped: {w0} of {k0}, {100 * m0:.1f} %)", file=out)
    return 0


def busbw_report(out: TextIO | None = None) -> list:
    """Prints every size of every sweep (both backends), a summary per sweep and the calibrated
    out-of-sample check; returns [(sweep id, topology, analytical summary, flow summary)]."""
    out = out or sys.stdout
    table = []
    todo = list(sweeps())
    for e, tname in progress.track(todo, len(todo), "busbw", "sweep"):
        n, nodes, coll = e["n_gpus"], e["n_nodes"], e["collective"]
        rows = predict(e, tname)
        print(f"\n{e['id']} ({coll}, {n} GPUs on {nodes} node(s), topology {tname}; confidence {e.get('confidence', '?')})", file=out)
        print(f"  {'size':>10} {'measured':>9} {'analytical':>10} {'err':>7} {'flow':>8} {'err':>7}   GB/s busbw; tuner's choice", file=out)
        mark = lambda x: " " if abs(x) <= TOLERANCE else "*"
        for r in rows:
            print(f"  {r.size / 2**20:8.0f}Mi {r.measured:9.1f} {r.analytical:10.1f} {100 * r.err_a:+6.1f}%{mark(r.err_a)}"
                  f"{r.flow_backend:8.1f} {100 * r.err_f:+6.1f}%{mark(r.err_f)}  {r.choice}", file=out)
        sa, sf = summary([r.err_a for r in rows]), summary([r.err_f for r in rows])
        print(f"  analytical: {sa[0]} of {sa[1]} sizes within 15 %, mean |error| {100 * sa[2]:.1f} %;  "
              f"flow: {sf[0]} of {sf[1]}, {100 * sf[2]:.1f} %   (* outside 15 %)", file=out)
        table.append((e["id"], tname, sa, sf))
    print("\nsummary, sizes from 1 MiB up within 15 % of the measured busbw:", file=out)
    print(f"  {'sweep':34s} {'topology':12s} {'analytical':>12s} {'mean':>7s} {'flow':>12s} {'mean':>7s}", file=out)
    for i, t, sa, sf in table:
        print(f"  {i:34s} {t:12s} {sa[0]:>5d} of {sa[1]:<3d} {100 * sa[2]:6.1f}% {sf[0]:>5d} of {sf[1]:<3d} {100 * sf[2]:6.1f}%", file=out)
    calibrated(out)
    return table


def table_of(e: dict) -> dict:
    """A profile's collective table built from one sweep, as simtrain calibrate builds it."""
    n = e["n_gpus"]
    f = bus_factor(e["collective"], n)
    pts = [(r["bytes"], r["busbw_GBps"]) for r in e["data"] if r.get("busbw_GBps")]
    alpha, peak = fit_alpha_beta([(b * f, b * f / (bw * 1e9)) for b, bw in pts])
    return {"collective": e["collective"], "ranks": n, "nodes": e["n_nodes"], "alpha_us": alpha * 1e6,
            "peak_busbw_GBps": peak / 1e9,
            "points": [{"bytes": b, "busbw_GBps": bw, "time_us": b * f / (bw * 1e9) * 1e6} for b, bw in pts]}


def calibrated(out: TextIO | None = None) -> None:
    """Out of sample: each sweep predicted from the profile table of the other sweep on the same fabric."""
    out = out or sys.stdout
    by_id = {e["id"]: (e, t) for e, t in sweeps()}
    print("\ncalibrated, out of sample (table measured on the same fabric, another system):", file=out)
    for target, source in SAME_FABRIC.items():
        if target not in by_id or source not in by_id:
            continue
        e, tname = by_id[target]
        _, _, shape = layout(e, tname)
        table = (table_of(by_id[source][0]),)
        errs, line = [], []
        for row in e["data"]:
            if row["bytes"] < MIN_SIZE:
                continue
            cost, _ = measured_cost(e["collective"], row["bytes"], shape, table)
            err = busbw(e, row["bytes"], cost.seconds) / row["busbw_GBps"] - 1
            errs.append(err)
            line.append(f"{row['bytes'] / 2**20:.0f}Mi {100 * err:+.1f}%")
        w, k, m = summary(errs)
        print(f"  {target} from {source}: mean |error| {100 * m:.1f} %, worst {100 * max(map(abs, errs)):.1f} %, "
              f"{w} of {k} within 15 %", file=out)
        print("    " + ", ".join(line), file=out)


# --- command line ------------------------------------------------------------------------------

def main(args: argparse.Namespace) -> int:
    """Entry of `simtrain validate vtrain|h100|busbw` (arguments: simtrain.cli.validate)."""
    if args.what == "h100":
        profile = None if args.profile == "none" else args.profile
        h100_report(args.table, profile, args.csv, overrides=args.set or ())
        return 0
    if args.what == "vtrain":
        profile = None if args.profile == "none" else args.profile
        runs, overrides = args.runs, []
        for v in args.set or ():
            if v in VTRAIN_SETS:         # the selector's former spelling, `--set both`
                print(f"note: `--set {v}` selects the runs as `--runs {v}` (use that: --set overrides scenario keys)", file=sys.stderr)
                runs = v
            else:
                overrides.append(v)
        vtrain_report(runs, args.table, profile, args.limit, args.csv, overrides=overrides)
        return 0
    if args.fit:
        keys, sweep_id = args.fit
        return fit(keys.split(","), sweep_id)
    busbw_report()
    return 0
