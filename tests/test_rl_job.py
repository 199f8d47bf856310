"""The `job: rl` file: parsing, defaults, batch checks and one error per bad key (simtrain.rl.spec)."""
from __future__ import annotations

import copy
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from simtrain.errors import Collector, ConfigError
from simtrain.rl.spec import build_rl_job, is_rl_file, load_rl_job

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "scenarios" / "qwen2.5-7b-grpo-h20-32.yaml"

BASE = {
    "job": "rl", "name": "t", "seed": 0,
    "cluster": {"device": "h20-96gb", "topology": "hgx-h20", "nodes": 2},
    "model": {"preset": "qwen2.5-7b"},
    "algorithm": {"estimator": "grpo"},
    "data": {"train_batch_size": 32, "n": 4, "max_prompt_length": 512, "max_response_length": 1024,
             "prompt_length": {"kind": "fixed", "tokens": 256}, "response_length": {"kind": "fixed", "tokens": 512}},
    "rollout": {"tp": 2},
    "actor": {"ppo_mini_batch_size": 8, "use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 8192},
    "placement": {"kind": "colocated", "iterations": 1},
}


def _build(raw: dict):
    errs = Collector("job.yaml")
    job = build_rl_job(raw, ROOT / "job.yaml", errs)
    return job, [str(p) for p in errs.problems]


def test_is_rl_file():
    assert is_rl_file({"job": "rl"}) and is_rl_file({"actor_rollout_ref": {}})
    assert not is_rl_file({"model": {}, "training": {}})


def test_defaults_and_derived_plans():
    """dp = pool / (tp pp cp): 16 devices, fsdp tp 1 -> dp 16, zero 3 (FSDP full sharding);
    rollout replicas = 16 / tp 2 = 8; the reference defaults to the actor's plan."""
    job, probs = _build(copy.deepcopy(BASE))
    assert probs == []
    a = job.roles["actor"].scenario.parallel
    assert (a.dp, a.tp, a.zero_stage) == (16, 1, 3)
    assert job.engine.dp == 8 and job.engine.tp == 2
    assert job.roles["reference"].scenario.parallel.dp == 16
    assert job.rollout_devices == job.train_devices == job.total_devices == 16
    assert job.response_length.hi == 1024      # max defaults to max_response_length


def test_kernel_inventory_follows_the_engine():
    """vLLM's inventory is the newest release read (0.10.1); SGLang's was not read, so it is one
    kernel per operator unless the job names one."""
    job, probs = _build(copy.deepcopy(BASE))
    assert probs == [] and job.engine.kernels == "vllm-0.10.1"
    job, probs = _build(_set("rollout.engine", "sglang"))
    assert probs == [] and job.engine.kernels == "minimal"
    raw = _set("rollout.engine", "sglang")
    raw["rollout"]["kernels"] = "vllm-0.9.2"
    job, probs = _build(raw)
    assert probs == [] and job.engine.kernels == "vllm-0.9.2"


def test_rollout_devices_null_means_not_given():
    """`rollout_devices: null` is the key left out: a colocated job loads with it (so a compare
    can pair colocated+null with split+16), and a split job still reports it missing."""
    raw = copy.deepcopy(BASE)
    raw["placement"] = {"kind": "colocated", "rollout_devices": None}
    job, probs = _build(raw)
    assert probs == [] and job.rollout_devices == job.total_devices == 16
    raw["placement"] = {"kind": "split", "rollout_devices": None}
    job, probs = _build(raw)
    assert job is None and any("placement.rollout_devices: missing for placement split" in str(p) for p in probs)


def test_split_pools():
    """8 rollout devices of 16: the training pool is the other 8 (one node), dp 8."""
    raw = copy.deepcopy(BASE)
    raw["placement"] = {"kind": "split", "rollout_devices": 8}
    job, probs = _build(raw)
    assert probs == []
    assert job.roles["actor"].scenario.parallel.dp == 8 and job.engine.dp == 4 and job.train_devices == 8


def _set(path: str, value):
    raw = copy.deepcopy(BASE)
    node = raw
    *head, last = path.split(".")
    for k in head:
        node = node.setdefault(k, {})
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return raw


BAD = [
    ("jobz", 1, "jobz: unknown key"),
    ("algorithm.estimator", "ppx", "algorithm.estimator: unknown 'ppx'"),
    ("data.train_batch_size", 0, "data.train_batch_size: 0 is not a whole number"),
    ("data.n", float("nan"), "data.n: nan is not a whole number"),
    ("data.response_length", {"kind": "lognormal", "mean": 300, "sigma": -1}, "data.response_length.sigma"),
    ("data.response_length", {"kind": "fixed", "tokens": 100, "max": 4096}, "data.response_length.max: 4096 is over"),
    ("rollout.tp", 3, "rollout.tp: the rollout pool's 16 devices are not a multiple of rollout.tp 3"),
    ("rollout.gpu_memory_utilization", 1.5, "rollout.gpu_memory_utilization"),
    ("rollout.max_num_seqz", 1, "rollout.max_num_seqz: unknown key"),
    ("actor.ppo_mini_batch_size", 5, "actor.ppo_mini_batch_size: 5 does not divide data.train_batch_size 32"),
    ("actor.ppo_max_token_len_per_gpu", 1000, "actor.ppo_max_token_len_per_gpu: 1000 is below the longest sequence (1536"),
    ("actor.parallel", {"tp": 3}, "actor.parallel: tp x pp x cp = 3 does not divide the pool's 16 devices"),
    ("actor.parallel", {"dp": 4}, "actor.parallel.dp: dp is derived"),
    ("actor.training", {"micro_batch_size": 2}, "actor.training.micro_batch_size: batch sizes are derived"),
    ("actor.offload", {"params": "yes"}, "actor.offload: expected"),
    ("placement.kind", "async", "placement.kind: unknown 'async'"),
    ("placement.rollout_devices", 8, "placement.rollout_devices: a colocated job runs the rollout on every device"),
    ("placement.iterations", 0, "placement.iterations: 0 is not a whole number"),
    ("critic", {"parallel": {}}, "critic: estimator grpo has no critic"),
    ("algorithm.estimator", "ppo", "critic: estimator ppo needs a critic"),
    ("reward.kind", "llm", "reward.kind: unknown 'llm'"),
    ("reward.seconds_per_response", float("inf"), "reward.seconds_per_response: inf is not a finite number"),
    ("cluster.nodes", KeyError, "cluster: a job needs cluster.topology and cluster.nodes"),
    ("rollout.cuda_graphs", "false", "rollout.cuda_graphs: 'false' is not true or false"),
    ("rollout.overlap_cpu", [1], "rollout.overlap_cpu: [1] is not true or false"),
    ("rollout.max_num_seqs", 2.5e2 + 0.5, "rollout.max_num_seqs: 250.5 is not a whole number"),
    ("rollout.kernels", "vllm-0.7", "rollout.kernels: unknown 'vllm-0.7'"),
]


@pytest.mark.parametrize("path,value,expected", BAD, ids=[b[0] + "=" + repr(b[1])[:20] for b in BAD])
def test_bad_input_gives_one_error(path, value, expected):
    """Each bad key gives exactly one problem, at its key path, with a fix after `; `."""
    job, probs = _build(_set(path, value))
    assert job is None
    assert len(probs) == 1, probs
    assert probs[0].startswith("job.yaml: ") and expected in probs[0], probs
    assert "; " in probs[0]


def test_split_needs_divisible_dp():
    """train_batch_size x n = 128 sequences over a training pool of 24 devices (dp 24): 128 % 24 != 0."""
    raw = copy.deepcopy(BASE)
    raw["cluster"]["nodes"] = 4
    raw["placement"] = {"kind": "split", "rollout_devices": 8}
    job, probs = _build(raw)
    assert job is None and len(probs) == 1 and "do not split over actor's dp 24" in probs[0]


def test_set_overrides_and_example(tmp_path):
    job = load_rl_job(EXAMPLE, ["data.n=4", "placement.iterations=2"])
    assert job.n == 4 and job.iterations == 2 and job.device_name == "h20-96gb"
    with pytest.raises(ConfigError) as e:
        load_rl_job(EXAMPLE, ["actor.ppo_mini_batch_size=7"])
    assert len(e.value.problems) == 1 and e.value.problems[0].path == "actor.ppo_mini_batch_size"


def test_cli_check_and_bad_file_exit_2(tmp_path):
    out = subprocess.run([sys.executable, "-m", "simtrain", "check", str(EXAMPLE)], capture_output=True, text=True)
    assert out.returncode == 0 and "RL job qwen2.5-7b-grpo-h20-32" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "simtrain", "run", str(EXAMPLE), "--set", "placement.kind=async"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().count("\n") == 0 and "placement.kind: unknown 'async'" in bad.stderr


def test_an_error_from_a_set_names_that_set():
    """As for scenario files: a wrong value a --set wrote is named after the file and the argument."""
    with pytest.raises(ConfigError) as e:
        load_rl_job(EXAMPLE, ["rollout.kernels=vllm-0.7", "data.n=0"])
    got = sorted(str(p) for p in e.value.problems)
    assert got == [f"{EXAMPLE} (--set data.n=0): data.n: 0 is not a whole number in 1..4096; give a whole number in 1..4096",
                   f"{EXAMPLE} (--set rollout.kernels=vllm-0.7): rollout.kernels: unknown 'vllm-0.7'; use one of minimal, "
                   "vllm-0.8.5, vllm-0.9.2, vllm-0.10.1 (the read release nearest yours)"]


def test_check_says_the_reference_is_not_run_without_a_kl_term():
    """No KL loss and no KL in the reward: verl builds no reference policy, so `check` lists none."""
    args = [sys.executable, "-m", "simtrain", "check", str(EXAMPLE)]
    off = subprocess.run(args + ["--set", "algorithm.use_kl_loss=false", "--set", "algorithm.kl_in_reward=false"],
                         capture_output=True, text=True)
    assert off.returncode == 0
    assert "  reference: not run (no KL term" in off.stdout and "reference: fsdp" not in off.stdout
    on = subprocess.run(args + ["--set", "algorithm.use_kl_loss=true"], capture_output=True, text=True)
    assert on.returncode == 0 and "  reference: fsdp" in on.stdout


def test_reward_model_and_critic_roles():
    """A model reward gets its own forward-only role on the training pool; ppo gets a critic whose
    model defaults to the policy's."""
    raw = copy.deepcopy(BASE)
    raw["reward"] = {"kind": "model", "model": {"preset": "qwen2.5-math-1.5b"}, "parallel": {"tp": 1}}
    raw["algorithm"] = {"estimator": "ppo"}
    raw["critic"] = {"ppo_mini_batch_size": 8, "use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 8192}
    job, probs = _build(raw)
    assert probs == []
    assert set(job.roles) == {"actor", "reference", "critic", "reward_model"}
    assert job.roles["reward_model"].scenario.model.hidden_size == 1536
    assert job.roles["critic"].scenario.model.hidden_size == job.roles["actor"].scenario.model.hidden_size
    assert job.has_critic and not job.needs_ref


def test_every_shipped_rl_job_loads():
    """Each shipped `job: rl` scenario passes the job-file checks (the RL counterpart of the
    training scenarios' load test); run times are in benchmarks/rl_speed.py."""
    import yaml

    from simtrain.rl.spec import is_rl_file, load_rl_job
    root = Path(__file__).resolve().parents[1]
    jobs = [p for p in sorted((root / "scenarios").glob("*.yaml")) if is_rl_file(yaml.safe_load(p.read_text()))]
    jobs += sorted((root / "validation" / "data" / "rl" / "jobs").glob("*.yaml"))
    assert len(jobs) >= 6
    for p in jobs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")      # offload on a split placement is warned about
            job = load_rl_job(p)
        assert job.total_devices >= job.engine.tp, p


def test_pools_split_within_nodes():
    """verl's 4 + 12 split (one_step_off.md, trainer.nnodes = rollout.nnodes = 2, n_gpus_per_node
    6 + 2): 4 rollout devices of 2 nodes x 8 are 2 per node, so training has 6 of each node, dp 12
    (fsdp tp 1). The training pool's topology has 6 devices per node; hgx-h20's 4 x 400 Gb/s NICs
    (= 200 GB/s a node) cannot be shared by 6 devices, so they are re-counted as 6 NICs of
    200 / 6 = 33.33 GB/s each: the node's scale-out total is kept. Rollout replicas: 4 / tp 2 = 2."""
    raw = copy.deepcopy(BASE)
    raw["data"]["train_batch_size"] = 48       # 48 x 4 = 192 sequences: a multiple of dp 12
    raw["actor"]["ppo_mini_batch_size"] = 12
    raw["placement"] = {"kind": "one_step_off", "rollout_devices": 4}
    job, probs = _build(raw)
    assert probs == []
    a = job.roles["actor"]
    assert (job.rollout_devices, job.train_devices, job.engine.dp) == (4, 12, 2)
    assert a.scenario.parallel.dp == 12
    assert (a.topology.nodes, a.topology.devices_per_node, a.topology.num_devices) == (2, 6, 12)
    assert a.scenario.cluster.nodes == 2
    over = __import__("json").loads(a.scenario.cluster.topology_overrides)
    assert over["devices_per_node"] == 6
    assert over["scale_out"]["nics_per_node"] == 6
    assert float(over["scale_out"]["nic_bandwidth"].split()[0]) == pytest.approx(200 / 6)


def test_pools_split_within_nodes_must_share_every_node_alike():
    """3 rollout devices over 2 nodes is neither whole nodes nor the same share of each node; 2 per
    node (4 of 16) with rollout tp 4 leaves a replica straddling two nodes' rollout shares."""
    raw = copy.deepcopy(BASE)
    raw["rollout"]["tp"] = 1
    raw["placement"] = {"kind": "split", "rollout_devices": 3}
    _, probs = _build(raw)
    assert any("placement.rollout_devices: 3 devices are neither whole nodes of 8 nor the same share of each of the 2 nodes"
               in p for p in probs), probs
    raw = copy.deepcopy(BASE)
    raw["rollout"]["tp"] = 4
    raw["placement"] = {"kind": "split", "rollout_devices": 4}
    _, probs = _build(raw)
    assert any("rollout.tp: 4 does not fit the rollout pool's 2 devices on each node" in p for p in probs), probs


def test_offload_on_a_split_placement_is_warned():
    """Host swaps are timed only around generation on a colocated pool; a split job's offload says so."""
    raw = copy.deepcopy(BASE)
    raw["placement"] = {"kind": "split", "rollout_devices": 8}
    raw["actor"]["offload"] = {"params": True}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, probs = _build(raw)
    assert probs == []
    assert any("actor.offload: params offload on a split placement is not timed" in str(w.message) for w in caught)


class _Recorder:
    """Stands in for phases.PassCache: records the (seq_len, micro, micro batches) a pass asks for."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def run(self, role, forward_only: bool, seq_len: int, micro: int, per_rank: int) -> str:  # noqa: ANN001
        self.calls.append((seq_len, micro, per_rank))
        return "cost"


def test_fixed_micro_batches_count_real_tokens_with_remove_padding():
    """Fixed micro batches (use_dynamic_bsz false), dp 16, micro 2: 64 sequences are 4 per rank,
    2 micro batches. With use_remove_padding (verl's default) a micro batch computes its real tokens:
    sequences of 256 + 100 and 256 + 900 tokens average 756, rounded up to 768 (QUANTUM 64). Without
    it verl pads every sequence to max_prompt_length + max_response_length = 512 + 1024 = 1536."""
    import dataclasses

    import numpy as np

    from simtrain.rl import phases
    raw = copy.deepcopy(BASE)
    raw["actor"] = {"ppo_mini_batch_size": 8, "ppo_micro_batch_size_per_gpu": 2}
    job, probs = _build(raw)
    assert probs == []
    role = job.roles["actor"]
    assert role.remove_padding and role.padded_length == 1536
    seq = np.array([356, 1156] * 32)
    rec = _Recorder()
    phases.pass_over(rec, role, seq, False)
    assert rec.calls == [(768, 2, 2)]
    phases.pass_over(rec, dataclasses.replace(role, remove_padding=False), seq, False)
    assert rec.calls[-1] == (1536, 2, 2)
    raw["actor"]["use_remove_padding"] = False
    job, _ = _build(raw)
    assert not job.roles["actor"].remove_padding and not job.roles["reference"].remove_padding


def test_summary_memory_parts_add_up_to_each_row():
    """Every memory row's bracketed parts sum to the row's total (to the printed rounding, 0.01 GiB
    a part); state offloaded to the host during gen is named apart, not as a part."""
    import re

    from simtrain.cli.rl import summary
    from simtrain.rl.iteration import simulate_rl
    raw = copy.deepcopy(BASE)
    raw["actor"]["offload"] = {"params": True, "optimizer": True}
    raw["algorithm"]["use_kl_loss"] = True
    job, probs = _build(raw)
    assert probs == []
    text = summary(simulate_rl(job), 0.0)
    rows = text.split("memory per device by phase")[1].split("\n\n")[0].splitlines()[1:]
    assert rows and any("on host, not counted" in r for r in rows)
    for row in rows:
        total = float(re.search(r"^\s+\S+\s+([\d.]+) GiB", row).group(1))
        inside = row.split("(", 1)[1].split(";")[0].rstrip(")")
        parts = [float(x) for x in re.findall(r"([\d.]+) GiB", inside)]
        assert sum(parts) == pytest.approx(total, abs=0.01 * len(parts) + 0.005), row


def test_one_node_split_four_and_four():
    """One node of 8: 4 rollout + 4 training devices. The training topology has 4 devices per node;
    hgx-h20's 4 NICs divide 4 devices, so they stay 4 NICs of 400 Gb/s (no re-count)."""
    import json

    raw = copy.deepcopy(BASE)
    raw["cluster"]["nodes"] = 1
    raw["placement"] = {"kind": "split", "rollout_devices": 4}
    job, probs = _build(raw)
    assert probs == []
    a = job.roles["actor"]
    assert (a.topology.nodes, a.topology.devices_per_node, a.scenario.parallel.dp, job.engine.dp) == (1, 4, 4, 2)
    assert json.loads(a.scenario.cluster.topology_overrides) == {"devices_per_node": 4}


def test_engine_whole_numbers_may_be_written_with_an_exponent():
    """`max_num_seqs: 2.56e2` is the whole number 256 (YAML reads it as a float)."""
    job, probs = _build(_set("rollout.max_num_seqs", 2.56e2))
    assert not probs and job.engine.max_num_seqs == 256 and isinstance(job.engine.max_num_seqs, int)
    assert job.raw["rollout"]["max_num_seqs"] == 256 and isinstance(job.raw["rollout"]["max_num_seqs"], int)
