"""Prediction error against measured Megatron-DeepSpeed iteration times on A100 clusters (vTrain).

Reads ../shared/data/vtrain/ground_truth_{multi,single}.csv (vTrain artifact, MICRO'24, MIT
licence), simulates every run with the settings the artifact states (GPT, vocabulary 50,257,
fp16, full activation recompute, 1F1B, gradient all-reduce after the backward pass, 8 A100 per
node, 800 Gb/s per node) with the shipped A100 profile and prints MAPE and the worst case, and
with --table every run (config, measured, predicted, error). Nothing is fitted to the
multi-node runs: the device and fabric numbers come from operator and collective
microbenchmarks, and the profile's per-operator overhead from the single-node runs.

    python benchmarks/vtrain_validation.py [--set multi|single|both] [--profile NAME|none] [--table] [--limit N] [--csv OUT.csv]
"""
from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simtrain.errors import Collector, SimtrainError  # noqa: E402
from simtrain.simulate import simulate  # noqa: E402
from simtrain.spec.loading import build_scenario  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "vtrain"


def rows(name: str):
    with open(DATA / f"ground_truth_{name}.csv", encoding="utf-8-sig") as f:
        for r in csv.DictReader(f):
            yield {k.strip(): v for k, v in r.items()}


def scenario(r: dict) -> dict:
    gpus = int(r["# GPUs"])
    return {
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
        "cluster": {"device": "a100-sxm4-80gb", "topology": str(ROOT / "topologies" / "vtrain-a100.yaml"),
                    "nodes": max(1, gpus // 8)},
    }, float(r["iteration time (ms)"]) / 1e3, gpus


def evaluate(name: str, limit: int | None, profile: str | None = "a100-megatron-deepspeed"):
    out = []
    for i, r in enumerate(rows(name)):
        if limit and i >= limit:
            break
        raw, measured, gpus = scenario(r)
        if profile:
            raw["cluster"]["device_profile"] = profile
        if gpus < 8:
            # single-node runs on fewer than 8 GPUs: a node of `gpus` devices
            raw["cluster"]["nodes"] = 1
        try:
            errs = Collector(raw["name"])
            if gpus < 8:
                raw["cluster"]["topology"] = _partial_node(gpus)
            sc, topo = build_scenario(raw, ROOT / "scenarios" / "x.yaml", errs)
            t0 = time.perf_counter()
            pred = simulate(sc, topo).result.step_time_s
            wall = time.perf_counter() - t0
        except SimtrainError as e:
            print(f"skip {raw['name']}: {e}", file=sys.stderr)
            continue
        out.append((raw["name"], gpus, measured, pred, abs(pred - measured) / measured, wall))
    return out


_partials: dict = {}


def _partial_node(gpus: int) -> str:
    """A one-node fabric with `gpus` A100s (the single-node set uses 2-8 GPUs of a DGX A100)."""
    if gpus not in _partials:
        import tempfile
        src = (ROOT / "topologies" / "vtrain-a100.yaml").read_text()
        text = src.replace("devices_per_node: 8", f"devices_per_node: {gpus}").replace("nics_per_node: 4", f"nics_per_node: {gpus if gpus < 4 else 4}")
        f = Path(tempfile.mkdtemp()) / f"vtrain-a100-{gpus}.yaml"
        f.write_text(text)
        _partials[gpus] = str(f)
    return _partials[gpus]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", choices=("multi", "single", "both"), default="multi")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--csv")
    ap.add_argument("--profile", default="a100-megatron-deepspeed", help="device profile (a shipped name or a file); none: the preset")
    ap.add_argument("--table", action="store_true", help="print every run")
    args = ap.parse_args()
    profile = None if args.profile == "none" else args.profile
    if not DATA.is_dir():
        print(f"{DATA} not found: the vTrain reference data is not available here", file=sys.stderr)
        return 2
    sets = ("multi", "single") if args.set == "both" else (args.set,)
    all_rows = []
    for s in sets:
        res = evaluate(s, args.limit, profile)
        all_rows += [(s,) + r for r in res]
        if args.table:
            print(f"{'run':48s} {'measured':>10} {'predicted':>10} {'error':>8}")
            for r in res:
                print(f"{r[0]:48s} {r[2]:9.3f}s {r[3]:9.3f}s {100 * (r[3] - r[2]) / r[2]:+7.1f}%")
        errs = [r[4] for r in res]
        worst = max(res, key=lambda r: r[4])
        print(f"{s}: {len(res)} runs, MAPE {100 * sum(errs) / len(errs):.2f} %, median APE "
              f"{100 * sorted(errs)[len(errs) // 2]:.2f} %, worst {100 * worst[4]:.1f} % ({worst[0]}: measured "
              f"{worst[2]:.3f} s, predicted {worst[3]:.3f} s); simulator wall {sum(r[5] for r in res):.1f} s")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["set", "run", "gpus", "measured_s", "predicted_s", "abs_pct_error", "sim_wall_s"])
            for r in all_rows:
                w.writerow([r[0], r[1], r[2], f"{r[3]:.4f}", f"{r[4]:.4f}", f"{100 * r[5]:.2f}", f"{r[6]:.3f}"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
