"""Frozen input specifications (first stage of the pipeline: spec -> workload -> plan -> ...).

Everything here is in SI units and already validated by `simtrain.spec.loading`; later stages never
re-check user input. Closed families are plain string choices validated at load time.

Each field declares its YAML key once (`spec_field`: kind, default, unit, allowed values, doc);
the loader's checks, the resolved dump (`Scenario.resolved`), the key reference and the JSON
Schema are all derived from these declarations (`simtrain.spec.fields`).
"""
from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from typing import Any, Optional

from simtrain.spec.fields import Key, Section, dump, section_of, spec_field
from simtrain.spec.reliability import RELIABILITY


def _registry(module: str, attr: str, pick=None):
    """Allowed values named by a registry of a later stage, read when first needed, so that the
    spec stays plain data that every stage can import."""
    def choices() -> tuple:
        reg = getattr(importlib.import_module(module), attr)
        reg = reg() if callable(reg) else reg
        return tuple(n for n in reg if pick is None or pick(reg, n))
    return choices


def _algorithms(collective: str):
    names = _registry("simtrain.network.collectives", "ALGORITHMS", lambda reg, n: collective in reg[n].collectives)
    return lambda: ("auto",) + names()


_SCHEDULES = _registry("simtrain.schedules", "SCHEDULES")
_DEVICES = _registry("simtrain.hardware.devices", "preset_names")
# every backend registered with simtrain.network.registry, a plug-in's included
_BACKENDS = _registry("simtrain.network.registry", "BACKENDS")
_POSINTS = {"type": "array", "items": {"type": "integer", "minimum": 1}}


@dataclass(frozen=True)
class RoutingSpec:
    """How tokens are spread over the experts (fractions of the token-to-expert assignments)."""
    distribution: str = spec_field(("uniform", "zipf", "explicit"), "how tokens pick experts", default="uniform")
    skew: float = spec_field("float", "zipf exponent s: expert i (0-based) gets a share ~ 1/(i+1)^s (0 is uniform)", default=1.0, minimum=0.0, maximum=100.0)
    loads: Optional[tuple] = spec_field("any", "explicit: one share per expert (normalised to sum 1; none above 1/top_k)",
                                        default=None, dump="none",
                                        json={"type": "array", "items": {"type": "number", "minimum": 0}})
    per_layer: bool = spec_field("bool", "zipf: a fresh seeded permutation of the hot experts in every MoE layer", default=True)


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-experts MLP (Megatron-core MoE; HF Mixtral / Qwen-MoE / DeepSeek-V3 configs)."""
    _schema_required = False        # inline keys may refine a preset's section
    num_experts: int = spec_field("posint", "routed experts per MoE layer", maximum=65_536)
    top_k: int = spec_field("posint", "experts each token is routed to (<= num_experts)", maximum=1024)
    expert_ffn_hidden_size: int = spec_field("posint", "FFN width of one expert", maximum=4_194_304)
    num_shared_experts: int = spec_field("int", "experts every token passes through (>= 0)", default=0, minimum=0, maximum=1024)
    shared_expert_ffn_hidden_size: int = spec_field(
        "int", "total FFN width of the shared experts", default=0, yaml_default=None, optional=True,
        derived="num_shared_experts x expert_ffn_hidden_size", minimum=0, maximum=67_108_864)
    shared_expert_gate: bool = spec_field("bool", "Qwen-MoE: a sigmoid gate (h -> 1) on the shared expert", default=False)
    layer_freq: int = spec_field("posint", "an MoE MLP every layer_freq-th layer (others dense)", default=1, maximum=10_000)
    first_dense_layers: int = spec_field("int", "DeepSeek first_k_dense_replace: the first layers stay dense", default=0, minimum=0, maximum=10_000)
    capacity_factor: Optional[float] = spec_field("float", "tokens over capacity are dropped (> 0); null: dropless",
                                                  default=None, optional=True, maximum=1000.0)
    dispatcher: str = spec_field(("alltoall", "allgather"), "token dispatcher", default="alltoall")
    dispatch_precision: str = spec_field(("bf16", "fp8"), "precision of dispatched tokens (DeepSeek-V3: fp8; combined in bf16)",
                                         default="bf16")
    max_nodes_per_token: Optional[int] = spec_field(
        "posint", "node-limited routing (DeepSeek-V3: 4): a token crosses the network once per node", default=None, optional=True, maximum=65_536)
    routing: RoutingSpec = spec_field("any", "expert load distribution", default_factory=RoutingSpec, yaml_default=None,
                                      section=RoutingSpec)

    def is_moe_layer(self, i: int) -> bool:
        return i >= self.first_dense_layers and (i - self.first_dense_layers) % self.layer_freq == 0


@dataclass(frozen=True)
class MLASpec:
    """DeepSeek multi-head latent attention (DeepSeek-V2 report §2.1; V3 config.json)."""
    _schema_required = False        # inline keys may refine a preset's section
    kv_lora_rank: int = spec_field("posint", "rank of the compressed KV latent", maximum=1_048_576)
    qk_nope_head_dim: int = spec_field("posint", "query/key head dimension without rotary embedding", maximum=65_536)
    qk_rope_head_dim: int = spec_field("posint", "query/key head dimension with rotary embedding", maximum=65_536)
    v_head_dim: int = spec_field("posint", "value head dimension", maximum=65_536)
    q_lora_rank: Optional[int] = spec_field("posint", "rank of the compressed query; null: queries projected directly (V2-Lite)",
                                            default=None, optional=True, maximum=1_048_576)


@dataclass(frozen=True)
class EncoderSpec:
    """A vision (or audio) encoder in front of the language model, with a projector into it."""
    _extra_keys = {"preset": Key("str", None, "an encoder preset (simtrain list encoders); the keys below refine it",
                                 loader=False, choices=_registry("simtrain.spec.loading", "encoder_presets"))}
    _schema_required = False        # a preset supplies the required keys

    name: str = spec_field("str", "label in results", loader=False, required=False, derived="the preset's name, else `encoder`")
    num_layers: int = spec_field("posint", "encoder transformer layers", maximum=10_000)
    hidden_size: int = spec_field("posint", "encoder hidden size", maximum=1_048_576)
    num_attention_heads: int = spec_field("posint", "encoder attention heads (divide hidden_size)", maximum=65_536)
    ffn_hidden_size: int = spec_field("posint", "encoder FFN width", maximum=4_194_304)
    tokens_per_sample: int = spec_field("posint", "encoder tokens of one sample (patches, + class token)", maximum=16_777_216)
    projector: str = spec_field(("mlp", "linear"), "projector into the language model (mlp: two GEMMs, GeLU: LLaVA-1.5)",
                                default="mlp")
    pipeline_stages: int = spec_field("int", "0: on the first LM stage; k: its own k pipeline stages in front", default=0, minimum=0, maximum=1024)


@dataclass(frozen=True)
class ModelSpec:
    """The model: a preset, a Hugging Face config.json or the fields themselves (inline keys override)."""
    _extra_keys = {
        "preset": Key("str", None, "a model preset (simtrain list models); the keys below refine it", loader=False,
                      choices=_registry("simtrain.spec.loading", "model_presets")),
        "hf_config": Key("str", None, "path of a Hugging Face config.json (beside the scenario or the current directory)",
                         loader=False),
    }
    _schema_required = False        # a preset or config.json supplies the required keys

    name: str = spec_field("str", "label in results", loader=False, required=False,
                           derived="the preset's name, the config's folder, else `custom`")
    architecture: str = spec_field(("gpt", "llama"), "gpt: learned positions, GeLU MLP; llama: RoPE, SwiGLU, RMSNorm")
    num_layers: int = spec_field("posint", "transformer layers", maximum=10_000, example="32")
    hidden_size: int = spec_field("posint", "hidden size (divisible by num_attention_heads unless head_dim is given)",
                                  maximum=1_048_576, example="4096")
    num_attention_heads: int = spec_field("posint", "attention heads", maximum=65_536, example="32")
    num_key_value_heads: int = spec_field("posint", "KV heads (GQA; divides num_attention_heads)", required=False,
                                          derived="num_attention_heads", maximum=65_536, example="8")
    ffn_hidden_size: int = spec_field("posint", "MLP width (required for llama)", required=False,
                                      derived="4 x hidden_size for gpt", maximum=4_194_304, example="14336")
    vocab_size: int = spec_field("posint", "vocabulary size", maximum=10_000_000, example="128256")
    seq_length: int = spec_field("posint", "sequence length in tokens", maximum=16_777_216, example="8192")
    head_dim: Optional[int] = spec_field("posint", "width of one attention head (Q, K and V); Hugging Face's `head_dim`",
                                         default=None, optional=True, derived="hidden_size / num_attention_heads",
                                         maximum=65_536)
    qk_norm: bool = spec_field("bool", "an RMSNorm over each query and key head between the QKV projection and the "
                               "rotary (Qwen3's q_norm and k_norm; Megatron --qk-layernorm)", default=False)
    tie_embeddings: bool = spec_field("bool", "input and output embeddings share weights", default=False)
    make_vocab_size_divisible_by: int = spec_field("posint", "vocabulary padded to a multiple of this (Megatron)", default=128, maximum=65_536)
    moe: Optional[MoESpec] = spec_field("any", "mixture-of-experts MLP (refines a preset's section key by key)",
                                        default=None, dump="none", section=MoESpec)
    mla: Optional[MLASpec] = spec_field("any", "multi-head latent attention (DeepSeek)", default=None, dump="none", section=MLASpec)
    encoder: Optional[EncoderSpec] = spec_field("any", "a vision encoder in front of the model", default=None, dump="none",
                                                section=EncoderSpec)

    def __post_init__(self) -> None:
        # an absent head_dim is the hidden size split over the heads (Llama, Qwen2); Qwen3 and
        # Gemma give their own (Qwen3-30B-A3B: 32 heads of 128 on a hidden size of 2048)
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)


@dataclass(frozen=True)
class FusionSpec:
    """Which non-GEMM kernel families run fused (one kernel, one pass over the tensor) or as
    chains of eager PyTorch kernels; defaults as Megatron-LM's (`simtrain.workload.nongemm`)."""
    norm: bool = spec_field("bool", "LayerNorm / RMSNorm as one fused kernel (apex FusedLayerNorm, persistent LayerNorm, "
                            "Transformer Engine); false: torch's LayerNorm, or RMSNorm as eager ops", default=True)
    bias_gelu: bool = spec_field("bool", "bias + GeLU in one kernel (Megatron --no-bias-gelu-fusion: false)", default=True)
    bias_swiglu: bool = spec_field("bool", "SwiGLU in one kernel (Megatron --no-bias-swiglu-fusion: false)", default=True)
    bias_dropout_add: bool = spec_field("bool", "GPT's bias + dropout + residual add in one kernel "
                                        "(Megatron --no-bias-dropout-fusion: false)", default=True)
    masked_softmax: bool = spec_field("bool", "without flash attention: scale + causal mask + softmax in one kernel "
                                      "(Megatron --no-masked-softmax-fusion: false)", default=True)
    rope: bool = spec_field("bool", "rotary embedding in one kernel per tensor (Megatron --no-rope-fusion: false)", default=True)
    cross_entropy: bool = spec_field("bool", "Megatron's fused vocab-parallel cross-entropy (--cross-entropy-loss-fusion)",
                                     default=False)


@dataclass(frozen=True)
class UBGemmSpec:
    """One GEMM's Transformer Engine userbuffers overlap (an entry of TE's / Megatron's
    tp_comm_overlap_cfg); absent keys keep TE's initialize_ub defaults for that GEMM."""
    method: str = spec_field(("default", "ring_exchange", "pipeline", "bulk"), "how the collective overlaps the GEMM: "
                             "default (TE's for this GEMM), ring_exchange (the all-gathers into QKV, fc1 and the dgrads "
                             "of proj and fc2; proj and fc2 forward too), pipeline (proj and fc2 forward), bulk (QKV and "
                             "fc1 dgrad and wgrad)", default="default", dump_if=lambda g: g.method != "default")
    num_sm: Optional[int] = spec_field("posint", "SMs the communication kernels hold (pipeline, bulk; TE default 16)",
                                       default=None, optional=True, dump="none", maximum=1024, example="16",
                                       range_fix="use fewer than the device's SMs (132 on an H100 or H200, 108 on an A100); "
                                                 "TE's default is 16")
    num_splits: Optional[int] = spec_field("posint", "pipeline: pieces the GEMM is cut into (TE default 4)",
                                           default=None, optional=True, dump="none", maximum=256)


UB_GEMMS = ("qkv_fprop", "proj_fprop", "fc1_fprop", "fc2_fprop", "qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad",
            "proj_dgrad", "fc2_dgrad")
"""The GEMMs of a layer that TE's userbuffers overlap, by TE's names (initialize_ub)."""


def _ub_field(name: str, attr: str) -> Any:
    return spec_field("map", f"{name}'s overlap: method, num_sm, num_splits", default_factory=UBGemmSpec, section=UBGemmSpec,
                      dump_if=lambda c: getattr(c, attr) != UBGemmSpec())


@dataclass(frozen=True)
class UBConfigSpec:
    """Per-GEMM settings of TE's userbuffers overlap (Megatron --tp-comm-overlap-cfg, Megatron-Bridge
    TransformerLayerTPOverlapCfg); every GEMM left out runs TE's defaults."""
    qkv_fprop: UBGemmSpec = _ub_field("QKV forward", "qkv_fprop")
    proj_fprop: UBGemmSpec = _ub_field("the output projection's forward", "proj_fprop")
    fc1_fprop: UBGemmSpec = _ub_field("fc1 forward", "fc1_fprop")
    fc2_fprop: UBGemmSpec = _ub_field("fc2 forward", "fc2_fprop")
    qkv_dgrad: UBGemmSpec = _ub_field("QKV's input gradient", "qkv_dgrad")
    qkv_wgrad: UBGemmSpec = _ub_field("QKV's weight gradient", "qkv_wgrad")
    fc1_dgrad: UBGemmSpec = _ub_field("fc1's input gradient", "fc1_dgrad")
    fc1_wgrad: UBGemmSpec = _ub_field("fc1's weight gradient", "fc1_wgrad")
    proj_dgrad: UBGemmSpec = _ub_field("the output projection's input gradient", "proj_dgrad")
    fc2_dgrad: UBGemmSpec = _ub_field("fc2's input gradient", "fc2_dgrad")

    def __post_init__(self) -> None:
        for name in UB_GEMMS:
            v = getattr(self, name)
            if isinstance(v, dict):                  # the loader's checked mapping
                object.__setattr__(self, name, UBGemmSpec(**v))


RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "moe_act")
FP8_RECIPES = ("delayed", "current", "blockwise", "mxfp8", "torchao_tensorwise", "torchao_rowwise")
"""The parts training.recompute_modules may name (Megatron-core TransformerConfig.recompute_modules)."""


@dataclass(frozen=True)
class TrainingSpec:
    """One training step: batch sizes and numerics."""
    micro_batch_size: int = spec_field("posint", "sequences per microbatch", maximum=65_536)
    global_batch_size: int = spec_field("posint", "sequences per step (a multiple of micro_batch_size x dp)", maximum=1_048_576)
    precision: str = spec_field(("fp16", "bf16", "fp8"), "GEMM precision (the device preset needs its peak); fp8: "
                                "Transformer Engine's linear layers in FP8, the LM head, router and attention core in bf16",
                                default="bf16")
    # how FP8 scales are found: Transformer Engine's recipe classes (Megatron-LM --fp8-recipe) or
    # torchao's float8 recipes (torchtitan recipe_name)
    fp8_recipe: str = spec_field(FP8_RECIPES, "with precision: fp8, the scaling recipe: Transformer Engine's delayed "
                                 "(amax history), current (this tensor's amax, one extra read), blockwise (1x128 / "
                                 "128x128 tiles), mxfp8 (32-element blocks, Blackwell only); or torchao's float8 "
                                 "(torchtitan) torchao_tensorwise, torchao_rowwise (16-bit inputs kept, recast in "
                                 "the backward)", default="delayed",
                                 dump_if=lambda t: t.precision == "fp8")
    # Megatron-LM --grad-reduce-in-bf16 (megatron-core DDP grad_reduce_in_fp32 = False)
    grad_reduce_in_bf16: bool = spec_field("bool", "the gradient buffer the backward accumulates into, and the "
                                           "data-parallel reduction of it, in bf16 (2 bytes per parameter) instead of "
                                           "fp32; fp16 training's gradients are 16-bit already",
                                           default=False, dump_if=lambda t: t.grad_reduce_in_bf16)
    # Megatron-LM --fp8-param-gather (with the distributed optimizer or FSDP), torchtitan's
    # float8 enable_fsdp_float8_all_gather
    fp8_param_gather: bool = spec_field("bool", "with precision: fp8, the FP8 linears' weights are kept in FP8 "
                                        "(no 16-bit copy) and all-gathered in FP8 (needs zero_stage >= 1)",
                                        default=False, dump_if=lambda t: t.precision == "fp8")
    recompute: str = spec_field(("none", "selective", "full", "op"), "activation recomputation: selective "
                                "(Megatron-core's recompute_modules), full (whole layers), or op (torchtitan's "
                                "op-level selective checkpointing: every second matmul and the layer's non-matmul "
                                "kernels re-run before its backward)", default="none")
    # Megatron-LM's --recompute-method / --recompute-num-layers (with recompute: full), per model
    # stage (each virtual chunk): uniform checkpoints groups of N layers (every layer recomputed,
    # one input kept per group), block recomputes the first N layers and keeps the rest whole
    recompute_method: str = spec_field(("uniform", "block"), "with recompute: full, which layers are recomputed "
                                       "(uniform: all, in groups of recompute_num_layers; block: the first "
                                       "recompute_num_layers of each model stage)", default="uniform",
                                       dump_if=lambda t: t.recompute == "full")
    recompute_num_layers: int = spec_field("posint", "with recompute: full, layers per checkpointed group (uniform) "
                                           "or layers recomputed per model stage (block)", default=1, maximum=10_000,
                                           dump_if=lambda t: t.recompute == "full")
    # Megatron-core's --recompute-modules (with --recompute-granularity selective; default core_attn)
    recompute_modules: tuple = spec_field(
        "any", "with recompute: selective, the parts recomputed: core_attn, layernorm (norm outputs), "
        "mla_up_proj (MLA's Q, K, V from the latents), moe_act (expert SwiGLU/GeLU outputs)",
        default=("core_attn",), dumper=list, dump_if=lambda t: t.recompute == "selective",
        json={"type": "array", "items": {"enum": list(RECOMPUTE_MODULES)}, "minItems": 1,
              "description": "list of core_attn, layernorm, mla_up_proj, moe_act"})
    # Megatron-core's --exp-avg-dtype / --exp-avg-sq-dtype (with --use-precision-aware-optimizer)
    optimizer_moments: str = spec_field(("fp32", "bf16"), "dtype of Adam's two moments (DeepSeek-V3: bf16; "
                                        "the master weights stay fp32)", default="fp32")
    # ZeRO-Offload (Ren et al., USENIX ATC'21): the fp32 master weights and Adam state on the host
    optimizer_offload: str = spec_field(("none", "cpu"), "cpu: the optimizer state (fp32 master weights, Adam moments) "
                                        "lives in host memory and the step runs there: gradients copied to the host, "
                                        "updated 16-bit weights back, over the device's host link", default="none")
    # Megatron-core's --activation-func-fp8-input-store (TransformerConfig.activation_func_fp8_input_store)
    activation_fp8_input_store: bool = spec_field(
        "bool", "keep the MLP and expert activation function's input (fc1 output) in FP8 for the backward, "
        "1 byte per value (DeepSeek-V3 caches its SwiGLU inputs in FP8)", default=False)
    flash_attention: bool = spec_field("bool", "fused attention (needed for cp > 1)", default=True)
    fusions: FusionSpec = spec_field("map", "non-GEMM kernel fusions (norm, bias_gelu, bias_swiglu, bias_dropout_add, "
                                     "masked_softmax, rope, cross_entropy)", default_factory=FusionSpec, section=FusionSpec)
    # which cross-entropy implementation the LM loss runs, for the memory its backward holds
    loss_kernel: str = spec_field(("megatron", "torch"), "the LM loss: megatron (Megatron-core's vocab-parallel cross "
                                  "entropy, in place on the fp32 logits) or torch (F.cross_entropy on logits.float(), as "
                                  "torchtitan: its backward holds two more fp32 logit-sized buffers)", default="megatron",
                                  dump_if=lambda t: t.loss_kernel != "megatron")
    # Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR'24) §4: step optimistically, validate after
    optimizer_post_validation: Optional[bool] = spec_field(
        "bool", "the optimizer steps without waiting for the global gradient-norm / NaN all-reduce, which "
        "validates the step afterwards (rollback on failure); each pipeline rank starts its next step when its own "
        "step ends. Absent: the schedule's default (on for the zero-bubble schedules, off otherwise)",
        default=None, optional=True, derived="the schedule's default")
    forward_only: bool = spec_field(
        "bool", "simulate a forward pass over the batch only (no backward, gradient reduction or optimizer step; "
        "weights-only memory): the old_log_prob / ref / values passes of RL", default=False)

    def __post_init__(self) -> None:
        if isinstance(self.fusions, dict):          # the loader's checked mapping
            object.__setattr__(self, "fusions", FusionSpec(**self.fusions))


@dataclass(frozen=True)
class ParallelSpec:
    """The parallel plan: tp x pp x dp x cp devices, and how the work is split over them."""
    tp: int = spec_field("posint", "tensor parallel", default=1, maximum=65_536)
    pp: int = spec_field("posint", "pipeline parallel", default=1, maximum=65_536)
    dp: int = spec_field("posint", "data parallel", default=1, maximum=1_048_576)
    cp: int = spec_field("posint", "context parallel", default=1, maximum=65_536)
    cp_kind: str = spec_field(("ring", "allgather", "ulysses"),
                              "ring: KV passed around, overlapped; allgather: KV gathered; ulysses: all-to-all over heads",
                              default="ring")
    ep: int = spec_field("posint", "expert parallel: experts split over ep ranks", default=1, maximum=65_536)
    etp: int = spec_field("posint", "expert tensor parallel: each expert's FFN split over etp ranks", default=1, maximum=65_536)
    sequence_parallel: bool = spec_field("bool", "Megatron sequence parallelism (needed by MoE with tp > 1)", default=False)
    tp_comm_overlap: str = spec_field(("none", "userbuffers", "async_tp"),
                                      "tensor-parallel collectives overlapped with their GEMMs: userbuffers (Megatron "
                                      "--tp-comm-overlap on Transformer Engine), async_tp (torchtitan / PyTorch async TP); "
                                      "needs sequence_parallel", default="none")
    tp_comm_overlap_cfg: UBConfigSpec = spec_field("map", "with tp_comm_overlap: userbuffers, each GEMM's overlap "
                                                   "(Megatron --tp-comm-overlap-cfg); absent: TE's defaults",
                                                   default_factory=UBConfigSpec, section=UBConfigSpec,
                                                   dump_if=lambda p: p.tp_comm_overlap_cfg != UBConfigSpec())
    zero_stage: int = spec_field((0, 1, 2, 3), "ZeRO / FSDP sharding stage", default=0)
    schedule: str = spec_field("str", "pipeline schedule (simtrain list schedules)", default="1f1b", choices=_SCHEDULES,
                               dump_if=lambda p: not p.schedule_csv)
    overlap_grad_reduce: bool = spec_field("bool", "gradient reduction overlapped with the backward pass", default=True)
    overlap_param_gather: bool = spec_field("bool", "parameter all-gather overlapped with the forward pass", default=False)
    # pipeline messages split over the tp group and all-gathered by the receiver (tp > 1 without
    # sequence parallelism): Megatron-LM's scatter_gather_tensors_in_pipeline, DeepSpeed's
    # PipelineEngine pipe_partitioned / grad_partitioned
    pp_scatter_gather: bool = spec_field("bool", "pipeline messages split over the tp group, all-gathered by the receiver",
                                         default=True)
    bucket_size_params: int = spec_field("posint", "gradient bucket size", default=40_000_000, unit="parameters", maximum=10**12)
    layers_per_stage: Optional[object] = spec_field(
        "any", "layer count of each model stage, or `balanced` (by device speed)", default=None, dump="none",
        json={"anyOf": [_POSINTS, {"const": "balanced"}], "description": "list of whole numbers >= 1, or `balanced`"})
    first_stage_layers: Optional[int] = spec_field("posint", "layers of the first stage (the rest split evenly)", default=None,
                                                   optional=True, dump="none", maximum=10_000)
    last_stage_layers: Optional[int] = spec_field("posint", "layers of the last stage (the rest split evenly)", default=None,
                                                  optional=True, dump="none", maximum=10_000)
    # Megatron-core's account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split
    # (TransformerConfig): the split counts the embedding and the loss as one layer each, so the
    # first and the last model stage hold one transformer layer fewer
    account_for_embedding_in_pipeline_split: bool = spec_field(
        "bool", "the even layer split counts the embedding as a layer: the first model stage holds one layer fewer",
        default=False, dump_if=lambda p: p.account_for_embedding_in_pipeline_split)
    account_for_loss_in_pipeline_split: bool = spec_field(
        "bool", "the even layer split counts the LM head and loss as a layer: the last model stage holds one layer fewer",
        default=False, dump_if=lambda p: p.account_for_loss_in_pipeline_split)
    vpp: int = spec_field("posint", "model chunks per rank (schedules that take it: interleaved_1f1b)", default=1,
                          yaml_default=None, optional=True, derived="the schedule's default, else 1", maximum=1024)
    schedule_csv: Optional[str] = spec_field("str", "a torchtitan-format CSV schedule (in place of `schedule`)", default=None,
                                             optional=True, dump="none")
    placement: str = spec_field("str", "megatron | scattered | random | topology_aware | an order such as dp-tp-cp-pp",
                                default="megatron")
    device_of_rank: Optional[tuple] = spec_field(
        "any", "explicit placement: entry r is rank r's device (a permutation)", default=None, dump="none",
        json={"type": "array", "items": {"type": "integer", "minimum": 0}, "description": "list of device indices"})

    def __post_init__(self) -> None:
        if isinstance(self.tp_comm_overlap_cfg, dict):    # the loader's checked mapping
            object.__setattr__(self, "tp_comm_overlap_cfg", UBConfigSpec(**self.tp_comm_overlap_cfg))

    @property
    def tp_overlap(self) -> str | None:
        """The tensor-parallel overlap the step runs: tp_comm_overlap where there is sequence-
        parallel communication to overlap (tp > 1 with sequence parallelism), else None."""
        on = self.tp > 1 and self.sequence_parallel and self.tp_comm_overlap != "none"
        return self.tp_comm_overlap if on else None


STRAGGLER = Section({
    "devices": Key("any", None, "device indices (or give fraction)", dump="falsy", attr="devices",
                   json={"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1,
                         "description": "list of device indices >= 0"}),
    "fraction": Key("float", None, "share of the devices, in (0, 1], drawn with the scenario seed", optional=True, dump="falsy",
                    attr="fraction"),
    "compute": Key("float", 1.0, "compute time factor (> 0; 1.3: 30 % slower)", attr="compute", maximum=1000.0),
    "memory": Key("float", 1.0, "memory-bound time factor (> 0)", attr="memory", maximum=1000.0),
    "link": Key("float", 1.0, "link time factor (> 0)", attr="link", maximum=1000.0),
}, doc="one group of slow devices: exactly one of devices and fraction")

JITTER = Section({
    "distribution": Key(("normal", "lognormal"), "normal", "per-step noise on every compute time", attr="distribution"),
    "sigma": Key("float", doc="relative standard deviation (>= 0; 0.02: 2 %)", attr="sigma", minimum=0.0, maximum=10.0),
})

def bytes_text(n: float) -> str:
    """A size in bytes as a string with its unit that reads back to the same float.

    >>> bytes_text(85899345920.0)
    '85899345920 B'
    """
    return f"{n:.17g} B"


def _reserve_text(v: float) -> object:
    return v if v < 1 else bytes_text(v)


MEMORY_RESERVE_DEFAULT = 0.05
"""cluster.memory_reserve when none is given: 5 % of each device's capacity (4 GiB of 80 GiB,
7 GiB of an H200), held back for what the memory model does not count. Its parts:
  CUDA context      about 0.3-0.4 GiB: 287,047,680 B measured with lazy module loading
                    (pytorch/pytorch PR #86509), "around 400MB" for CUDA >= 11.7 (ptrblck,
                    pytorch/pytorch issue #109888)
  NCCL buffers      NCCL_BUFFSIZE, 4 MiB by default (NCCL user guide, Environment Variables), per
                    channel, peer and direction: with 16-32 channels and a few communicators
                    (tp, dp, pp) about 0.5-1 GiB - an estimate, not a measurement
  fragmentation     the rest, about 3.5 % of capacity: ASSUMED. The caching allocator's measured
                    fragmentation is larger under recomputation, offloading and ZeRO (GMLake,
                    Guo et al., ASPLOS 2024: 15 % on average, up to 33 %, eight LLMs on A100-80GB),
                    smaller for steady Megatron steps; set memory_reserve to your own measurement.
"""

MIXED = Section({
    "nodes": Key("posint", doc="nodes of this block", attr=0, maximum=65_536),
    "device": Key("str", doc="device preset of the block", attr=1, choices=_DEVICES),
}, doc="a block of nodes with another device type, in node order")


@dataclass(frozen=True)
class ClusterSpec:
    """The cluster: device, fabric and node count, and how devices differ."""
    device: str = spec_field("str", "device preset (simtrain list devices)", choices=_DEVICES)
    topology_file: str = spec_field(
        "str", "topology YAML: a path or a shipped name (simtrain list topologies); or a mapping "
        "`{file: NAME, <topology key>: value, ...}` whose keys override the file's", name="topology",
        json={"anyOf": [{"type": "string"}, {"type": "object", "required": ["file"], "properties": {"file": {"type": "string"}}}],
              "description": "a topology file or shipped name, or {file: ..., keys of that topology to override}"})
    nodes: int = spec_field("posint", "scale-up domains (the topology's nodes)", maximum=65_536)
    device_profile: str = spec_field("str", "a measured profile (simtrain calibrate) refining the device preset", default="",
                                     yaml_default=None, optional=True)
    stragglers: tuple = spec_field("any", "slow devices", default=(), yaml_default=None, dump="falsy", section=STRAGGLER,
                                   many=True)
    jitter: Optional[object] = spec_field("any", "per-step noise on compute times", default=None, dump="none", section=JITTER)
    variability: object = spec_field(
        "any", "per-device speed spread, modelled by order statistics (simtrain.plan.heterogeneity.Variability): "
        "`auto` (the default: the measured spread, at every size), `measured` (the same), `none`, or a sigma "
        "(0.015: 1.5 %)", default="auto", dump_if=lambda c: c.variability != "auto",
        json={"anyOf": [{"enum": ["auto", "measured", "none"]}, {"type": "number", "minimum": 0, "maximum": 1}],
              "description": "auto, measured, none, or a relative standard deviation in [0, 1]"})
    mixed: tuple = spec_field("any", "blocks of nodes with other device types (the rest runs `device`)", default=(),
                              yaml_default=None, dump="falsy", section=MIXED, many=True)
    straggler_model: str = spec_field(("lockstep", "exact"), "how slow devices hold up the step (simtrain.plan.heterogeneity)",
                                      default="lockstep", dump_if=lambda c: c.heterogeneous)
    # keys of the topology file overridden by `cluster.topology: {file: ..., key: value}` or
    # `--set cluster.topology.<key>=value`, as sorted JSON (the spec stays hashable); dumped by
    # Scenario.resolved as that mapping
    topology_overrides: str = ""
    memory_capacity: Optional[float] = spec_field(
        "bytes", "memory of every device of `device`, in place of the preset's (e.g. \"80 GiB\"); mixed blocks keep theirs",
        default=None, optional=True, dump="none", minimum=2.0**20, maximum=2.0**50, dumper=bytes_text)
    memory_reserve: float = spec_field(
        "any", "memory held back on every device for CUDA context, NCCL buffers and allocator fragmentation: "
        "a size (\"6 GiB\"), a fraction of the capacity in [0, 1) or a percentage (\"5%\"); what fits is capacity - reserve",
        default=MEMORY_RESERVE_DEFAULT, dumper=_reserve_text,
        json={"anyOf": [{"type": "number", "minimum": 0, "exclusiveMaximum": 1},
                        {"type": "string", "pattern": r"^\s*[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\s*(?:Ki|Mi|Gi|Ti|Pi|k|K|M|G|T|P)?[Bb]\s*$"},
                        {"type": "string", "pattern": r"^\s*(?:\d+\.?\d*|\.\d+)\s*%\s*$"}],
              "description": "a size such as \"6 GiB\", a fraction of the capacity in [0, 1), or a percentage such as \"5%\""})

    @property
    def heterogeneous(self) -> bool:
        return bool(self.stragglers or (self.jitter is not None and self.jitter.sigma > 0) or self.mixed)

    def reserve_of(self, capacity: float) -> float:
        """Bytes held back on a device of `capacity` bytes: memory_reserve is stored as one float,
        a fraction of the capacity when below 1, else bytes (a reserve of under one byte is no
        size). Example: 0.05 of 80 GiB -> 4 GiB; "6 GiB" (6442450944.0) -> 6 GiB on any device.

        >>> ClusterSpec("a100-sxm4-80gb", "t", 1).reserve_of(80 * 2**30) / 2**30
        4.0
        >>> ClusterSpec("a100-sxm4-80gb", "t", 1, memory_reserve=6 * 2.0**30).reserve_of(141e9) / 2**30
        6.0
        """
        r = self.memory_reserve
        return r * capacity if r < 1 else r


@dataclass(frozen=True)
class NetworkSpec:
    """How collectives and point-to-point messages are costed."""
    backend: str = spec_field(_BACKENDS, "analytical: link classes; flow: max-min fair flows on the graph",
                              default="analytical")
    # algorithm per collective: auto (the fastest predicted, as NCCL's tuner) or a registered name
    all_reduce: str = spec_field(_algorithms("all_reduce"), "all-reduce algorithm (auto: the fastest predicted)", default="auto")
    reduce_scatter: str = spec_field(_algorithms("reduce_scatter"), "reduce-scatter algorithm", default="auto")
    all_gather: str = spec_field(_algorithms("all_gather"), "all-gather algorithm", default="auto")
    all_to_all: str = spec_field(_algorithms("all_to_all"), "all-to-all algorithm", default="auto")
    protocol: str = spec_field(("auto", "LL", "LL128", "Simple"), "NCCL protocol", default="auto")
    # NCCL's tuner (simtrain.network.nccl_tuning): which release chooses the algorithm and protocol
    # where they are auto, and what NCCL_ALGO / NCCL_PROTO allow it (NCCL's syntax: "Ring,Tree", "^LL128")
    nccl_version: str = spec_field("any", "NCCL release whose tuning model picks algorithm and protocol: "
                                   "2.18 ... 2.23 (a full tag such as 2.22.3 reads as its release)", default="2.23",
                                   json={"type": ["string", "number"]})
    nccl_algo: Optional[str] = spec_field("str", "NCCL_ALGO: algorithms the tuner may pick (e.g. Ring,Tree or ^NVLS)",
                                          default=None, optional=True, dump="none")
    nccl_proto: Optional[str] = spec_field("str", "NCCL_PROTO: protocols the tuner may pick (e.g. Simple or ^LL128)",
                                           default=None, optional=True, dump="none")
    env: Optional[dict] = spec_field("any", "NCCL environment (NCCL_ALGO, NCCL_PROTO read; nccl_algo / nccl_proto win)",
                                     default=None, optional=True, dump="none",
                                     json={"type": "object", "additionalProperties": {"type": "string"}})

    def algorithm_for(self, collective: str) -> str:
        return getattr(self, collective, "auto")


# `cost:` (read by simtrain search --objective cost): what one device costs to rent
COST = Section({
    "price_per_device_hour": Key("float", None, "rent of one device for an hour (> 0)", unit="US$", optional=True, maximum=1e6),
}, doc="what one device costs to rent (simtrain search --objective cost)")


@dataclass(frozen=True)
class Scenario:
    """A scenario file."""
    _keys_after = {
        "cost": Key("any", None, "device price", section=COST),
        "reliability": Key("any", None, "failures, checkpoints and restarts of a long run (simtrain reliability)",
                           section=RELIABILITY),
    }

    name: str = spec_field("str", "scenario name")
    model: ModelSpec = spec_field("any", "the model", section=ModelSpec)
    training: TrainingSpec = spec_field("any", "batch sizes and numerics", section=TrainingSpec)
    parallel: ParallelSpec = spec_field("any", "the parallel plan", section=ParallelSpec)
    cluster: ClusterSpec = spec_field("any", "devices and fabric", section=ClusterSpec)
    network: NetworkSpec = spec_field("any", "collective algorithms and backend", default_factory=NetworkSpec,
                                      section=NetworkSpec)
    seed: int = spec_field("int", "seed of every random choice (stragglers, routing, ECMP)", default=0)
    source_file: str = "<scenario>"

    @property
    def world_size(self) -> int:
        p = self.parallel
        return p.tp * p.pp * p.dp * p.cp

    @property
    def expert_dp(self) -> int:
        """Expert data parallel size: Megatron splits the tp·cp·dp ranks of a stage as etp x ep x edp."""
        p = self.parallel
        return p.tp * p.cp * p.dp // (p.etp * p.ep)

    @property
    def num_microbatches(self) -> int:
        return self.training.global_batch_size // (self.training.micro_batch_size * self.parallel.dp)

    def resolved(self) -> dict:
        """The scenario with every default filled in, in the YAML layout (units in SI), dumped from
        the field declarations; loading it again gives the same scenario."""
        d = dump(self, section_of(Scenario))
        if self.cluster.topology_overrides:
            d["cluster"]["topology"] = {"file": self.cluster.topology_file, **json.loads(self.cluster.topology_overrides)}
        return d
