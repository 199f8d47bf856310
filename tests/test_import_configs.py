"""`simtrain import` of real public configuration files (tests/data/imports/, sources and licences
in its README) and `simtrain run` of them directly.

Expected values are read by hand from the files; derived ones follow the frameworks' own rules:
Megatron dp = world / (tp x pp x cp), microbatches = global / (micro x dp); DeepSpeed
train_batch_size = micro x accumulation x dp; torchtitan dp = replicate x shard with shard -1
filling the world and global batch = local batch x dp.
"""
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from simtrain.cli.main import main
from simtrain.errors import Collector, ConfigError
from simtrain.imports import megatron, shell
from simtrain.imports.common import Options
from simtrain.imports.dispatch import import_files, load_foreign
from simtrain.rl.spec import load_rl_job
from simtrain.spec.loading import load_scenario

DATA = ROOT / "tests" / "data" / "imports"
MEG = DATA / "megatron"
H100 = ["--topology", "dgx-h100", "--device", "h100-sxm5-80gb"]
# Llama 3 8B's published dimensions (meta-llama/Meta-Llama-3-8B config.json)
LLAMA3_8B_HF = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
                "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
                "vocab_size": 128256, "max_position_embeddings": 8192, "tie_word_embeddings": False}


def run_import(tmp_path: Path, *argv: str) -> dict:
    out = tmp_path / "s.yaml"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["import", *argv, "-o", str(out)]) == 0
    assert main(["check", str(out)]) == 0          # the written scenario loads
    return yaml.safe_load(out.read_text())


def loaded(tmp_path: Path):
    return load_scenario(tmp_path / "s.yaml")[0]


# -- Megatron-LM ----------------------------------------------------------------------------

def test_gpt3_175b_script(tmp_path):
    """examples/gpt3/train_gpt3_175b_distributed.sh: tp 8, pp 16, micro 1, global 1536, fp16, 96 layers
    of 12288 with 96 heads, seq 2048. The script runs on 1 node of 8 (NUM_NODES=1), too few for
    tp x pp = 128: with --world-size 1024, dp = 1024 / 128 = 8 and 1536 / (1 x 8) = 192 microbatches.
    No tokenizer type with --merge-file: GPT-2's BPE, 50257 tokens."""
    t = run_import(tmp_path, "megatron", str(MEG / "train_gpt3_175b_distributed.sh"), "--world-size", "1024",
                   "--topology", "dgx-a100", "--device", "a100-sxm4-80gb")
    assert t["parallel"] | {} == {**t["parallel"], "tp": 8, "pp": 16, "cp": 1, "dp": 8, "zero_stage": 0,
                                  "overlap_grad_reduce": False}
    assert t["model"] == {"architecture": "gpt", "num_layers": 96, "hidden_size": 12288, "num_attention_heads": 96,
                          "num_key_value_heads": 96, "ffn_hidden_size": 4 * 12288, "vocab_size": 50257, "seq_length": 2048,
                          "tie_embeddings": True}
    assert t["training"]["precision"] == "fp16" and t["training"]["global_batch_size"] == 1536
    assert t["cluster"]["nodes"] == 1024 // 8
    sc = loaded(tmp_path)
    assert sc.training.global_batch_size // (sc.training.micro_batch_size * sc.parallel.dp) == 192


def test_gpt3_script_as_written_is_refused_naming_the_field():
    """Without --world-size the script's own 1 x 8 devices cannot hold tp 8 x pp 16."""
    with warnings.catch_warnings(), pytest.raises(ConfigError) as e:
        warnings.simplefilter("ignore")
        import_files("megatron", [str(MEG / "train_gpt3_175b_distributed.sh")], Options(topology="dgx-a100", device="a100-sxm4-80gb"),
                     Path("s.yaml"))
    (p,) = e.value.problems
    assert p.file.endswith("train_gpt3_175b_distributed.sh") and p.path == "--pipeline-model-parallel-size"
    assert "128 does not divide the world size 8" in p.problem and "--world-size" in p.fix


def test_llama3_8b_fp8_script(tmp_path):
    """examples/llama/train_llama3_8b_h100_fp8.sh: variables ($TP_SIZE=1, $NUM_LAYERS=32, $SEQ_LENGTH=8192),
    an `if [[ $DTYPE == fp8 ]]` array (--fp8-format hybrid) and the MOCK-data branch (--vocab-size
    128256); GQA with 8 groups, distributed optimizer, both overlaps; 1 node x 8: dp 8, 128 / 8 = 16
    microbatches."""
    t = run_import(tmp_path, "megatron", str(MEG / "train_llama3_8b_h100_fp8.sh"), *H100)
    m, p, tr = t["model"], t["parallel"], t["training"]
    assert (m["architecture"], m["num_layers"], m["hidden_size"], m["ffn_hidden_size"], m["num_key_value_heads"],
            m["vocab_size"], m["seq_length"], m["tie_embeddings"]) == ("llama", 32, 4096, 14336, 8, 128256, 8192, False)
    assert "head_dim" not in m                        # --kv-channels 128 = 4096 / 32
    # --sequence-parallel at tp 1: Megatron-LM switches it off, so the file leaves it out (no warning on every run)
    assert (p["tp"], p["cp"], p["pp"], p["dp"], p["zero_stage"], "sequence_parallel" in p) == (1, 1, 1, 8, 1, False)
    assert p["overlap_grad_reduce"] is True and p["overlap_param_gather"] is True
    assert (tr["precision"], tr["micro_batch_size"], tr["global_batch_size"]) == ("fp8", 1, 128)
    assert t["cluster"]["nodes"] == 1


def test_mixtral_script_moe_and_derived_expert_tp(tmp_path):
    """examples/mixtral/train_mixtral_8x7b_distributed.sh: 8 experts top-2, ep 8, pp 4, tp 1; no
    --expert-tensor-parallel-size, so Megatron's default etp = tp = 1; on 64 devices dp = 64 / 4 = 16,
    256 / (1 x 16) = 16 microbatches. Llama2Tokenizer: the vocabulary (32000) comes from --vocab-size."""
    t = run_import(tmp_path, "megatron", str(MEG / "train_mixtral_8x7b_distributed.sh"), "--world-size", "64",
                   "--vocab-size", "32000", *H100)
    assert t["model"]["moe"] == {"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 14336, "dispatcher": "alltoall"}
    p = t["parallel"]
    assert (p["tp"], p["pp"], p["ep"], p["etp"], p["dp"]) == (1, 4, 8, 1, 16)
    sc = loaded(tmp_path)
    assert sc.training.global_batch_size // (sc.training.micro_batch_size * sc.parallel.dp) == 16


def test_argument_string_and_megatron_defaults(tmp_path):
    """An argument string: --swiglu without --ffn-hidden-size gives int(8 x 1024 / 3 / 64) x 64 = 2688;
    no --global-batch-size: micro x dp = 2 x (16 / 2) = 16; --num-query-groups has no effect without
    --group-query-attention; full recompute of 1 layer at a time (uniform) is full recompute."""
    args = ("--tensor-model-parallel-size 2 --num-layers 32 --hidden-size 1024 --num-attention-heads 16 "
            "--num-query-groups 4 --swiglu --seq-length 1024 --micro-batch-size 2 --vocab-size 32000 --bf16 "
            "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1")
    t = run_import(tmp_path, "megatron", "--args", args, "--world-size", "16", *H100)
    assert t["model"]["ffn_hidden_size"] == 2688 and t["model"]["num_key_value_heads"] == 16
    assert t["parallel"]["dp"] == 8 and t["training"]["global_batch_size"] == 16
    assert t["training"]["recompute"] == "full" and t["parallel"]["schedule"] == "1f1b"


def test_virtual_pipeline_stages(tmp_path):
    """--num-layers-per-virtual-pipeline-stage 4 with 32 layers and pp 2: 32 / (2 x 4) = 4 chunks per
    rank, the interleaved schedule; dp = 16 / (2 x 2) = 4, 64 / (2 x 4) = 8 microbatches."""
    args = ("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 4 "
            "--num-layers 32 --hidden-size 1024 --num-attention-heads 16 --ffn-hidden-size 4096 --seq-length 1024 "
            "--micro-batch-size 2 --global-batch-size 64 --vocab-size 32000 --bf16")
    t = run_import(tmp_path, "megatron", "--args", args, "--world-size", "16", *H100)
    assert t["parallel"]["schedule"] == "interleaved_1f1b" and t["parallel"]["vpp"] == 4 and t["parallel"]["dp"] == 4
    sc = loaded(tmp_path)
    assert sc.training.global_batch_size // (sc.training.micro_batch_size * sc.parallel.dp) == 8


def test_pipeline_layout():
    """`Et*3|(tt|)*2,t|L`: stages of 3, 2, 2 and 1 (+ the loss stage, 0) transformer layers."""
    from simtrain.errors import Collector
    assert megatron.layout_stages("Et*3|(tt|)*2,t|L", "f", Collector("f")) == [3, 2, 2, 1, 0]


def test_layout_sets_the_stages(tmp_path):
    """--pipeline-model-parallel-layout with 4 stages on pp 2: 2 virtual stages per rank, layer counts
    as written (E and L ride on the first and last stage)."""
    args = ("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et*3|t*3|t|t*1L --num-layers 8 "
            "--hidden-size 256 --num-attention-heads 4 --ffn-hidden-size 1024 --seq-length 512 --micro-batch-size 1 "
            "--global-batch-size 16 --vocab-size 1000 --bf16")
    t = run_import(tmp_path, "megatron", "--args", args, "--world-size", "8", *H100)
    assert t["parallel"]["layers_per_stage"] == [3, 3, 1, 1] and t["parallel"]["vpp"] == 2


def test_run_and_export_from_the_command_line(tmp_path, capsys):
    """`simtrain run` on the 8B TOML: 8 nodes x 8 = 64 devices, dp 64, global 1 x 64 = 64;
    `simtrain export megatron` prints arguments that carry the scenario's tp."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["run", str(DATA / "torchtitan" / "llama3_8b.toml"), "--json", "--set", "cluster.topology=dgx-h100",
                     "--set", "cluster.device=h100-sxm5-80gb", "--set", "cluster.nodes=8"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["num_devices"] == 64 and r["num_microbatches"] == 1
    assert main(["export", "megatron", str(ROOT / "scenarios" / "llama3-8b-h200-64.yaml")]) == 0
    out = capsys.readouterr().out
    assert "--tensor-model-parallel-size 2" in out and "--global-batch-size 512" in out


def test_export_round_trip(tmp_path):
    """scenario -> `simtrain export megatron` -> `simtrain import megatron` gives the same resolved scenario
    (the shipped Mixtral scenario: MoE, ep, pp, selective recompute, ZeRO 1)."""
    src = ROOT / "scenarios" / "mixtral-8x7b-h100-64.yaml"
    sc, _ = load_scenario(src)
    args = " ".join(megatron.to_args(sc.resolved()))
    run_import(tmp_path, "megatron", "--args", args, "--world-size", "64", *H100, "--name", sc.name)
    back = loaded(tmp_path).resolved()
    want = sc.resolved()
    for d in (back, want):
        d["model"].pop("name", None)
        d["cluster"].pop("topology", None)
    assert back["model"] == want["model"]
    assert back["training"] == want["training"]
    assert back["parallel"] == want["parallel"]


def test_fp8_param_gather_round_trip(tmp_path):
    """training.fp8_param_gather exports as --fp8-param-gather and imports back (current scaling:
    --fp8-recipe tensorwise)."""
    src = ROOT / "scenarios" / "mixtral-8x7b-h100-64.yaml"
    sc, _ = load_scenario(src, ["training.precision=fp8", "training.fp8_recipe=current", "training.fp8_param_gather=true"])
    args = megatron.to_args(sc.resolved())
    assert "--fp8-param-gather" in args
    t = run_import(tmp_path, "megatron", "--args", " ".join(args), "--world-size", "64", *H100, "--name", sc.name)
    assert (t["training"]["fp8_recipe"], t["training"]["fp8_param_gather"]) == ("current", True)


@pytest.mark.parametrize("section,key,flag", [("training", "grad_reduce_in_bf16", "--grad-reduce-in-bf16"),
                                              ("model", "qk_norm", "--qk-layernorm")])
def test_boolean_key_round_trip(tmp_path, section, key, flag):
    """A boolean key set true exports as its Megatron flag and imports back; left at its default
    (false on the shipped Mixtral scenario) the flag is not written."""
    src = ROOT / "scenarios" / "mixtral-8x7b-h100-64.yaml"
    sc, _ = load_scenario(src, [f"{section}.{key}=true"])
    args = megatron.to_args(sc.resolved())
    assert flag in args
    t = run_import(tmp_path, "megatron", "--args", " ".join(args), "--world-size", "64", *H100, "--name", sc.name)
    assert t[section][key] is True
    assert flag not in megatron.to_args(load_scenario(src)[0].resolved())


def test_megatron_fusion_switches_round_trip(tmp_path):
    """Megatron's --no-*-fusion switches and --cross-entropy-loss-fusion map onto training.fusions
    (their names in megatron/training/arguments.py), and export back to the same switches."""
    src = ROOT / "scenarios" / "mixtral-8x7b-h100-64.yaml"
    sc, _ = load_scenario(src)
    args = " ".join(megatron.to_args(sc.resolved())) + " --no-bias-swiglu-fusion --no-rope-fusion --cross-entropy-loss-fusion"
    t = run_import(tmp_path, "megatron", "--args", args, "--world-size", "64", *H100, "--name", sc.name)
    assert t["training"]["fusions"] == {"bias_swiglu": False, "rope": False, "cross_entropy": True}
    back = megatron.to_args(loaded(tmp_path).resolved())
    assert {"--no-bias-swiglu-fusion", "--no-rope-fusion", "--cross-entropy-loss-fusion"} <= set(back)
    assert "--no-bias-gelu-fusion" not in back


# -- DeepSpeed ------------------------------------------------------------------------------

def _hf(tmp_path: Path) -> str:
    f = tmp_path / "config.json"
    f.write_text(json.dumps(LLAMA3_8B_HF))
    return str(f)


def test_deepspeed_auto_micro_batch_from_flag(tmp_path):
    """ds_config_fp16_z2.json: micro "auto" -> --micro-batch-size 2; ZeRO 2, fp16; overlap_comm absent
    (DeepSpeed: false below stage 3); 64 devices: dp 64, train batch 2 x 1 x 64 = 128."""
    t = run_import(tmp_path, "deepspeed", str(DATA / "deepspeed" / "ds_config_fp16_z2.json"), "--hf-config", _hf(tmp_path),
                   "--world-size", "64", "--seq-length", "4096", "--micro-batch-size", "2", *H100)
    assert t["parallel"] == {"tp": 1, "pp": 1, "dp": 64, "zero_stage": 2, "overlap_grad_reduce": False,
                             "bucket_size_params": 500_000_000}
    assert t["training"] == {"micro_batch_size": 2, "global_batch_size": 128, "precision": "fp16", "recompute": "none"}
    assert loaded(tmp_path).model.num_layers == 32


def test_deepspeed_train_batch_with_accumulation(tmp_path):
    """ds_fp16_z1_config.json: train_batch_size 256, gradient_accumulation_steps 1: on 64 devices the
    micro batch is 256 / (1 x 64) = 4; ZeRO 1, fp16."""
    t = run_import(tmp_path, "deepspeed", str(DATA / "deepspeed" / "ds_fp16_z1_config.json"), "--model", "llama3-8b",
                   "--world-size", "64", "--seq-length", "2048", *H100)
    assert (t["training"]["micro_batch_size"], t["training"]["global_batch_size"]) == (4, 256)
    assert t["parallel"]["zero_stage"] == 1 and t["training"]["precision"] == "fp16"


def test_deepspeed_zero3_example_with_flags(tmp_path):
    """ds_config_z3.json says only stage 3 and micro "auto": --micro-batch-size 1 and --precision bf16
    complete it; overlap_comm absent at stage 3 is on (DeepSpeed's stage-3 default), for gradients and
    parameter gathering alike; dp 16, global 1 x 1 x 16 = 16."""
    t = run_import(tmp_path, "deepspeed", str(DATA / "deepspeed" / "ds_config_z3.json"), "--model", "llama3-8b",
                   "--world-size", "16", "--seq-length", "2048", "--micro-batch-size", "1", "--precision", "bf16", *H100)
    assert t["parallel"]["zero_stage"] == 3 and t["parallel"]["overlap_grad_reduce"] is True
    assert t["parallel"]["overlap_param_gather"] is True
    assert t["training"]["global_batch_size"] == 16 and t["training"]["precision"] == "bf16"


def test_deepspeed_other_auto_values_are_reported(tmp_path):
    f = tmp_path / "ds.json"
    f.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                             "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto"}}))
    with pytest.warns(UserWarning, match=r'2 "auto" values .* zero_optimization\.reduce_bucket_size, '
                                         r"zero_optimization\.stage3_prefetch_bucket_size"):
        import_files("deepspeed", [str(f)], Options(topology="dgx-h100", device="h100-sxm5-80gb", world_size=8, seq_length=1024,
                                                    model="llama3-8b"), tmp_path / "s.yaml")


# -- torchtitan -----------------------------------------------------------------------------

@pytest.mark.parametrize("flavor,local,tp,recompute,prec", [
    ("8b", 1, 1, "op", "bf16"),             # selective_ac_option "op": the op-level policy
    ("70b", 8, 8, "full", "bf16"),
    ("405b", 2, 8, "full", "fp8"),          # converters = ["float8"]; no recipe_name: torchao's tensorwise
])
def test_torchtitan_llama3(tmp_path, flavor, local, tp, recompute, prec):
    """torchtitan's Llama 3 TOMLs (commit 4a950ea) on 128 devices: shard -1 fills the world,
    dp = 128 / tp; FSDP (ZeRO 3); global batch = local x dp; seq_len 8192."""
    t = run_import(tmp_path, "torchtitan", str(DATA / "torchtitan" / f"llama3_{flavor}.toml"), "--world-size", "128", *H100)
    dp = 128 // tp
    assert t["model"] == {"preset": f"llama3-{flavor}", "seq_length": 8192}
    assert (t["parallel"]["tp"], t["parallel"]["dp"], t["parallel"]["zero_stage"]) == (tp, dp, 3)
    # torchao float8 with its default tensorwise scaling; the 405B file all-gathers its weights in FP8
    recipe = {"fp8_recipe": "torchao_tensorwise", "fp8_param_gather": True} if prec == "fp8" else {}
    # eager SwiGLU and rotary (torchtitan's model code); these files set no norm_type: torch.nn.RMSNorm, fused
    assert t["training"] == {"micro_batch_size": local, "global_batch_size": local * dp, "precision": prec,
                             "recompute": recompute, **recipe,
                             "fusions": {"norm": True, "bias_swiglu": False, "rope": False}, "loss_kernel": "torch"}


@pytest.mark.parametrize("norm_type,fused", [("rmsnorm", False), ("fused_rmsnorm", True)])
def test_torchtitan_norm_type(tmp_path, norm_type, fused):
    """Older torchtitan files name the norm: rmsnorm is its eager RMSNorm (torchtitan/models/norms.py
    at 9dec370: x.float(), pow, mean, rsqrt, type_as, * weight), fused_rmsnorm its Triton kernel."""
    f = tmp_path / "t.toml"
    f.write_text(f'[model]\nname = "llama3"\nflavor = "8B"\nnorm_type = "{norm_type}"\n[training]\nlocal_batch_size = 1\n'
                 'seq_len = 1024\n[activation_checkpoint]\nmode = "none"\n')
    t = run_import(tmp_path, "torchtitan", str(f), "--world-size", "8", *H100)
    assert t["training"]["fusions"] == {"norm": fused, "bias_swiglu": False, "rope": False}


# -- verl -----------------------------------------------------------------------------------

def test_verl_script_becomes_a_job_file(tmp_path):
    """tests/data/verl/run_qwen2-7b.sh: train_batch_size 1024, n 5, rollout tp 2, trainer.nnodes 1."""
    out = tmp_path / "job.yaml"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["import", "verl", str(ROOT / "tests" / "data" / "verl" / "run_qwen2-7b.sh"), "--model", "qwen2.5-7b",
                     "--response-length", "{kind: lognormal, mean: 600, sigma: 0.5}", "--topology", "hgx-h20",
                     "--device", "h20-96gb", "-o", str(out)]) == 0
    t = yaml.safe_load(out.read_text())
    assert t["job"] == "rl" and t["data"]["train_batch_size"] == 1024 and t["data"]["n"] == 5
    assert t["rollout"]["tp"] == 2 and t["cluster"]["nodes"] == 1
    job = load_rl_job(out)
    assert job.engine.tp == 2 and job.train_batch_size == 1024


# -- simtrain run on a foreign file ---------------------------------------------------------

def test_run_takes_a_megatron_script(tmp_path, capsys):
    """`simtrain run script.sh --set cluster...`: imported in memory, dp = 8 x 1 / 1 = 8 for the 8B script."""
    over = ["cluster.topology=dgx-h100", "cluster.device=h100-sxm5-80gb"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sc, _ = load_foreign(str(MEG / "train_llama3_8b_h100_fp8.sh"), over)
    assert sc.parallel.dp == 8 and sc.training.precision == "fp8"
    assert load_foreign(str(ROOT / "scenarios" / "llama3-8b-h200-64.yaml"), []) is None


# -- broken files: one clear error naming file and field ----------------------------------

@dataclass
class Bad:
    id: str
    kind: str
    text: str
    suffix: str
    field: str
    words: str
    extra: tuple = ()


BAD = [
    Bad("unset-variable", "megatron", "torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size $TP "
        "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --vocab-size 100 --bf16", ".sh",
        "--tensor-model-parallel-size", "$TP unset"),
    Bad("fp32", "megatron", "torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --num-layers 2 --hidden-size 64 "
        "--num-attention-heads 4 --seq-length 128 --vocab-size 100", ".sh", "--bf16", "fp32"),
    Bad("no-vocab", "megatron", "torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --num-layers 2 --hidden-size 64 "
        "--num-attention-heads 4 --seq-length 128 --bf16 --tokenizer-type HuggingFaceTokenizer", ".sh", "--vocab-size", "vocabulary"),
    Bad("cpu-offload", "megatron", "torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --num-layers 2 --hidden-size 64 "
        "--num-attention-heads 4 --seq-length 128 --vocab-size 100 --bf16 --cpu-offloading", ".sh", "--cpu-offloading", "offloading"),
    Bad("partial-recompute", "megatron", "torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --num-layers 8 --hidden-size 64 "
        "--num-attention-heads 4 --seq-length 128 --vocab-size 100 --bf16 --recompute-granularity full --recompute-method block "
        "--recompute-num-layers 2", ".sh", "--recompute-num-layers", "2 of 8"),
    Bad("bad-batch", "megatron", "torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --num-layers 2 --hidden-size 64 "
        "--num-attention-heads 4 --seq-length 128 --vocab-size 100 --bf16 --micro-batch-size 1 --global-batch-size 12", ".sh",
        "--global-batch-size", "micro batch x dp"),
    Bad("no-launch", "megatron", "echo hello\n", ".sh", "(script)", "no launch command"),
    Bad("ds-offload", "deepspeed", json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}), ".json",
        "zero_optimization.offload_optimizer.device", "offloading to cpu"),
    Bad("ds-auto", "deepspeed", json.dumps({"train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": True}}), ".json",
        "train_micro_batch_size_per_gpu", '"auto"'),
    Bad("ds-fp32", "deepspeed", json.dumps({"train_micro_batch_size_per_gpu": 1}), ".json", "bf16.enabled", "fp32"),
    Bad("ds-batch-mismatch", "deepspeed", json.dumps({"train_batch_size": 100, "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1, "bf16": {"enabled": True}}), ".json", "train_batch_size", "!="),
    Bad("tt-hsdp", "torchtitan", '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 1\nseq_len = 1024\n'
        "[activation_checkpoint]\nmode = \"none\"\n[parallelism]\ndata_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 4\n", ".toml",
        "parallelism.data_parallel_replicate_degree", "HSDP"),
    Bad("tt-schedule", "torchtitan", '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 4\nseq_len = 1024\n'
        '[activation_checkpoint]\nmode = "none"\n[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = "LoopedBFS"\n', ".toml",
        "parallelism.pipeline_parallel_schedule", "LoopedBFS"),
    Bad("tt-every-2nd", "torchtitan", '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 1\nseq_len = 1024\n'
        '[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "2"\n', ".toml",
        "activation_checkpoint.selective_ac_option", "every 2-th"),
    Bad("tt-default-ac", "torchtitan", '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 1\nseq_len = 1024\n',
        ".toml", "activation_checkpoint.selective_ac_option", "torchtitan's default"),
    Bad("tt-syntax", "torchtitan", "[training\n", ".toml", "", "not valid TOML"),
    Bad("tt-layernorm", "torchtitan", '[model]\nname = "llama3"\nflavor = "8B"\nnorm_type = "layernorm"\n[training]\n'
        'local_batch_size = 1\nseq_len = 1024\n[activation_checkpoint]\nmode = "none"\n', ".toml", "model.norm_type",
        "not modelled"),
    Bad("tt-unknown-model", "torchtitan", '[model]\nname = "qwen3"\nflavor = "0.6B"\n[training]\nlocal_batch_size = 1\n'
        "seq_len = 1024\n[activation_checkpoint]\nmode = \"full\"\n", ".toml", "model.flavor", "no simtrain preset"),
]


@pytest.mark.parametrize("case", BAD, ids=[b.id for b in BAD])
def test_broken_file_gives_one_clear_error(tmp_path, case):
    f = tmp_path / f"bad{case.suffix}"
    f.write_text(case.text)
    opts = Options(topology="dgx-h100", device="h100-sxm5-80gb", world_size=8, seq_length=1024, model="llama3-8b"
                   if case.kind == "deepspeed" else None)
    with warnings.catch_warnings(), pytest.raises(ConfigError) as e:
        warnings.simplefilter("ignore")
        import_files(case.kind, [str(f)], opts, tmp_path / "s.yaml")
    (p,) = e.value.problems
    assert p.file == str(f) and p.path == case.field
    assert case.words in p.problem and p.fix


def test_env_sets_a_variable_the_script_reads(tmp_path):
    """`--env TP=2`: the script's $TP is 2, so dp = 8 / 2 = 4 (the same script without it: the
    unset-variable case above)."""
    f = tmp_path / "t.sh"
    f.write_text(BAD[0].text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = import_files("megatron", [str(f)], Options(topology="dgx-h100", device="h100-sxm5-80gb", env={"TP": "2"}),
                         tmp_path / "s.yaml")
    assert t["parallel"]["tp"] == 2 and t["parallel"]["dp"] == 4


def test_missing_cluster_flags_are_named(tmp_path):
    with warnings.catch_warnings(), pytest.raises(ConfigError) as e:
        warnings.simplefilter("ignore")
        import_files("torchtitan", [str(DATA / "torchtitan" / "llama3_8b.toml")], Options(world_size=8), tmp_path / "s.yaml")
    (p,) = e.value.problems
    assert p.path == "cluster" and "--topology" in p.fix and "--device" in p.fix


def test_ignored_fields_are_one_warning_with_count_and_names(tmp_path):
    """The 8B TOML's 26 unread fields (checkpoint, job, metrics, ...) in one warning."""
    with pytest.warns(UserWarning, match=r"ignored 26 fields that simtrain does not read: checkpoint\.async_mode, .* and 14 more"):
        import_files("torchtitan", [str(DATA / "torchtitan" / "llama3_8b.toml")], Options(world_size=8, topology="dgx-h100",
                     device="h100-sxm5-80gb"), tmp_path / "s.yaml")


def test_shell_arrays_quotes_and_arithmetic():
    """The bash subset the reader follows, each against what bash prints for it."""
    s = shell.run_script('N=2\nG=8\nW=$(($N*$G))\nA=(--a 1\n  "--b two" # c\n)\nA+=("--w $W")\n'
                         'if [[ "$X" == "" ]]; then B=yes; else B=no; fi\nrun.py ${A[@]} "${A[@]}" ${B:-z} ${U:-dflt}\n',
                         lambda w: w[0].text == "run.py")
    assert [w.text for w in s.words] == ["run.py", "--a", "1", "--b", "two", "--w", "16", "--a", "1", "--b two", "--w 16",
                                         "yes", "dflt"]


# -- misspelled and answer-changing Megatron arguments ---------------------------------------

GPT3_ARGS = ["--world-size", "1024", "--topology", "dgx-a100", "--device", "a100-sxm4-80gb"]


def _megatron_problems(tmp_path, text: str, suffix: str = ".sh", **opts) -> list:
    f = tmp_path / f"t{suffix}"
    f.write_text(text)
    with warnings.catch_warnings(), pytest.raises(ConfigError) as e:
        warnings.simplefilter("ignore")
        import_files("megatron", [str(f)], Options(topology="dgx-a100", device="a100-sxm4-80gb", **opts), tmp_path / "s.yaml")
    return list(e.value.problems)


def test_misspelled_megatron_argument_is_refused_with_the_real_name(tmp_path, capsys):
    """The GPT-3 script with one letter dropped from --tensor-model-parallel-size: Megatron-LM would
    refuse it, and read as written tp would silently be 1. One error, naming it and the real name."""
    text = (MEG / "train_gpt3_175b_distributed.sh").read_text()
    assert text.count("--tensor-model-parallel-size 8") == 1
    typo = text.replace("--tensor-model-parallel-size 8", "--tensor-model-paralel-size 8")
    (p,) = _megatron_problems(tmp_path, typo, world_size=1024)
    assert p.file == str(tmp_path / "t.sh") and p.path == "--tensor-model-paralel-size"
    assert p.problem.startswith("not a Megatron-LM argument") and p.fix == "did you mean --tensor-model-parallel-size?"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["import", "megatron", str(tmp_path / "t.sh"), *GPT3_ARGS, "-o", str(tmp_path / "o.yaml")]) == 2
    err = capsys.readouterr().err
    assert "--tensor-model-paralel-size: not a Megatron-LM argument" in err and "Traceback" not in err
    assert not (tmp_path / "o.yaml").exists()


def test_unknown_argument_without_a_close_name_is_a_warning(tmp_path):
    """--deepspeed / --zero-stage (Megatron-DeepSpeed's) and --patch-tokenizer-type
    (Pai-Megatron-Patch's; six edits from --tokenizer-type) are more than two edits from every
    Megatron-LM name: a fork's arguments, named in one warning, not refused."""
    f = tmp_path / "t.args"
    f.write_text("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 "
                 "--vocab-size 1000 --bf16 --micro-batch-size 1 --deepspeed --zero-stage 1 --patch-tokenizer-type Qwen2Tokenizer")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        import_files("megatron", [str(f)], Options(topology="dgx-a100", device="a100-sxm4-80gb", world_size=8), tmp_path / "s.yaml")
    (msg,) = [str(x.message) for x in w if "does not define" in str(x.message)]
    assert "3 arguments" in msg and all(x in msg for x in ("--deepspeed", "--zero-stage", "--patch-tokenizer-type"))
    assert not any("--deepspeed" in str(x.message) for x in w if "does not define" not in str(x.message))


def test_every_argument_of_the_examples_and_the_export_is_known():
    """Nothing the committed Megatron-LM scripts pass, nor what `simtrain export megatron` writes,
    is taken for a misspelling."""
    for f in sorted(MEG.glob("*.sh")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            values, _, _ = megatron.read_args(str(f), f.read_text(), Options(), Collector(str(f)))
        assert len(values) > 30 and [k for k in values if not megatron.known_arg(k)] == []
    for src in ("mixtral-8x7b-h100-64.yaml", "llama3-8b-h200-64.yaml"):
        sc, _ = load_scenario(ROOT / "scenarios" / src)
        flags = [a for a in megatron.to_args(sc.resolved()) if a.startswith("--")]
        assert [a for a in flags if not megatron.known_arg(a)] == []
    assert not megatron.known_arg("--tensor-model-paralel-size")


def _import_warnings(tmp_path, capsys, *argv) -> list:
    """The warnings `simtrain import megatron ARGV` prints, one per line, without `warning: `."""
    assert main(["import", "megatron", *argv, "-o", str(tmp_path / "s.yaml")]) == 0
    return [x.removeprefix("warning: ") for x in capsys.readouterr().err.splitlines() if x.startswith("warning: ")]


def test_grad_reduce_in_bf16_and_fp8_param_gather_are_read(tmp_path, capsys):
    """The Llama 3 8B FP8 script passes --grad-reduce-in-bf16 (bf16 gradients) and, in its fp8
    branch (delayed scaling, Megatron-LM's default recipe), --fp8-param-gather: they become
    training.grad_reduce_in_bf16 and training.fp8_param_gather, without a warning, and neither
    hides in the ignored list."""
    f = str(MEG / "train_llama3_8b_h100_fp8.sh")
    msgs = _import_warnings(tmp_path, capsys, f, *H100)
    assert not [m for m in msgs if "--grad-reduce-in-bf16" in m or "--fp8-param-gather" in m]
    t = yaml.safe_load((tmp_path / "s.yaml").read_text())["training"]
    assert t["grad_reduce_in_bf16"] is True and t["fp8_param_gather"] is True


def test_fp8_param_gather_with_block_scales_warns(tmp_path, capsys):
    """With a block recipe (blockwise; mxfp8 as Megatron-Bridge's MXFP8 configs) the FP8 gather is not modelled:
    the import keeps 16-bit weights and says so."""
    f = tmp_path / "t.args"
    f.write_text(SMALL + "--fp8-format e4m3 --fp8-recipe blockwise --fp8-param-gather --use-distributed-optimizer")
    msgs = _import_warnings(tmp_path, capsys, str(f), "--world-size", "8", *H100)
    assert any(m.startswith("--fp8-param-gather: ") or ": --fp8-param-gather: " in m for m in msgs), msgs
    assert "fp8_param_gather" not in yaml.safe_load((tmp_path / "s.yaml").read_text())["training"]


def test_torchtitan_fsdp_float8_all_gather_is_read(tmp_path):
    """torchtitan's 405B TOML sets enable_fsdp_float8_all_gather (tensorwise float8 under FSDP):
    training.fp8_param_gather; the 8B one sets it false."""
    t = run_import(tmp_path, "torchtitan", str(DATA / "torchtitan" / "llama3_405b.toml"), "--world-size", "128", *H100)
    assert t["training"]["fp8_param_gather"] is True and t["training"]["fp8_recipe"] == "torchao_tensorwise"
    t = run_import(tmp_path, "torchtitan", str(DATA / "torchtitan" / "llama3_8b.toml"), "--world-size", "8", *H100)
    assert "fp8_param_gather" not in t["training"]


def test_grad_reduce_in_bf16_with_fp16_and_dropout_against_the_architecture(tmp_path, capsys):
    """With --fp16 simtrain's gradients are 16-bit too: no warning. simtrain's llama has no dropout,
    so --hidden-dropout 0.1 with --swiglu is warned and --attention-dropout 0.0 is not (it agrees);
    its gpt has dropout, so --hidden-dropout 0 without --swiglu is warned, and --attention-dropout 0
    only without flash attention (flash attention keeps no dropout mask)."""
    base = ("--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --vocab-size 1000 "
            "--micro-batch-size 1 --global-batch-size 8 ")
    msgs = _import_warnings(tmp_path, capsys, "--args", base + "--fp16 --grad-reduce-in-bf16 --swiglu --hidden-dropout 0.1 "
                            "--attention-dropout 0.0", "--world-size", "8", *H100)
    assert not any("--grad-reduce-in-bf16" in m for m in msgs)
    (drop,) = [m for m in msgs if "dropout" in m]
    assert drop == ("--args: --hidden-dropout: the run applies hidden dropout 0.1, but simtrain's llama architecture "
                    "has none: its masks in activation memory are left out")
    msgs = _import_warnings(tmp_path, capsys, "--args", base + "--bf16 --hidden-dropout 0 --attention-dropout 0",
                            "--world-size", "8", *H100)
    assert [m for m in msgs if "dropout" in m] == [
        "--args: --hidden-dropout: the run has no hidden dropout, but simtrain's gpt architecture counts it: its masks in activation memory"]
    msgs = _import_warnings(tmp_path, capsys, "--args", base + "--bf16 --attention-dropout 0 --attention-backend unfused",
                            "--world-size", "8", *H100)
    assert [m for m in msgs if "dropout" in m] == [
        "--args: --attention-dropout: the run has no attention dropout, but simtrain's gpt architecture counts it: "
        "its masks in activation memory and its kernels in the step time"]


# -- JSON that cannot be read ---------------------------------------------------------------

def test_truncated_deepspeed_config_names_line_and_column(tmp_path):
    """The file stops inside the string that opens at line 3, column 33 (` "zero_optimization":
    {"stage": "3`: a space, the 19-character key with its quotes, `:`, a space, `{`, `"stage"`,
    `:`, a space, then the quote). A repeated key keeps the reader's own fix."""
    f = tmp_path / "ds.json"
    f.write_text('{\n "train_micro_batch_size_per_gpu": 4,\n "zero_optimization": {"stage": "3')
    with pytest.raises(ConfigError) as e:
        import_files("deepspeed", [str(f)], Options(topology="dgx-h100", device="h100-sxm5-80gb", world_size=8), tmp_path / "s.yaml")
    (p,) = e.value.problems
    assert p.file == str(f) and p.path == ""
    assert p.problem == "not valid JSON (line 3, column 33: unterminated string starting at this point)"
    assert p.fix == "give a DeepSpeed config (JSON)" and "it not valid" not in str(p)
    f.write_text('{"a": 1, "a": 2}')
    with pytest.raises(ConfigError) as e:
        import_files("deepspeed", [str(f)], Options(topology="dgx-h100", device="h100-sxm5-80gb", world_size=8), tmp_path / "s.yaml")
    (p,) = e.value.problems
    assert p.problem.startswith("duplicate key 'a'") and p.fix == "remove one"


def test_truncated_hf_config_is_named_not_the_output(tmp_path, capsys):
    """`{"model_type": "llama", "hidden_size": 4096` ends after column 43 (1 + 12 + 1 + 1 + 7 + 1 +
    1 + 13 + 1 + 1 + 4 characters), where json expects `,` or `}`: the error names the config file
    and column 44, not the scenario being written."""
    hf = tmp_path / "config.json"
    hf.write_text('{"model_type": "llama", "hidden_size": 4096')
    out = tmp_path / "o.yaml"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["import", "megatron", str(MEG / "train_llama3_8b_h100_fp8.sh"), "--hf-config", str(hf), *H100,
                     "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{hf}: not valid JSON (line 1, column 44: expecting ',' delimiter); give the model's Hugging Face config.json" in err
    assert str(out) not in err and "Traceback" not in err
    hf.write_text("[1, 2]")
    with warnings.catch_warnings(), pytest.raises(ConfigError) as e:
        warnings.simplefilter("ignore")
        import_files("torchtitan", [str(DATA / "torchtitan" / "llama3_8b.toml")],
                     Options(world_size=8, topology="dgx-h100", device="h100-sxm5-80gb", hf_config=str(hf)), out)
    (p,) = e.value.problems
    assert p.file == str(hf) and p.problem == "holds a JSON list, not an object"


def test_torchtitan_degree_below_one_says_the_bound(tmp_path):
    (p,) = _torchtitan_problems(tmp_path, "tensor_parallel_degree = -3")
    assert p.path == "parallelism.tensor_parallel_degree"
    assert p.problem == "expected a whole number >= 1, got -3" and p.fix == "give a whole number >= 1"


def _torchtitan_problems(tmp_path, line: str) -> list:
    f = tmp_path / "t.toml"
    f.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 1\nseq_len = 1024\n'
                 f'[activation_checkpoint]\nmode = "full"\n[parallelism]\n{line}\n')
    with warnings.catch_warnings(), pytest.raises(ConfigError) as e:
        warnings.simplefilter("ignore")
        import_files("torchtitan", [str(f)], Options(topology="dgx-h100", device="h100-sxm5-80gb", world_size=8), tmp_path / "s.yaml")
    return list(e.value.problems)


# -- --tp-comm-overlap ------------------------------------------------------------------------

TP_ARGS = ("--num-layers 2 --hidden-size 256 --num-attention-heads 8 --seq-length 128 --vocab-size 1000 --bf16 "
           "--micro-batch-size 1 --global-batch-size 4 --tensor-model-parallel-size 2 --sequence-parallel --tp-comm-overlap")


def test_tp_comm_overlap_is_read_and_written_back(tmp_path):
    f = tmp_path / "tp.args"
    f.write_text(TP_ARGS)
    t = run_import(tmp_path, "megatron", str(f), "--world-size", "8", "--topology", "dgx-h100", "--device", "h100-sxm5-80gb")
    assert t["parallel"]["tp_comm_overlap"] == "userbuffers" and t["parallel"]["sequence_parallel"] is True
    assert "--tp-comm-overlap" in megatron.to_args(loaded(tmp_path).resolved())


def test_tp_comm_overlap_variants_simtrain_does_not_model(tmp_path):
    """Turning part of the overlap off changes the answer: refused. A configuration file of the
    overlap's methods that is not there: a warning says the defaults are timed (one that is there
    is read: tests/test_tp_comm_overlap.py)."""
    (p,) = _megatron_problems(tmp_path, TP_ARGS + " --tp-comm-overlap-disable-qkv", suffix=".args", world_size=8)
    assert p.path == "--tp-comm-overlap-disable-qkv" and "not modelled" in p.problem
    f = tmp_path / "cfg.args"
    f.write_text(TP_ARGS + " --tp-comm-overlap-cfg ub.yaml")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        import_files("megatron", [str(f)], Options(topology="dgx-h100", device="h100-sxm5-80gb", world_size=8), tmp_path / "s.yaml")
    assert any("--tp-comm-overlap-cfg ub.yaml: no such file" in str(x.message) and "default overlap is timed" in str(x.message)
               for x in w)


def test_torchtitan_async_tp_is_read(tmp_path):
    """torchtitan's Llama 3 405B TOML turns on enable_async_tensor_parallel with tp 8; the 70B
    one leaves it off."""
    t = run_import(tmp_path, "torchtitan", str(DATA / "torchtitan" / "llama3_405b.toml"), "--world-size", "128", *H100)
    assert t["parallel"]["tp_comm_overlap"] == "async_tp" and t["parallel"]["sequence_parallel"] is True
    t = run_import(tmp_path, "torchtitan", str(DATA / "torchtitan" / "llama3_70b.toml"), "--world-size", "128", *H100)
    assert "tp_comm_overlap" not in t["parallel"]


# -- FP8 recipes -----------------------------------------------------------------------------

SMALL = ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --vocab-size 1000 "
         "--bf16 --micro-batch-size 1 ")


@pytest.mark.parametrize("recipe,want", [("delayed", "delayed"), ("tensorwise", "current"),
                                         ("blockwise", "blockwise"), ("mxfp8", "mxfp8")])
def test_megatron_fp8_recipe_maps_onto_training_fp8_recipe(tmp_path, recipe, want):
    """Megatron-LM's --fp8-recipe choices (megatron/training/arguments.py): tensorwise is
    Transformer Engine's Float8CurrentScaling, simtrain's current; the others keep their names."""
    f = tmp_path / "t.args"
    f.write_text(SMALL + f"--fp8-format hybrid --fp8-recipe {recipe}")
    # MXFP8 needs a Blackwell device (an 8-GPU DGX fabric carries it here)
    device = ("--device", "b200-sxm-180gb", "--topology", "dgx-h100") if recipe == "mxfp8" else H100
    t = run_import(tmp_path, "megatron", str(f), "--world-size", "8", *device)
    assert (t["training"]["precision"], t["training"]["fp8_recipe"]) == ("fp8", want)


def test_unknown_fp8_recipe_and_bf16_layers_are_named(tmp_path, capsys):
    """A recipe simtrain has no model of is refused by name; --first-last-layers-bf16 gets its own
    warning saying how the answer differs."""
    f = tmp_path / "t.args"
    f.write_text(SMALL + "--fp8-format hybrid --fp8-recipe custom")
    (p,) = _megatron_problems(tmp_path, f.read_text(), ".args", world_size=8)
    assert p.path == "--fp8-recipe" and "'custom'" in p.problem and "delayed" in p.fix
    f.write_text(SMALL + "--fp8-format hybrid --first-last-layers-bf16")
    msgs = _import_warnings(tmp_path, capsys, str(f), "--world-size", "8", *H100)
    assert any(m.startswith(f"{f}: --first-last-layers-bf16: ") and "faster than the run's" in m for m in msgs)


def test_torchtitan_float8_recipe_names(tmp_path):
    """torchtitan's float8 recipe_name: rowwise -> torchao_rowwise; rowwise_with_gw_hp (bf16
    weight gradients) is refused naming the key."""
    base = (DATA / "torchtitan" / "llama3_405b.toml").read_text()
    f = tmp_path / "t.toml"
    assert base.count("[quantize.linear.float8]\n") == 1
    f.write_text(base.replace("[quantize.linear.float8]\n", '[quantize.linear.float8]\nrecipe_name = "rowwise"\n'))
    t = run_import(tmp_path, "torchtitan", str(f), "--world-size", "128", *H100)
    assert t["training"]["fp8_recipe"] == "torchao_rowwise"
    f.write_text(base.replace("[quantize.linear.float8]\n", '[quantize.linear.float8]\nrecipe_name = "rowwise_with_gw_hp"\n'))
    with warnings.catch_warnings(), pytest.raises(ConfigError) as e:
        warnings.simplefilter("ignore")
        import_files("torchtitan", [str(f)], Options(topology="dgx-h100", device="h100-sxm5-80gb", world_size=128), tmp_path / "s.yaml")
    (p,) = e.value.problems
    assert p.path == "quantize.linear.float8.recipe_name" and "rowwise_with_gw_hp" in p.problem


@pytest.mark.parametrize("recipe", ["delayed", "current", "blockwise"])
def test_fp8_recipe_round_trips_through_megatron_arguments(tmp_path, recipe):
    """An FP8 scenario exported to Megatron-LM arguments and imported back keeps its recipe."""
    sc, _ = load_scenario(ROOT / "scenarios" / "llama3-8b-h200-64.yaml",
                          ["training.precision=fp8", f"training.fp8_recipe={recipe}"])
    args = " ".join(megatron.to_args(sc.resolved()))
    assert f"--fp8-recipe {'tensorwise' if recipe == 'current' else recipe}" in args
    run_import(tmp_path, "megatron", "--args", args, "--world-size", "64", "--topology", "dgx-h100",
               "--device", "h200-sxm-141gb", "--name", sc.name)
    assert loaded(tmp_path).resolved()["training"] == sc.resolved()["training"]


def test_torchao_recipe_exports_as_te_current_scaling_with_a_warning():
    """Megatron-LM has no torchao float8: the export writes TE's current scaling and says so."""
    sc, _ = load_scenario(ROOT / "scenarios" / "llama3-8b-h200-64.yaml",
                          ["training.precision=fp8", "training.fp8_recipe=torchao_tensorwise"])
    with pytest.warns(UserWarning, match="torchao_tensorwise is torchao's"):
        args = megatron.to_args(sc.resolved())
    assert args[args.index("--fp8-recipe") + 1] == "tensorwise"


def test_fp8_format_values_and_base_precision_are_checked(tmp_path):
    """Megatron-LM's --fp8-format takes e4m3 or hybrid; FP8 without --bf16 / --fp16 has an fp32
    base, which simtrain does not model: both refused naming the argument."""
    base = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --vocab-size 1000 --micro-batch-size 1 "
    (p,) = _megatron_problems(tmp_path, base + "--bf16 --fp8-format hybird", ".args", world_size=8)
    assert p.path == "--fp8-format" and "'hybird'" in p.problem and p.fix == "did you mean hybrid?"
    (p,) = _megatron_problems(tmp_path, base + "--bf16 --fp8-format e5m2", ".args", world_size=8)
    assert p.fix == "use e4m3 or hybrid"          # nothing near enough to name
    (p,) = _megatron_problems(tmp_path, base + "--fp8-format hybrid", ".args", world_size=8)
    assert p.path == "--fp8-format" and "fp32" in p.problem


def test_fp8_recipe_without_fp8_format_warns(tmp_path, capsys):
    f = tmp_path / "t.args"
    f.write_text(SMALL + "--fp8-recipe tensorwise")
    msgs = _import_warnings(tmp_path, capsys, str(f), "--world-size", "8", *H100)
    assert any("--fp8-recipe tensorwise: without --fp8-format the run is not FP8" in m for m in msgs)
    f.write_text(SMALL + "--fp8-param-gather")
    msgs = _import_warnings(tmp_path, capsys, str(f), "--world-size", "8", *H100)
    assert any("--fp8-param-gather: without --fp8-format the run is not FP8" in m for m in msgs)


def test_llama_export_writes_no_biases_and_no_dropout():
    """Megatron-LM's defaults have linear biases and 0.1 dropout; simtrain's llama has neither, so
    the export says so."""
    sc, _ = load_scenario(ROOT / "scenarios" / "llama3-8b-h200-64.yaml")
    args = megatron.to_args(sc.resolved())
    assert "--disable-bias-linear" in args
    assert args[args.index("--attention-dropout") + 1] == "0.0" and args[args.index("--hidden-dropout") + 1] == "0.0"


def test_run_on_arguments_without_a_vocabulary_takes_it_from_set(tmp_path, capsys):
    """Megatron reads the vocabulary from the tokenizer at run time, so an argument file may not
    state it: `simtrain run` takes it from --set model.vocab_size (before, only `import` could)."""
    f = tmp_path / "t.args"
    f.write_text("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --bf16 "
                 "--micro-batch-size 1 --tokenizer-type HuggingFaceTokenizer")
    where = ["--set", "cluster.topology=dgx-h100", "--set", "cluster.device=h100-sxm5-80gb", "--set", "cluster.nodes=1"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["run", str(f), *where]) == 2
        assert "--set model.vocab_size=N" in capsys.readouterr().err
        assert main(["run", str(f), *where, "--set", "model.vocab_size=32000", "--json"]) == 0
    assert '"step_time_s"' in capsys.readouterr().out


def test_megatron_pipeline_split_flags_round_trip(tmp_path):
    """--account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split (Megatron-core
    TransformerConfig) map onto the parallel keys of the same names, and export back with the virtual
    stages given per rank (a fixed layer count per virtual stage would not hold: the first and last
    are one layer short). Llama 3.1 405B's 126 layers on pp 8 x vpp 8 need both."""
    sc, _ = load_scenario(ROOT / "scenarios" / "llama3-405b-h100-16384.yaml")
    doc = sc.resolved()
    doc["parallel"].update({"pp": 8, "vpp": 8, "schedule": "interleaved_1f1b", "layers_per_stage": None,
                            "first_stage_layers": None, "last_stage_layers": None})
    args = megatron.to_args(doc)
    assert {"--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"}.isdisjoint(args)
    doc["parallel"]["account_for_embedding_in_pipeline_split"] = doc["parallel"]["account_for_loss_in_pipeline_split"] = True
    args = megatron.to_args(doc)
    assert {"--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"} <= set(args)
    assert args[args.index("--num-virtual-stages-per-pipeline-rank") + 1] == "8"
    assert "--num-layers-per-virtual-pipeline-stage" not in args
    n = sc.world_size
    t = run_import(tmp_path, "megatron", "--args", " ".join(args), "--world-size", str(n), *H100)
    assert t["parallel"]["account_for_embedding_in_pipeline_split"] is True
    assert t["parallel"]["account_for_loss_in_pipeline_split"] is True
    assert t["parallel"]["vpp"] == 8


def test_run_on_a_megatron_file_names_its_flags_in_errors(tmp_path, capsys):
    """`simtrain run FILE.sh`: a value the scenario checks refuse is named after the flag that set it,
    with the scenario key beside it; a value given with --set keeps the --set attribution."""
    f = tmp_path / "bad.sh"
    f.write_text("torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --num-layers 2 --hidden-size 64 "
                 "--num-attention-heads 4 --seq-length 128 --vocab-size 100 --bf16 --tensor-model-parallel-size 8 "
                 "--micro-batch-size 1 --global-batch-size 8\n")
    where = ["--set", "cluster.topology=dgx-h100", "--set", "cluster.device=h100-sxm5-80gb", "--set", "cluster.nodes=1"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["run", str(f), *where]) == 2
    err = capsys.readouterr().err
    assert f"{f}: --tensor-model-parallel-size (parallel.tp): tp=8 does not divide num_attention_heads=4" in err
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["run", str(f), *where, "--set", "parallel.tp=3"]) == 2
    err = capsys.readouterr().err
    assert f"{f} (--set parallel.tp=3): parallel.tp:" in err and "--tensor-model-parallel-size (" not in err
