"""Times the RL iteration simulator: 100 iterations of a colocated 7B GRPO job on 32 GPUs.

    python benchmarks/rl_speed.py [runs] [iterations] [scenario]

The job is scenarios/qwen2.5-7b-grpo-h20-32.yaml (Qwen2.5-7B, 32 x H20, vLLM tp 2 rollout, FSDP
actor, reference forward, 256 prompts x 8 responses) with placement.iterations = 100 (default);
`scenario` names another file of scenarios/ (e.g. deepseek-v3-grpo-h20-96 with 1 iteration).
Prints the median wall time of `simulate_rl` over the runs (default 3), the training-step
simulations it needed (passes of one shape are simulated once and reused) and the simulated step.
Targets: under 10 s for the 100 iterations of the 7B job, under 5 s for one iteration of the
DeepSeek-V3 job.

It then times the rollout of the first iteration's requests (`simulate_generation`, the part of
an RL iteration that dominated it) three ways, median of the same runs, so that the speed-up is
read as a ratio on the same (possibly shared) machine:
  fast       the default: decode stretches finish to finish from sorted arrays, decode
             iterations priced from scalars (docs/modelling/generation.md, "Bulk advance")
  bulk       stretch=False: one scheduler pass per bulk advance (the records are identical)
  reference  bulk=False: one scheduler iteration at a time (finish times agree to 1e-9 on the
             7B job; tests/test_rollout_fast.py)
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from simtrain.hardware.devices import get_device  # noqa: E402
from simtrain.rl.iteration import _sample, simulate_rl  # noqa: E402
from simtrain.rl.spec import RLJob, load_rl_job  # noqa: E402
from simtrain.rollout.engine import Request, simulate_generation  # noqa: E402


def rollout_walls(job: RLJob, runs: int) -> dict:
    """Median wall time of the first iteration's rollout under each path, and its results."""
    prompts, responses = _sample(job, 0)
    reqs = [Request(int(p), int(r)) for p, r in zip(prompts, responses)]
    model = job.roles["actor"].scenario.model
    dev = get_device(job.roles["actor"].scenario.cluster.device)
    out = {}
    for name, kw in (("fast", {}), ("bulk", {"stretch": False}), ("reference", {"bulk": False})):
        walls, res = [], None
        for _ in range(runs):
            t0 = time.perf_counter()
            res = simulate_generation(model, dev, job.rollout_topology, job.engine, reqs, **kw)
            walls.append(time.perf_counter() - t0)
        out[name] = (statistics.median(walls), res)
    return out


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    iters = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    scenario = sys.argv[3] if len(sys.argv) > 3 else "qwen2.5-7b-grpo-h20-32"
    job = load_rl_job(ROOT / "scenarios" / f"{scenario}.yaml", [f"placement.iterations={iters}"])
    walls, run = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        run = simulate_rl(job)
        walls.append(time.perf_counter() - t0)
    assert run is not None
    r = run.result
    target = "target < 10 s for 100 iterations of the 7B job, < 5 s for 1 of DeepSeek-V3"
    print(f"{job.name}: {iters} iteration{'s' if iters != 1 else ''}, {job.train_batch_size * job.n} responses each, placement {job.placement}")
    print(f"  wall: median {statistics.median(walls):.2f} s over {runs} runs ({', '.join(f'{w:.2f}' for w in walls)}); {target}")
    print(f"  training-step simulations: {run.simulations} (cached by shape)")
    print(f"  simulated step {r.timing['step']:.1f} s (gen {r.timing['gen']:.1f} s, update_actor {r.timing['update_actor']:.1f} s), "
          f"{r.throughput:.0f} tokens/s per device")
    g = rollout_walls(job, runs)
    ref_w, ref = g["reference"]
    print(f"  one rollout ({len(ref.finish_s)} requests, {ref.num_steps} scheduler iterations), median of {runs}:")
    for name in ("fast", "bulk", "reference"):
        w, res = g[name]
        err = float(np.max(np.abs(res.finish_s / ref.finish_s - 1)))
        print(f"    {name:9s} {w:7.3f} s  {ref_w / w:6.1f}x the reference  {len(res.iterations):6d} records  "
              f"max |finish / reference - 1| {err:.1e}")


if __name__ == "__main__":
    main()
