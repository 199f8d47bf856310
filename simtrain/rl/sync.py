"""Weight synchronisation between an RL trainer and its rollout engine, and host swaps.

After every optimiser update the rollout engine needs the new policy weights. Three cases:

- **Colocated, in place** (`reshard`, verl's hybrid engine: the trainer and the engine share the
  devices). FSDP (ZeRO-3): the parameters are sharded over the `s = dp x cp` ranks of the pool.
  verl's FSDP sharding manager materialises the full state dict on every rank (an all-gather over
  the shard group) and hands it to the engine, whose `load_weights` keeps the rank's tensor-parallel
  slice (verl/workers/sharding_manager/fsdp_vllm.py at commit b178a3cd; vLLM's per-layer
  `weight_loader`). Per device: an all-gather delivering W (1 - 1/s) bytes, then a device-local copy
  of W / tp_r bytes into the engine's buffers (read and written: 2 W / tp_r bytes of HBM traffic at
  the device's memory-bound efficiency). Without ZeRO-3 (zero_stage < 3) every rank holds W already
  and only the copy remains.
  Megatron: each layer's tensor-parallel shards are all-gathered over the training tp group and each
  pipeline stage's layers are then broadcast to the other stages (verl's Megatron weight converter
  walks the layers of every pp rank and broadcasts them over the pp group,
  verl/workers/sharding_manager/megatron_vllm.py and verl/utils/megatron_utils.py
  `per_tensor_generator`). Per device: an all-gather of W / pp over tp_t (receives
  W (1 - 1/tp_t) / pp), then the pp exchange, priced as an all-gather of W over the pp group
  (each rank receives the W (1 - 1/pp) of the other stages), then the local copy.
- **Split pools** (`transfer`: the trainer and the engine on different devices). verl's
  one-step-off and fully asynchronous trainers broadcast every tensor from a trainer rank to all
  rollout ranks over one NCCL group (verl/experimental/one_step_off_policy, `sync_rollout_weights`);
  each rollout rank receives the full W and its engine keeps its slice. NCCL pipelines a broadcast
  along a ring/chain, so every link of the chain carries W once: the time is that of a ring
  all-gather over the same group of W p / (p - 1) bytes in total (a ring all-gather of N bytes moves
  N (p - 1) / p over each link), which prices the chain with the project's collective model
  (bottleneck link, latency per hop, protocol). Before it the trainer gathers its shards, as in the
  colocated case.
- **Host swaps** (`swap_seconds`): parameters, gradients or optimizer state offloaded to host
  memory while the other phase runs, moved over the device's host link (`Device.host_bandwidth`,
  measured or nominal per device preset).

Weight bytes W are the model's parameters in bf16 (2 bytes), as verl syncs them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from simtrain.errors import SimtrainError
from simtrain.hardware.devices import Device
from simtrain.hardware.topology import Topology
from simtrain.network.collectives import choose
from simtrain.plan.grid import group_shape
from simtrain.spec.scenario import ModelSpec, ParallelSpec
from simtrain.workload.generation import GenerationDims

SYNC_DTYPE_BYTES = 2        # bf16 weights, as verl's sharding managers hand them to the engine

# Bytes per parameter that an offload moves (mixed-precision Adam, Megatron/DeepSpeed layout):
# bf16 parameters 2; fp32 gradients 4 (FSDP's mixed precision reduces and keeps them in fp32 for
# the optimizer); optimizer state = fp32 master weights + Adam m + v = 12 (Rajbhandari et al.,
# ZeRO, SC'20, section 3.1: "K = 12").
OFFLOAD_BYTES_PER_PARAM = {"params": 2.0, "grads": 4.0, "optimizer": 12.0}


@dataclass(frozen=True)
class SyncCost:
    """Time of one weight synchronisation, the bytes each device receives or copies, and the parts."""
    seconds: float
    bytes_per_device: float
    detail: dict = field(default_factory=dict)      # part -> seconds
    notes: tuple = ()


def model_params(model: ModelSpec) -> float:
    """All parameters of the model (layers, embedding, LM head unless tied), one full copy."""
    return GenerationDims(model, 1, 1).weight_params()


def weight_bytes(model: ModelSpec) -> float:
    """W: the bytes of one full copy of the weights as synchronised (bf16)."""
    return model_params(model) * SYNC_DTYPE_BYTES


def _check(rollout_tp: int, devices: Sequence[int], model: ModelSpec, what: str) -> None:
    if isinstance(rollout_tp, bool) or not isinstance(rollout_tp, int) or rollout_tp < 1:
        raise SimtrainError(f"rollout.tp: {rollout_tp!r} is not a positive whole number; give the engine's tensor-parallel size")
    if not devices:
        raise SimtrainError(f"{what}: no devices; give the pool at least one device")
    if model.num_attention_heads % rollout_tp:
        raise SimtrainError(f"rollout.tp: {rollout_tp} does not divide the model's {model.num_attention_heads} attention heads; "
                            "use a divisor of the head count")
    if len(devices) % rollout_tp:
        raise SimtrainError(f"rollout.tp: {rollout_tp} does not divide the {len(devices)} devices of the {what}; "
                            "use a tp that divides the pool, or resize the pool")


def _all_gather(nbytes: float, devs: Sequence[int], topo: Topology) -> float:
    if len(devs) <= 1 or nbytes <= 0:
        return 0.0
    return choose("all_gather", nbytes, group_shape(list(devs), topo), topo).seconds


def local_copy_seconds(nbytes: float, device: Device) -> float:
    """Copy `nbytes` inside one device: read and written, 2 x nbytes of HBM traffic at the device's
    memory-bound efficiency."""
    return 2.0 * nbytes / (device.memory_bw * device.mem_efficiency)


def _gather(model: ModelSpec, train: ParallelSpec, strategy: str, topo: Topology, devs: Sequence[int]) -> tuple:
    """(seconds, bytes received per device, detail) of assembling full weights on the trainer."""
    W = weight_bytes(model)
    if strategy == "fsdp":
        shards = train.dp * train.cp if train.zero_stage >= 3 else 1
        group = list(devs)[:shards]
        t = _all_gather(W, group, topo) if shards > 1 else 0.0
        return t, W * (1.0 - 1.0 / shards), {"all_gather_shards": t}
    if strategy == "megatron":
        tp, pp = train.tp, train.pp
        stride = tp * train.cp * train.dp
        tp_group = list(devs)[:tp]
        pp_group = list(devs)[::stride][:pp]
        t_tp = _all_gather(W / pp, tp_group, topo)
        t_pp = _all_gather(W, pp_group, topo)
        recv = W * (1.0 - 1.0 / tp) / pp + W * (1.0 - 1.0 / pp)
        return t_tp + t_pp, recv, {"all_gather_tp": t_tp, "exchange_pp": t_pp}
    raise SimtrainError(f"actor.strategy: unknown {strategy!r}; use fsdp or megatron")


def reshard(model: ModelSpec, train: ParallelSpec, strategy: str, rollout_tp: int, rollout_ep: int,
            device: Device, topo: Topology, devices: Sequence[int], costs: object | None = None) -> SyncCost:
    """Colocated weight sync: the trainer's layout to the engine's, in place on `devices`."""
    _check(rollout_tp, devices, model, "colocated pool")
    t_gather, recv, detail = _gather(model, train, strategy, topo, devices)
    mine = weight_bytes(model) / rollout_tp
    t_copy = local_copy_seconds(mine, device)
    detail = {**detail, "load_into_engine": t_copy}
    return SyncCost(t_gather + t_copy, recv + mine, detail,
                    (f"{strategy}: full weights gathered on every rank, each engine rank keeps 1/{rollout_tp}",))


def transfer(model: ModelSpec, train: ParallelSpec, strategy: str, rollout_tp: int, rollout_ep: int, topo: Topology,
             train_devices: Sequence[int], rollout_devices: Sequence[int], backend: str = "analytical") -> SyncCost:
    """Split pools: the trainer gathers its weights, then one trainer rank broadcasts every tensor to
    all rollout ranks (a pipelined NCCL broadcast over one group), then each engine keeps its slice.
    `backend` is accepted for symmetry with the step simulation; the broadcast uses the closed form."""
    _check(rollout_tp, rollout_devices, model, "rollout pool")
    if not train_devices:
        raise SimtrainError("placement: the training pool has no devices; give it at least one")
    if set(train_devices) & set(rollout_devices):
        raise SimtrainError("placement: the training and rollout pools share devices; a split placement needs disjoint pools")
    W = weight_bytes(model)
    t_gather, _, detail = _gather(model, train, strategy, topo, train_devices)
    group = [train_devices[0], *rollout_devices]
    p = len(group)
    t_bcast = _all_gather(W * p / (p - 1), group, topo)
    return SyncCost(t_gather + t_bcast, W, {**detail, "broadcast": t_bcast},
                    (f"broadcast of {W / 1e9:.2f} GB from a trainer rank to {len(rollout_devices)} rollout devices, "
                     "priced as the pipelined ring it runs as",))


def offload_bytes(model: ModelSpec, parallel: ParallelSpec, what: str) -> float:
    """Bytes per device that offloading `what` (params | grads | optimizer) moves, sharded as
    ZeRO shards them (params and gradients over dp x cp at stage 3, gradients from stage 2,
    optimizer state from stage 1; the model split over tp x pp in every case)."""
    if what not in OFFLOAD_BYTES_PER_PARAM:
        raise SimtrainError(f"offload: unknown {what!r}; use one of {', '.join(OFFLOAD_BYTES_PER_PARAM)}")
    z = parallel.zero_stage
    sharded = {"params": z >= 3, "grads": z >= 2, "optimizer": z >= 1}[what]
    shards = parallel.tp * parallel.pp * (parallel.dp * parallel.cp if sharded else 1)
    return model_params(model) * OFFLOAD_BYTES_PER_PARAM[what] / shards


def swap_seconds(nbytes: float, device: Device) -> float:
    """Moving `nbytes` between device and host memory over the device's host link, one direction."""
    if device.host_bandwidth <= 0:
        raise SimtrainError(f"cluster.device: {device.key} has no host-link bandwidth; give its host_link in the device preset")
    return nbytes / device.host_bandwidth
