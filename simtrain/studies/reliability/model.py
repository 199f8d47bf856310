"""Failure, checkpoint and recovery models resolved for one job (elaborate stage of the job model).

    ReliabilitySpec (config.py) + Scenario + Topology + step result  ->  JobParams (SI floats)

Failure model: each category c is a point process with rate lambda_c = rate_per_unit_hour x
units(c) / 3600 per second, units from the job (GPUs = world size, hosts = GPUs / devices per
host, NICs = hosts x NICs per host, job = 1). Any failure stops the whole job (synchronous
training). Job MTBF = 1 / sum of the unexpected categories' rates, so it scales as 1/N with
the component count. Worked example, Llama 3 on 16,384 GPUs: 419 failures in 54 days ->
MTBF = 54 x 24 / 419 = 3.09 h.

Checkpoint size: weights + optimizer state of every rank, deduplicated over dp where they are
replicated (weights unless ZeRO-3, optimizer unless ZeRO >= 1), from the step simulation's
per-rank memory. 405B, tp 8 pp 16 dp 128, ZeRO-1: 2 B x 405e9 + 12 B x 405e9 = 5.7 TB.

Checkpoint methods, as a blocking stall `stall_s`, a background write `write_s` (the checkpoint
is durable only when it ends; steps run `background_slowdown` slower meanwhile) and levels:
  sync       stall = fixed + S / B_storage                         write = 0
  async      stall = snapshot_overhead + (S / ranks) / B_snapshot   write = fixed + S / B_storage
  in_memory  stall as async; write = (replicas - 1) x S / hosts / B_node to peer hosts' memory,
             and every `persist_every`-th checkpoint also to storage (fixed + S / B_storage, not
             slowing the steps: it streams from host memory)
B_storage = min(storage write bandwidth, hosts x per-host bandwidth), the per-host bandwidth
being the topology's NICs x NIC bandwidth unless given.

Recovery after a failure: detection (crash: heartbeat, hang: collective timeout), a spare host
for `swap` failures, restart = requeue + launch + comm_init_base + comm_init_per_rank x ranks,
checkpoint load (S / read bandwidth + fixed, or from peer memory: S / hosts / B_node + fixed),
warm-up = warmup_steps x step time x (slowdown - 1).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from simtrain.errors import Collector
from simtrain.schedules import schedule_for
from simtrain.studies.reliability.config import ReliabilitySpec
from simtrain.workload.flops import parameter_counts

if TYPE_CHECKING:
    from simtrain.hardware.topology import Topology
    from simtrain.results.step import MemoryEntry, StepResult
    from simtrain.spec.scenario import Scenario


@dataclass(frozen=True)
class Level:
    """One place a checkpoint becomes durable: every `every`-th checkpoint, `write_s` after its stall."""
    name: str           # storage | memory
    every: int
    write_s: float


@dataclass(frozen=True)
class JobParams:
    step_time_s: float
    step_time_cv: float
    tokens_per_step: float
    gpus: int
    hosts: int
    dp: int
    hosts_per_replica: int
    # failures: per-category (name, rate per second, action, detection, group, planned)
    categories: tuple
    distribution: str
    weibull_shape: float
    # checkpoint
    method: str
    checkpoint_bytes: float
    checkpoint_size_source: str
    stall_s: float
    write_s: float                  # background write that makes the checkpoint durable (first level)
    background_slowdown: float
    storage_write_s: float          # fixed + S / B_storage (the storage level of every method)
    persist_interval_s: float       # in_memory: how often a checkpoint also goes to storage
    # recovery
    detect_s: dict                  # detection kind -> seconds
    restart_s: float
    load_storage_s: float
    load_memory_s: float
    warmup_s: float
    replicas: int
    # spares
    hot_spares: int
    repair_time_s: float
    swap_time_s: float
    elastic: bool
    min_dp: int
    # run length
    horizon_s: float | None
    target_steps: int | None
    interval_s: float | None        # configured interval; None = auto

    @property
    def job_rate(self) -> float:
        """Unexpected failures per second of the whole job."""
        return sum(c[1] for c in self.categories if not c[5])

    @property
    def mtbf_s(self) -> float:
        r = self.job_rate
        return 1.0 / r if r > 0 else math.inf

    @property
    def effective_overhead_s(self) -> float:
        """Seconds a checkpoint costs the training: the stall plus the slowdown while its write runs."""
        rho = self.background_slowdown
        return self.stall_s + (self.write_s * rho / (1 + rho) if self.write_s > 0 else 0.0)

    @property
    def mean_restart_s(self) -> float:
        """Expected recovery per unexpected failure (no spare waiting): detection weighted by the
        category mix + restart + load + warm-up (Daly's R)."""
        r = self.job_rate
        if r <= 0:
            return self.restart_s + self.load_storage_s + self.warmup_s
        det = sum(c[1] * self.detect_s[c[3]] for c in self.categories if not c[5]) / r
        return det + self.restart_s + self.load_storage_s + self.warmup_s

    def with_(self, **kw: Any) -> "JobParams":
        return replace(self, **kw)


def checkpoint_bytes(memory: list[MemoryEntry], sc: Scenario) -> tuple:
    """Unique weights + optimizer bytes of the job, and how they were counted.

    Dense plans: from the per-rank memory entries (one per pipeline rank), deduplicated over the
    ranks that hold the same state: each of the tp shards of a stage is replicated over dp x cp
    (the weights unless ZeRO-3, the optimizer unless ZeRO >= 1). Where the entries do not map
    one-to-one onto model state (experts sharded over ep, DualPipe's duplicated stages) the
    whole-model parameter count is used with the same bytes per parameter (2 for bf16/fp16
    weights, 12 or 16 for the optimizer: the Megatron table of simtrain.simulate.static_memory)."""
    p = sc.parallel
    dup = False
    try:
        dup = bool(schedule_for(p, sc.num_microbatches).duplicated_stages)
    except Exception:           # a schedule given as CSV: its stages are never duplicated
        dup = False
    if getattr(sc.model, "moe", None) is None and not dup:
        rep = p.dp * getattr(p, "cp", 1)
        w_rep = rep if p.zero_stage >= 3 else 1
        o_rep = rep if p.zero_stage >= 1 else 1
        return sum(m.weights * p.tp * w_rep + m.optimizer * p.tp * o_rep for m in memory), "memory model"
    per = 2.0 + (16.0 if sc.training.precision == "fp16" else 12.0)
    return parameter_counts(sc)["total"] * per, "parameter count x bytes per parameter"


def node_bandwidth_of(topo: Topology | None) -> float | None:
    try:
        return float(topo.nics_per_node) * float(topo.nic_bw) / max(1, topo.hosts_per_node)
    except AttributeError:
        return None


def build(spec: ReliabilitySpec, sc: Scenario, topo: Topology | None, step: StepResult | None,
          file: str = "<scenario>") -> JobParams:
    """Resolve the spec for this job. `step` is the step simulation's StepResult (step time, memory);
    it may be None when reliability.step_time and checkpoint.size are both given."""
    errs = Collector(file)
    gpus = sc.world_size
    dph = topo.devices_per_host if topo is not None else 8
    hosts = max(1, gpus // dph)
    try:
        nics_per_host = topo.nics_per_node / max(1, topo.hosts_per_node)
    except AttributeError:
        nics_per_host = dph
    units = {"gpu": gpus, "host": hosts, "nic": hosts * nics_per_host, "job": 1}
    f = spec.failures
    cats = tuple((c.name, c.rate_per_unit_hour * units[c.per] * f.rate_scale / 3600.0, c.action, c.detection, c.group, c.planned)
                 for c in f.categories if c.rate_per_unit_hour > 0)

    step_time = spec.step_time_s if spec.step_time_s is not None else (step.step_time_s if step is not None else None)
    if not step_time:
        errs.add("reliability.step_time", "no step time (the step simulation gave none)", 'give reliability.step_time, e.g. "12 s"')
    ck = spec.checkpoint
    size_source = "reliability.checkpoint.size"
    if ck.size_bytes is not None:
        size = ck.size_bytes
    elif step is not None and step.memory:
        size, size_source = checkpoint_bytes(step.memory, sc)
    else:
        size = 0.0
        errs.add("reliability.checkpoint.size", "no checkpoint size (no memory model result)", 'give checkpoint.size, e.g. "5.7 TB"')
    node_bw = ck.node_bandwidth if ck.node_bandwidth is not None else node_bandwidth_of(topo)
    if node_bw is None:
        if ck.method == "in_memory":
            errs.add("reliability.checkpoint.storage.node_bandwidth", f"the topology kind {getattr(topo, 'kind', '?')} has no NIC bandwidth "
                     "for the copies to peer hosts", 'give a bandwidth per host, e.g. "50 GB/s"')
        node_bw = math.inf          # storage traffic bounded by the storage alone
    errs.raise_if_any()

    store_bw = min(ck.write_bandwidth, hosts * node_bw)
    storage_write = ck.fixed_overhead_s + size / store_bw
    snapshot = ck.snapshot_overhead_s + (size / gpus) / ck.snapshot_bandwidth
    rho = ck.background_slowdown
    if ck.method == "sync":
        stall, write = storage_write, 0.0
    elif ck.method == "async":
        stall, write = snapshot, storage_write
    else:
        per_host = size / hosts
        if ck.replicas * per_host > ck.usable_host_memory_fraction * ck.host_memory_bytes:
            errs.add("reliability.checkpoint.in_memory", f"{ck.replicas} copies of {per_host / 2**30:.1f} GiB per host exceed "
                     f"{ck.usable_host_memory_fraction:g} x {ck.host_memory_bytes / 2**30:.0f} GiB of host memory",
                     "use fewer replicas, more host memory or another method")
            errs.raise_if_any()
        stall = snapshot
        write = (ck.replicas - 1) * per_host / node_bw
    rec = spec.recovery
    restart = rec.requeue_s + rec.launch_s + rec.comm_init_base_s + rec.comm_init_per_rank_s * gpus
    load_storage = rec.load_fixed_s + size / min(rec.read_bandwidth, hosts * node_bw)
    load_memory = rec.load_fixed_s + (size / hosts) / node_bw
    warmup = rec.warmup_steps * step_time * (rec.warmup_slowdown - 1.0)
    p = sc.parallel
    per_replica_gpus = p.tp * p.pp * p.cp
    hosts_per_replica = max(1, math.ceil(per_replica_gpus / dph))
    target = None
    if spec.tokens is not None:
        tps = sc.training.global_batch_size * sc.model.seq_length
        target = max(1, math.ceil(spec.tokens / tps))
    sp = spec.spares
    return JobParams(
        step_time_s=step_time, step_time_cv=spec.step_time_cv,
        tokens_per_step=sc.training.global_batch_size * sc.model.seq_length,
        gpus=gpus, hosts=hosts, dp=p.dp, hosts_per_replica=hosts_per_replica,
        categories=cats, distribution=f.distribution, weibull_shape=f.weibull_shape,
        method=ck.method, checkpoint_bytes=size, checkpoint_size_source=size_source, stall_s=stall, write_s=write, background_slowdown=rho,
        storage_write_s=storage_write, persist_interval_s=ck.persist_interval_s,
        detect_s={"crash": rec.detect_crash_s, "hang": rec.detect_hang_s, "none": 0.0},
        restart_s=restart, load_storage_s=load_storage, load_memory_s=load_memory, warmup_s=warmup,
        replicas=ck.replicas,
        hot_spares=sp.hot_nodes, repair_time_s=sp.repair_time_s, swap_time_s=sp.swap_time_s, elastic=sp.elastic,
        min_dp=max(1, math.ceil(sp.min_dp_fraction * p.dp)),
        horizon_s=spec.horizon_s, target_steps=target, interval_s=ck.interval_s,
    )


def levels(p: JobParams, interval_steps: int) -> tuple:
    """Where checkpoints become durable, first level first. in_memory: every checkpoint in peer
    memory, every m-th also on storage, m = round(persist_interval / interval) >= 1
    (interval 10 min, persist 1 h -> m = 6)."""
    if p.method == "sync":
        return (Level("storage", 1, 0.0),)
    if p.method == "async":
        return (Level("storage", 1, p.write_s),)
    m = max(1, round(p.persist_interval_s / (interval_steps * p.step_time_s)))
    return (Level("memory", 1, p.write_s), Level("storage", m, p.storage_write_s))
