"""Times the rollout-engine simulator on an RL-sized rollout batch.

    python benchmarks/bench_generation.py [runs]

1,024 requests of a 7B model (Llama-2-7B dimensions: 32 layers, hidden 4096, 32 heads, FFN 11008,
vocabulary 32000) on one H100 with vLLM's default engine settings: prompts of 256..1,024 tokens,
responses long-tailed (lognormal, median ~1,100 tokens, capped at 8,192), seed 0. Prints the
median wall time of `simulate_generation` over the runs (default 5) and the simulated makespan,
iterations and preemptions. The target is well under 1 s per rollout batch, so an RL iteration
(rollout, scoring, training, weight sync) simulates in seconds.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simtrain.hardware.devices import get_device  # noqa: E402
from simtrain.rollout.engine import EngineConfig, Request, simulate_generation  # noqa: E402
from simtrain.spec.scenario import ModelSpec  # noqa: E402

LLAMA2_7B = ModelSpec(name="llama2-7b", architecture="llama", num_layers=32, hidden_size=4096, num_attention_heads=32,
                      num_key_value_heads=32, ffn_hidden_size=11008, vocab_size=32000, seq_length=4096)


def requests(n: int = 1024, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    prompts = rng.integers(256, 1025, n)
    out = np.minimum(8192, rng.lognormal(7.0, 1.0, n).astype(int) + 1)
    return [Request(int(p), int(o)) for p, o in zip(prompts, out)]


def main(runs: int = 5) -> None:
    dev, reqs = get_device("h100-sxm5-80gb"), requests()
    walls, res = [], None
    for _ in range(runs):
        t = time.perf_counter()
        res = simulate_generation(LLAMA2_7B, dev, None, EngineConfig(), reqs)
        walls.append(time.perf_counter() - t)
    print(f"1024 requests, 7B, H100: median {statistics.median(walls) * 1e3:.0f} ms over {runs} runs "
          f"(simulated makespan {res.makespan_s:.1f} s, {res.num_steps} iterations in {len(res.iterations)} records, "
          f"{res.preemptions} preemptions, {res.output_tokens_per_s:,.0f} output tok/s)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
