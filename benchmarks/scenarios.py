"""Times every shipped scenario: median simulator wall time over several runs, and the prediction.

    python benchmarks/scenarios.py [--repeats 3] [scenarios/X.yaml ...]

Prints per scenario: ranks, simulated step time, MFU, bubble, simulated rank classes and ops, and
the median / min / max wall time of the whole pipeline (load excluded).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simtrain.rl.spec import is_rl_file  # noqa: E402
from simtrain.simulate import simulate  # noqa: E402
from simtrain.spec.loading import load_scenario  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenarios", nargs="*")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    # training steps only: RL job files (`job: rl`) are timed by benchmarks/rl_speed.py
    paths = [Path(p) for p in args.scenarios] or sorted(
        p for p in (ROOT / "scenarios").glob("*.yaml") if not is_rl_file(yaml.safe_load(p.read_text())))
    print(f"{'scenario':32s} {'ranks':>6s} {'step':>9s} {'MFU':>6s} {'bubble':>7s} {'classes':>7s} {'ops':>8s} "
          f"{'wall med':>9s} {'min':>7s} {'max':>7s}")
    for p in paths:
        sc, topo = load_scenario(p)
        walls = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            r = simulate(sc, topo).result
            walls.append(time.perf_counter() - t0)
        print(f"{p.stem:32s} {r.num_devices:6d} {r.step_time_s:8.3f}s {100 * r.mfu:5.1f}% "
              f"{100 * r.bubble_fraction:6.1f}% {r.simulated_classes:7d} {r.simulated_ops:8d} "
              f"{statistics.median(walls):8.2f}s {min(walls):6.2f}s {max(walls):6.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
