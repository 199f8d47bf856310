"""Context parallelism: ring overlap and KV volumes against their closed forms, the perfect split
when communication is free, and the plan rules."""
import pytest
import yaml
from conftest import FlopCost, node_topology

from simtrain.errors import ConfigError
from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario

h, heads, s = 256, 8, 1024
d = h // heads




def cp_scenario(tmp_path, topo, cp=4, kind="ring", name="cp.yaml", gbs=1, **par):
    doc = {"name": "cp",
           "model": {"architecture": "llama", "num_layers": 2, "hidden_size": h, "num_attention_heads": heads,
                     "num_key_value_heads": heads, "ffn_hidden_size": 512, "vocab_size": 1024, "seq_length": s},
           "training": {"micro_batch_size": 1, "global_batch_size": gbs, "precision": "bf16"},
           "parallel": {"tp": 1, "pp": 1, "dp": 1, "cp": cp, "cp_kind": kind, **par},
           "cluster": {"device": "h100-sxm5-80gb", "topology": str(topo), "nodes": 1, "variability": "none"}}
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc))
    return p


def one_node(tmp_path, n):
    return node_topology(tmp_path, n)


def kv_local(cp):
    return 2 * (s / cp) * 2 * h          # K and V (MHA: h wide each), 16-bit, of s/cp tokens


@pytest.mark.parametrize("P", [1e15, 1e12])
def test_ring_rounds_follow_the_closed_form(tmp_path, P):
    """Rounds of c seconds, transfers of x = 2 us + KV/(100 GB/s): the forward ring takes
    c + (cp - 1)·max(c, x) from its first round's start to its last round's end (Ring docstring).
    P = 1e15: x > c (communication-bound); P = 1e12: c > x (compute hides the ring)."""
    cp = 4
    sc, topo = load_scenario(cp_scenario(tmp_path, one_node(tmp_path, 4), cp))
    run = simulate(sc, topo, FlopCost(P), fuse=False)      # every op on its own, to read the rounds
    ops = [o for o in run.ops if o.cls == 0 and o.category == "F" and ":ring" in o.label]
    first = ops[:cp]                                  # layer 0's rounds
    c = 2 * (s / cp) ** 2 * heads * (2 * d) / 2 / P   # half of one block pair's 2·sq·sk·heads·(dqk + dv)
    x = 2e-6 + kv_local(cp) / 100e9
    span = run.timeline.end[first[-1].id] - run.timeline.start[first[0].id]
    assert span == pytest.approx(c + (cp - 1) * max(c, x), rel=1e-9)
    cp_ops = [o for o in run.ops if o.cls == 0 and o.stream == "cp" and o.category == "cp"]
    assert all(o.duration == pytest.approx(x, rel=1e-12) for o in cp_ops if o.bytes == kv_local(cp))


@pytest.mark.parametrize("kind,fwd,bwd", [
    ("ring", 3 * kv_local(4), 3 * 2 * kv_local(4)),            # cp - 1 hops; backward passes K, V and dK, dV
    ("allgather", 3 * kv_local(4), 3 * kv_local(4)),           # (cp-1)/cp of the gathered cp·KV; dKV reduce-scattered
    # q + k + v out, o back: (cp-1)/cp of 3·(s/cp)·h·2 and (s/cp)·h·2 bytes
    ("ulysses", 3 / 4 * (2 * (s / 4) * h * 2 + 2 * (s / 4) * h) + 3 / 4 * 2 * (s / 4) * h, None),
])
def test_kv_volumes_per_layer(tmp_path, kind, fwd, bwd):
    sc, topo = load_scenario(cp_scenario(tmp_path, one_node(tmp_path, 4), 4, kind))
    r = simulate(sc, topo).result.context_parallel
    assert r.bytes_sent_per_layer_forward == pytest.approx(fwd)
    assert r.bytes_sent_per_layer_backward == pytest.approx(bwd if bwd is not None else fwd)


@pytest.mark.parametrize("kind", ["ring", "allgather", "ulysses"])
def test_free_communication_gives_a_perfect_split(tmp_path, fast_topology, kind):
    """With free communication and FLOP-only costs every per-rank cost divides by cp (tokens,
    GEMMs, and, with causal balance, attention). Global batch 4 on 4 ranks: dp 4 runs one whole
    sequence per rank, cp 2 x dp 2 two half-sequences per rank: the same work, the same step
    time and the same model FLOPs (the cp = 1 path is the foundation's)."""
    sc1, t1 = load_scenario(cp_scenario(tmp_path, fast_topology, 1, name="a.yaml", gbs=4, dp=4))
    sc2, t2 = load_scenario(cp_scenario(tmp_path, fast_topology, 2, kind, name="b.yaml", gbs=4, dp=2))
    r1 = simulate(sc1, t1, FlopCost()).result
    r2 = simulate(sc2, t2, FlopCost()).result
    # the free fabric still moves 1e18 B/s: the exposed gathers / all-to-alls add ~1e-12 s
    assert r2.step_time_s == pytest.approx(r1.step_time_s, abs=1e-10)
    assert r2.model_flops_per_step == pytest.approx(r1.model_flops_per_step, rel=1e-12)


def test_cp_divides_activation_memory(tmp_path, fast_topology):
    """One microbatch in flight (pp 1): a quarter of the sequence per rank stores a quarter."""
    sc1, t1 = load_scenario(cp_scenario(tmp_path, fast_topology, 1, name="a.yaml", gbs=4, dp=4))
    sc4, t4 = load_scenario(cp_scenario(tmp_path, fast_topology, 4, name="b.yaml", gbs=4))
    a1 = simulate(sc1, t1).result.memory[0].activations
    a4 = simulate(sc4, t4).result.memory[0].activations
    assert a4 == pytest.approx(a1 / 4, rel=1e-12)


def test_cp_plan_rules(tmp_path, fast_topology):
    with pytest.raises(ConfigError, match="model.seq_length: 1024 is not divisible by 2 x cp = 2048"):
        load_scenario(cp_scenario(tmp_path, node_topology(tmp_path, 1024, latency="1 us", ideal=False), 1024))
    with pytest.raises(ConfigError, match="Ulysses splits the 8 heads"):
        load_scenario(cp_scenario(tmp_path, node_topology(tmp_path, 16, latency="1 us", ideal=False), 16, "ulysses"))
