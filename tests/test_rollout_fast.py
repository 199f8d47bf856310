"""The rollout engine's fast paths against its reference paths.

Three layers, each checked against the slower one it replaces:
  * `IterationCost.decode_seconds` (a decode-only batch priced from scalars) against
    `seconds_from_ops` (the batch's operators): the same arithmetic in the same order, so equal
    to the last bit;
  * the decode stretch (`_Replica._stretch`, finish to finish from arrays sorted by remaining
    tokens) against the bulk advance it stands in for: the same records, bit for bit;
  * the bulk advance (k iterations at once, time k·(t_1 + t_k)/2) against one scheduler
    iteration at a time (`bulk=False`): the trapezoid is exact for a step time linear in the KV
    read, which the roofline's memory-bound decode attention is, so finish and first-token
    times agree to rounding (rtol 1e-9); step, preemption and block counts are equal.
"""
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from simtrain.cost.roofline import host_queue
from simtrain.hardware.devices import get_device
from simtrain.hardware.topology import load_topology
from simtrain.network.collectives import choose
from simtrain.plan.grid import group_shape
from simtrain.rollout.cost import IterationCost, grouped_host_queue
from simtrain.rollout.engine import EngineConfig, Request, simulate_generation
from simtrain.spec.scenario import ModelSpec
from simtrain.studies.validate_serving import model_spec
from simtrain.workload.generation import Batch, GenerationDims
from simtrain.workload.ir import Comm

ROOT = Path(__file__).resolve().parent.parent
H20 = get_device("h20-96gb")
TINY = ModelSpec(name="tiny", architecture="llama", num_layers=2, hidden_size=64, num_attention_heads=4,
                 num_key_value_heads=2, ffn_hidden_size=128, vocab_size=256, seq_length=64)


def h20_topology(nodes: int):
    return load_topology(ROOT / "topologies" / "hgx-h20.yaml", nodes=nodes)


@pytest.mark.parametrize("name, tp, nodes", [("llama3-8b", 1, 0), ("qwen2.5-7b", 2, 1), ("qwen2.5-7b", 8, 1),
                                             ("deepseek-v3", 32, 4), ("mixtral-8x7b", 4, 1)])
@pytest.mark.parametrize("engine", [EngineConfig(), EngineConfig(overlap_cpu=True), EngineConfig(cuda_graphs=False),
                                    EngineConfig(cuda_graph_max_batch=64, launch_overhead_s=0.0)])
def test_decode_seconds_is_the_operator_path(name, tp, nodes, engine):
    """Dense (llama3-8b), GQA with a KV head replicated (qwen2.5-7b at tp 8: 4 KV heads), MLA and
    MoE (deepseek-v3 at tp 32), MoE with tp collectives (mixtral); batches below and above the
    CUDA-graph limit, sampled rows fewer than decode rows: the scalar price equals the operator
    price exactly (both are the same floating-point expressions)."""
    m = model_spec(name)
    e = replace(engine, tp=tp)
    cost = IterationCost(GenerationDims(m, tp), H20, h20_topology(nodes) if nodes else None, e)
    ref = IterationCost(GenerationDims(m, tp), H20, h20_topology(nodes) if nodes else None, e)
    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 64, 65, 255, 256, 513):
        for _ in range(3):
            ctx = float(n * int(rng.integers(1, 20000)))
            for sampled in (n, max(n - 1, 0)):
                b = Batch(n, ctx, (), sampled)
                assert cost.seconds(b) == ref.seconds_from_ops(b)
                assert cost.decode_seconds(n, ctx, sampled) == ref.seconds_from_ops(b)


def test_grouped_host_queue_by_hand_and_against_the_expanded_list():
    """c = 10 us; one group (2 x [50, 5]) then [5]: expanded 50, 5, 50, 5, 5; host_queue =
    max(10 + 115, 20 + 65, 30 + 60, 40 + 10, 50 + 5) = 125 us. Random groups agree with
    `host_queue` of the expanded list to rounding."""
    groups = [(2, [50e-6, 5e-6]), (1, [5e-6])]
    assert grouped_host_queue(groups, 10e-6) == pytest.approx(125e-6, rel=1e-12)
    assert host_queue([50e-6, 5e-6, 50e-6, 5e-6, 5e-6], 10e-6) == pytest.approx(125e-6, rel=1e-12)
    rng = np.random.default_rng(0)
    for _ in range(200):
        groups = [(int(rng.integers(1, 70)), list(rng.exponential(rng.choice([1e-6, 1e-5, 1e-4]), int(rng.integers(1, 20)))))
                  for _ in range(int(rng.integers(1, 4)))]
        c = float(rng.choice([0.0, 1e-6, 5e-6, 2e-5]))
        flat = [t for count, seq in groups for t in seq * count]
        assert grouped_host_queue(groups, c) == pytest.approx(host_queue(flat, c), rel=1e-12)


@pytest.mark.parametrize("name, tp, nodes", [("llama3-8b", 1, 0), ("deepseek-v3", 32, 4), ("mixtral-8x7b", 4, 1)])
def test_eager_iterations_queue_like_the_expanded_kernel_list(name, tp, nodes):
    """Eager iterations (graphs off, or above the graph limit: prefill chunks) priced per layer
    kind equal `host_queue` over every kernel in issue order, to rounding."""
    m = model_spec(name)
    for e in (EngineConfig(tp=tp, cuda_graphs=False), EngineConfig(tp=tp, launch_overhead_s=2e-5)):
        cost = IterationCost(GenerationDims(m, tp), H20, h20_topology(nodes) if nodes else None, e)
        for b in (Batch(200, 200 * 900.0, ((0, 7992),), 200), Batch(0, 0.0, ((0, 2048), (2048, 2048), (0, 4096)), 2),
                  Batch(3, 3000.0, (), 3), Batch(600, 600 * 1500.0, (), 600)):
            want = host_queue(cost.kernels(b), e.launch_overhead_s)
            if e.cuda_graphs and b.tokens <= e.cuda_graph_max_batch:
                continue
            assert cost.gpu_seconds(b) == pytest.approx(want, rel=1e-12)


def test_collective_times_kept_across_engines_are_each_topologys_own():
    """Collective times are kept across IterationCost instances by (collective, bytes, group
    shape, topology): two topologies with different links keep different times, each equal to
    `choose` on its own topology."""
    m = model_spec("qwen2.5-7b")
    topos = [h20_topology(1), load_topology(ROOT / "topologies" / "dgx-a100.yaml", nodes=1)]
    for size in (4096.0, 2.0 ** 20, 3.0 * 2 ** 24):
        c = Comm("tp", "all_reduce", size, "x")
        got = []
        for topo in topos + topos:
            cost = IterationCost(GenerationDims(m, 2), H20, topo, EngineConfig(tp=2))
            got.append(cost.comm_time(c))
            assert got[-1] == choose("all_reduce", size, group_shape([0, 1], topo), topo).seconds
        assert got[0] != got[1] and got[:2] == got[2:]


def long_tail(n: int, seed: int, arrivals: bool = False) -> list:
    """Prompts 16..1023 tokens, lognormal responses (median e^6.5 = 665) clipped at 4096."""
    rng = np.random.default_rng(seed)
    out = np.minimum(4096, rng.lognormal(6.5, 0.8, n).astype(int) + 1)
    prompts = rng.integers(16, 1024, n)
    arr = np.sort(rng.uniform(0.0, 20.0, n)) if arrivals else np.zeros(n)
    return [Request(int(p), int(o), float(t)) for p, o, t in zip(prompts, out, arr)]


def with_blocks(m: ModelSpec, e: EngineConfig, blocks: int | None):
    """H20 with memory for exactly `blocks` KV blocks (None: the real 96 GB)."""
    if blocks is None:
        return H20
    d = GenerationDims(m, e.tp)
    used = d.weight_bytes() + d.workspace_bytes(e.max_num_batched_tokens, e.max_num_seqs) + e.reserved_bytes
    return replace(H20, memory_bytes=(used + (blocks + 0.5) * e.block_size * d.kv_bytes_per_token()) / e.gpu_memory_utilization)


CASES = {
    # name: (engine, KV blocks, arrivals, requests)
    "all fit, no waiting": (EngineConfig(), None, False, 120),
    "max_num_seqs binds": (EngineConfig(max_num_seqs=48), None, False, 120),
    "cache binds: preemption": (EngineConfig(max_num_seqs=64), 3000, False, 120),
    "small budget: chunked prefill and preemption": (EngineConfig(max_num_batched_tokens=512, max_num_seqs=128), 5000, False, 120),
    "no chunked prefill": (EngineConfig(chunked_prefill=False, max_num_seqs=32), None, False, 80),
    "arrivals over 20 s": (EngineConfig(max_num_seqs=64), None, True, 120),
    "two replicas, overlapped CPU": (EngineConfig(dp=2, overlap_cpu=True), 4000, False, 120),
}


def results(case: str, seed: int, **kw):
    e, blocks, arrivals, n = CASES[case]
    m = model_spec("llama3-8b")
    return simulate_generation(m, with_blocks(m, e, blocks), None, e, long_tail(n, seed, arrivals), **kw)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("seed", [1, 2])
def test_fast_path_matches_one_iteration_at_a_time(case, seed):
    fast = results(case, seed)
    ref = results(case, seed, bulk=False)
    assert fast.num_steps == ref.num_steps
    assert fast.preemptions == ref.preemptions
    assert fast.kv_blocks_peak == ref.kv_blocks_peak
    assert len(fast.iterations) < len(ref.iterations)
    np.testing.assert_allclose(fast.finish_s, ref.finish_s, rtol=1e-9)
    np.testing.assert_allclose(fast.first_token_s, ref.first_token_s, rtol=1e-9)
    assert fast.makespan_s == pytest.approx(ref.makespan_s, rel=1e-9)
    assert sum(it.steps for it in fast.iterations) == fast.num_steps
    if case == "cache binds: preemption":
        assert fast.preemptions > 0


@pytest.mark.parametrize("case", sorted(CASES))
def test_stretch_records_what_the_bulk_advance_records(case):
    """The stretch is a faster way to take the bulk advance's decisions: identical records,
    finish and first-token times and notes, bit for bit."""
    a = results(case, 5)
    b = results(case, 5, stretch=False)
    assert a.iterations == b.iterations
    assert np.array_equal(a.finish_s, b.finish_s) and np.array_equal(a.first_token_s, b.first_token_s)
    assert (a.num_steps, a.preemptions, a.kv_blocks_peak, a.notes) == (b.num_steps, b.preemptions, b.kv_blocks_peak, b.notes)


def test_mla_moe_engine_matches_reference():
    """DeepSeek-V3 (MLA, MoE) at tp 32 on 4 H20 nodes, a cache of 600 blocks: preemptions. Here
    the decode step is not linear in the KV read: MLA decode attention (8,704 FLOPs per 1,152 B
    of KV per layer and rank) sits near the point where max(memory time, FLOPs / (peak x
    FlashAttention efficiency at the mean context)) switches terms, and that efficiency varies
    with the mean context. The trapezoid then differs from the step-by-step sum by 7e-6 of the
    finish times (measured); the bound checked is 1e-4. The schedule itself (steps, preemptions)
    is the same."""
    m = model_spec("deepseek-v3")
    e = EngineConfig(tp=32, max_num_seqs=64)
    dev = with_blocks(m, e, 600)
    reqs = [Request(r.prompt_tokens, min(r.output_tokens, 600)) for r in long_tail(48, 7)]
    fast = simulate_generation(m, dev, h20_topology(4), e, reqs)
    ref = simulate_generation(m, dev, h20_topology(4), e, reqs, bulk=False)
    assert fast.preemptions > 0 and fast.preemptions == ref.preemptions
    assert fast.num_steps == ref.num_steps and fast.kv_blocks_peak == ref.kv_blocks_peak
    np.testing.assert_allclose(fast.finish_s, ref.finish_s, rtol=1e-4)
    np.testing.assert_allclose(fast.first_token_s, ref.first_token_s, rtol=1e-4)


class ZeroCosts:
    """Every kernel takes no time: iteration times are the engine's CPU term (1 s here)."""
    coverage: set = set()

    def duration(self, op) -> float:
        return 0.0

    def device_time(self, op) -> float:
        return 0.0

    def memory_time(self, nbytes: float) -> float:
        return 0.0


@pytest.mark.parametrize("kw", [{}, {"stretch": False}, {"bulk": False}])
def test_a_one_token_last_chunk_samples_the_first_token(kw):
    """Budget 64, prompt 65, response 5, 1 s per iteration: iteration 1 computes 64 prompt
    tokens, iteration 2 the last one and samples the first response token (at 2 s), iterations
    3..6 the other four: finish at 6 s, 6 steps. The second iteration looks like a decode step
    (one new token after cached ones), so the bulk advance must still record the first token."""
    e = EngineConfig(cpu_overhead_s=1.0, launch_overhead_s=0.0, reserved_bytes=0, max_num_batched_tokens=64, max_num_seqs=8)
    r = simulate_generation(TINY, H20, None, e, [Request(65, 5)], costs=ZeroCosts(), **kw)
    assert list(r.first_token_s) == pytest.approx([2.0], abs=1e-6)
    assert list(r.finish_s) == pytest.approx([6.0], abs=1e-6)
    assert r.num_steps == 6
