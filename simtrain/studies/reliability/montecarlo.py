"""Monte-Carlo over trials, in parallel processes, resumable (collect stage of the job model).

Trial i of a run uses the random streams SeedSequence([seed, i]) whatever process runs it, so
the number of processes never changes a result. Trials are grouped in chunks; each finished
chunk is written at once (atomically) under `store/<tag>-<key>/`, where key is a hash of every
input of the trial (JobParams, interval, seed, model version). A rerun after an interruption
reads the chunks already there and computes only the missing ones; a changed input has another
key, so stale chunks are never mixed in.

Statistics of a metric over n trials: mean, standard deviation, the 95 % confidence half-width
of the mean 1.96 sd / sqrt(n), and the 5th, 50th and 95th percentiles of the trials.
"""
from __future__ import annotations

import hashlib
import json
import math
import multiprocessing as mp
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simtrain import progress
from simtrain.results.io import write_atomic
from simtrain.studies.reliability.job import BUCKETS, run_trial

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from simtrain.studies.reliability.model import JobParams

MODEL_VERSION = "job-model-1"
CHUNK = 50


def task_key(p: JobParams, interval_steps: int, seed: int) -> str:
    text = f"{MODEL_VERSION}|{p!r}|{interval_steps}|{seed}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _work(job):
    tag, p, n, seed, lo, hi = job
    return tag, lo, hi, [run_trial(p, n, seed, i) for i in range(lo, hi)]


def _chunk_file(store: Path, tag: str, key: str, lo: int, hi: int) -> Path:
    return store / f"{tag}-{key}" / f"trials-{lo:06d}-{hi:06d}.json"


def run_many(tasks: Sequence[tuple[str, JobParams, int]], trials: int, seed: int, jobs: int = 1, store: Path | None = None,
             chunk: int = CHUNK, log: Callable[[str], None] | None = None) -> dict:
    """tasks: [(tag, JobParams, interval_steps)] -> {tag: [trial result, ...] in trial order}."""
    out = {tag: [None] * trials for tag, _, _ in tasks}
    todo = []
    keys = {}
    for tag, p, n in tasks:
        key = keys[tag] = task_key(p, n, seed)
        for lo in range(0, trials, chunk):
            hi = min(trials, lo + chunk)
            if store is not None:
                f = _chunk_file(store, tag, key, lo, hi)
                if f.is_file():
                    try:
                        d = json.loads(f.read_text())
                        if d.get("key") == key and len(d.get("trials", ())) == hi - lo:
                            out[tag][lo:hi] = d["trials"]
                            continue
                    except (OSError, ValueError):
                        pass           # unreadable: compute it again
            todo.append((tag, p, n, seed, lo, hi))

    def keep(tag, lo, hi, res):
        out[tag][lo:hi] = res
        if store is not None:
            f = _chunk_file(store, tag, keys[tag], lo, hi)
            write_atomic(f, json.dumps({"key": keys[tag], "seed": seed, "first": lo, "trials": res}).encode())

    done_before = sum(1 for tag in out for r in out[tag] if r is not None)
    if log and done_before:
        log(f"resuming: {done_before} trials read back from {store}")
    n_todo = sum(hi - lo for *_, lo, hi in todo)
    with progress.bar(n_todo, "reliability", "trial") as b:
        if jobs <= 1 or len(todo) <= 1:
            for job in todo:
                res = _work(job)
                keep(*res)
                b.update(res[2] - res[1])
        else:
            ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")
            with ctx.Pool(min(jobs, len(todo))) as pool:
                for res in pool.imap_unordered(_work, todo):
                    keep(*res)
                    b.update(res[2] - res[1])
    # JSON round trip, so results computed now and results read back from chunks are identical
    return {tag: json.loads(json.dumps(v)) for tag, v in out.items()}


def stats(values: Sequence[float]) -> dict:
    a = np.asarray(values, dtype=float)
    n = len(a)
    sd = float(a.std(ddof=1)) if n > 1 else 0.0
    p5, p50, p95 = (float(x) for x in np.percentile(a, [5, 50, 95]))
    return {"mean": float(a.mean()), "sd": sd, "ci95": 1.96 * sd / math.sqrt(n) if n > 1 else 0.0,
            "p5": p5, "p50": p50, "p95": p95, "n": n}


def summarize(results: list) -> dict:
    """Per-trial results -> statistics of goodput, time, interruptions and time lost per cause."""
    groups = sorted({g for r in results for g in r["by_group"]})
    cats = sorted({g for r in results for g in r["by_category"]})
    return {
        "goodput": stats([r["goodput"] for r in results]),
        "time_s": stats([r["time_s"] for r in results]),
        "tokens": stats([r["tokens"] for r in results]),
        "interruptions": stats([r["interruptions"] for r in results]),
        "planned_interruptions": stats([r["planned"] for r in results]),
        "lost_s": {k: stats([r["lost_s"][k] for r in results]) for k in BUCKETS if k != "useful"},
        "interruptions_by_group": {g: stats([r["by_group"].get(g, 0) for r in results]) for g in groups},
        "interruptions_by_category_mean": {c: float(np.mean([r["by_category"].get(c, 0) for r in results])) for c in cats},
        "storage_fallbacks_mean": float(np.mean([r["storage_fallbacks"] for r in results])),
        "spare_waits_mean": float(np.mean([r["spare_waits"] for r in results])),
        "min_dp": int(min(r["min_dp"] for r in results)),
    }
