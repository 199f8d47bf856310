"""The backward of a column-parallel linear under sequence parallelism (QKV, fc1), as Megatron's
linear layers and Transformer Engine's LayerNormLinear run it.

The forward keeps the linear's input sequence-sharded (T/tp rows) and all-gathers it into the
GEMM; the backward gathers it again for the weight gradient, asynchronously beside the
input-gradient GEMM, then reduce-scatters the input gradient asynchronously beside the
weight-gradient GEMM. Both are `Ring`s in bulk mode. NCCL's collectives share the SMs with the
GEMM, which the device profile's measured compute-under-communication slowdown s prices: a GEMM
of W seconds beside a collective of x seconds takes max(x, W + s·x) (derived in `Ring.time`).
Expected values: hand counts of Megatron's tensor-parallel communication (Korthikanti et al.,
"Reducing Activation Recomputation in Large Transformer Models", 2022, section 4.2.2: with
sequence parallelism each layer's forward has two all-gathers and two reduce-scatters) and the
closed form above, with GEMMs at a fixed FLOP rate (conftest.FlopCost)."""
from pathlib import Path

import pytest
import yaml
from conftest import FlopCost, node_topology

from simtrain.hardware.devices import device_of, slowdown
from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario
from simtrain.workload.build import build_workload
from simtrain.workload.ir import Comm, Op, Ring

H, S, TP = 256, 128, 4
PROFILE = Path(__file__).resolve().parent.parent / "simtrain/data/profiles/a100-megatron-deepspeed.yaml"


def scenario(tmp_path, **extra):
    doc = {"name": "sp",
           "model": {"architecture": "gpt", "num_layers": 2, "hidden_size": H, "num_attention_heads": 8,
                     "vocab_size": 1024, "seq_length": S},
           "training": {"micro_batch_size": 1, "global_batch_size": 1, "precision": "bf16"},
           "parallel": {"tp": TP, "pp": 1, "dp": 1, "sequence_parallel": True},
           "cluster": {"device": "a100-sxm4-80gb", "topology": str(node_topology(tmp_path, TP)), "nodes": 1},
           "network": {"nccl_algo": "Ring", "nccl_proto": "Simple"}}
    for path, value in extra.items():
        section, key = path.split(".")
        doc[section][key] = value
    p = tmp_path / f"sp-{len(list(tmp_path.glob('sp-*.yaml')))}.yaml"
    p.write_text(yaml.safe_dump(doc))
    return load_scenario(p)


def tp_comms(items):
    out = []
    for it in items:
        if isinstance(it, Ring):
            out.append((it.comm.collective, it.comm.name, it.comm.size_bytes, it.mode, tuple(o.name for o in it.segment)))
        elif isinstance(it, Comm) and it.kind == "tp":
            out.append((it.collective, it.name, it.size_bytes, "", ()))
    return out


def test_bulk_closed_form_with_a_slowdown():
    """W = 10, x = 4, s = 0.2: by x the GEMM has done 0.8·4 = 3.2 of its 10, the other 6.8 run at
    full rate: 10.8 = W + s·x. W = 2: at rate 0.8 it needs 2.5 < 4, so the collective sets the
    time, 4. s = 0 gives the plain max(W, x)."""
    seg = (Op("g", "gemm", "B", 1.0, 1.0),)
    r = Ring(1, seg, Comm("tp", "all_gather", 1.0), "bulk")
    assert r.time(10.0, 4.0, 0.2) == pytest.approx(10.8)
    assert r.time(2.0, 4.0, 0.2) == 4.0
    assert r.time(10.0, 4.0) == 10.0
    # the SM share still divides the compute: W = 3 / 0.5 = 6, 6 + 0.5·5 = 8.5
    assert Ring(1, seg, Comm("tp", "all_gather", 1.0), "bulk", 0.5).time(3.0, 5.0, 0.5) == pytest.approx(8.5)


def test_layer_backward_regathers_and_overlaps(tmp_path):
    """Per layer (msg = 2 bytes·S·H): the forward moves 2 all-gathers and 2 reduce-scatters of msg;
    the backward all-gathers the output gradients of the two row-parallel linears (attn_out, fc2)
    as plain collectives, and for each column-parallel linear re-gathers its input beside its
    dgrad and reduce-scatters that dgrad beside its wgrad: 6 collectives of msg, 4 of them
    overlapped."""
    sc, _ = scenario(tmp_path)
    lp = build_workload(sc, 1)[0].layers[0]
    msg = 2 * S * H
    fwd = tp_comms(lp.forward)
    assert sorted(c[0] for c in fwd) == ["all_gather"] * 2 + ["reduce_scatter"] * 2
    bwd = tp_comms(lp.backward)
    assert bwd == [
        ("all_gather", "tp_all_gather3", msg, "", ()),
        ("all_gather", "tp_regather2", msg, "bulk", ("fc1.dgrad",)),
        ("reduce_scatter", "tp_reduce_scatter2", msg, "bulk", ("fc1.wgrad",)),
        ("all_gather", "tp_all_gather1", msg, "", ()),
        ("all_gather", "tp_regather0", msg, "bulk", ("qkv.dgrad",)),
        ("reduce_scatter", "tp_reduce_scatter0", msg, "bulk", ("qkv.wgrad",)),
    ]
    # without sequence parallelism nothing is gathered: one all-reduce per column-parallel linear
    off, _ = scenario(tmp_path, **{"parallel.sequence_parallel": False})
    lp_off = build_workload(off, 1)[0].layers[0]
    assert [c[0] for c in tp_comms(lp_off.backward)] == ["all_reduce", "all_reduce"]


def test_deferred_wgrad_leaves_the_reduce_scatter_alone_in_b(tmp_path):
    """A schedule that defers W keeps the re-gather beside the dgrad (both are B) and leaves the
    reduce-scatter in B as a plain collective; the wgrad GEMMs go to W."""
    sc, _ = scenario(tmp_path)
    lp = build_workload(sc, 1)[0].layers[0]
    b = tp_comms(lp.backward_input)
    assert ("reduce_scatter", "tp_reduce_scatter2", 2 * S * H, "", ()) in b
    assert ("all_gather", "tp_regather2", 2 * S * H, "bulk", ("fc1.dgrad",)) in b
    assert {"qkv.wgrad", "fc1.wgrad"} <= {o.name for seg in lp.backward_weight for o in seg}


def test_fp8_regathers_the_fp8_copy(tmp_path):
    """Under FP8 (delayed scaling) TE keeps the norm's FP8 output and gathers that again: one byte
    per element, half the 16-bit message, like the forward's gather."""
    sc, _ = scenario(tmp_path, **{"training.precision": "fp8", "training.fp8_recipe": "delayed", "cluster.device": "h100-sxm5-80gb"})
    lp = build_workload(sc, 1)[0].layers[0]
    sizes = {c[1]: c[2] for c in tp_comms(lp.backward) + tp_comms(lp.forward)}
    assert sizes["tp_regather0"] == sizes["tp_regather2"] == S * H
    assert sizes["tp_all_gather0"] == S * H
    assert sizes["tp_reduce_scatter0"] == 2 * S * H        # the input gradient stays 16-bit


def test_the_engine_realises_the_closed_form(tmp_path):
    """Unfolded (fuse=False), the collective and its GEMM are separate ops and the engine slows the
    GEMM by the shipped A100 profile's s while the collective runs; folded (the default), each bulk Ring
    is one op of max(x, W + s·x). Both give the same step; and the re-gather's GEMM ends at
    W + s·x or at the collective's end, whichever is later."""
    sc, topo = scenario(tmp_path, **{"cluster.device_profile": str(PROFILE)})
    cost = FlopCost()
    run = simulate(sc, topo, cost, fuse=False)
    folded = simulate(sc, topo, cost)
    assert folded.result.step_time_s == pytest.approx(run.result.step_time_s, rel=1e-12)
    assert len(folded.ops) < len(run.ops)
    tl = run.timeline
    s = slowdown(device_of(sc.cluster).slowdown_table(), "gemm", "all_gather")
    assert s == 0.433          # the profile's measured GEMM-under-AllGather slowdown
    cls = run.ops[0].cls
    x = next(o for o in run.ops if o.cls == cls and o.label == "all_gather:tp_regather2")
    piece = next(o for o in run.ops if o.cls == cls and o.stream == "compute" and "bulk0:fc1.dgrad" in o.label
                 and tl.start[o.id] == pytest.approx(tl.start[x.id]))
    w, d = piece.duration, tl.end[x.id] - tl.start[x.id]
    assert tl.end[piece.id] - tl.start[piece.id] == pytest.approx(w / (1 - s) if w <= (1 - s) * d else w + s * d)

