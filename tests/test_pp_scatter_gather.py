"""Pipeline messages split over the tensor-parallel group (`parallel.pp_scatter_gather`).

Without sequence parallelism every tp rank holds the whole boundary activation. Megatron-LM
(p2p_communication.py, `scatter_gather_tensors_in_pipeline`, on by default) and DeepSpeed's
PipelineEngine (`is_pipe_partitioned` / `is_grad_partitioned` when the model-parallel size is
above 1) send 1/tp of it from each rank and all-gather the slices over tp on the receiving stage.
Expected values are derived by hand below."""
import pytest
import yaml
from conftest import FlopCost, node_topology

from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario

H, S = 256, 128


def scenario(tmp_path, topo, **par):
    parallel = {"tp": 2, "pp": 2, "dp": 1, "schedule": "1f1b"}
    parallel.update(par)
    doc = {"name": "sg",
           "model": {"architecture": "gpt", "num_layers": 4, "hidden_size": H, "num_attention_heads": 8,
                     "vocab_size": 1024, "seq_length": S},
           "training": {"micro_batch_size": 1, "global_batch_size": 1, "precision": "bf16"},
           "parallel": parallel,
           "cluster": {"device": "a100-sxm4-80gb", "topology": str(topo), "nodes": 2},
           # the derivations below price the gather as a ring at full link bandwidth: pin NCCL to
           # Ring/Simple, as a user pins NCCL_ALGO/NCCL_PROTO (NCCL's own pick at these 64 KiB sizes is a low-latency protocol)
           "network": {"nccl_algo": "Ring", "nccl_proto": "Simple"}}
    p = tmp_path / f"sg-{len(list(tmp_path.iterdir()))}.yaml"
    p.write_text(yaml.safe_dump(doc))
    return load_scenario(p)


@pytest.fixture
def two_nodes(tmp_path):
    # 2 nodes of 2 devices, no protocol latencies: tp inside a node, the pipeline across nodes
    return node_topology(tmp_path, 2)


def _messages(run):
    sends = sorted({o.bytes for o in run.ops if o.category == "pp" and o.kind == "send"})
    gathers = sorted({o.bytes for o in run.ops if o.label.startswith("all_gather:pp_gather")})
    return sends, gathers


def test_split_messages_and_the_receivers_gather(tmp_path, two_nodes):
    """A boundary activation is 2·S·H bytes (bf16, micro batch 1). Split: each tp rank sends half
    and the receiver all-gathers the whole; off: the whole is sent and nothing gathered; with
    sequence parallelism the activation is already split and nothing is gathered."""
    n = 2 * S * H
    sc, t = scenario(tmp_path, two_nodes)
    assert _messages(simulate(sc, t, FlopCost())) == ([n / 2], [n])
    sc, t = scenario(tmp_path, two_nodes, pp_scatter_gather=False)
    assert _messages(simulate(sc, t, FlopCost())) == ([n], [])
    sc, t = scenario(tmp_path, two_nodes, sequence_parallel=True)
    assert _messages(simulate(sc, t, FlopCost())) == ([n / 2], [])


def test_split_messages_change_the_step_by_hand(tmp_path, two_nodes):
    """One microbatch through two stages: the activation and its gradient each cross the node
    boundary once on the critical path. Splitting saves (n - n/2)/B_net per crossing and adds the
    receiver's 2-rank ring all-gather, (2-1)/2 · n / B_up, so the step changes by
    2 · (n/(2·B_up) - n/(2·B_net)) = n/B_up - n/B_net."""
    n = 2 * S * H
    sc, t = scenario(tmp_path, two_nodes)
    on = simulate(sc, t, FlopCost()).result.step_time_s
    sc, t = scenario(tmp_path, two_nodes, pp_scatter_gather=False)
    off = simulate(sc, t, FlopCost()).result.step_time_s
    up, net = t._link_by_class("scale_up"), t._link_by_class("leaf")
    b_up, b_net = up.bw * up.efficiency, net.bw * net.efficiency
    assert on - off == pytest.approx(n / b_up - n / b_net, rel=1e-9)
    assert on < off


def test_the_gather_counts_as_pipeline_communication(tmp_path, two_nodes):
    """The receiver's all-gather runs on the tp stream but exists because of the pipeline: the
    breakdown files it under pp, so the exposed tp time (the layers' own all-reduces) is the same
    as without the split."""
    sc, t = scenario(tmp_path, two_nodes)
    run = simulate(sc, t, FlopCost())
    gathers = [o for o in run.ops if o.label.startswith("all_gather:pp_gather")]
    assert gathers and all(o.category == "pp" and o.stream == "tp" for o in gathers)
    sc, t = scenario(tmp_path, two_nodes, pp_scatter_gather=False)
    off = simulate(sc, t, FlopCost()).result.breakdown.exposed_comm_s
    on = run.result.breakdown.exposed_comm_s
    assert on["tp"] == pytest.approx(off["tp"], rel=1e-9)
