"""simtrain.rl.verl: verl launch scripts and configs mapped onto the ``job: rl`` tree.

The two scripts under tests/data/verl/ are verl's own files (commit b178a3cd, see the README
there). Every expected value below was read by hand from the script line named next to it.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from simtrain.errors import Collector
from simtrain.rl.verl import overrides_to_cfg, tree_from_verl, verl_from_script

DATA = Path(__file__).parent / "data" / "verl"
ROOT = Path(__file__).resolve().parents[1]


def _load(name: str) -> tuple[dict, Collector]:
    errs = Collector(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = verl_from_script((DATA / name).read_text(), name, errs)
        tree = tree_from_verl(cfg, name, errs)
    tree["_warnings"] = [str(w.message) for w in caught]
    return tree, errs


def test_one_step_off_dapo_fsdp2_colocate_script() -> None:
    tree, errs = _load("dapo_7b_math_fsdp2_colocate.sh")
    assert errs.problems == []
    # max_prompt_length=$((1024 * 2)), max_response_length=$((1024 * 8))
    assert tree["data"] == {"train_batch_size": 512,      # train_prompt_bsz=512
                            "n": 12,                      # n_resp_per_prompt=12
                            "max_prompt_length": 2048, "max_response_length": 8192}
    # adv_estimator=grpo, use_kl_in_reward=False, use_kl_loss=False
    assert tree["algorithm"] == {"estimator": "grpo", "use_kl_loss": False, "kl_in_reward": False}
    # gen_tp=2, gpu_memory_utilization=0.80, enable_chunked_prefill=True, name=vllm,
    # max_num_batched_tokens=$((max_prompt_length + max_response_length)) = 2048 + 8192
    assert tree["rollout"] == {"engine": "vllm", "tp": 2, "gpu_memory_utilization": 0.8,
                               "chunked_prefill": True, "max_num_batched_tokens": 10240}
    assert tree["cluster"] == {"nodes": 2}                # NNODES=${NNODES:-2}
    # MODEL_PATH=.../models/Qwen2.5-Math-7B
    assert tree["model"] == {"preset": "qwen2.5-math-7b"}
    actor = tree["actor"]
    assert actor["strategy"] == "fsdp"                    # strategy=fsdp2
    assert actor["ppo_mini_batch_size"] == 32             # train_prompt_mini_bsz=32
    assert actor["use_dynamic_bsz"] is True
    # actor_ppo_max_token_len=$(((max_prompt_length + max_response_length) * 2)) = 10240 * 2
    assert actor["ppo_max_token_len_per_gpu"] == 20480
    # infer_ppo_max_token_len=$(((max_prompt_length + max_response_length) * 3)) = 10240 * 3
    assert actor["log_prob_max_token_len_per_gpu"] == 30720
    assert actor["parallel"] == {"cp": 4, "cp_kind": "ulysses"}   # sp_size=4
    assert actor["offload"] == {"params": True, "optimizer": True}  # offload=True
    assert actor["training"] == {"recompute": "full"}     # enable_gradient_checkpointing=True
    assert tree["reference"] == {"offload": {"params": True}}
    assert actor["use_remove_padding"] is True            # model.use_remove_padding=True
    # two warnings: fsdp_size=2 (hybrid sharding, not modelled) and one short line counting the
    # keys without timing effect, naming the first five (sorted) and pointing at the full list
    assert len(tree["_warnings"]) == 2
    hsdp = [w for w in tree["_warnings"] if "fsdp_size 2" in w]
    assert len(hsdp) == 1 and "hybrid sharding" in hsdp[0] and "ZeRO-3" in hsdp[0]
    ign = [w for w in tree["_warnings"] if "ignored" in w][0]
    assert "verl keys without effect on the simulated timing ignored (" in ign
    assert "and " in ign and " more); every ignored key: docs/reference/verl-config.md" in ign
    assert len(ign) < 400


def test_grpo_qwen2_7b_example_needs_a_model_section() -> None:
    tree, errs = _load("run_qwen2-7b.sh")
    # Qwen/Qwen2-7B-Instruct is not a preset: one error on the model path, asking for model:
    assert [p.path for p in errs.problems] == ["actor_rollout_ref.model.path"]
    assert "model:" in errs.problems[0].fix
    # data.train_batch_size=1024, max_prompt_length=512, max_response_length=1024, rollout.n=5
    assert tree["data"] == {"train_batch_size": 1024, "max_prompt_length": 512,
                            "max_response_length": 1024, "n": 5}
    # use_kl_loss=True -> a reference forward each iteration
    assert tree["algorithm"] == {"estimator": "grpo", "use_kl_loss": True, "kl_in_reward": False}
    assert tree["rollout"] == {"engine": "vllm", "tp": 2, "gpu_memory_utilization": 0.6}
    assert tree["actor"]["ppo_mini_batch_size"] == 256
    assert tree["actor"]["ppo_micro_batch_size_per_gpu"] == 40
    assert tree["actor"]["offload"] == {"params": False, "optimizer": False}
    # ref.fsdp_config.param_offload=True, ref.log_prob_micro_batch_size_per_gpu=40
    assert tree["reference"] == {"offload": {"params": True}, "log_prob_micro_batch_size_per_gpu": 40}
    assert tree["cluster"] == {"nodes": 1}


def test_overrides_nest_and_type_values() -> None:
    cfg = overrides_to_cfg(["a.b.c=3", "+a.b.d=True", "x=0.5", "y='s'", "z=null", "--flag"])
    assert cfg == {"a": {"b": {"c": 3, "d": True}}, "x": 0.5, "y": "s", "z": None}


def test_yaml_config_interpolation_missing_and_megatron_critic() -> None:
    cfg = {
        "data": {"train_batch_size": 64, "max_prompt_length": 1024, "max_response_length": 2048},
        "actor_rollout_ref": {
            "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
            "rollout": {"n": 1, "enforce_eager": True, "max_num_seqs": "???",
                        "log_prob_max_token_len_per_gpu": "${actor_rollout_ref.actor.ppo_max_token_len_per_gpu}"},
            "actor": {"strategy": "megatron", "ppo_max_token_len_per_gpu": 8192,
                      "megatron": {"tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 2}},
        },
        "critic": {"strategy": "fsdp", "ppo_mini_batch_size": 16},
        "algorithm": {"adv_estimator": "gae"},
    }
    errs = Collector("c.yaml")
    tree = tree_from_verl(cfg, "c.yaml", errs)
    assert errs.problems == []
    assert tree["model"] == {"preset": "qwen2.5-7b"}
    assert tree["rollout"] == {"cuda_graphs": False}          # ??? is "not given"
    assert tree["actor"]["parallel"] == {"tp": 4, "pp": 2}
    assert tree["actor"]["log_prob_max_token_len_per_gpu"] == 8192   # via ${...}
    assert tree["algorithm"] == {"estimator": "ppo"}
    assert tree["critic"] == {"strategy": "fsdp", "ppo_mini_batch_size": 16}


def test_unsupported_key_is_an_error_naming_it() -> None:
    errs = Collector("c.yaml")
    tree_from_verl({"actor_rollout_ref": {"rollout": {"speculative_decoding": True}}}, "c.yaml", errs)
    assert [p.path for p in errs.problems] == ["actor_rollout_ref.rollout.speculative_decoding"]


def test_unset_shell_variable_in_a_mapped_key_is_named() -> None:
    text = "python3 -m verl.trainer.main_ppo data.train_batch_size=${BSZ} trainer.nnodes=1\n"
    errs = Collector("run.sh")
    cfg = verl_from_script(text, "run.sh", errs)
    assert [p.path for p in errs.problems] == ["data.train_batch_size"]
    assert "BSZ" in errs.problems[0].problem
    assert cfg == {"trainer": {"nnodes": 1}}


def test_script_without_launch_line_is_refused() -> None:
    errs = Collector("x.sh")
    verl_from_script("echo hi\n", "x.sh", errs)
    assert len(errs.problems) == 1


@pytest.mark.parametrize("expr,value", [("$((3 + 4 * 2))", 11), ("$(((1 + 2) * 3))", 9),
                                        ("$((A / 2 - 1))", 4)])
def test_shell_arithmetic(expr: str, value: int) -> None:
    text = f"A=10\npython3 -m verl.trainer.main_ppo data.train_batch_size={expr}\n"
    errs = Collector("s.sh")
    assert verl_from_script(text, "s.sh", errs) == {"data": {"train_batch_size": value}}


def test_megatron_offload_and_context_parallel() -> None:
    # key names as in verl's examples/grpo_trainer/run_deepseek671b_math_megatron_96gb.sh
    p = "actor_rollout_ref.actor.megatron."
    args = [f"{p}param_offload=True", f"{p}optimizer_offload=False", f"{p}grad_offload=True",
            f"{p}context_parallel_size=2", "actor_rollout_ref.ref.megatron.param_offload=True"]
    errs = Collector("m.sh")
    tree = tree_from_verl(overrides_to_cfg(args), "m.sh", errs)
    assert errs.problems == []
    assert tree["actor"]["offload"] == {"params": True, "optimizer": False, "grads": True}
    assert tree["actor"]["parallel"] == {"cp": 2}
    assert tree["reference"] == {"offload": {"params": True}}


def test_a_job_file_takes_the_rest_from_its_verl_launch_script(tmp_path):
    """`verl_config:` names verl's own launch script; the job file adds what verl does not say (the
    device, the response lengths) and wins where both speak. Expected values are read from
    tests/data/verl/dapo_7b_math_fsdp2_colocate.sh: train_batch_size 512, rollout.n 12, rollout tp
    2, 2 nodes x 8 GPUs; the job file's placement.iterations 2 and its lognormal mean 1500."""
    import shutil

    from simtrain.rl.spec import load_rl_job

    shutil.copy(DATA / "dapo_7b_math_fsdp2_colocate.sh", tmp_path / "run.sh")
    f = tmp_path / "job.yaml"
    f.write_text("job: rl\nname: j\nverl_config: run.sh\ncluster: {device: h20-96gb, topology: hgx-h20}\n"
                 "data: {response_length: {kind: lognormal, mean: 1500, sigma: 0.8}}\n"
                 "placement: {kind: colocated, iterations: 2}\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        job = load_rl_job(f)
    assert (job.train_batch_size, job.n, job.engine.tp, job.total_devices, job.iterations) == (512, 12, 2, 16, 2)
    # the script's max_response_length 8192 cuts the lognormal's tail: the clipped mean is a little
    # below 1500 (P(X > 8192) ~ 1 % at sigma 0.8), and well above it had the script's cap not applied
    assert job.response_length.hi == 8192
    assert 1450 < job.response_length.mean() < 1500


def test_a_missing_verl_config_is_one_error(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text("job: rl\nname: j\nverl_config: nowhere.sh\ncluster: {device: h20-96gb, topology: hgx-h20}\n")
    p = subprocess.run([sys.executable, "-m", "simtrain", "run", str(f)], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "verl_config: file 'nowhere.sh' not found beside the job file" in p.stderr


def test_ignored_warning_counts_and_names_the_first_five() -> None:
    """Seven ignored keys: the line gives the count, the first five and '2 more'."""
    from simtrain.rl.verl import ignored_warning
    keys = [f"trainer.k{i}" for i in range(7)]
    w = ignored_warning("f.sh", keys)
    assert w.startswith("f.sh: 7 verl keys without effect on the simulated timing ignored (trainer.k0, ")
    assert "trainer.k4 and 2 more)" in w and "trainer.k5" not in w
    assert "1 verl key without" in ignored_warning("f.sh", keys[:1])


def test_log_prob_micro_batches_map_to_the_actor_and_reference() -> None:
    """run_qwen2-7b.sh: rollout.log_prob_micro_batch_size_per_gpu=40 is the old_log_prob micro batch
    (actor), ref.log_prob_micro_batch_size_per_gpu=40 the reference's; use_remove_padding=True."""
    tree, errs = _load("run_qwen2-7b.sh")
    assert tree["actor"]["log_prob_micro_batch_size_per_gpu"] == 40
    assert tree["reference"]["log_prob_micro_batch_size_per_gpu"] == 40
    assert tree["actor"]["use_remove_padding"] is True
