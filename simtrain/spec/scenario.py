"""Frozen input specifications (first stage of the pipeline: spec -> workload -> plan -> ...).

Everything here is in SI units and already validated by `simtrain.spec.loading`; later stages never
re-check user input. Closed families are plain string choices validated at load time.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional


@dataclass(frozen=True)
class RoutingSpec:
    """How tokens are spread over the experts (fractions of the token-to-expert assignments)."""
    distribution: str = "uniform"   # uniform | zipf | explicit
    skew: float = 1.0               # zipf exponent s: expert i (0-based) gets a share ~ 1/(i+1)^s
    loads: Optional[tuple] = None   # explicit: one share per expert (normalised to sum 1)
    per_layer: bool = True          # zipf: a fresh seeded permutation of the hot experts in every MoE layer


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-experts MLP (Megatron-core MoE; HF Mixtral / Qwen-MoE / DeepSeek-V3 configs)."""
    num_experts: int
    top_k: int
    expert_ffn_hidden_size: int
    num_shared_experts: int = 0
    shared_expert_ffn_hidden_size: int = 0   # total width of the shared experts (0: none)
    shared_expert_gate: bool = False          # Qwen-MoE: a sigmoid gate (h -> 1) on the shared expert
    layer_freq: int = 1                       # an MoE MLP every layer_freq-th layer (others dense)
    first_dense_layers: int = 0               # DeepSeek first_k_dense_replace: the first layers stay dense
    capacity_factor: Optional[float] = None   # None: dropless; else tokens over capacity are dropped
    dispatcher: str = "alltoall"              # alltoall | allgather
    dispatch_precision: str = "bf16"          # bf16 | fp8 (DeepSeek-V3: tokens dispatched in FP8, combined in BF16)
    max_nodes_per_token: Optional[int] = None # node-limited routing (DeepSeek-V3: 4): a token crosses the network once per node
    routing: RoutingSpec = field(default_factory=RoutingSpec)

    def is_moe_layer(self, i: int) -> bool:
        return i >= self.first_dense_layers and (i - self.first_dense_layers) % self.layer_freq == 0


@dataclass(frozen=True)
class MLASpec:
    """DeepSeek multi-head latent attention (DeepSeek-V2 report §2.1; V3 config.json)."""
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: Optional[int] = None         # None: queries projected directly (V2-Lite)


@dataclass(frozen=True)
class EncoderSpec:
    """A vision (or audio) encoder in front of the language model, with a projector into it."""
    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    tokens_per_sample: int          # encoder tokens of one sample (patches, + class token)
    projector: str = "mlp"          # mlp (two GEMMs, GeLU: LLaVA-1.5) | linear
    pipeline_stages: int = 0        # 0: on the first LM stage; k: its own k pipeline stages in front


@dataclass(frozen=True)
class ModelSpec:
    name: str
    architecture: str              # gpt | llama
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    ffn_hidden_size: int
    vocab_size: int
    seq_length: int
    tie_embeddings: bool = False
    make_vocab_size_divisible_by: int = 128
    moe: Optional[MoESpec] = None
    mla: Optional[MLASpec] = None
    encoder: Optional[EncoderSpec] = None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass(frozen=True)
class TrainingSpec:
    micro_batch_size: int
    global_batch_size: int
    precision: str = "bf16"        # fp16 | bf16 | fp8
    recompute: str = "none"        # none | selective | full
    flash_attention: bool = True


@dataclass(frozen=True)
class ParallelSpec:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    cp_kind: str = "ring"           # ring (KV passed around, overlapped) | allgather (KV gathered) | ulysses (all-to-all over heads)
    ep: int = 1                     # expert parallel: experts split over ep ranks
    etp: int = 1                    # expert tensor parallel: each expert's FFN split over etp ranks
    sequence_parallel: bool = False
    zero_stage: int = 0
    schedule: str = "1f1b"
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = False
    # pipeline messages split over the tp group and all-gathered by the receiver (tp > 1 without
    # sequence parallelism): Megatron-LM's scatter_gather_tensors_in_pipeline, DeepSpeed's
    # PipelineEngine pipe_partitioned / grad_partitioned
    pp_scatter_gather: bool = True
    bucket_size_params: int = 40_000_000
    layers_per_stage: Optional[object] = None   # a tuple of counts, or "balanced" (by device speed)
    first_stage_layers: Optional[int] = None
    last_stage_layers: Optional[int] = None
    vpp: int = 1                    # model chunks per rank (schedules that take it: interleaved_1f1b)
    schedule_csv: Optional[str] = None   # a torchtitan-format CSV schedule (absolute path once loaded)
    placement: str = "megatron"     # megatron | random | an order such as dp-tp-cp-pp
    device_of_rank: Optional[tuple] = None   # explicit placement: device of each rank


@dataclass(frozen=True)
class ClusterSpec:
    device: str
    topology_file: str
    nodes: int
    device_profile: str = ""       # a measured profile (simtrain calibrate) refining the device preset
    stragglers: tuple = ()         # simtrain.stragglers.Straggler entries
    jitter: Optional[object] = None   # simtrain.stragglers.Jitter
    mixed: tuple = ()              # ((nodes, device preset), ...) blocks in node order
    straggler_model: str = "lockstep"   # lockstep | exact (simtrain.stragglers)

    @property
    def heterogeneous(self) -> bool:
        return bool(self.stragglers or (self.jitter is not None and self.jitter.sigma > 0) or self.mixed)


@dataclass(frozen=True)
class NetworkSpec:
    backend: str = "analytical"
    # algorithm per collective: auto (the fastest predicted, as NCCL's tuner) or a registered name
    all_reduce: str = "auto"
    reduce_scatter: str = "auto"
    all_gather: str = "auto"
    all_to_all: str = "auto"
    protocol: str = "auto"         # auto | LL | LL128 | Simple

    def algorithm_for(self, collective: str) -> str:
        return getattr(self, collective, "auto")


@dataclass(frozen=True)
class Scenario:
    name: str
    model: ModelSpec
    training: TrainingSpec
    parallel: ParallelSpec
    cluster: ClusterSpec
    network: NetworkSpec = field(default_factory=NetworkSpec)
    seed: int = 0
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
        """The scenario with every default filled in, in the YAML layout (units in SI)."""
        d = asdict(self)
        d.pop("source_file")
        d["cluster"]["topology"] = d["cluster"].pop("topology_file")
        for k in ("moe", "mla", "encoder"):
            if d["model"][k] is None:
                d["model"].pop(k)
        if not self.cluster.heterogeneous:
            d["cluster"].pop("straggler_model")
        for k, empty in (("stragglers", ()), ("jitter", None), ("mixed", ())):
            if d["cluster"][k] in (empty, None):
                d["cluster"].pop(k)
        if "stragglers" in d["cluster"]:
            d["cluster"]["stragglers"] = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in x.items()
                                           if v not in ((), 0.0) or k in ("compute", "memory", "link")}
                                          for x in d["cluster"]["stragglers"]]
        if "mixed" in d["cluster"]:
            d["cluster"]["mixed"] = [{"nodes": n, "device": dv} for n, dv in d["cluster"]["mixed"]]
        if "moe" in d["model"]:
            r = d["model"]["moe"]["routing"]
            if r["loads"] is None:
                r.pop("loads")
            else:
                r["loads"] = list(r["loads"])
        for k in ("first_stage_layers", "last_stage_layers", "schedule_csv", "device_of_rank"):
            if d["parallel"][k] is None:
                d["parallel"].pop(k)
        if d["parallel"].get("schedule_csv"):
            d["parallel"].pop("schedule")
        if d["parallel"]["layers_per_stage"] == "balanced":
            pass
        elif d["parallel"]["layers_per_stage"] is not None:
            d["parallel"]["layers_per_stage"] = list(d["parallel"]["layers_per_stage"])
        else:
            d["parallel"].pop("layers_per_stage")
        return d
