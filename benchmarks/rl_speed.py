"""Times the RL iteration simulator: 100 iterations of a colocated 7B GRPO job on 32 GPUs.

    python benchmarks/rl_speed.py [runs] [iterations]

The job is scenarios/qwen2.5-7b-grpo-h20-32.yaml (Qwen2.5-7B, 32 x H20, vLLM tp 2 rollout, FSDP
actor, reference forward, 256 prompts x 8 responses) with placement.iterations = 100 (default).
Prints the median wall time of `simulate_rl` over the runs (default 3), the training-step
simulations it needed (passes of one shape are simulated once and reused) and the simulated step.
The target is under 10 s for the 100 iterations.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simtrain.rl.iteration import simulate_rl  # noqa: E402
from simtrain.rl.spec import load_rl_job  # noqa: E402


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    iters = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    job = load_rl_job(ROOT / "scenarios" / "qwen2.5-7b-grpo-h20-32.yaml", [f"placement.iterations={iters}"])
    walls, run = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        run = simulate_rl(job)
        walls.append(time.perf_counter() - t0)
    assert run is not None
    r = run.result
    print(f"{job.name}: {iters} iterations, {job.train_batch_size * job.n} responses each, placement {job.placement}")
    print(f"  wall: median {statistics.median(walls):.2f} s over {runs} runs ({', '.join(f'{w:.2f}' for w in walls)}); target < 10 s")
    print(f"  training-step simulations: {run.simulations} (cached by shape)")
    print(f"  simulated step {r.timing['step']:.1f} s (gen {r.timing['gen']:.1f} s, update_actor {r.timing['update_actor']:.1f} s), "
          f"{r.throughput:.0f} tokens/s per device")


if __name__ == "__main__":
    main()
