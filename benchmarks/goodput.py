"""Benchmark of the job model: 1,000 trials of a 30-day run of the shipped 16,384-GPU scenario.

    python benchmarks/goodput.py [--trials 1000] [--jobs 2] [--days 30]

The step simulation runs once first (its wall time is printed apart); the Monte-Carlo is timed
from the first trial to the last result, with the worker processes' start included. Target:
under 10 s on 2 cores. It also prints the trials per second of one process and the
ratio of the parallel to the serial time.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simtrain.simulate import simulate  # noqa: E402
from simtrain.spec.loading import load_scenario  # noqa: E402
from simtrain.studies.reliability import model as M  # noqa: E402
from simtrain.studies.reliability.config import load_spec  # noqa: E402
from simtrain.studies.reliability.montecarlo import run_many, summarize  # noqa: E402
from simtrain.studies.reliability.study import auto_interval_steps  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default=str(ROOT / "scenarios" / "llama3-405b-h100-16384-goodput.yaml"))
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--days", type=float, default=30.0)
    ap.add_argument("--serial-trials", type=int, default=100, help="trials timed in one process for the per-trial cost")
    a = ap.parse_args()
    t = time.perf_counter()
    sc, topo = load_scenario(a.scenario)
    run = simulate(sc, topo)
    step_wall = time.perf_counter() - t
    spec = replace(load_spec(a.scenario), horizon_s=a.days * 86400.0)
    p = M.build(spec, sc, topo, run.result)
    n = auto_interval_steps(p)
    print(f"{sc.name}: step {p.step_time_s:.3f} s (step simulation {step_wall:.2f} s wall), MTBF {p.mtbf_s / 3600:.2f} h, "
          f"interval {n} steps, {os.cpu_count()} CPUs here")
    t = time.perf_counter()
    run_many([("s", p, n)], a.serial_trials, spec.seed, jobs=1)
    serial = (time.perf_counter() - t) / a.serial_trials
    t = time.perf_counter()
    res = run_many([("m", p, n)], a.trials, spec.seed, jobs=a.jobs)["m"]
    wall = time.perf_counter() - t
    s = summarize(res)
    print(f"  one process: {1e3 * serial:.2f} ms per {a.days:g}-day trial ({1 / serial:.0f} trials/s)")
    print(f"  {a.trials} trials on {a.jobs} processes: {wall:.2f} s wall (target < 10 s on 2 cores: "
          f"{'met' if wall < 10 and a.jobs <= 2 else 'not met' if a.jobs <= 2 else 'n/a'}); "
          f"speed-up over serial {serial * a.trials / wall:.2f}x")
    print(f"  goodput {100 * s['goodput']['mean']:.2f} % ± {100 * s['goodput']['ci95']:.2f} (p5 {100 * s['goodput']['p5']:.2f}, "
          f"p95 {100 * s['goodput']['p95']:.2f}), {s['interruptions']['mean']:.1f} interruptions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
