"""Simulator speed at scale: one scenario family, 1,024 to 131,072 ranks.

    python benchmarks/scale.py [--repeats 5] [--sizes 8,16,...,1024] [--straggler-sizes 8,...,128]
                               [--straggler-fraction 0.01] [--straggler-repeats 3]

Llama-3-405B-class dense model (scenarios/llama3-405b-h100-16384.yaml: tp 8, pp 16, full
recompute, 1F1B), dp from 8 to 1,024 (1,024 to 131,072 H100), global batch 16 x dp so every
pipeline runs 16 microbatches. Per size, each run in a fresh process: the wall time of
`simulate` (median of the repeats; loading the scenario excluded), the ops run and the SimPy
events waited on, the peak resident memory of the process, and the ratio to the 1,024-rank
time. Then the same with a fraction of the devices 20 % slower (seeded), and the closed-form
estimate (simtrain.studies.estimate) timed the same way.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, resource, sys, time, yaml
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from simtrain.spec.loading import load_scenario
from simtrain.simulate import simulate
from simtrain.studies.estimate import estimate
dp, frac, what, tmp = int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
doc = yaml.safe_load(open(Path(sys.argv[1]) / "scenarios" / "llama3-405b-h100-16384.yaml"))
doc["parallel"]["dp"] = dp
doc["training"]["global_batch_size"] = 16 * dp * doc["training"]["micro_batch_size"]
doc["cluster"]["nodes"] = 16 * dp * doc["parallel"]["tp"] // 8
if frac > 0:
    doc["cluster"]["stragglers"] = [{"fraction": frac, "compute": 1.2}]
p = Path(tmp) / f"scale-{dp}-{frac}.yaml"
p.write_text(yaml.safe_dump(doc))
sc, topo = load_scenario(p)
t0 = time.perf_counter()
if what == "estimate":
    r = estimate(sc, topo)
    out = {"wall_s": time.perf_counter() - t0, "step_time_s": r["step_time_s"]}
else:
    run = simulate(sc, topo)
    out = {"wall_s": time.perf_counter() - t0, "step_time_s": run.result.step_time_s,
           "classes": run.result.simulated_classes, "ops": run.result.simulated_ops, "waits": run.timeline.waits}
    if frac > 0:
        out["without_s"] = run.result.stragglers.step_time_without_s
out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def measure(dp: int, frac: float, what: str, repeats: int, tmp: str) -> dict:
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), str(dp), str(frac), what, tmp],
                             capture_output=True, text=True, check=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    best = dict(runs[0])
    best["wall_s"] = statistics.median(r["wall_s"] for r in runs)
    best["rss_mb"] = max(r["rss_mb"] for r in runs)
    return best


def main() -> int:
    import tempfile
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sizes", default="8,16,32,64,128,256,512,1024", help="dp values (ranks = 128 x dp)")
    ap.add_argument("--straggler-sizes", default="8,32,128")
    ap.add_argument("--straggler-fraction", type=float, default=0.01)
    ap.add_argument("--straggler-repeats", type=int, default=3)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    sizes = [int(x) for x in a.sizes.split(",")]
    print(f"{'ranks':>8} {'wall s':>8} {'x 1,024':>8} {'classes':>8} {'ops':>7} {'events':>8} {'RSS MB':>8} {'step s':>8}  closed form")
    base = None
    for dp in sizes:
        r = measure(dp, 0.0, "simulate", a.repeats, tmp)
        e = measure(dp, 0.0, "estimate", a.repeats, tmp)
        base = base or r["wall_s"]
        print(f"{128 * dp:>8,} {r['wall_s']:>8.2f} {r['wall_s'] / base:>8.2f} {r['classes']:>8} {r['ops']:>7,} {r['waits']:>8,} "
              f"{r['rss_mb']:>8.0f} {r['step_time_s']:>8.3f}  {e['wall_s'] * 1e3:.0f} ms, {e['step_time_s']:.3f} s", flush=True)
    if a.straggler_sizes:
        print(f"\nwith {100 * a.straggler_fraction:g} % of the devices 20 % slower (median of {a.straggler_repeats}):")
        print(f"{'ranks':>8} {'wall s':>8} {'classes':>8} {'ops':>7} {'RSS MB':>8} {'step s':>8} {'without':>8}")
        for dp in [int(x) for x in a.straggler_sizes.split(",")]:
            r = measure(dp, a.straggler_fraction, "simulate", a.straggler_repeats, tmp)
            print(f"{128 * dp:>8,} {r['wall_s']:>8.2f} {r['classes']:>8} {r['ops']:>7,} {r['rss_mb']:>8.0f} "
                  f"{r['step_time_s']:>8.3f} {r['without_s']:>8.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
