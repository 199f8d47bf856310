"""Every shipped pipeline schedule on the big shipped scenarios: one comparison table each.

    python benchmarks/schedules.py                       # GPT-3 175B and Llama-3 405B, all schedules
    python benchmarks/schedules.py --scenario gpt3-175b-a100-1024 --out /tmp/cmp
    python benchmarks/schedules.py --small               # 1.5B GPT on 8 A100, gains over 1F1B

--small: a GPT-2-XL-shaped 1.5B model (48 layers, hidden 1600, 25 heads, vocab 50257, seq 1024;
Radford et al. 2019) on one DGX A100 (pp 8, microbatch 1, 32 microbatches), every pipeline
schedule's gain over 1F1B, the zero-bubble ones with and without optimizer post-validation.

What each plan needs for the multi-chunk and DualPipe schedules is in PLANS: the 405B plan's 126
layers split 3 + 30 x 4 + 3 over 32 stages for the 2-chunk schedules, and DualPipe needs >= 2·pp
microbatches, so the whole 405B comparison runs at global batch 4096 (32 microbatches) to keep
the rows comparable. Prints the table of `simtrain compare` plus the wall time of each variant
(median over --repeats runs).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simtrain.results.io import write_atomic  # noqa: E402
from simtrain.schedules import SCHEDULES  # noqa: E402
from simtrain.simulate import simulate  # noqa: E402
from simtrain.spec.loading import load_scenario  # noqa: E402
from simtrain.studies.compare import Row, compute_spans, figure, table, to_csv  # noqa: E402

SPLIT_405B = ["parallel.layers_per_stage=null", "parallel.first_stage_layers=3", "parallel.last_stage_layers=3"]
PLANS = {   # scenario -> (overrides for every variant, extra overrides per schedule)
    "gpt3-175b-a100-1024": ([], {}),
    "llama3-405b-h100-16384": (["training.global_batch_size=4096"],
                               {"interleaved_1f1b": SPLIT_405B, "zb_v": SPLIT_405B, "dualpipev": SPLIT_405B}),
}


SMALL = """name: gpt-1.5b-a100-8
model: {{architecture: gpt, num_layers: 48, hidden_size: 1600, num_attention_heads: 25, vocab_size: 50257, seq_length: 1024}}
training: {{micro_batch_size: 1, global_batch_size: 32, precision: bf16, recompute: none}}
parallel: {{tp: 1, pp: 8, dp: 1, schedule: 1f1b}}
cluster: {{device: a100-sxm4-80gb, topology: {topo}, nodes: 1}}
"""
SMALL_RUNS = [("1f1b", []), ("interleaved_1f1b", ["parallel.vpp=2"])] + [
    (s, [f"training.optimizer_post_validation={pv}"]) for s in ("zb_h1", "zb_h2", "zb_1p", "zb_2p", "zb_v")
    for pv in ("false", "true")]


def small() -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "gpt-1.5b-a100-8.yaml"
        path.write_text(SMALL.format(topo=ROOT / "topologies" / "dgx-a100.yaml"))
        base = None
        print("gpt-1.5b-a100-8 (pp 8, 32 microbatches)")
        for sched, over in SMALL_RUNS:
            sc, topo = load_scenario(path, [f"parallel.schedule={sched}"] + over)
            step = simulate(sc, topo).result.step_time_s
            base = base or step
            print(f"  {sched:17s} {' '.join(over):45s} step {step * 1e3:8.2f} ms  gain over 1f1b {100 * (base / step - 1):6.2f} %")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="the 1.5B GPT on 8 A100 only")
    ap.add_argument("--scenario", action="append", choices=sorted(PLANS))
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", help="write compare-<scenario>.csv / .png here")
    args = ap.parse_args()
    if args.small:
        small()
        return 0
    for name in args.scenario or sorted(PLANS):
        rows, walls = [], []
        common, extra = PLANS[name]
        for sched in SCHEDULES:
            over = common + [f"parallel.schedule={sched}"] + extra.get(sched, [])
            sc, topo = load_scenario(ROOT / "scenarios" / f"{name}.yaml", over)
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                run = simulate(sc, topo)
                times.append(time.perf_counter() - t0)
            row = Row(sched + (" (3 + 30x4 + 3 layers)" if sched in extra else ""), over, run.result)
            row.step, row.pp, row.spans = run.result.step_time_s, sc.parallel.pp, compute_spans(run)
            rows.append(row)
            walls.append((sched, statistics.median(times), run.result.simulated_ops))
        print(f"\n{name}" + (f" with {' '.join(common)}" if common else ""))
        print(table(rows))
        print("  wall per variant (median of %d): " % args.repeats + ", ".join(f"{s} {w:.1f} s ({n:,} ops)" for s, w, n in walls))
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            write_atomic(out / f"compare-{name}.csv", to_csv(rows).encode())
            figure(rows, out / f"compare-{name}.png", f"{name}: every shipped schedule")
    return 0


if __name__ == "__main__":
    sys.exit(main())
