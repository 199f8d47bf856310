"""Weight sync between an RL trainer and its rollout engine, against hand derivations."""
from __future__ import annotations

import pytest

from simtrain.errors import SimtrainError
from simtrain.hardware.devices import get_device
from simtrain.hardware.topology import find_topology_file, load_topology
from simtrain.rl import sync
from simtrain.spec.scenario import ModelSpec, ParallelSpec

# Llama-2-7B dimensions; Meta's released checkpoint has 6,738,415,616 parameters, of which
# 65 x 4096 = 266,240 are RMSNorm gains (not synchronised as GEMM weights here, and < 0.004 %).
LLAMA2_7B = ModelSpec(name="llama2-7b", architecture="llama", num_layers=32, hidden_size=4096, num_attention_heads=32,
                      num_key_value_heads=32, ffn_hidden_size=11008, vocab_size=32000, seq_length=4096)
H20 = get_device("h20-96gb")


def topo(nodes: int):
    return load_topology(find_topology_file("hgx-h20", None), nodes)


def test_weight_bytes_of_llama2_7b_match_the_released_parameter_count():
    assert sync.model_params(LLAMA2_7B) == pytest.approx(6_738_415_616 - 266_240, rel=1e-9)
    assert sync.weight_bytes(LLAMA2_7B) == 2 * sync.model_params(LLAMA2_7B)


def test_fsdp_reshard_bytes_and_time_by_hand():
    """FSDP (ZeRO-3) over the 8 H20 of one node, engine tp 2: each device receives 7/8 W in the
    all-gather and copies its W/2 slice into the engine. Time: ring all-gather (p-1)/p W over the
    NVLink ring at 450 GB/s x 0.82 (hgx-h20.yaml) plus 7 hop latencies, then 2 (W/2) bytes of HBM
    traffic at 4.0 TB/s x the device's memory-bound efficiency."""
    W = sync.weight_bytes(LLAMA2_7B)
    r = sync.reshard(LLAMA2_7B, ParallelSpec(dp=8, zero_stage=3), "fsdp", 2, 1, H20, topo(1), range(8))
    assert r.bytes_per_device == pytest.approx(7 / 8 * W + W / 2)
    gather = 7 / 8 * W / (450e9 * 0.82)
    assert r.detail["all_gather_shards"] == pytest.approx(gather, rel=0.01)           # latency: tens of us of ~32 ms
    assert r.detail["load_into_engine"] == pytest.approx(2 * (W / 2) / (4.0e12 * H20.mem_efficiency))
    assert r.seconds == pytest.approx(sum(r.detail.values()))


def test_zero1_has_full_weights_already_and_only_copies():
    W = sync.weight_bytes(LLAMA2_7B)
    r = sync.reshard(LLAMA2_7B, ParallelSpec(dp=8, zero_stage=1), "fsdp", 4, 1, H20, topo(1), range(8))
    assert r.detail["all_gather_shards"] == 0.0 and r.bytes_per_device == pytest.approx(W / 4)


def test_megatron_regroup_bytes_by_hand():
    """Megatron tp 4 x pp 2 -> engine tp 2: each rank all-gathers its stage (W/2) over tp 4, receiving
    3/4 of it, then receives the other stage's W/2 over pp, then copies W/2 into the engine:
    3/8 W + 1/2 W + 1/2 W."""
    W = sync.weight_bytes(LLAMA2_7B)
    r = sync.reshard(LLAMA2_7B, ParallelSpec(tp=4, pp=2), "megatron", 2, 1, H20, topo(1), range(8))
    assert r.bytes_per_device == pytest.approx(3 / 8 * W + W / 2 + W / 2)
    assert set(r.detail) == {"all_gather_tp", "exchange_pp", "load_into_engine"}


def test_split_pool_broadcast_runs_at_the_nic_share_by_hand():
    """Trainer on node 0, engine on node 1 (8 devices each). The pipelined broadcast carries W over
    every link of its chain once; the slowest is the inter-node hop at one device's NIC share:
    hgx-h20 has 4 x 400 Gb/s NICs per 8 devices = 25 GB/s per device, x 0.825 efficiency.
    So T_broadcast = W / (25e9 x 0.825) plus per-hop latencies (< 1 ms here)."""
    W = sync.weight_bytes(LLAMA2_7B)
    t = sync.transfer(LLAMA2_7B, ParallelSpec(dp=8, zero_stage=3), "fsdp", 2, 1, topo(2), list(range(8)), list(range(8, 16)))
    assert t.detail["broadcast"] == pytest.approx(W / (25e9 * 0.825), abs=1e-3)
    assert t.bytes_per_device == W
    assert t.seconds == pytest.approx(t.detail["all_gather_shards"] + t.detail["broadcast"])


def test_host_swaps_by_hand():
    """Adam state of a 7B model over 8 ZeRO-1 ranks: 12 B/param / 8; over the H20's host link
    (63 GB/s nominal PCIe Gen5 x16 in the device preset) that takes 12 P / 8 / 63e9 s."""
    P = sync.model_params(LLAMA2_7B)
    par = ParallelSpec(dp=8, zero_stage=1)
    b = sync.offload_bytes(LLAMA2_7B, par, "optimizer")
    assert b == pytest.approx(12 * P / 8)
    assert sync.offload_bytes(LLAMA2_7B, par, "params") == pytest.approx(2 * P)      # not sharded below stage 3
    assert sync.swap_seconds(b, H20) == pytest.approx(12 * P / 8 / 63e9)


@pytest.mark.parametrize("call, msg", [
    (lambda: sync.reshard(LLAMA2_7B, ParallelSpec(dp=8, zero_stage=3), "fsdp", 3, 1, H20, topo(1), range(8)),
     "rollout.tp: 3 does not divide the model's 32 attention heads"),
    (lambda: sync.reshard(LLAMA2_7B, ParallelSpec(dp=8, zero_stage=3), "fsdp", 2, 1, H20, topo(1), []), "no devices"),
    (lambda: sync.transfer(LLAMA2_7B, ParallelSpec(dp=8), "fsdp", 2, 1, topo(2), list(range(8)), list(range(4, 12))),
     "share devices"),
    (lambda: sync.reshard(LLAMA2_7B, ParallelSpec(dp=8), "deepspeed", 2, 1, H20, topo(1), range(8)), "actor.strategy"),
    (lambda: sync.offload_bytes(LLAMA2_7B, ParallelSpec(), "activations"), "offload: unknown"),
])
def test_bad_sync_inputs_are_one_clear_error(call, msg):
    with pytest.raises(SimtrainError, match=msg):
        call()
