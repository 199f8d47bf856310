"""Frozen input specifications (first stage of the pipeline: spec -> workload -> plan -> ...).

Everything here is in SI units and already validated by `simtrain.loading`; later stages never
re-check user input. Closed families are plain string choices validated at load time.
"""
from __future__ import annotations

from dataclasses import dataclass, field, asdict
from typing import Optional


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
    sequence_parallel: bool = False
    zero_stage: int = 0
    schedule: str = "1f1b"
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = False
    bucket_size_params: int = 40_000_000
    layers_per_stage: Optional[tuple] = None
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
    def num_microbatches(self) -> int:
        return self.training.global_batch_size // (self.training.micro_batch_size * self.parallel.dp)

    def resolved(self) -> dict:
        """The scenario with every default filled in, in the YAML layout (units in SI)."""
        d = asdict(self)
        d.pop("source_file")
        d["cluster"]["topology"] = d["cluster"].pop("topology_file")
        for k in ("first_stage_layers", "last_stage_layers", "schedule_csv", "device_of_rank"):
            if d["parallel"][k] is None:
                d["parallel"].pop(k)
        if d["parallel"].get("schedule_csv"):
            d["parallel"].pop("schedule")
        if d["parallel"]["layers_per_stage"] is not None:
            d["parallel"]["layers_per_stage"] = list(d["parallel"]["layers_per_stage"])
        else:
            d["parallel"].pop("layers_per_stage")
        return d
