"""Predicted peak memory per GPU against published measurements (validation/data/memory/*.yaml):
one row per run with the signed error (predicted - measured) in GiB and in %.

    python benchmarks/memory_validation.py [--data FILE.yaml] [--csv OUT.csv]

Each row is simulated as written in its data file (model preset, sequence length, tp / cp / pp
/ dp, micro and global batch, ZeRO stage, the device and topology of the file; precision fp8 with
torchao's tensorwise recipe and full recompute unless the row says otherwise: `precision`,
`recompute`, `fusions`; the file's `loss_kernel`);
the prediction is result.json's peak_memory_bytes (the largest rank's weights + gradients +
optimizer + buffers + simulated activation peak), without the reserve.
"""
from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simtrain.simulate import simulate  # noqa: E402
from simtrain.spec.loading import load_scenario  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "validation" / "data" / "memory"
GiB = 2**30


def scenario(doc: dict, row: dict) -> dict:
    """The scenario of one data row."""
    nodes = max(row["gpus"] // 8, 1)
    return {
        "name": row["name"],
        "model": {"preset": row["model"], "seq_length": row["seq"]},
        "training": {"micro_batch_size": row["mbs"], "global_batch_size": row["gbs"],
                     **({"precision": "fp8", "fp8_recipe": "torchao_tensorwise"} if row.get("precision", "fp8") == "fp8"
                        else {"precision": row["precision"]}),
                     "recompute": row.get("recompute", "full"), **({"fusions": row["fusions"]} if "fusions" in row else {}),
                     **({"loss_kernel": doc["loss_kernel"]} if "loss_kernel" in doc else {})},
        "parallel": {"tp": row["tp"], "cp": row["cp"], "pp": row["pp"], "dp": row["dp"], "zero_stage": row["zero"],
                     "sequence_parallel": row["tp"] > 1, "schedule": "1f1b",
                     **({k: row[k] for k in ("first_stage_layers", "last_stage_layers") if k in row})},
        "cluster": {"device": doc["device"], "topology": doc["topology"], "nodes": nodes,
                    **({"memory_capacity": doc["memory_capacity"]} if "memory_capacity" in doc else {})},
    }


def evaluate(path: Path) -> list[dict]:
    doc = yaml.safe_load(path.read_text())
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for row in doc["rows"]:
            f = Path(tmp) / f"{row['name']}.yaml"
            f.write_text(yaml.safe_dump(scenario(doc, row), sort_keys=False))
            r = simulate(*load_scenario(f)).result
            pred = r.peak_memory_bytes / GiB
            err = pred - row["measured_gib"]
            out.append({"file": path.name, "name": row["name"], "table": row["table"], "measured_gib": row["measured_gib"],
                        "predicted_gib": round(pred, 2), "error_gib": round(err, 2),
                        "error_pct": round(100 * err / row["measured_gib"], 1), "config": row["config"]})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, action="append", help="a data file (default: every file under validation/data/memory)")
    ap.add_argument("--csv", type=Path, help="write the rows as CSV")
    a = ap.parse_args(argv)
    rows = [r for p in (a.data or sorted(DATA.glob("*.yaml"))) for r in evaluate(p)]
    print(f"{'row':<20} {'measured':>9} {'predicted':>10} {'error':>8} {'error':>7}")
    for r in rows:
        print(f"{r['name']:<20} {r['measured_gib']:>6.1f} GiB {r['predicted_gib']:>6.1f} GiB {r['error_gib']:>+5.1f} GiB {r['error_pct']:>+6.1f} %")
    if rows:
        mean_abs = sum(abs(r["error_pct"]) for r in rows) / len(rows)
        print(f"mean |error| {mean_abs:.1f} % over {len(rows)} rows")
    if a.csv:
        with open(a.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
