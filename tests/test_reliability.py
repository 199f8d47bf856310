"""Failure and recovery (simtrain.studies.reliability): expected values from hand derivations and closed forms.

Notation: mu step time, N steps per checkpoint interval (tau = N mu), s checkpoint stall, w its
background write, rho the slowdown while it runs, M the job MTBF, R the restart time.
"""
import json
import math
import subprocess
import sys
import textwrap
from dataclasses import replace

import numpy as np
import pytest
import yaml
from conftest import ROOT, write

from simtrain import resources
from simtrain.errors import ConfigError
from simtrain.spec.loading import load_scenario
from simtrain.studies.reliability import model as M
from simtrain.studies.reliability.config import defaults, load_spec, parse_duration
from simtrain.studies.reliability.job import BUCKETS, run_trial
from simtrain.studies.reliability.montecarlo import run_many, stats, summarize
from simtrain.studies.reliability.optimize import daly, daly_goodput, daly_wall, exact_optimum, grid, refine, young

CAT = ("x", 1 / 3600.0, "restart", "crash", "x", False)      # restart in place, MTBF 1 h


def params(**kw) -> M.JobParams:
    """A job with round numbers: 10 s steps, 100 s sync checkpoints, 50 s restart, no detection,
    load or warm-up time, one failure category of MTBF 1 h."""
    base = dict(step_time_s=10.0, step_time_cv=0.0, tokens_per_step=1.0, gpus=8, hosts=1, dp=1, hosts_per_replica=1,
                categories=(CAT,), distribution="exponential", weibull_shape=1.0,
                method="sync", checkpoint_bytes=0.0, checkpoint_size_source="test", stall_s=100.0, write_s=0.0, background_slowdown=0.0, storage_write_s=100.0,
                persist_interval_s=3600.0, detect_s={"crash": 0.0, "hang": 0.0, "none": 0.0}, restart_s=50.0,
                load_storage_s=0.0, load_memory_s=0.0, warmup_s=0.0, replicas=2, hot_spares=0, repair_time_s=0.0,
                swap_time_s=0.0, elastic=False, min_dp=1, horizon_s=11000.0, target_steps=None, interval_s=None)
    base.update(kw)
    return M.JobParams(**base)


def total(r) -> float:
    return r["goodput"] * r["time_s"] + sum(r["lost_s"].values())


def scen(extra: str = "") -> str:
    """The small scenario (llama3-8b on 8 DGX H100) with a section appended."""
    return textwrap.dedent(SMALL) + textwrap.dedent(extra)


SMALL = """
    name: small
    model: {preset: llama3-8b}
    training: {micro_batch_size: 1, global_batch_size: 64, precision: bf16}
    parallel: {tp: 8, pp: 1, dp: 8, zero_stage: 1}
    cluster: {device: h100-sxm5-80gb, topology: dgx-h100, nodes: 8}
"""


# --- hand-derived single trials ---------------------------------------------------------------

def test_no_failures_goodput_is_one_minus_checkpoint_fraction():
    # tau = 100 x 10 s = 1000 s, s = 100 s: 10 cycles of 1100 s fill 11,000 s exactly;
    # goodput = tau / (tau + s) = 1000 / 1100, the rest is checkpoint time
    r = run_trial(params(categories=()), 100, seed=0, trial=0)
    assert r["goodput"] == pytest.approx(1000 / 1100, rel=1e-12)
    assert r["lost_s"]["checkpoint"] == pytest.approx(1000.0, rel=1e-12)
    assert r["checkpoints"] == 10 and r["interruptions"] == 0


def test_failure_at_known_time_loses_work_since_last_checkpoint():
    # checkpoints end at 1100 and 2200; a failure at 2500 s loses 2500 - 2200 = 300 s of work,
    # restart 50 s, resume at 2550 from step 200: 7 more cycles (to 10,250 s) + 750 s = 75 steps
    r = run_trial(params(), 100, 0, 0, injected=[(2500.0, "x")])
    assert r["lost_s"]["lost_work"] == pytest.approx(300.0)
    assert r["lost_s"]["restart"] == pytest.approx(50.0)
    assert r["steps"] == pytest.approx(200 + 700 + 75)
    assert r["checkpoints"] == 9
    assert total(r) == pytest.approx(11000.0, rel=1e-12)


def test_failure_during_checkpoint_stall_loses_the_whole_interval():
    # stall 1000-1100: a failure at 1050 rolls back to step 0 -> 1000 s lost, 50 s of stall spent
    r = run_trial(params(), 100, 0, 0, injected=[(1050.0, "x")])
    assert r["lost_s"]["lost_work"] == pytest.approx(1000.0)
    assert total(r) == pytest.approx(11000.0, rel=1e-12)


def test_async_checkpoint_is_durable_only_after_its_write():
    # mu 10, N 100, s 5, w 300, rho 0.5. Cycle 0: train 1000 s, stall to 1005 -> checkpoint 1
    # (step 100) durable at 1305. Cycle 1: the write overlaps the steps: train = 1000 + 300 x
    # 0.5/1.5 = 1100, stall ends 2110 -> checkpoint 2 (step 200) durable at 2410.
    p = params(method="async", stall_s=5.0, write_s=300.0, background_slowdown=0.5)
    # failure at 2300: checkpoint 2 not durable yet; progress = 200 + (190 / 1.5) / 10 steps
    r = run_trial(p, 100, 0, 0, injected=[(2300.0, "x")])
    assert r["lost_s"]["lost_work"] == pytest.approx((200 + 190 / 1.5 / 10 - 100) * 10)
    # failure at 1200, before checkpoint 1 is durable (1305): back to step 0; 195 s at rate 1/1.5
    r = run_trial(p, 100, 0, 0, injected=[(1200.0, "x")])
    assert r["lost_s"]["lost_work"] == pytest.approx(1000 + 195 / 1.5)
    assert total(r) == pytest.approx(11000.0, rel=1e-12)


def test_async_write_longer_than_interval_stalls_the_next_checkpoint():
    # G = 100 s < w / (1 + rho) = 300 / 1.5: steps run slowed for 150 s, then wait 150 s for the
    # write; cycle 1 = 150 + 150 + 5 = 305 s, cycle 0 = 105 s; no failures, horizon 105 + 305 x 10
    p = params(method="async", stall_s=5.0, write_s=300.0, background_slowdown=0.5, categories=(), horizon_s=105.0 + 3050.0)
    r = run_trial(p, 10, 0, 0)
    assert r["steps"] == pytest.approx(110)
    assert r["lost_s"]["checkpoint"] == pytest.approx(5 + 10 * 205)


def test_recovery_phases_and_failure_during_restart_start_over():
    # detection 60 s, restart 50, load 20, warm-up 30 = 160 s; a second failure 100 s into the
    # first recovery (at 2600) starts it again: 100 s spent + 160 s, then training resumes
    p = params(detect_s={"crash": 60.0, "hang": 600.0, "none": 0.0}, load_storage_s=20.0, warmup_s=30.0)
    r = run_trial(p, 100, 0, 0, injected=[(2500.0, "x"), (2600.0, "x")])
    assert r["lost_s"]["detection"] == pytest.approx(120.0)
    assert r["lost_s"]["restart"] == pytest.approx(50.0 + 40.0)
    assert r["lost_s"]["load"] == pytest.approx(20.0) and r["lost_s"]["warmup"] == pytest.approx(30.0)
    assert r["interruptions"] == 2
    assert total(r) == pytest.approx(11000.0, rel=1e-12)


def test_swap_failure_waits_for_repair_without_spares_and_not_with_them():
    swap = ("g", 1 / 3600.0, "swap", "crash", "gpu", False)
    p = params(categories=(swap,), repair_time_s=7200.0, horizon_s=30 * 86400.0)
    none = run_trial(p, 100, 3, 0)
    many = run_trial(p.with_(hot_spares=1000), 100, 3, 0)
    assert none["spare_waits"] > 0 and none["lost_s"]["spare_wait"] > 0
    assert many["lost_s"]["spare_wait"] == 0.0 and many["interruptions"] == none["interruptions"]   # same failures
    assert many["goodput"] > none["goodput"]
    # elastic: 4 hosts per replica of dp 8; one missing host drops one replica -> steps x 8/7, no waiting
    el = run_trial(p.with_(dp=8, hosts=32, hosts_per_replica=4, elastic=True, min_dp=4), 100, 3, 0)
    assert el["lost_s"]["spare_wait"] == 0.0 and el["min_dp"] < 8 and el["lost_s"]["degraded"] > 0
    for r in (none, many, el):
        assert total(r) == pytest.approx(30 * 86400.0, rel=1e-9)


def test_in_memory_checkpoint_restores_from_peer_memory_unless_a_group_is_wiped():
    # every checkpoint in memory (w = 1 s), every 6th on storage (persist 1 h / 10 min)
    p = params(method="in_memory", stall_s=1.0, write_s=1.0, storage_write_s=100.0, load_memory_s=5.0, load_storage_s=50.0,
               hosts=2, replicas=2, categories=(CAT, ("h", 1e-9, "swap", "crash", "host", False)), hot_spares=10)
    assert [lv.every for lv in M.levels(p, 60)] == [1, 6]
    # restart failure at 5000 s: cycles of 600 + 1 s end at 601, 1202, ..., 4808 (checkpoint of
    # step 480 in peer memory at 4809); the steps since 4808 are lost: 192 s
    r = run_trial(p, 60, 0, 0, injected=[(5000.0, "x")])
    assert r["lost_s"]["lost_work"] == pytest.approx(5000 - 4808)
    assert r["lost_s"]["load"] == pytest.approx(5.0) and r["storage_fallbacks"] == 0
    # two host losses in the same replica pair (2 hosts, replicas 2) within one window: copies gone,
    # back to the storage checkpoint of step 360 (6th checkpoint, durable at 3606 + 100 s):
    # 192 s, then the 480 - 360 steps of checkpoints 7 and 8
    r = run_trial(p, 60, 0, 0, injected=[(5000.0, "h"), (5001.0, "h")])
    assert r["storage_fallbacks"] == 1
    assert r["lost_s"]["lost_work"] == pytest.approx(5000 - 4808 + (8 - 6) * 600)


def test_random_step_times_keep_the_mean_and_the_accounting():
    # Gamma steps with CV 0.3: the mean cycle is still N mu + s, so without failures goodput ->
    # tau / (tau + s) over many cycles; every second stays accounted
    p = params(categories=(), step_time_cv=0.3, horizon_s=1100.0 * 400)
    r = run_trial(p, 100, 0, 0)
    assert r["goodput"] == pytest.approx(1000 / 1100, rel=2e-3)
    assert total(r) == pytest.approx(1100.0 * 400, rel=1e-12)
    assert run_trial(p, 100, 0, 0) == r


# --- closed forms -----------------------------------------------------------------------------

def test_daly_formulas_worked_example():
    assert young(10, 3600) == pytest.approx(math.sqrt(2 * 10 * 3600))
    x = 10 / 7200
    assert daly(10, 3600) == pytest.approx(math.sqrt(72000) * (1 + math.sqrt(x) / 3 + x / 9) - 10)
    assert daly(10000, 3600) == 3600
    assert exact_optimum(10, 3600) == pytest.approx(daly(10, 3600), rel=1e-3)
    # T_w over the segments of a budget equals the per-segment expectation times their number
    assert daly_wall(1000, 100, 50, 3600, 1e5) == pytest.approx(100 * 3600 * math.exp(50 / 3600) * math.expm1(1100 / 3600))


def test_monte_carlo_time_to_train_matches_daly_closed_form():
    # budget of 100 segments of tau = 1000 s, delta = 100 s, R = 50 s, M = 1 h: Daly's
    # E[T] = 100 M e^(R/M) (e^((tau + delta)/M) - 1) = 130,456 s
    p = params(horizon_s=None, target_steps=100 * 100)
    res = run_many([("t", p, 100)], trials=300, seed=1)["t"]
    s = stats([r["time_s"] for r in res])
    expect = 100 * 3600 * math.exp(50 / 3600) * math.expm1(1100 / 3600)
    assert abs(s["mean"] - expect) <= 1.3 * s["ci95"], (s, expect)
    assert all(total(r) == pytest.approx(r["time_s"], rel=1e-9) for r in res)


def test_goodput_matches_closed_form_and_confidence_interval_holds_across_seeds():
    # 20 independent seeds x 40 trials of a 20-segment budget: the batch means scatter as the
    # reported 95 % half-width says (sd of the means ~ ci95 / 1.96), and most intervals cover Daly's value
    p = params(horizon_s=None, target_steps=20 * 100)
    expect = daly_wall(1000, 100, 50, 3600, 20 * 1000)
    means, halfs = [], []
    for seed in range(20):
        s = stats([r["time_s"] for r in run_many([("t", p, 100)], 40, seed)["t"]])
        means.append(s["mean"])
        halfs.append(s["ci95"])
    ratio = np.std(means, ddof=1) / (np.mean(halfs) / 1.96)
    assert 0.6 < ratio < 1.5, ratio
    covered = sum(abs(m - expect) <= h for m, h in zip(means, halfs))
    assert covered >= 16, covered


def test_sweep_optimum_within_five_percent_of_young_daly():
    # delta = 10 s, R = 60 s, M = 1 h, 1 s steps (so intervals are fine-grained): Young 268 s,
    # Daly 261.7 s; the simulated optimum (same failures at every interval) lies within 5 %
    p = params(step_time_s=1.0, stall_s=10.0, storage_write_s=10.0, restart_s=60.0, horizon_s=20 * 86400.0)
    ns = grid(daly(10, 3600), 1.0, points=11, span=2.0)
    res = run_many([(str(n), p, n) for n in ns], trials=12, seed=7)
    means = [np.mean([r["goodput"] for r in res[str(n)]]) for n in ns]
    best = refine([float(n) for n in ns], means)
    assert abs(best / daly(10, 3600) - 1) < 0.05, (best, ns, means)
    assert abs(best / young(10, 3600) - 1) < 0.05
    # and the simulated goodput at the optimum is Daly's closed form within the Monte-Carlo noise
    i = int(np.argmax(means))
    g = stats([r["goodput"] for r in res[str(ns[i])]])
    assert abs(g["mean"] - daly_goodput(ns[i], 10, 60, 3600)) < 1.5 * g["ci95"]


def test_expected_number_of_failures_and_weibull_renewal():
    # Poisson of rate 1/h over 30 days: E = 720, sd = sqrt(720) = 26.8
    p = params(horizon_s=30 * 86400.0)
    n = [r["interruptions"] for r in run_many([("e", p, 100)], 30, 5)["e"]]
    assert abs(np.mean(n) - 720) < 3 * math.sqrt(720 / 30)
    assert np.std(n, ddof=1) == pytest.approx(math.sqrt(720), rel=0.35)
    # Weibull gaps of the same mean (renewal theorem: the count still grows as H / mean);
    # shape 0.7 is burstier: the count's spread is larger than Poisson
    w = [r["interruptions"] for r in run_many([("w", p.with_(distribution="weibull", weibull_shape=0.7), 100)], 30, 5)["w"]]
    assert abs(np.mean(w) - 720) < 0.06 * 720
    assert np.std(w) > np.std(n)


# --- the model built from a scenario ----------------------------------------------------------

def test_defaults_carry_the_llama3_table5_counts(tmp_path):
    d = defaults()["failures"]
    counts = sum(c["count"] for c in d["categories"].values())
    assert counts == d["exposure"]["unexpected"] == 419
    assert d["exposure"]["unexpected"] + d["planned"]["count"] == d["exposure"]["interruptions"] == 466
    src = resources.VALIDATION / "reliability" / "reliability.yaml"
    pub = {e["id"]: e for e in yaml.safe_load(src.read_text())}["llama3_reliability_summary"]["measured"]
    assert (pub["unexpected"], pub["interruptions"], pub["planned"], pub["days"], pub["gpus"]) == (419, 466, 47, 54, 16384)


def build_small(tmp_path, extra="", nodes=8):
    f = write(tmp_path / "s.yaml", scen(extra).replace("nodes: 8", f"nodes: {nodes}").replace("dp: 8", f"dp: {nodes}"))
    sc, topo = load_scenario(f)
    return f, sc, topo


def test_job_mtbf_scales_as_one_over_n_and_16k_rate_matches_published(tmp_path):
    f, sc, topo = build_small(tmp_path, "reliability: {step_time: '10 s', checkpoint: {size: '1 TB'}}\n")
    f2, sc2, topo2 = build_small(tmp_path, "reliability: {step_time: '10 s', checkpoint: {size: '1 TB'}}\n", nodes=16)
    p1 = M.build(load_spec(f), sc, topo, None)
    p2 = M.build(load_spec(f2), sc2, topo2, None)
    assert p1.mtbf_s / p2.mtbf_s == pytest.approx(2.0, rel=1e-12)
    # 2,048 hosts x 8 GPUs: by construction 419 failures in 54 days (Llama 3), MTBF 3.09 h
    path = ROOT / "scenarios" / "llama3-405b-h100-16384-goodput.yaml"
    sc3, topo3 = load_scenario(path)
    spec = replace(load_spec(path), step_time_s=11.0, checkpoint=replace(load_spec(path).checkpoint, size_bytes=5.7e12))
    p3 = M.build(spec, sc3, topo3, None)
    assert p3.job_rate * 54 * 86400 == pytest.approx(419, rel=1e-9)
    assert p3.mtbf_s / 3600 == pytest.approx(54 * 24 / 419, rel=1e-9)
    # independent source (Meta RSC, failures per 1,000 node-days): RSC-2 2.34 < Llama 3's 3.79 < RSC-1 6.5
    per = p3.job_rate * 86400 / p3.hosts * 1000
    cc = defaults()["failures"]["cross_check"]
    assert cc["rsc2_failures_per_1000_node_days"] < per < cc["rsc1_failures_per_1000_node_days"]
    assert per == pytest.approx(3.79, abs=0.01)
    # communicator init 3 ms per rank: 49 s of the restart at 16,384 ranks (MegaScale's < 30 s at 10k)
    assert p3.restart_s == pytest.approx(120 + 90 + 0.003 * 16384)


def test_checkpoint_size_from_memory_model_and_storage_bound(tmp_path):
    # llama3-8b, vocab padded to 126 x 1024 = 129,024: P = 2 x 129,024 x 4096 (embedding + head)
    # + 32 x (2 x 4096^2 + 2 x 4096 x 1024 + 3 x 4096 x 14336 + 2 x 4096) + 4096; bf16 + Adam
    # with fp32 master weights: 2 + 12 = 14 bytes per parameter, deduplicated over dp
    P = 2 * 129024 * 4096 + 32 * (2 * 4096 ** 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096) + 4096
    f, sc, topo = build_small(tmp_path, "reliability: {trials: 2}\n")
    from simtrain.simulate import simulate
    step = simulate(sc, topo).result
    p = M.build(load_spec(f), sc, topo, step)
    assert p.checkpoint_bytes == pytest.approx(14 * P, rel=1e-3)
    # sync: stall = 10 s fixed + S / min(2 TB/s, 8 hosts x 8 NICs x 50 GB/s = 3.2 TB/s)
    assert p.stall_s == pytest.approx(10 + 14 * P / 2e12, rel=1e-3)
    f2, sc2, topo2 = build_small(tmp_path, "reliability: {checkpoint: {storage: {write_bandwidth: '100 TB/s'}}}\n")
    q = M.build(load_spec(f2), sc2, topo2, step)
    assert q.stall_s == pytest.approx(10 + 14 * P / (8 * 8 * 50e9), rel=1e-3)


@pytest.mark.parametrize("plan", ["tp: 8, pp: 1, dp: 8, zero_stage: 1", "tp: 8, pp: 1, dp: 4, cp: 2, zero_stage: 1",
                                  "tp: 4, pp: 2, dp: 8, zero_stage: 3", "tp: 8, pp: 1, dp: 8, zero_stage: 0"])
def test_checkpoint_size_deduplicates_replicas_for_every_plan(tmp_path, plan):
    # whatever the plan, the unique state is the model's: 14 bytes x P (the padded vocabulary of
    # tp 4 / tp 8 adds at most 0.2 % over the published-vocabulary count)
    from simtrain.simulate import simulate
    from simtrain.workload.flops import parameter_counts
    f = write(tmp_path / "p.yaml", scen().replace("tp: 8, pp: 1, dp: 8, zero_stage: 1", plan))
    sc, topo = load_scenario(f)
    size, how = M.checkpoint_bytes(simulate(sc, topo).result.memory, sc)
    assert how == "memory model"
    assert size == pytest.approx(14 * parameter_counts(sc)["total"], rel=2e-3)


def test_checkpoint_size_of_moe_from_parameter_count():
    # Mixtral 8x7B: 46.7B parameters (Mistral AI), 2 + 12 bytes each in bf16 with Adam
    sc, _ = load_scenario(ROOT / "scenarios" / "mixtral-8x7b-h100-64.yaml")
    size, how = M.checkpoint_bytes([], sc)
    assert how.startswith("parameter count")
    assert size == pytest.approx(14 * 46.7e9, rel=5e-3)


def test_section_errors_are_collected_with_key_paths(tmp_path):
    f = write(tmp_path / "bad.yaml", scen("""
    reliability:
      horizon: 30
      trials: 0
      checkpoint: {method: tape, intervall: "5 min"}
      spares: {hot_nodes: -1}
      failures: {categories: {faulty_gpu: {count: 148, per: rack}}}
    """))
    with pytest.raises(ConfigError) as e:
        load_scenario(f)
    text = str(e.value)
    for path in ("reliability.horizon", "reliability.trials", "reliability.checkpoint.method", "reliability.checkpoint.intervall",
                 "reliability.spares.hot_nodes", "reliability.failures.categories.faulty_gpu.per"):
        assert f"bad.yaml: {path}:" in text, (path, text)
    assert "did you mean `interval`?" in text
    assert len(e.value.problems) == 6


def test_scenario_without_section_is_unchanged(tmp_path):
    f, sc, topo = build_small(tmp_path)
    g = write(tmp_path / "with.yaml", scen("reliability: {horizon: '7 days'}\n"))
    sc2, _ = load_scenario(g)
    assert sc.resolved() == sc2.resolved()
    assert parse_duration("30 days") == 30 * 86400 and parse_duration("90 s") == 90


# --- Monte-Carlo: determinism, processes, resume ---------------------------------------------

def test_same_seed_identical_processes_do_not_matter_and_resume(tmp_path, monkeypatch):
    p = params(horizon_s=5 * 86400.0, categories=(CAT, ("g", 1 / 7200, "swap", "hang", "gpu", False)), hot_spares=2, repair_time_s=3 * 3600.0)
    a = run_many([("a", p, 30)], 24, 11, jobs=1, chunk=5)
    b = run_many([("a", p, 30)], 24, 11, jobs=2, chunk=5)
    assert json.dumps(a) == json.dumps(b)
    c = run_many([("a", p, 30)], 24, 12, jobs=1, chunk=5)
    assert c != a
    store = tmp_path / "trials"
    run_many([("a", p, 30)], 24, 11, store=store, chunk=5)
    files = sorted(store.rglob("*.json"))
    assert len(files) == 5
    files[2].unlink()                                    # as if interrupted before this chunk finished
    import simtrain.studies.reliability.montecarlo as mc
    calls = []
    real = mc.run_trial
    monkeypatch.setattr(mc, "run_trial", lambda *a, **k: calls.append(a[3]) or real(*a, **k))
    d = run_many([("a", p, 30)], 24, 11, store=store, chunk=5)
    assert calls == list(range(10, 15))                  # only the missing chunk is computed again
    assert json.dumps(d) == json.dumps(a)
    s = summarize(d["a"])
    assert s["goodput"]["p5"] <= s["goodput"]["p50"] <= s["goodput"]["p95"]
    assert set(s["lost_s"]) == set(BUCKETS) - {"useful"}


def test_cli_reliability_outputs_are_byte_identical_and_errors_exit_2(tmp_path):
    f = write(tmp_path / "s.yaml", scen("""
    reliability:
      horizon: "3 days"
      trials: 6
      step_time: "5 s"
      checkpoint: {size: "0.5 TB"}
      failures: {rate_scale: 200}
    """))
    outs = []
    for k in (1, 2):
        o = tmp_path / f"o{k}"
        cmd = [sys.executable, "-m", "simtrain", "reliability", str(f), "--sweep", "--sweep-points", "5", "--what-if-spares", "0,4",
               "--what-if-methods", "async,in_memory", "--jobs", str(k), "--out", str(o)]
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        assert p.returncode == 0, p.stderr
        outs.append(o)
    for name in ("result.json", "sweep.csv", "whatif.csv", "timeline.json", "goodput_vs_interval.png", "timeline.png"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    r = json.loads((outs[0] / "result.json").read_text())
    assert r["interruptions"]["mean"] > 0 and len(r["sweep"]["intervals_s"]) == 5
    assert {w["variant"] for w in r["what_if"]} == {"spares=0", "spares=4", "method=async", "method=in_memory"}
    bad = write(tmp_path / "bad.yaml", scen("reliability: {checkpoint: {method: tape}}\n"))
    p = subprocess.run([sys.executable, "-m", "simtrain", "reliability", str(bad)], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "reliability.checkpoint.method: 'tape' is not one of sync, async, in_memory" in p.stderr


# --- a failure inside a step ------------------------------------------------------------------

@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
    from simtrain.simulate import simulate
    f = write(tmp_path_factory.mktemp("pp") / "pp.yaml", scen().replace("pp: 1, dp: 8", "pp: 2, dp: 4"))
    sc, topo = load_scenario(f)
    return simulate(sc, topo)


def test_replay_without_fault_is_the_step_timeline(pipeline_run):
    from simtrain.studies.reliability.instep import replay
    tl = pipeline_run.timeline
    d = [tl.end[i] - tl.start[i] for i in range(len(pipeline_run.ops))]
    start, end, status, blocked = replay(pipeline_run.ops, d)
    assert status == ["done"] * len(d) and blocked == []
    assert max(abs(a - b) for a, b in zip(end, tl.end)) <= 1e-9 * tl.step_time


def test_fault_inside_a_step_cuts_in_flight_work_and_peers_wait_for_the_watchdog(pipeline_run):
    from simtrain.studies.reliability.instep import inject, trace
    run = pipeline_run
    tl = run.timeline
    c0 = next(c for c in run.classes if c.stage == 0)
    # the middle of a forward compute op of stage 0, a third into the step
    op = next(o for o in run.ops if o.cls == c0.id and o.stream == "compute" and tl.start[o.id] > tl.step_time / 3)
    t = (tl.start[op.id] + tl.end[op.id]) / 2
    f = inject(run, c0.ranks[0], t, timeout_s=600.0)
    assert f.status[op.id] == "cut" and f.end[op.id] == pytest.approx(t)
    # the failed class issues nothing after the fault; everything that ended before it is unchanged
    assert all(f.start[o.id] is None or f.start[o.id] <= t for o in run.ops if o.cls == c0.id)
    assert all(f.end[o.id] == pytest.approx(tl.end[o.id]) for o in run.ops if tl.end[o.id] < t)
    # stage 1 blocks on a send of stage 0 that never comes; the watchdog fires 600 s after the
    # first such wait began: abort = min(wait start) + 600. A wait can begin before the fault
    # (stage 1's tp gather of the split activation waits for the message stage 0 was still
    # computing), so the abort lies within one step either side of the fault + 600
    peers = [b for b in f.blocked if b[5] and b[0] != c0.id]
    assert peers and all("class %d" % c0.id in b[4] or b[4] == "peers at the collective" for b in peers)
    assert f.abort_s == pytest.approx(min(b[3] for b in peers) + 600.0)
    assert t + 600.0 - tl.step_time <= f.abort_s <= t + 600.0 + tl.step_time
    ev = trace(run, f)["traceEvents"]
    assert any(e.get("name", "").endswith("(interrupted)") for e in ev)
    assert any(e.get("cat") == "fault" and e["ts"] + e["dur"] == pytest.approx(f.abort_s * 1e6, abs=1) for e in ev)


def test_token_budget_with_a_short_last_interval_and_timeline_covers_the_run():
    # 250 steps in intervals of 100: cycles of 100, 100 and 50 steps, each followed by a 100 s
    # checkpoint: 2,500 s of steps + 300 s of checkpoints = 2,800 s to train, goodput 2500 / 2800
    r, events, marks = run_trial(params(categories=(), horizon_s=None, target_steps=250), 100, 0, 0, record=True)
    assert r["time_s"] == pytest.approx(2800.0) and r["goodput"] == pytest.approx(2500 / 2800)
    # with failures, the recorded phases of trial 0 tile the horizon: no gap, no overlap
    p = params(horizon_s=2 * 86400.0, detect_s={"crash": 60.0, "hang": 600.0, "none": 0.0}, warmup_s=30.0)
    r, events, marks = run_trial(p, 100, 4, 0, record=True)
    ev = sorted(events)
    assert ev[0][0] == 0.0 and ev[-1][1] == pytest.approx(2 * 86400.0)
    assert all(b[0] == pytest.approx(a[1], abs=1e-6) for a, b in zip(ev, ev[1:]))
    assert len(marks) == r["interruptions"] > 0


def test_study_answers_a_token_budget_in_process(tmp_path):
    from simtrain.studies.reliability.study import study, summary
    f = write(tmp_path / "s.yaml", scen("reliability: {trials: 3, step_time: '5 s', checkpoint: {size: '0.5 TB'}}\n"))
    r = study(f, tokens=64 * 8192 * 2000)            # 2,000 steps of 64 x 8,192 tokens
    assert r["target_tokens"] == 64 * 8192 * 2000 and r["time_s"]["mean"] > 2000 * 5.0
    assert r["goodput"]["mean"] == pytest.approx(2000 * 5.0 / r["time_s"]["mean"], rel=0.05)
    assert "time to train" in summary(r)


def test_shipped_scenario_answers_the_30_day_question():
    # Llama 3 (Sec. 3.3.4) reports "higher than 90 % effective training time" for this job; the
    # failure counts are its own, the recovery times our documented defaults: the answer must land
    # in that range, and the Daly interval (8.8 min) must be what the scenario runs
    from simtrain.studies.reliability.study import study
    r = study(ROOT / "scenarios" / "llama3-405b-h100-16384-goodput.yaml", trials=20, days=30)
    assert 0.90 < r["goodput"]["mean"] < 0.93
    # and Daly's closed form, with the planned stops' restarts, within the Monte-Carlo interval
    assert abs(r["goodput"]["mean"] - r["closed_form"]["goodput_with_planned_stops"]) < 2 * r["goodput"]["ci95"]
    assert r["interruptions"]["mean"] == pytest.approx(30 * 419 / 54, rel=0.05)
    assert r["job"]["interval_s"] == pytest.approx(r["closed_form"]["daly_interval_s"], rel=0.03)
    assert r["job"]["checkpoint_bytes"] == pytest.approx(14 * 405.85e9, rel=0.01)     # 405B x (2 + 12) bytes


@pytest.mark.slow
def test_shipped_scenario_sweep_optimum_matches_daly():
    # the README figure's claim at 200 trials per interval: the simulated optimum within 5 % of Daly
    from simtrain.studies.reliability.study import study
    r = study(ROOT / "scenarios" / "llama3-405b-h100-16384-goodput.yaml", trials=200, sweep=True, sweep_points=9, jobs=2)
    s = r["sweep"]
    assert abs(s["refined_optimum_s"] / s["daly_s"] - 1) < 0.05
    assert abs(s["refined_optimum_s"] / s["young_s"] - 1) < 0.05


@pytest.mark.parametrize("args, key", [
    (("--trials", "0"), "--trials"), (("--trials", "-3"), "--trials"), (("--sweep-points", "0"), "--sweep-points"),
    (("--tokens", "inf"), "--tokens"), (("--days", "nan"), "--days"), (("--jobs", "0"), "--jobs"),
])
def test_bad_counts_on_the_command_line_are_one_line(args, key):
    # a Monte-Carlo of no trials has no percentiles; an infinite token budget never ends
    p = subprocess.run([sys.executable, "-m", "simtrain", "reliability",
                        str(ROOT / "scenarios" / "llama3-405b-h100-16384-goodput.yaml"), *args],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith(key) and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


# --- bounds, wording and the provenance of the rates --------------------------------------------

@pytest.mark.parametrize("section, key, rule", [
    ("failures: {rate_scale: 0}", "reliability.failures.rate_scale", "> 0 and <= 1000"),
    ("failures: {rate_scale: .nan}", "reliability.failures.rate_scale", ""),
    ("failures: {distribution: weibull, weibull_shape: 1.0e-9}", "reliability.failures.weibull_shape", ">= 0.05 and <= 20"),
    ("failures: {categories: {faulty_gpu: {rate_per_unit_hour: 2.5, per: gpu}}}",
     "reliability.failures.categories.faulty_gpu.rate_per_unit_hour", "<= 1"),
    ("step_time_cv: 2", "reliability.step_time_cv", "<= 1"),
    ("failures: {exposure: {days: abc}}", "reliability.failures.exposure.days", "expected a number"),
    ("failures: {categories: {faulty_gpu: {rate_per_unit_hour: 1e6, per: gpu}}}",      # YAML 1.1 reads 1e6 as a string
     "reliability.failures.categories.faulty_gpu.rate_per_unit_hour", "1000000.0 is out of range"),
])
def test_out_of_range_reliability_values_are_refused_with_the_range(tmp_path, section, key, rule):
    """A rate scale of 0 divided the MTBF by zero (a traceback); each bound is refused at its key
    path with the allowed range, exit 2, no traceback."""
    f = write(tmp_path / "s.yaml", scen(f"reliability: {{step_time: '5 s', {section}}}\n"))
    p = subprocess.run([sys.executable, "-m", "simtrain", "reliability", str(f), "--trials", "2"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert key in p.stderr and rule in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr            # one error, not a cascade


def test_one_trial_reads_singular_and_claims_no_interval(tmp_path):
    """With one trial there is no spread to estimate: the summary must not print '± 0.00 (95 % CI)'
    nor '1 trials'; it names the device and gives the tokens trained."""
    f = write(tmp_path / "s.yaml", scen("reliability: {horizon: '1 days', step_time: '5 s', checkpoint: {size: '0.5 TB'}}\n"))
    p = subprocess.run([sys.executable, "-m", "simtrain", "reliability", str(f), "--trials", "1"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert out.splitlines()[0].endswith(", 1 day, 1 trial") and "1 trials" not in out and "(1 process)" in out
    assert "no confidence interval" in out and "± 0.00" not in out
    assert "64 x h100-sxm5-80gb" in out and "GPUs" not in out.splitlines()[0]
    assert "tokens trained" in out


def test_failure_rates_say_when_they_are_assumed():
    """The shipped per-component rates were measured on H100 (Llama 3, Table 5): a run on H100 cites
    them as measured; an MLU590 run borrows them and must say so; a scenario's own categories are
    its own."""
    from simtrain.studies.reliability.study import failure_rate_source
    assert failure_rate_source("h100-sxm5-80gb", False)["assumed"] is False
    mlu = failure_rate_source("mlu590", False)
    assert mlu["assumed"] is True and "assumed" in mlu["source"] and "MLU590" in mlu["source"]
    assert failure_rate_source("h200-sxm-141gb", False)["assumed"] is True
    assert failure_rate_source("mlu590", True) == {"device": "mlu590", "assumed": False,
                                                   "source": "the scenario's reliability.failures section"}


def test_monte_carlo_advances_a_progress_bar_by_its_trials(monkeypatch):
    """A reliability run reports progress in trials: two tasks of 30 trials each make a bar of 60
    that is advanced by exactly 60 (chunks of trials as they finish)."""
    from simtrain import progress

    seen = {"total": None, "done": 0}

    class Bar:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n=1):
            seen["done"] += n

    def fake_bar(total, desc, unit="it"):
        seen["total"], seen["unit"] = total, unit
        return Bar()

    monkeypatch.setattr(progress, "bar", fake_bar)
    p = params(horizon_s=2000.0)
    run_many([("a", p, 10), ("b", p, 20)], trials=30, seed=3)
    assert seen == {"total": 60, "done": 60, "unit": "trial"}
