"""Gradients in bf16 (training.grad_reduce_in_bf16, Megatron-LM --grad-reduce-in-bf16): the buffer
the backward accumulates into, and its data-parallel reduction, at 2 bytes per parameter instead
of fp32's 4 (Megatron's distributed-optimizer table: 2 + 4 + 12 for bf16 with fp32 gradients)."""
import pytest
from conftest import small_scenario

from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario
from simtrain.workload.build import build_workload


def _run(tmp_path, topo, bf16_grads, **par):
    path = small_scenario(tmp_path, topo, parallel={"pp": 1, "dp": 4, **par},
                          training={"grad_reduce_in_bf16": bf16_grads})
    sc, t = load_scenario(path)
    run = simulate(sc, t)
    return sc, run


@pytest.mark.parametrize("zero,collective", [(0, "all_reduce"), (1, "reduce_scatter")])
def test_bf16_gradients_halve_the_buffer_and_the_reduction(tmp_path, plain_topology, zero, collective):
    """dp 4, one stage: the gradients take 4 B per parameter (ZeRO-0 and 1 keep them whole), 2 B
    with grad_reduce_in_bf16; the reduction's buckets together move the same 4 or 2 B per parameter."""
    sc, fp32 = _run(tmp_path, plain_topology, False, zero_stage=zero)
    _, bf16 = _run(tmp_path, plain_topology, True, zero_stage=zero)
    params = sum(w.params for w in build_workload(sc))
    assert fp32.result.memory[0].gradients == pytest.approx(4 * params)
    assert bf16.result.memory[0].gradients == pytest.approx(2 * params)
    assert bf16.result.memory[0].weights == fp32.result.memory[0].weights
    assert bf16.result.memory[0].optimizer == fp32.result.memory[0].optimizer

    def reduced(run):
        return sum(o.bytes for o in run.ops if o.label.startswith(f"{collective}:grad_bucket") and o.cls == run.ops[0].cls)
    assert reduced(fp32) == pytest.approx(4 * params)
    assert reduced(bf16) == pytest.approx(2 * params)


def test_bf16_gradients_in_fp16_training_warn(tmp_path, plain_topology):
    path = small_scenario(tmp_path, plain_topology, training={"precision": "fp16", "grad_reduce_in_bf16": True})
    with pytest.warns(UserWarning, match="grad_reduce_in_bf16 has no effect in fp16 training"):
        load_scenario(path)
