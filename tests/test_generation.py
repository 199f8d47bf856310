"""The generation workload and the rollout-engine simulator, checked against hand derivations.

The tiny model: llama architecture, L = 2 layers, h = 64, a = 4 heads, g = 2 KV heads, d = 16,
f = 128, V = 256, tp 1, bf16 (2 bytes). Per layer: qkv h·(a + 2g)·d = 64·128 = 8,192, o_proj
a·d·h = 4,096, gate/up/down 3·h·f = 24,576: 36,864 GEMM parameters; embedding and LM head
V·h = 16,384 each. KV per token and layer: K and V of g heads: 2·2·16·2 B = 128 B.
"""
from dataclasses import replace

import numpy as np
import pytest

from simtrain.cost.roofline import CalibratedRoofline
from simtrain.errors import SimtrainError
from simtrain.hardware.devices import get_device
from simtrain.rollout.cost import IterationCost
from simtrain.rollout.engine import EngineConfig, Request, kv_cache_blocks, simulate_generation
from simtrain.spec.scenario import ModelSpec
from simtrain.studies.validate_serving import model_spec, trtllm_bench_settings
from simtrain.workload.generation import Batch, GenerationDims
from simtrain.workload.ir import Comm

TINY = ModelSpec(name="tiny", architecture="llama", num_layers=2, hidden_size=64, num_attention_heads=4,
                 num_key_value_heads=2, ffn_hidden_size=128, vocab_size=256, seq_length=64)
LAYER_PARAMS = 8192 + 4096 + 3 * 64 * 128
H100 = get_device("h100-sxm5-80gb")


def approx(xs: list):
    """Times of the unit-step engine: decode attention keeps its FLOP time (~1e-12 s) under ZeroCosts."""
    return pytest.approx(xs, abs=1e-6)


class ZeroCosts:
    """Every kernel takes no time: iteration times are then the engine's CPU and launch terms."""
    coverage: set = set()

    def duration(self, op) -> float:
        return 0.0

    def device_time(self, op) -> float:
        return 0.0

    def memory_time(self, nbytes: float) -> float:
        return 0.0


def test_weights_and_kv_bytes_by_hand():
    d = GenerationDims(TINY)
    assert d.weight_params() == 2 * LAYER_PARAMS + 2 * 16384
    assert d.kv_bytes_per_token_layer() == 128
    assert d.kv_bytes_per_token() == 256
    # tp 2: a KV head per rank (2 / 2), so half the KV; tp 4 replicates the 2 KV heads: 1 head per rank
    assert GenerationDims(TINY, tp=2).kv_bytes_per_token_layer() == 64
    assert GenerationDims(TINY, tp=4).kv_bytes_per_token_layer() == 64


def test_decode_step_reads_every_weight_once_and_each_sequences_kv():
    """One decode step of n = 3 sequences with 10, 20 and 30 cached tokens (each reads its cache
    plus the new token: 11 + 21 + 31 = 63 tokens). GEMM weight bytes: 2 B x (2 layers x 36,864 +
    LM head 16,384) = 180,224 B, whatever n is; KV read per layer 63 x 128 B = 8,064 B."""
    d = GenerationDims(TINY)
    b = Batch(decode=3, decode_ctx=63.0, sampled=3)
    weight_bytes = attn_bytes = 0.0
    for count, items in d.step_items(b):
        for it in items:
            for o in (it if isinstance(it, tuple) else ()):
                if o.kind == "gemm":
                    m, n, k = o.shape
                    weight_bytes += count * (o.bytes - 2 * m * (n + k))
                if o.name == "decode_attn":
                    attn_bytes += count * o.bytes
    assert weight_bytes == 180224
    qo = 2 * 3 * 4 * 32             # 16-bit queries and outputs: 3 tokens x 4 heads x (qk 16 + v 16)
    assert attn_bytes == 2 * (63 * 128 + qo)


def test_prefill_flops_by_hand():
    """Prefill of n = 8 tokens: 2 x (layer GEMM parameters) x n per layer, the LM head on the
    last token only (2·V·h), and causal attention 2·a·(qk + v)·n(n+1)/2 = 2·4·32·36 per layer."""
    d = GenerationDims(TINY)
    n = 8
    expected = 2 * (2 * LAYER_PARAMS * n) + 2 * 256 * 64 + 2 * (2 * 4 * 32 * n * (n + 1) / 2)
    assert d.prefill_flops(n) == expected


def test_tp_comms_are_two_all_reduces_per_layer():
    d = GenerationDims(TINY, tp=2)
    b = Batch(decode=4, decode_ctx=40.0, sampled=4)
    comms = [(count, it) for count, items in d.step_items(b) for it in items if isinstance(it, Comm)]
    per_layer = [c for count, c in comms if count == 2]
    assert [c.collective for c in per_layer] == ["all_reduce", "all_reduce"]
    assert all(c.size_bytes == 2 * 4 * 64 for c in per_layer)      # 16-bit hidden state of 4 tokens


def tiny_device(blocks: float, engine: EngineConfig):
    """A device whose memory leaves exactly `blocks` KV blocks (plus half a block of slack)."""
    d = GenerationDims(TINY)
    used = d.weight_bytes() + d.workspace_bytes(engine.max_num_batched_tokens, engine.max_num_seqs) + engine.reserved_bytes
    return replace(H100, memory_bytes=used + (blocks + 0.5) * engine.block_size * d.kv_bytes_per_token())


def test_kv_capacity_by_hand():
    """util 0.5 of 1 GB, weights 2 B x 106,496 params = 212,992 B, workspace 2 B x 64 tokens x
    (2·64 + 128 + 3·128) + 4 B x 8 rows x 256 = 81,920 + 8,192 = 90,112 B, reserved 0: free
    500,000,000 - 303,104 = 499,696,896 B over blocks of 16 x 256 B = 4,096 B: 121,996 blocks."""
    e = EngineConfig(gpu_memory_utilization=0.5, max_num_batched_tokens=64, max_num_seqs=8, reserved_bytes=0)
    dev = replace(H100, memory_bytes=1e9)
    assert GenerationDims(TINY).workspace_bytes(64, 8) == 90112
    assert kv_cache_blocks(GenerationDims(TINY), dev, e) == 121996


def unit_steps(**kw) -> EngineConfig:
    """Every iteration takes exactly 1 s (CPU overhead 1 s, kernels free, no launch cost)."""
    base = dict(cpu_overhead_s=1.0, launch_overhead_s=0.0, reserved_bytes=0, gpu_memory_utilization=1.0,
                max_num_batched_tokens=64, max_num_seqs=8)
    base.update(kw)
    return EngineConfig(**base)


def test_preemption_by_hand():
    """Cache of 4 blocks of 4 tokens; A and B each prompt 4, response 8 (11 tokens cached at the
    end: 3 blocks each, 6 > 4). Iteration 1 prefills both (1 block each) and samples their first
    tokens; 2..5 decode (tokens 5..8: 2 blocks each, cache full); in 6 A's token 9 needs a third
    block: B, the most recently admitted, is preempted (its 2 blocks freed, recompute) and A
    runs alone to its 8th token in 8. B waits (its 4 + 5 = 9 tokens need 3 blocks, 1 is free)
    until A's blocks return, is prefilled again in 9 and finishes in 11."""
    e = unit_steps(block_size=4)
    dev = tiny_device(4, e)
    assert kv_cache_blocks(GenerationDims(TINY), dev, e) == 4
    for bulk in (True, False):
        r = simulate_generation(TINY, dev, None, e, [Request(4, 8), Request(4, 8)], costs=ZeroCosts(), bulk=bulk)
        assert r.preemptions == 1
        assert list(r.finish_s) == approx([8.0, 11.0])
        assert r.num_steps == 11
        assert r.kv_blocks_peak == 4
        assert list(r.first_token_s) == approx([1.0, 1.0])


def test_continuous_batching_order():
    """max_num_seqs 1: FIFO, B starts when A leaves (A: prefill 1, decode 2; B: 3, 4, 5). With 2
    slots both start at once and A's slot is not waited for: A ends at 2, B at 3."""
    reqs = [Request(4, 2), Request(4, 3)]
    dev = tiny_device(100, unit_steps())
    one = simulate_generation(TINY, dev, None, unit_steps(max_num_seqs=1), reqs, costs=ZeroCosts())
    assert list(one.finish_s) == approx([2.0, 5.0]) and list(one.first_token_s) == approx([1.0, 3.0])
    two = simulate_generation(TINY, dev, None, unit_steps(max_num_seqs=2), reqs, costs=ZeroCosts())
    assert list(two.finish_s) == approx([2.0, 3.0])


def test_chunked_prefill_mixes_chunks_into_decode_iterations():
    """Budget 4 tokens. A (prompt 2, response 4) is admitted first; B (prompt 10) gets the 2 tokens
    left in iteration 1, then 3 (A decodes 1) in 2, 3 in 3, and its last 2 in 4: B's first token
    at 4. Without chunking B's 10 tokens exceed the budget and are refused."""
    e = unit_steps(max_num_batched_tokens=4)
    dev = tiny_device(100, e)
    r = simulate_generation(TINY, dev, None, e, [Request(2, 4), Request(10, 1)], costs=ZeroCosts())
    assert list(r.first_token_s) == approx([1.0, 4.0])
    assert [it.num_tokens for it in r.iterations][:4] == [4, 4, 4, 3]
    with pytest.raises(SimtrainError, match="max_num_batched_tokens"):
        simulate_generation(TINY, dev, None, replace(e, chunked_prefill=False), [Request(10, 1)], costs=ZeroCosts())


def test_cuda_graphs_on_off():
    """Kernels free, the default 23 us per launch: with graphs one launch per iteration; without,
    the host issues each kernel: 2 layers x 9 operators (add + RMSNorm fused as the engines run it,
    qkv, rotary, attention, o_proj; add + RMSNorm, gate_up, silu, down) + 4 (embedding, final norm,
    LM head, sampler) = 22 kernels, 22 x 23 = 506 us (host_queue of 22 zero-length kernels); at
    5 us, 110 us."""
    b = Batch(decode=2, decode_ctx=20.0, sampled=2)
    on = IterationCost(GenerationDims(TINY), H100, None, EngineConfig(cpu_overhead_s=0.0), ZeroCosts())
    off = IterationCost(GenerationDims(TINY), H100, None, EngineConfig(cpu_overhead_s=0.0, cuda_graphs=False), ZeroCosts())
    assert on.seconds(b) == pytest.approx(23e-6, rel=1e-3)
    assert off.seconds(b) == pytest.approx(506e-6, rel=1e-3)
    five = EngineConfig(cpu_overhead_s=0.0, cuda_graphs=False, launch_overhead_s=5e-6)
    assert IterationCost(GenerationDims(TINY), H100, None, five, ZeroCosts()).seconds(b) == pytest.approx(110e-6, rel=1e-3)


def test_graphs_matter_for_small_models_only_at_small_batches():
    """On the roofline, a 26-kernel iteration of the tiny model is launch-bound without graphs."""
    b = Batch(decode=2, decode_ctx=20.0, sampled=2)
    costs = CalibratedRoofline(H100, "bf16")
    on = IterationCost(GenerationDims(TINY), H100, None, EngineConfig(cpu_overhead_s=0.0), costs).seconds(b)
    off = IterationCost(GenerationDims(TINY), H100, None, EngineConfig(cpu_overhead_s=0.0, cuda_graphs=False), costs).seconds(b)
    assert off > 3 * on


def long_tail(n: int = 64, seed: int = 1) -> list:
    rng = np.random.default_rng(seed)
    out = np.minimum(2048, rng.lognormal(5.5, 1.0, n).astype(int) + 1)
    return [Request(int(p), int(o)) for p, o in zip(rng.integers(16, 512, n), out)]


def test_bulk_advance_matches_step_by_step():
    """Bulk-advanced decode iterations (closed form over k steps) against one iteration at a
    time, with preemptions (a cache of 600 blocks) and the real roofline: the decode step time is
    linear in the KV read, so the trapezoid is exact up to rounding."""
    m = model_spec("llama3-8b")
    e = EngineConfig(max_num_seqs=64)
    d = GenerationDims(m)
    used = d.weight_bytes() + d.workspace_bytes(e.max_num_batched_tokens, e.max_num_seqs) + e.reserved_bytes
    dev = replace(H100, memory_bytes=(used + 600.5 * 16 * d.kv_bytes_per_token()) / e.gpu_memory_utilization)
    reqs = long_tail()
    a = simulate_generation(m, dev, None, e, reqs, bulk=True)
    b = simulate_generation(m, dev, None, e, reqs, bulk=False)
    assert a.preemptions > 0 and a.preemptions == b.preemptions
    assert a.num_steps == b.num_steps
    assert len(a.iterations) < len(b.iterations) / 4
    np.testing.assert_allclose(a.finish_s, b.finish_s, rtol=1e-9)


def test_deterministic():
    m = model_spec("llama3-8b")
    reqs = long_tail()
    r1 = simulate_generation(m, H100, None, EngineConfig(), reqs)
    r2 = simulate_generation(m, H100, None, EngineConfig(), reqs)
    assert r1.iterations == r2.iterations
    assert np.array_equal(r1.finish_s, r2.finish_s) and r1.makespan_s == r2.makespan_s


def test_arrivals_wait_and_dp_replicas_split_requests():
    """A request arriving at 10 s starts at 10 s; two dp replicas each take one request."""
    dev = tiny_device(100, unit_steps())
    r = simulate_generation(TINY, dev, None, unit_steps(), [Request(4, 2), Request(4, 2, arrival_s=10.0)], costs=ZeroCosts())
    assert list(r.finish_s) == approx([2.0, 12.0])
    r2 = simulate_generation(TINY, dev, None, unit_steps(dp=2, max_num_seqs=1), [Request(4, 2), Request(4, 2)], costs=ZeroCosts())
    assert list(r2.finish_s) == approx([2.0, 2.0])


@pytest.mark.parametrize("kw, text", [
    ({"tp": 0}, "tp: 0 is not a whole number"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization: 1.5 is not in (0, 1]"),
    ({"cpu_overhead_s": float("nan")}, "cpu_overhead_s: nan is not a finite number"),
    ({"tp": 2, "ep": 4}, "ep: 4 must be 1 or equal tp"),
    ({"kv_dtype": "fp7"}, "kv_dtype: unknown 'fp7'"),
])
def test_bad_engine_settings(kw, text):
    with pytest.raises(SimtrainError) as ei:
        EngineConfig(**kw)
    assert text in str(ei.value)
    assert str(ei.value).count("\n") == 0


def test_bad_requests_and_a_cache_too_small():
    with pytest.raises(SimtrainError, match=r"requests\[0\]: output_tokens: 0"):
        simulate_generation(TINY, H100, None, EngineConfig(), [Request(4, 0)])
    e = unit_steps(block_size=4)
    with pytest.raises(SimtrainError, match="needs more than the 4 KV blocks"):
        simulate_generation(TINY, tiny_device(4, e), None, e, [Request(10, 10)], costs=ZeroCosts())


def test_moe_decode_reads_only_touched_experts():
    """Mixtral-like MoE (8 experts, top-2): one token touches 2 experts, so a decode step of one
    sequence reads 2/8 of the expert weights; 64 tokens touch all of them (8·(1 - 0.75^64) ≈ 8)."""
    m = model_spec("mixtral-8x7b")
    d = GenerationDims(m)

    def expert_weight_bytes(T):
        b = Batch(decode=T, decode_ctx=10.0 * T, sampled=T)
        for _, items in d.step_items(b):
            for it in items:
                for o in (it if isinstance(it, tuple) else ()):
                    if o.name == "experts.down":
                        rows = T * 2
                        return o.bytes - 2 * rows * (m.hidden_size + m.moe.expert_ffn_hidden_size)
    one_expert = 2 * m.hidden_size * m.moe.expert_ffn_hidden_size
    assert expert_weight_bytes(1) == pytest.approx(2 * one_expert)
    assert expert_weight_bytes(64) == pytest.approx(8 * one_expert, rel=1e-6)


def test_trtllm_bench_heuristic_worked_example():
    """tensorrt_llm/bench/build/tuning.py for Llama 3 8B on an 80 GB H100, tp 1, 128/128, FP8:
    64 KiB per token, 8.03 GB of weights; 0.95 x (74.5 - 7.48) GiB / (64 KiB x 256) = 4,074
    requests -> batch 256·ceil(4074/256) = 4,096; tokens 4,074 x 2 = 8,148 -> 512·16 = 8,192."""
    assert trtllm_bench_settings(model_spec("llama3-8b"), H100, 1, 128, 128) == (4096, 8192)


def test_residual_add_is_fused_into_the_rmsnorm_as_engines_run_it():
    """vLLM's and SGLang's RMSNorm with a residual is one kernel (`fused_add_rms_norm`): it reads
    the hidden state and the residual and writes both, 4 x 2 bytes x T x h; with T = 3 and h = 64,
    1,536 bytes, two per layer and no separate residual add. GPT keeps its LayerNorm (2 x 2 x T x h
    = 768 bytes) and residual adds (3 x 2 x T x h = 1,152 bytes)."""
    b = Batch(decode=3, decode_ctx=30.0, sampled=3)

    def names(model):
        return [o for count, items in GenerationDims(model).step_items(b) for it in items if not isinstance(it, Comm)
                for o in it if count]
    ops = {o.name: o for o in names(TINY)}
    assert ops["add_rmsnorm1"].bytes == ops["add_rmsnorm2"].bytes == 1536
    assert not any(n.startswith(("residual_add", "rmsnorm")) for n in ops)
    gpt = {o.name: o for o in names(replace(TINY, architecture="gpt"))}
    assert gpt["layernorm1"].bytes == 768 and gpt["residual_add1"].bytes == gpt["residual_add2"].bytes == 1152
