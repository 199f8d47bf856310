"""RL iterations (simtrain.rl.iteration): phase order, placements, long tails, host swaps, output."""
from __future__ import annotations

import copy
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simtrain.cli.rl import timeline_title
from simtrain.errors import Collector
from simtrain.hardware.devices import get_device
from simtrain.rl.iteration import TRAIN_PHASES, simulate_rl
from simtrain.rl.phases import VERL_ORDER
from simtrain.rl.spec import build_rl_job

sync = pytest.importorskip("simtrain.rl.sync")

ROOT = Path(__file__).resolve().parents[1]

BASE = {
    "job": "rl", "name": "t", "seed": 0,
    "cluster": {"device": "h20-96gb", "topology": "hgx-h20", "nodes": 2},
    "model": {"preset": "qwen2.5-math-1.5b"},
    "algorithm": {"estimator": "grpo", "use_kl_loss": True},
    "data": {"train_batch_size": 32, "n": 4, "max_prompt_length": 512, "max_response_length": 2048,
             "prompt_length": {"kind": "fixed", "tokens": 256}, "response_length": {"kind": "fixed", "tokens": 512}},
    "rollout": {"tp": 1, "gpu_memory_utilization": 0.5},
    "actor": {"ppo_mini_batch_size": 8, "use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 8192},
    "placement": {"kind": "colocated", "iterations": 3},
}


def job_of(**changes):
    raw = copy.deepcopy(BASE)
    for path, value in changes.items():
        node = raw
        *head, last = path.split("__")
        for k in head:
            node = node.setdefault(k, {})
        node[last] = value
    errs = Collector("job.yaml")
    job = build_rl_job(raw, ROOT / "job.yaml", errs)
    assert job is not None, [str(p) for p in errs.problems]
    return job


def test_colocated_phase_order_and_step_is_the_sum():
    """Colocated: one pool runs gen, reward, old_log_prob, ref, adv, update_actor, update_weights in
    verl's order, each starting when the one before ends, and a step is their sum."""
    run = simulate_rl(job_of())
    for k in range(3):
        sp = sorted((s for s in run.spans if s[2] == k), key=lambda s: s[3])
        names = [s[1] for s in sp]
        assert names == [p for p in VERL_ORDER if p in names]
        assert names[0] == "gen" and names[-1] == "update_weights" and "ref" in names
        for a, b in zip(sp, sp[1:]):
            assert b[3] == pytest.approx(a[4])
        row = run.result.iterations[k]
        assert row["timing_s/step"] == pytest.approx(sum(row.get(f"timing_s/{p}", 0.0) for p in VERL_ORDER))
    assert set(run.result.pools) == {"actor_rollout"}


def test_one_step_off_step_is_max_plus_sync():
    """With fixed lengths every iteration is the same; in steady state (k >= 1) the generation of
    k+1 overlaps the training on k, so step = max(gen, train) + update_weights, the last simulated
    iteration included (its update waits for the generation of the batch after the window)."""
    job = job_of(placement={"kind": "one_step_off", "rollout_devices": 8, "iterations": 4})
    run = simulate_rl(job)
    assert len([s for s in run.spans if s[1] == "gen"]) == 5
    for row in run.result.iterations[1:]:
        train = sum(row.get(f"timing_s/{p}", 0.0) for p in TRAIN_PHASES)
        expect = max(row["timing_s/gen"], train) + row["timing_s/update_weights"]
        assert row["timing_s/step"] == pytest.approx(expect, rel=1e-9)
    split = simulate_rl(job_of(placement={"kind": "split", "rollout_devices": 8, "iterations": 4}))
    assert run.result.timing["step"] < split.result.timing["step"]
    assert set(run.result.pools) == {"rollout", "train"}


LONG_TAIL = {"kind": "mixture", "components": [
    {"weight": 0.97, "kind": "fixed", "tokens": 200}, {"weight": 0.03, "kind": "fixed", "tokens": 2000}]}


def test_long_tail_sync_waits_for_the_longest_fully_async_does_not():
    """3 % of responses are 10x longer. Split (synchronous): gen lasts until the longest response
    ends, the finish time of a 2000-token request. Fully async (staleness 1): the trainer takes the
    first train_batch_size groups to finish, so its wait for data and its step are shorter."""
    pl = {"rollout_devices": 8, "iterations": 4, "staleness": 1}
    sync_run = simulate_rl(job_of(data__response_length=LONG_TAIL, placement={"kind": "split", **pl}))
    it = sync_run.result.iterations
    assert all(row["response_length/max"] == 2000 for row in it)
    gen_span = [s for s in sync_run.spans if s[1] == "gen" and s[2] == 1][0]
    assert it[1]["timing_s/gen"] == pytest.approx(gen_span[4] - gen_span[3])
    fa = simulate_rl(job_of(data__response_length=LONG_TAIL, placement={"kind": "fully_async", **pl}))
    assert fa.result.timing["gen"] < 0.5 * sync_run.result.timing["gen"]
    assert fa.result.timing["step"] < sync_run.result.timing["step"]


def test_staleness_zero_fully_async_is_not_faster_than_split():
    """staleness 0: batch j is only submitted after update j-1, so the stream is synchronous and
    the step cannot beat a split placement's (same phases, nothing overlaps)."""
    pl = {"rollout_devices": 8, "iterations": 3, "staleness": 0}
    fa = simulate_rl(job_of(data__response_length=LONG_TAIL, placement={"kind": "fully_async", **pl}))
    sp = simulate_rl(job_of(data__response_length=LONG_TAIL, placement={"kind": "split", **pl}))
    assert fa.result.timing["step"] >= 0.999 * sp.result.timing["step"]


def test_colocated_offload_swaps_by_hand():
    """actor.offload of params, grads and optimizer: the state goes to host before gen and back
    after it, 2 x bytes / host bandwidth more update_weights. The bytes per device by hand:
    qwen2.5-math-1.5b as modelled (llama form, tied embeddings, no QKV bias):
    P = 151936*1536 + 28*(1536*(1536+2*256) + 1536*1536 + 3*1536*8960 + 2*1536) + 1536;
    FSDP (ZeRO-3) over dp 16 with bf16 params (2 B), fp32 gradients (4 B) and fp32 Adam master,
    m and v (12 B): 18 B x P / 16 per device."""
    P = 151936 * 1536 + 28 * (1536 * (1536 + 2 * 256) + 1536 * 1536 + 3 * 1536 * 8960 + 2 * 1536) + 1536
    per_dev = 18 * P / 16
    on = simulate_rl(job_of(actor__offload={"params": True, "optimizer": True, "grads": True}))
    off = simulate_rl(job_of())
    bw = get_device("h20-96gb").host_bandwidth
    assert on.result.memory_detail["gen"]["offloaded_to_host"] == pytest.approx(per_dev, rel=0.02)
    d = on.result.timing["update_weights"] - off.result.timing["update_weights"]
    assert d == pytest.approx(2 * sync.swap_seconds(on.result.memory_detail["gen"]["offloaded_to_host"], get_device("h20-96gb")))
    assert d == pytest.approx(2 * per_dev / bw, rel=0.05)
    assert on.result.memory["gen"] < off.result.memory["gen"]


def _json(tmp_path: Path, seed: int = 0) -> str:
    f = tmp_path / f"job{seed}.yaml"
    raw = copy.deepcopy(BASE)
    raw["seed"] = seed
    raw["data"]["response_length"] = {"kind": "lognormal", "mean": 400, "sigma": 0.8}
    f.write_text(yaml.safe_dump(raw))
    out = subprocess.run([sys.executable, "-m", "simtrain", "run", str(f), "--json"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_json_has_verl_metric_names_and_is_reproducible(tmp_path):
    a = _json(tmp_path)
    d = json.loads(a)
    for k in ("timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/ref", "timing_s/values", "timing_s/adv",
              "timing_s/update_critic", "timing_s/update_actor", "timing_s/update_weights", "timing_s/step",
              "perf/throughput", "response_length/mean", "response_length/max", "response_length/clip_ratio",
              "pools", "memory", "iterations"):
        assert k in d, k
    assert d["timing_s/step"] > 0 and d["memory"]["gen"] > 0
    assert _json(tmp_path) == a                 # same seed: the same bytes
    assert _json(tmp_path, seed=1) != a         # another seed samples other lengths


def test_out_dir_files(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(BASE))
    out = subprocess.run([sys.executable, "-m", "simtrain", "run", str(f), "--out", str(tmp_path / "o")],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "timing" not in out.stdout and "gen" in out.stdout and "% of step" in out.stdout
    names = sorted(p.name for p in (tmp_path / "o").iterdir())
    assert names == sorted(["result.json", "scenario.resolved.yaml", "trace.json", "timeline.png", "run_info.json", "report.html"])
    tr = json.loads((tmp_path / "o" / "trace.json").read_text())
    assert {e["name"] for e in tr["traceEvents"] if e["ph"] == "X"} >= {"gen", "update_actor", "update_weights"}


def test_compare_on_an_rl_job_puts_placements_side_by_side(tmp_path):
    """`simtrain compare` of a job file: one row per variant with verl's phases. Split and
    one-step-off run the same phases on the same pools, so their gen and update_actor agree and the
    one-step-off step (max(gen, train) + sync) is the shorter; a variant that does not load is a row
    with its message and the command exits 2; compare.csv carries verl's metric names."""
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(BASE))
    out = tmp_path / "cmp"
    p = subprocess.run([sys.executable, "-m", "simtrain", "compare", str(f), "--set",
                        "placement.kind+placement.rollout_devices=split+8,one_step_off+8,split+7", "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "1 of 3 variants are invalid" in p.stderr
    rows = {r["variant"]: r for r in csv.DictReader((out / "compare.csv").open())}
    split = rows["placement.kind=split placement.rollout_devices=8"]
    off = rows["placement.kind=one_step_off placement.rollout_devices=8"]
    assert float(split["timing_s/gen"]) == pytest.approx(float(off["timing_s/gen"]))
    assert float(split["timing_s/update_actor"]) == pytest.approx(float(off["timing_s/update_actor"]))
    assert float(off["timing_s/step"]) < float(split["timing_s/step"])
    assert rows["placement.kind=split placement.rollout_devices=7"]["error"]


def test_tokens_per_step_are_the_same_quantity_for_every_placement():
    """perf/total_num_tokens is the batch sampled for the iteration: with fixed lengths 32 prompts x
    4 responses x (256 + 512) tokens = 98,304 under every placement. With a long tail the trainer
    of fully_async takes the groups that finish first (the shorter ones inside the window), yet
    an iteration still counts its sampled batch, so one_step_off and fully_async on the same job
    count the same tokens per iteration; and throughput x step x devices gives them back."""
    pl = {"rollout_devices": 8, "iterations": 4, "staleness": 1}
    for kind in ("colocated", "split", "one_step_off", "fully_async"):
        p = {"kind": kind, "iterations": 3} if kind == "colocated" else {"kind": kind, **pl}
        r = simulate_rl(job_of(placement=p)).result
        assert [row["perf/total_num_tokens"] for row in r.iterations] == [98304.0] * len(r.iterations), kind
    runs = {k: simulate_rl(job_of(data__response_length=LONG_TAIL, placement={"kind": k, **pl})).result
            for k in ("one_step_off", "fully_async")}
    off, fa = runs["one_step_off"], runs["fully_async"]
    assert [r["perf/total_num_tokens"] for r in off.iterations] == [r["perf/total_num_tokens"] for r in fa.iterations]
    for r in (off, fa):
        steady = r.iterations[1:]
        mean_tokens = sum(row["perf/total_num_tokens"] for row in steady) / len(steady)
        assert r.throughput * r.timing["step"] * r.devices == pytest.approx(mean_tokens, rel=1e-12)


def test_timeline_title_says_what_the_figure_shows():
    """The x axis spans every simulated iteration: the title names them and the placement, and
    calls the step what it is, a steady-state mean."""
    run = simulate_rl(job_of(placement={"kind": "split", "rollout_devices": 8, "iterations": 3}))
    t = timeline_title(run)
    assert t.startswith("t: 3 iterations, split on 16 x ") and "steady-state step" in t and "first iteration left out" in t
