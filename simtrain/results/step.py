"""The typed result of one simulated training step: StepResult and the sections it holds.

`StepResult.to_dict()` is the JSON contract (`simtrain run --json`, result.json, the sweep
store): its keys and their order are the dataclass fields in declaration order, each under its
JSON key (`Field.metadata["key"]` where the name differs, e.g. `class_id` -> "class"). Optional
sections and entries (`optional()`) are left out of the dict when they are None, as the scenario
has no such part (no MoE, no context parallelism, one device type ...).

Code reads a result by attribute (`result.step_time_s`, `entry.total`, `result.moe is None`);
the JSON key of a field is only for `to_dict()` and the files written from it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


def optional(key: str | None = None) -> Any:
    """A field that defaults to None and is left out of `to_dict()` while it is None."""
    meta = {"omit_none": True}
    if key is not None:
        meta["key"] = key
    return field(default=None, metadata=meta)


def keyed(key: str) -> Any:
    """A required field whose JSON key is not its attribute name."""
    return field(metadata={"key": key})


def _plain(v: Any) -> Any:
    if isinstance(v, Section):
        return v.to_dict()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


class Section:
    """Base of the result dataclasses: conversion to the JSON dict (`to_dict`)."""

    @classmethod
    def _keys(cls) -> dict:
        cache = cls.__dict__.get("_key_map")
        if cache is None:
            cache = {f.metadata.get("key", f.name): f for f in fields(cls)}
            cls._key_map = cache
        return cache

    def to_dict(self) -> dict:
        out = {}
        for key, f in self._keys().items():
            v = getattr(self, f.name)
            if v is None and f.metadata.get("omit_none"):
                continue
            out[key] = _plain(v)
        return out


@dataclass(kw_only=True)
class Breakdown(Section):
    """Where the busiest rank's step goes: compute, pipeline bubble, communication left exposed per kind."""
    rank: int
    stage: int
    compute_s: float
    bubble_s: float
    exposed_comm_s: dict[str, float]
    # compute_s split by operator kind in proportion to device time (`results.kinds`), and those device times
    compute_by_kind_s: dict[str, float]
    device_time_by_kind_s: dict[str, float]


@dataclass(kw_only=True)
class StageEntry(Section):
    """One simulated rank class: its pipeline rank, the model stages its chunks hold, its time split."""
    class_id: int = keyed("class")
    stage: int
    model_stages: list[int]
    layers: int
    ep_rank: int | None = optional()      # only when expert-parallel ranks run different programs
    ranks: int
    representative_rank: int
    device: str
    compute_s: float
    bubble_s: float
    exposed_comm_s: dict[str, float]


@dataclass(kw_only=True)
class MemoryEntry(Section):
    """Peak bytes of one pipeline rank (its largest class), by kind."""
    stage: int
    weights: float
    gradients: float
    optimizer: float
    activations: float
    communication_buffers: float
    total: float
    inflight_peak: float
    inflight_microbatches_peak: float
    device: str | None = optional()       # mixed device types: the rank's type and its memory
    capacity: float | None = optional()


@dataclass(kw_only=True)
class Collective(Section):
    """One distinct collective of the step: the algorithm and protocol it ran with, its time split."""
    kind: str
    collective: str
    nbytes: float = keyed("bytes")
    group_size: int
    algorithm: str
    protocol: str
    seconds: float
    latency_s: float
    transfer_s: float
    stage: int | None = optional()        # flow backend: the pipeline stage whose group ran it

    @classmethod
    def from_row(cls, row: dict) -> Collective:
        return cls(kind=row["kind"], collective=row["collective"], nbytes=row["bytes"], group_size=row["group_size"],
                   algorithm=row["algorithm"], protocol=row["protocol"], seconds=row["seconds"],
                   latency_s=row["latency_s"], transfer_s=row["transfer_s"], stage=row.get("stage"))


@dataclass(kw_only=True)
class MixedStage(Section):
    stage: int
    devices: dict[str, int]               # device type -> devices of that type in the stage


@dataclass(kw_only=True)
class Heterogeneity(Section):
    """Mixed device types: the types per pipeline stage and a warning per stage or tp group that mixes them."""
    stages: list[MixedStage]
    warnings: list[str]


@dataclass(kw_only=True)
class CriticalPathEntry(Section):
    class_id: int = keyed("class")
    representative_rank: int
    ranks: int
    stage: int
    device: str
    seconds: float
    straggler: bool
    straggler_ranks: list[int]
    factors: dict[str, float]             # compute, memory, link slowdown of the representative rank


@dataclass(kw_only=True)
class Stragglers(Section):
    """Stragglers and jitter: the devices, the step without them, and who is on the critical path."""
    devices: list[str]
    count: int
    step_time_without_s: float
    slowdown: float
    critical_path: list[CriticalPathEntry]


@dataclass(kw_only=True)
class MoeLayer(Section):
    layer: int
    imbalance: float
    dropped_fraction: float
    hottest_ep_rank: int


@dataclass(kw_only=True)
class MoeSection(Section):
    """Routing and expert-parallel traffic of the step."""
    num_experts: int
    top_k: int
    ep: int
    etp: int
    expert_dp: int
    routing: str
    capacity_factor: float | None
    dropped_fraction_mean: float
    imbalance_max: float
    ep_bytes_per_rank_per_microbatch: float
    slowest_ep_rank: int
    slowest_rank: int
    layers: list[MoeLayer]


@dataclass(kw_only=True)
class ContextParallel(Section):
    cp: int
    cp_kind: str
    tokens_per_rank: float
    bytes_sent_per_layer_forward: float
    bytes_sent_per_layer_backward: float


@dataclass(kw_only=True)
class LinkLoad(Section):
    link: str
    nbytes: float = keyed("bytes")
    saturated_s: float
    capacity_bytes_per_s: float


@dataclass(kw_only=True)
class Links(Section):
    """Flow backend: the busiest links by bytes moved and by time saturated."""
    by_bytes: list[LinkLoad]
    by_saturated_time: list[LinkLoad]
    scope: str

    @classmethod
    def from_report(cls, d: dict) -> Links:
        def load(r: dict) -> LinkLoad:
            return LinkLoad(link=r["link"], nbytes=r["bytes"], saturated_s=r["saturated_s"], capacity_bytes_per_s=r["capacity_bytes_per_s"])
        return cls(by_bytes=[load(r) for r in d["by_bytes"]], by_saturated_time=[load(r) for r in d["by_saturated_time"]], scope=d["scope"])


@dataclass(kw_only=True)
class StepResult(Section):
    """What one simulated training step reports (simtrain.simulate.simulate)."""
    scenario: str
    step_time_s: float
    tokens_per_s: float
    mfu: float
    hfu: float
    model_flops_per_step: float
    hardware_flops_per_step: float
    bubble_fraction: float
    peak_memory_bytes: float
    memory_capacity_bytes: float        # the device's (or cluster.memory_capacity)
    memory_reserve_bytes: float         # held back: CUDA context, NCCL buffers, fragmentation (cluster.memory_reserve)
    usable_memory_bytes: float          # capacity - reserve: what fits_in_memory compares the peak with
    fits_in_memory: bool
    memory_shortfall_bytes: float
    num_devices: int
    num_microbatches: int
    schedule: str
    model_stages: int
    device: str
    precision: str
    breakdown: Breakdown
    stages: list[StageEntry]
    memory: list[MemoryEntry]
    simulated_classes: int
    simulated_ops: int
    coverage: list[str]
    # lookups outside what was measured (operator curves, collective tables), never extrapolated silently
    calibration_warnings: list[str]
    collectives: list[Collective] = field(default_factory=list)
    # True for a forward-only pass (training.forward_only: no backward, gradients or optimizer
    # step; FLOPs are the forward's); left out for a training step
    forward_only: bool | None = optional()
    # with precision fp8, the scaling recipe (training.fp8_recipe); left out otherwise
    fp8_recipe: str | None = optional()
    heterogeneity: Heterogeneity | None = optional()
    stragglers: Stragglers | None = optional()
    moe: MoeSection | None = optional()
    context_parallel: ContextParallel | None = optional()
    links: Links | None = optional()
