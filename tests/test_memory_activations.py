"""Stored activation bytes per layer, term by term, against hand derivations from the published
counts: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv:2205.05198) §4.1-4.2 (GPT: s·b·h·(34 + 5·a·s/h) per layer, (10 + 24/t + 5as/(ht)) with
TP, /t of the whole with TP + SP), generalised per stored tensor for Llama (RMSNorm, SwiGLU's
three h→f tensors, GQA's K and V of g·d, no dropout) and for DeepSeek MLA (DeepSeek-V2 report
arXiv:2405.04434 §2.1.2: per head Q, K of qk_nope + qk_rope, V of v_head_dim, and the
latents), and Megatron-core's selective recompute_modules."""
import pytest
import yaml
from conftest import small_scenario

from simtrain.errors import ConfigError
from simtrain.results.memory import static_memory
from simtrain.spec.loading import load_scenario
from simtrain.workload.transformer import LayerBuilder

S, H, A = 128, 256, 8


def _builder(tmp_path, topo, model=None, training=None, parallel=None):
    over = {}
    if model is not None:
        over["model"] = model
    path = small_scenario(tmp_path, topo, parallel=parallel or {"pp": 1, "dp": 4}, training=training or {}, **over)
    sc, _ = load_scenario(path)
    return LayerBuilder(sc)


def test_gpt_without_flash_is_the_papers_34_plus_5as_over_h(tmp_path, plain_topology):
    """Korthikanti eq. (1): sbh(34 + 5as/h) = 128·256·(34 + 5·8·128/256) = 128·256·54 B;
    selective recompute drops the 5as/h score term, full keeps 2sbh (§4.3, §5)."""
    b = _builder(tmp_path, plain_topology, training={"flash_attention": False})
    assert b.act_per_layer("none") == S * H * (34 + 5 * A * S / H) == 1_769_472
    assert b.act_per_layer("selective") == S * H * 34
    assert b.act_per_layer("full") == 2 * S * H


def test_gpt_tensor_and_sequence_parallel(tmp_path, plain_topology):
    """t = 2: eq. (2) sbh(10 + 24/t + 5as/(ht)); with SP eq. (4) sbh/t·(34 + 5as/h)."""
    b = _builder(tmp_path, plain_topology, training={"flash_attention": False}, parallel={"tp": 2, "pp": 1, "dp": 2})
    assert b.act_per_layer("none") == pytest.approx(S * H * (10 + 24 / 2 + 5 * A * S / (H * 2)))
    b = _builder(tmp_path, plain_topology, training={"flash_attention": False},
                 parallel={"tp": 2, "pp": 1, "dp": 2, "sequence_parallel": True})
    assert b.act_per_layer("none") == pytest.approx(S * H / 2 * (34 + 5 * A * S / H))


LLAMA = {"architecture": "llama", "num_layers": 8, "hidden_size": H, "num_attention_heads": A, "num_key_value_heads": 2,
         "ffn_hidden_size": 512, "vocab_size": 1024, "seq_length": S}


def test_llama_gqa_swiglu_flash(tmp_path, plain_topology):
    """Per token: RMSNorm inputs 2 x 2h, their outputs (QKV and MLP inputs) 2 x 2h = 8h; Q 2·a·d
    = 2h, K and V 2·g·d each (g = 2, d = 32: 128 B each), attention output 2h, SwiGLU gate and up
    outputs 2 x 2f and its output 2f = 6f; flash log-sum-exp 4a. Rotary keeps nothing (its
    backward needs only the fixed angles). 8·256 + 512 + 4·64 + 512 + 6·512 + 32 = 6432 B."""
    b = _builder(tmp_path, plain_topology, model=LLAMA)
    per_token = 8 * H + 2 * H + 4 * 2 * 32 + 2 * H + 6 * 512 + 4 * A
    assert per_token == 6432
    assert b.act_per_layer("none") == S * per_token


MLA = dict(LLAMA, num_key_value_heads=A, mla={"kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
                                               "v_head_dim": 32, "q_lora_rank": 96})


def test_mla_keeps_the_per_head_q_k_v_and_the_latents(tmp_path, plain_topology):
    """MLA, 8 heads of qk 32 + 16 = 48 and v 32, per token: 8h sequence tensors (2048); Q and K
    2 x 2·8·48 = 1536, V 2·8·32 = 512, output 512; SwiGLU 6f = 3072; latents: q_down output
    2·96 and kv_down output 2·(64 + 16) (352), the norms' outputs 2·96 + 2·64 (320); LSE 32:
    8384 B per token."""
    b = _builder(tmp_path, plain_topology, model=MLA)
    per_token = 8 * H + (2 * 384 + 2 * 384 + 2 * 256) + 2 * 256 + 6 * 512 + 352 + 320 + 4 * A
    assert per_token == 8384
    assert b.act_per_layer("none") == S * per_token


def test_recompute_modules_drop_what_they_rebuild(tmp_path, plain_topology):
    """DeepSeek-V3's recompute (report arXiv:2412.19437 §3.2.3: all RMSNorms and MLA's
    up-projections) as Megatron-core names it: the norm outputs (4h + 2·96 + 2·64) and Q, K, V
    (2048) are not kept: 8384 - 1024 - 320 - 2048 = 4992 B per token; the recompute runs the
    norms, the up-projections and the rotary again before the backward."""
    b = _builder(tmp_path, plain_topology, model=MLA,
                 training={"recompute": "selective", "recompute_modules": ["layernorm", "mla_up_proj"]})
    assert b.act_per_layer("selective") == S * 4992
    names = {o.name for seg in b.layer().recompute for o in seg}
    assert names == {"rmsnorm1.recompute", "rmsnorm2.recompute", "q_norm.recompute", "kv_norm.recompute",
                     "q_up.recompute", "kv_up.recompute", "rotary.recompute"}


def test_recompute_modules_default_is_core_attention(tmp_path, plain_topology):
    b = _builder(tmp_path, plain_topology, model=LLAMA, training={"recompute": "selective"})
    assert b.sc.training.recompute_modules == ("core_attn",)
    assert b.act_per_layer("selective") == S * 6432     # flash: the core keeps no scores to drop


def test_recompute_modules_are_checked(tmp_path, plain_topology):
    with pytest.raises(ConfigError, match=r"training.recompute_modules: expected a list.*\('mlp_all' is not one\)"):
        _builder(tmp_path, plain_topology, training={"recompute": "selective", "recompute_modules": ["layernorm", "mlp_all"]})

def test_another_recompute_modes_settings_warn_and_are_not_used(tmp_path, plain_topology):
    """Megatron-LM ignores --recompute-modules outside selective granularity and --recompute-method /
    --recompute-num-layers outside full: so does the loader, with a warning, and the run is the
    plain mode's (an override of training.recompute on a file that names modules still runs)."""
    with pytest.warns(UserWarning, match="training.recompute_modules applies only with training.recompute: selective"):
        b = _builder(tmp_path, plain_topology, training={"recompute": "full", "recompute_modules": ["layernorm"]})
    assert b.sc.training.recompute_modules == ("core_attn",)
    assert "recompute_modules" not in b.sc.resolved()["training"]
    with pytest.warns(UserWarning, match="training.recompute_num_layers applies only with training.recompute: full"):
        b = _builder(tmp_path, plain_topology, training={"recompute": "selective", "recompute_num_layers": 2})
    assert b.sc.training.recompute_num_layers == 1


def test_recompute_modules_round_trip(tmp_path, plain_topology):
    b = _builder(tmp_path, plain_topology, model=MLA, training={"recompute": "selective", "recompute_modules": ["mla_up_proj", "layernorm"]})
    d = b.sc.resolved()
    assert d["training"]["recompute_modules"] == ["layernorm", "mla_up_proj"]
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(d, sort_keys=False))
    assert load_scenario(again)[0].resolved() == d


MOE = dict(LLAMA, moe={"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 128,
                       "num_shared_experts": 1, "shared_expert_ffn_hidden_size": 64})


def test_moe_layer_keeps_expert_rows_and_router_probabilities(tmp_path, plain_topology):
    """An MoE layer on one rank (ep 1, uniform routing, nothing dropped), per token: the Llama
    attention half 8h + 2h + 4·64 + 2h = 3328 (as above, without the MLP); the shared expert's
    SwiGLU 6·64 = 384; fp32 router probabilities 4·E = 16. Per routed row (k = 2 rows per token):
    input 2h = 512, gate and up 4·128 = 512, SwiGLU output 2·128 = 256, its fp32 routing weight 4
    (Megatron-core weights the SwiGLU output, so the combine keeps nothing): 1284. Flash LSE 4a.
    3328 + 384 + 16 + 2·1284 + 32 = 6328 B per token. With activation_fp8_input_store the gate
    and up outputs (routed and shared) are kept in 1 byte: 6328 - 2·256 - 128 = 5688."""
    b = _builder(tmp_path, plain_topology, model=MOE)
    tk = b.moe_tokens(((0.25,) * 4, 0.0), 0)
    assert tk["rows"] == 2 * S
    assert b.act_per_layer("none", "moe", tk["rows"], tk["send"]) == S * 6328
    b8 = _builder(tmp_path, plain_topology, model=MOE, training={"activation_fp8_input_store": True})
    assert b8.act_per_layer("none", "moe", tk["rows"], tk["send"]) == S * 5688
    # moe_act: the routed experts' SwiGLU output is rebuilt from its kept input (2·256 per token)
    br = _builder(tmp_path, plain_topology, model=MOE, training={"recompute": "selective", "recompute_modules": ["moe_act"]})
    assert br.act_per_layer("selective", "moe", tk["rows"], tk["send"]) == S * (6328 - 2 * 256)


def test_fp8_input_store_halves_the_dense_swiglu_input(tmp_path, plain_topology):
    """Llama dense layer: gate and up outputs 4f -> 2f bytes: 6432 - 2·512 = 5408 per token."""
    b = _builder(tmp_path, plain_topology, model=LLAMA, training={"activation_fp8_input_store": True})
    assert b.act_per_layer("none") == S * 5408


def test_bf16_moments_take_four_bytes_off_the_optimizer(tmp_path, plain_topology):
    """Megatron's distributed-optimizer table: bf16 training keeps 12 B of optimizer state per
    parameter (fp32 master, two fp32 moments); with bf16 moments 4 + 2 + 2 = 8 B."""

    path = small_scenario(tmp_path, plain_topology, parallel={"pp": 1, "dp": 4})
    sc, _ = load_scenario(path)
    assert static_memory(sc, 1e6)["optimizer"] == 12e6
    sc, _ = load_scenario(path, ["training.optimizer_moments=bf16"])
    assert static_memory(sc, 1e6)["optimizer"] == 8e6 and static_memory(sc, 1e6)["weights"] == 2e6


def test_the_loss_backward_holds_its_buffers(tmp_path, plain_topology):
    """The small GPT's logits: T = 128 tokens x V = 1024 (padded to 128 x 1 = 1024) on one rank.
    Megatron's vocab-parallel cross entropy turns the kept fp32 softmax into the gradient in place:
    2 bytes per logit more, its 16-bit copy. torch's F.cross_entropy(logits.float()) runs
    log_softmax then nll_loss (ATen), whose backward holds the kept fp32 log-probabilities, a new
    fp32 gradient of them (nll_loss) and log_softmax's own (4 + 4): 8 bytes per logit more. One
    stage, one microbatch: the peak is reached in the loss's backward, so the two runs' peaks
    differ by (8 - 2)·T·V."""
    from simtrain.simulate import simulate
    T, V = 128, 1024
    assert _builder(tmp_path, plain_topology).loss_working() == 2 * T * V
    b = _builder(tmp_path, plain_topology, training={"loss_kernel": "torch"})
    assert b.loss_working() == 8 * T * V and b.act_post() == 4 * T * V
    peaks = []
    for kernel in ("megatron", "torch"):
        path = small_scenario(tmp_path, plain_topology, parallel={"pp": 1, "dp": 4},
                              training={"loss_kernel": kernel, "global_batch_size": 4})
        peaks.append(simulate(*load_scenario(path)).result.peak_memory_bytes)
    assert peaks[1] - peaks[0] == pytest.approx(6 * T * V)
