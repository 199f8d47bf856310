"""simtrain search on a `job: rl` file (simtrain.studies.rl_search): the candidate space counted by
hand, the long-tail argument for fully_async, infeasible candidates counted by why, --fix, --json
and --out, determinism."""
from __future__ import annotations

import copy
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import small_scenario

from simtrain.cli.main import main
from simtrain.errors import ConfigError
from simtrain.rl.iteration import simulate_rl
from simtrain.rl.spec import load_rl_job
from simtrain.studies.rl_search import heads_problem, search_rl, to_dict

ROOT = Path(__file__).resolve().parents[1]

# Qwen2.5-Math-1.5B (12 attention heads, 2 KV heads) on 2 HGX H20 nodes of 8: a small, fast job
JOB = {
    "job": "rl", "name": "small", "seed": 0,
    "cluster": {"device": "h20-96gb", "topology": "hgx-h20", "nodes": 2},
    "model": {"preset": "qwen2.5-math-1.5b"},
    "algorithm": {"estimator": "grpo", "use_kl_loss": True},
    "data": {"train_batch_size": 32, "n": 4, "max_prompt_length": 512, "max_response_length": 4096,
             "prompt_length": {"kind": "fixed", "tokens": 256},
             "response_length": {"kind": "lognormal", "mean": 600, "sigma": 1.0}},
    "rollout": {"tp": 1, "gpu_memory_utilization": 0.5},
    "actor": {"ppo_mini_batch_size": 8, "use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 8192},
    "placement": {"kind": "colocated", "iterations": 3},
}


@pytest.fixture(scope="module")
def job_file(tmp_path_factory):
    f = tmp_path_factory.mktemp("rl") / "job.yaml"
    f.write_text(yaml.safe_dump(JOB))
    return f


@pytest.fixture(scope="module")
def full(job_file):
    return search_rl(job_file)


def test_candidates_and_infeasible_tp_counted_by_hand(full):
    """2 nodes of 8: colocated x tp {1, 2, 4, 8} = 4; split and one_step_off x pool {8} x tp = 4
    each; fully_async x pool {8} x tp x staleness {0, 1, 2} = 12: 24 candidates. tp 8 does not
    divide the 12 heads: 1 + 1 + 1 + 3 = 6 infeasible, nothing else is."""
    assert full.enumerated == 24
    assert full.infeasible == {"rollout.tp: heads": 6}
    assert all(o.candidate.rollout_tp == 8 for o in full.skipped)
    assert len(full.ranked) == 18


def test_heads_rule_by_hand():
    class M:
        num_attention_heads, num_key_value_heads = 28, 4     # Qwen2.5-7B
    assert [tp for tp in (1, 2, 4, 8) if heads_problem(M, tp) is None] == [1, 2, 4]   # 28 % 8 = 4


def test_long_tail_makes_fully_async_the_best(full):
    """Lognormal responses with sigma 1.0 (a long tail up to 4,096 tokens): a colocated or split
    step waits for the longest response of its batch before any training starts, while
    fully_async's trainer takes the first groups to finish and overlaps the rest with training,
    so the best candidate is fully_async, and faster than the best colocated one."""
    best = full.ranked[0]
    assert best.candidate.placement == "fully_async"
    colo = min(o.result.timing["step"] for o in full.ranked if o.candidate.placement == "colocated")
    split = min(o.result.timing["step"] for o in full.ranked if o.candidate.placement == "split")
    assert best.result.timing["step"] < colo and best.result.timing["step"] < split
    # a ranked candidate is the job with its keys: simulated alone it gives the same step
    alone = simulate_rl(load_rl_job(full.path, best.candidate.overrides())).result
    assert alone.timing["step"] == pytest.approx(best.result.timing["step"], rel=1e-12)


def test_split_and_one_step_off_share_generations_and_rank_as_placed(full):
    """Same pools and tp: the same batches generate in the same time (one simulation shared); the
    one_step_off step, max(gen, train) + sync, is shorter than split's gen + train + sync."""
    by = {(o.candidate.placement, o.candidate.rollout_tp): o.result for o in full.ranked}
    for tp in (1, 2, 4):
        s, o = by[("split", tp)], by[("one_step_off", tp)]
        assert s.iterations[0]["timing_s/gen"] == o.iterations[0]["timing_s/gen"]
        assert o.timing["step"] < s.timing["step"]


def test_tokens_per_s_objective_orders_like_step_time(job_file, full):
    """One cluster size: tokens/s per device = the same tokens per step / step / devices."""
    tps = search_rl(job_file, fixes=["placement.kind=split,one_step_off"], objective="tokens_per_s")
    order = [o.candidate for o in full.ranked if o.candidate.placement in ("split", "one_step_off")]
    assert [o.candidate for o in tps.ranked] == order
    with pytest.raises(ConfigError):
        search_rl(job_file, objective="cost")


def test_fix_gives_axes_values_and_loader_problems_are_counted(job_file):
    """--fix rollout_devices=4: 2 rollout devices on each of the 2 nodes leave a 12-device
    training pool (6 per node), whose data-parallel size does not divide the batch, a loader
    rule: every one of the 1 x 1 x 2 split candidates is skipped under that key."""
    res = search_rl(job_file, fixes=["placement.kind=split,one_step_off", "placement.rollout_devices=4,8", "rollout.tp=1"])
    assert res.enumerated == 4
    assert res.infeasible == {"data.train_batch_size": 2}
    assert {o.candidate.rollout_devices for o in res.ranked} == {8}
    with pytest.raises(ConfigError):
        search_rl(job_file, fixes=["placement.kind=sideways"])


def test_memory_infeasible_is_counted(job_file):
    """gpu_memory_utilization 0.04 of the H20's 102.6 GB is 4.1 GB per device, under the 3.1 GB of
    bf16 weights of a 1.5B model at tp 1 plus the engine's 1 GiB reserve (4.2 GB): no KV cache is
    left; at tp 4 the 0.8 GB shard leaves 2.2 GB for it."""
    res = search_rl(job_file, sets=["rollout.gpu_memory_utilization=0.04"], fixes=["placement.kind=split", "rollout.tp=1,4"])
    reasons = {o.candidate.rollout_tp: o.reason for o in res.skipped}
    assert reasons.get(1) == "memory: rollout"
    assert 4 not in reasons


def test_cli_json_is_deterministic_and_out_writes_every_candidate(job_file, tmp_path):
    def run(*extra):
        p = subprocess.run([sys.executable, "-m", "simtrain", "search", str(job_file), "--fix", "rollout.tp=1,8",
                            "--fix", "placement.staleness=1", *extra], capture_output=True, text=True, cwd=ROOT)
        assert p.returncode == 0, p.stderr
        return p.stdout
    a = run("--json")
    assert run("--json") == a                    # same file: the same bytes
    d = json.loads(a)
    # colocated, split, one_step_off, fully_async (staleness 1) x tp {1, 8}: 8, tp 8 infeasible
    assert d["enumerated"] == 8 and d["infeasible"] == {"rollout.tp: heads": 4}
    assert d["best"]["placement"] == "fully_async" and d["best"]["timing_s/step"] == d["ranked"][0]["timing_s/step"]
    out = tmp_path / "o"
    text = run("--out", str(out))
    assert "best: fully_async" in text and "skipped colocated tp8" in text
    assert sorted(x.name for x in out.iterdir()) == ["best.yaml", "report.html", "search.csv", "search.png"]
    page = (out / "report.html").read_text()     # self-contained: the figure inline, nothing fetched
    assert 'src="data:image/png;base64,' in page and "http" not in page and "<script" not in page
    rows = list(csv.DictReader((out / "search.csv").open()))
    assert len(rows) == 8 and sum(1 for r in rows if r["infeasible"]) == 4
    assert rows[0]["rank"] == "1" and float(rows[0]["timing_s/step"]) == d["ranked"][0]["timing_s/step"]
    best = load_rl_job(out / "best.yaml")
    assert best.placement == "fully_async" and best.engine.tp == 1
    assert simulate_rl(best).result.timing["step"] == pytest.approx(d["best"]["timing_s/step"], rel=1e-12)


def test_search_to_dict_is_the_same_twice(job_file):
    a = search_rl(job_file, fixes=["placement.kind=colocated,fully_async", "rollout.tp=2"])
    b = search_rl(job_file, fixes=["placement.kind=colocated,fully_async", "rollout.tp=2"])
    assert json.dumps(to_dict(a)) == json.dumps(to_dict(b))


def test_training_search_rejects_json(tmp_path, plain_topology, capsys):
    """--json is for RL jobs: a plan search says so (exit 2, one line) instead of ignoring it."""
    f = small_scenario(tmp_path, plain_topology)
    assert main(["search", str(f), "--json"]) == 2
    assert "--json" in capsys.readouterr().err


def test_colocated_candidate_drops_rollout_devices(tmp_path):
    """From a fully_async file (rollout_devices 8) the colocated candidate loads: it has no pool."""
    raw = copy.deepcopy(JOB)
    raw["placement"] = {"kind": "fully_async", "rollout_devices": 8, "iterations": 2}
    f = tmp_path / "fa.yaml"
    f.write_text(yaml.safe_dump(raw))
    res = search_rl(f, fixes=["placement.kind=colocated", "rollout.tp=1"])
    assert [o.candidate.placement for o in res.ranked] == ["colocated"] and not res.skipped


def test_compare_of_colocated_and_split_says_rollout_devices_is_needed(job_file):
    """`--set placement.kind=colocated,split`: the split row has no rollout pool; the command says
    to vary placement.rollout_devices with the kind (exit 2, no traceback)."""
    p = subprocess.run([sys.executable, "-m", "simtrain", "compare", str(job_file), "--set", "placement.kind=colocated,split"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "placement.kind+placement.rollout_devices=" in p.stderr and "simtrain search" in p.stderr
    ok = subprocess.run([sys.executable, "-m", "simtrain", "compare", str(job_file), "--set",
                         "placement.kind+placement.rollout_devices=split+8,fully_async+8"], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0 and "hint" not in ok.stderr, ok.stderr
