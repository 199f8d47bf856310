"""The engine's kernel inventory: how many kernels the small steps of a layer take in each vLLM
release whose source was read (simtrain.workload.generation.KERNEL_INVENTORIES).

Expected counts are the launches read from vLLM's released source for a Qwen3-MoE layer in eager
mode at tp > 1 (qwen3_moe.py, fused_moe.py, moe_align_sum_kernels.cu, _custom_ops.py):
  attention half: fused add+RMSNorm, qkv GEMM, q_norm, k_norm, rotary, KV-cache write, decode
  attention, o_proj, all-reduce; MoE half: fused add+RMSNorm, router GEMM, fp32 cast, top-k softmax,
  renormalize (sum, divide), the align stage, w13 GEMM, silu_and_mul, w2 GEMM, moe_sum, all-reduce.
  0.8.5: q/k norms 8 PyTorch kernels each, align 3 -> 2 + 22 + 13 = 37 per layer;
  0.9.2: q/k norms 2 each (contiguous copy + kernel), align 5 -> 27;
  0.10.1: q/k norms 2 each, align 2 -> 24;
  minimal (one kernel per operator, no cache write, no cast or renormalize, no align) -> 16.
"""
import pytest
import yaml

from simtrain.errors import SimtrainError
from simtrain.rollout.engine import EngineConfig
from simtrain.spec.loading import load_scenario
from simtrain.workload.generation import Batch, GenerationDims
from simtrain.workload.ir import Comm


def qwen3_moe(tmp_path, fast_topology):
    doc = {"name": "q", "model": {"preset": "qwen3-30b-a3b"}, "training": {"micro_batch_size": 1, "global_batch_size": 8},
           "parallel": {"tp": 1, "pp": 1, "dp": 4},
           "cluster": {"device": "h100-sxm5-80gb", "topology": str(fast_topology), "nodes": 1}}
    p = tmp_path / "q.yaml"
    p.write_text(yaml.safe_dump(doc))
    return load_scenario(p)[0].model


def layer_kernels(dims, b):
    """(count, kernels of one layer) of the MoE layer kind: every operator and every collective."""
    (count, items), = [(c, it) for c, it in dims.step_items(b)[:-1]]
    return count, [o for it in items for o in ((it,) if isinstance(it, Comm) else it)]


@pytest.mark.parametrize("kernels,per_layer", [("minimal", 16), ("vllm-0.8.5", 37), ("vllm-0.9.2", 27), ("vllm-0.10.1", 24)])
def test_kernels_per_moe_layer_as_read_from_the_source(tmp_path, fast_topology, kernels, per_layer):
    model = qwen3_moe(tmp_path, fast_topology)
    count, ks = layer_kernels(GenerationDims(model, tp=4, kernels=kernels), Batch(decode=256, decode_ctx=256 * 1000.0, sampled=256))
    assert count == 48
    assert len(ks) == per_layer


def test_extra_kernels_bytes_by_hand(tmp_path, fast_topology):
    """Qwen3-30B-A3B at tp 4 (4 KV heads of 128: one per rank), T = 256 tokens, bf16 KV:
    cache write = 2 x T x (2 x 1 x 128 x 2 B) = 262,144 B; router cast = (2 + 4) x T x 128 experts;
    renormalize = 4 x T x (top-8 + 1) each; align = 4 x (2 x T x 8 + 128) each;
    a 0.8.5 q_norm step = 2 x 2 B x T x (32 heads / 4 x 128)."""
    model = qwen3_moe(tmp_path, fast_topology)
    T = 256
    _, ks = layer_kernels(GenerationDims(model, tp=4, kernels="vllm-0.8.5"), Batch(decode=T, decode_ctx=T * 1000.0, sampled=T))
    by = {o.name: o.bytes for o in ks if not isinstance(o, Comm)}
    assert by["kv_cache_write"] == 2 * T * (2 * 1 * 128 * 2)
    assert by["router_cast"] == 6 * T * 128
    assert by["router_renorm.0"] == by["router_renorm.1"] == 4 * T * 9
    assert [by[f"moe_align.{j}"] for j in range(3)] == [4 * (2 * T * 8 + 128)] * 3
    assert [by[f"q_norm.{j}"] for j in range(8)] == [2 * 2 * T * 8 * 128] * 8
    names = [o.name for o in ks]
    # issue order: cast before the top-k kernel, renormalize after it, the sort before the expert GEMMs
    assert names.index("router_cast") < names.index("router_topk") < names.index("router_renorm.0") \
        < names.index("moe_align.0") < names.index("experts.gate_up")


def test_an_eager_decode_step_pays_a_launch_per_kernel(tmp_path, fast_topology):
    """Eager, every kernel is issued by the host: with kernels far shorter than the launch cost the
    step is at least kernels x launch_overhead_s, and 0.8.5's 21 more kernels per layer than the
    minimal inventory add about 48 x 21 x 23 us = 23.2 ms."""
    from simtrain.hardware.devices import get_device
    from simtrain.rollout.cost import IterationCost
    model = qwen3_moe(tmp_path, fast_topology)
    dev = get_device("h20-96gb")
    b = Batch(decode=16, decode_ctx=16 * 100.0, sampled=16)
    t = {}
    for inv in ("minimal", "vllm-0.8.5"):
        e = EngineConfig(tp=1, cuda_graphs=False, kernels=inv)
        t[inv] = IterationCost(GenerationDims(model, 1, kernels=inv), dev, None, e).gpu_seconds(b)
    assert t["vllm-0.8.5"] - t["minimal"] == pytest.approx(48 * 21 * 23e-6, rel=0.05)


def test_unknown_inventory_is_refused():
    with pytest.raises(SimtrainError, match="kernels: unknown 'vllm-0.7'; use one of minimal, vllm-0.8.5"):
        EngineConfig(kernels="vllm-0.7")
    with pytest.raises(SimtrainError, match="kernels: unknown"):
        EngineConfig(kernels=["vllm-0.8.5"])
