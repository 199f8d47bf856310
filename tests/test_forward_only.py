"""training.forward_only: one forward pass over the batch (the old_log_prob, reference and value
passes of RL), simulated with the training step's schedules, parallelism and memory rules.

Each test compares a forward-only run with the training run of the same scenario or with a
closed form; the derivation is in its docstring."""
import json

import pytest
from conftest import FlopCost, small_scenario, write

from simtrain.cli.run import summary
from simtrain.errors import ConfigError
from simtrain.hardware.devices import device_of
from simtrain.results.trace import chrome_trace
from simtrain.schedules import forward_pass, schedule_for
from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario
from simtrain.workload.build import build_workload

EDGE = {"embedding", "final_norm", "lm_head", "cross_entropy"}


def _load(tmp_path, topo, forward_only, parallel=None, training=None, name="s"):
    d = tmp_path / f"{name}-{int(forward_only)}"
    d.mkdir(exist_ok=True)
    tr = {"forward_only": forward_only, **(training or {})}
    return load_scenario(small_scenario(d, topo, parallel=parallel or {}, training=tr))


def _forward_compute_s(run):
    """Seconds of the forward compute of a run: every compute op of category F (a fused op's
    parts are all forward segments or collectives folded into it; on one device there are none)."""
    return sum(op.duration for op in run.ops if op.stream == "compute" and op.category == "F")


@pytest.fixture
def one_device(tmp_path):
    """A node of one device (the plain fabric's round numbers)."""
    return write(tmp_path / "one.yaml", """
        name: one
        kind: two_tier
        devices_per_node: 1
        scale_up: {bandwidth: "100 GB/s", latency: "2 us"}
        scale_out: {nics_per_node: 1, nic_bandwidth: "80 Gb/s", latency: "5 us"}
    """)


def test_single_device_forward_only_is_the_sum_of_the_training_forwards(tmp_path, one_device):
    """Hand relation: on one device (tp = pp = dp = 1) nothing overlaps and nothing waits, so a
    forward-only pass takes exactly the forward compute ops of the training step run one after
    the other: step = sum of the training run's F op durations (all 8 microbatches)."""
    par = {"tp": 1, "pp": 1, "dp": 1}
    train = simulate(*_load(tmp_path, one_device, False, par))
    fwd = simulate(*_load(tmp_path, one_device, True, par))
    expect = _forward_compute_s(train)
    assert expect > 0
    assert fwd.result.step_time_s == pytest.approx(expect, rel=1e-9)
    assert train.result.step_time_s > 2 * fwd.result.step_time_s      # the backward is about twice the forward
    assert {op.category for op in fwd.ops} == {"F"}                    # no backward, no optimizer step
    assert fwd.result.bubble_fraction == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_no_data_parallel_collective_and_overlap_grad_reduce_is_irrelevant(tmp_path, plain_topology, zero):
    """dp = 4: a training step reduces gradients over dp (all-reduce, or reduce-scatter under
    ZeRO 1/2, then the parameter all-gather); a forward-only pass has no gradients, so no op runs
    on the dp stream, no gradient-norm all-reduce and no optimizer step, and the time is the
    same whether or not gradient reduction would overlap the backward."""
    times = []
    for overlap in (True, False):
        par = {"tp": 1, "pp": 1, "dp": 4, "zero_stage": zero, "overlap_grad_reduce": overlap,
               "overlap_param_gather": zero > 0}
        tr = {"global_batch_size": 8}
        train = simulate(*_load(tmp_path, plain_topology, False, par, tr, name=f"o{int(overlap)}"))
        assert any(op.stream == "dp" for op in train.ops)
        run = simulate(*_load(tmp_path, plain_topology, True, par, tr, name=f"o{int(overlap)}"))
        assert not [op.label for op in run.ops if op.stream in ("dp", "edp")]
        assert not any(op.label in ("optimizer_step", "all_reduce:grad_norm") for op in run.ops)
        assert not any(c.kind == "dp" for c in run.result.collectives)
        assert run.result.breakdown.exposed_comm_s["dp"] == 0.0
        times.append(run.result.step_time_s)
    assert times[0] == times[1]


def test_fsdp_gathers_parameters_for_the_forward_only(tmp_path, plain_topology):
    """ZeRO-3 (FSDP) shards the weights, so the forward still all-gathers each layer (one layer
    ahead) and the embedding / head per microbatch, as in training; nothing is gathered for a
    backward and nothing is reduce-scattered. 8 microbatches x (8 layers + 1 edge gather)."""
    par = {"tp": 1, "pp": 1, "dp": 4, "zero_stage": 3}
    run = simulate(*_load(tmp_path, plain_topology, True, par, {"global_batch_size": 32}))
    dp = [op.label for op in run.ops if op.stream == "dp"]
    assert dp and all(lab.startswith("all_gather:fsdp_ag_") for lab in dp)
    assert not any("bwd" in lab for lab in dp)
    assert len(dp) == 8 * (8 + 1)


def test_memory_is_weights_and_one_microbatch_working_set(tmp_path, plain_topology):
    """pp = 4, 8 layers (2 per stage), 1F1B, 8 microbatches. Static memory: the 16-bit weights
    alone (no gradients, no optimizer state), the same weights as the training run's. Nothing
    is stored for a backward, so a stage's activation peak is the working set of one
    microbatch's forward: one layer's activations with nothing recomputed (every layer is the
    same: the training run's stored bytes of one layer without recompute), and on the last stage
    also the logits and loss, 4·s·b·V/t bytes (Korthikanti et al. 2022 §4.1: s 128, b 1,
    V 1024, t 1 -> 524,288 B). Both are at most one training microbatch's stored activations."""
    train_sc, topo = _load(tmp_path, plain_topology, False, training={"recompute": "none"})
    fwd_sc, _ = _load(tmp_path, plain_topology, True, training={"recompute": "full"})
    train = simulate(train_sc, topo).result
    fwd = simulate(fwd_sc, topo).result
    work = build_workload(train_sc, 4)
    layer = work[1].act_layers[0]
    for tm, fm in zip(train.memory, fwd.memory):
        assert fm.gradients == 0.0 and fm.optimizer == 0.0
        assert fm.weights == tm.weights > 0
        assert fm.communication_buffers == tm.communication_buffers
        assert fm.inflight_peak == 0                     # nothing is held between actions
        assert fm.activations <= work[fm.stage].act_bytes
        assert fm.total == pytest.approx(fm.weights + fm.communication_buffers + fm.activations, rel=1e-12)
    acts = [m.activations for m in fwd.memory]
    assert acts[1] == acts[2] == pytest.approx(layer, rel=1e-12)
    assert acts[3] - acts[1] == pytest.approx(4 * 128 * 1 * 1024 / 1, rel=1e-12)
    assert fwd.peak_memory_bytes < train.peak_memory_bytes


class UniformForward:
    """Every layer operator of a forward costs uf / n_f (n_f: the layer forward's operators);
    the embedding and head, the backward and the optimizer are free: every stage's forward of a
    microbatch takes uf x its layers."""

    def __init__(self, sc, uf=1e-3):
        lay = build_workload(sc)[0].layer
        self.nf = sum(len(x) for x in lay.forward if isinstance(x, tuple))
        self.uf = uf
        self.coverage = set()

    def duration(self, op):
        if op.name.split("/")[0] in EDGE or op.phase != "F":   # unfused edge ops run as "name/kernel"
            return 0.0
        return self.uf / self.nf

    def memory_time(self, nbytes):
        return 0.0


@pytest.mark.parametrize("m", [4, 8, 13])
def test_pipeline_forward_closed_form(tmp_path, fast_topology, m):
    """pp = 4 equal stages of 2 layers, forward time f = 2 x 1 ms per microbatch and stage,
    communication free. Forwards only: microbatch i leaves the last stage at (i + p) f (it
    waits for stage 0 to finish its first i forwards, then crosses p stages), so the pass ends at
    (m + p - 1) f and each stage idles (p - 1) f: bubble (p - 1) / (m + p - 1)."""
    p, f = 4, 2e-3
    sc, topo = _load(tmp_path, fast_topology, True, {"schedule": "1f1b"}, {"global_batch_size": m})
    r = simulate(sc, topo, costs=UniformForward(sc)).result
    assert r.step_time_s == pytest.approx((m + p - 1) * f, rel=1e-6)
    assert r.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), rel=1e-6)


def test_model_flops_are_the_forward_third(tmp_path, plain_topology):
    """simtrain counts model FLOPs as forward + backward, the backward being the input and the
    weight gradient GEMMs, each as many FLOPs as the forward GEMM (Narayanan et al. SC'21 eq. 3:
    training = 3 x forward). A forward-only pass counts the forward alone: exactly 1/3. Nothing
    is recomputed, so HFU = MFU even when the scenario says recompute: full; both divide by the
    pass's time, devices and peak."""
    tr = {"recompute": "full"}
    train_sc, topo = _load(tmp_path, plain_topology, False, training=tr)
    fwd_sc, _ = _load(tmp_path, plain_topology, True, training=tr)
    train, fwd = simulate(train_sc, topo).result, simulate(fwd_sc, topo).result
    assert fwd.model_flops_per_step == pytest.approx(train.model_flops_per_step / 3, rel=1e-12)
    assert train.hardware_flops_per_step > train.model_flops_per_step
    assert fwd.hardware_flops_per_step == fwd.model_flops_per_step
    peak = device_of(fwd_sc.cluster).peak("bf16")
    assert fwd.mfu == pytest.approx(fwd.model_flops_per_step / (fwd.step_time_s * fwd.num_devices * peak), rel=1e-12)
    assert fwd.hfu == fwd.mfu


@pytest.mark.parametrize("schedule,vpp", [("gpipe", None), ("1f1b", None), ("interleaved_1f1b", 2), ("zb_h1", None),
                                          ("zb_h2", None), ("zb_v", None), ("dualpipe", None), ("dualpipev", None)])
def test_every_schedule_runs_its_forwards(tmp_path, fast_topology, schedule, vpp):
    """Whatever the schedule, a forward-only pass runs one forward of every microbatch on every
    (rank, chunk) of its route and nothing else: no B, W or BW ops, no optimizer, no gradient
    exchange (DualPipe's twin all-reduce included); activations go forward, no gradient is sent;
    simulating every rank on its own gives the same pass as the equivalence classes.
    With FLOP-only costs (1 PFLOP/s, communication free) its compute is the forward third of
    the training step's FLOPs spread over the same ranks, so it is strictly shorter."""
    par = {"schedule": schedule, **({"vpp": vpp} if vpp else {})}
    tr = {"global_batch_size": 8}
    sc, topo = _load(tmp_path, fast_topology, True, par, tr)
    run = simulate(sc, topo, costs=FlopCost())
    assert {op.category for op in run.ops} <= {"F", "pp", "tp"}
    assert not any(op.label.startswith("send_grad") for op in run.ops)
    assert not any(op.stream == "dp" for op in run.ops)
    seen = {(op.cls, op.mb, op.chunk) for op in run.ops if op.category == "F" and op.stream == "compute"}
    stage_of = {c.id: c.stage for c in run.classes}
    sched_pos = {(stage_of[cls], mb, ch) for cls, mb, ch in seen}
    s = forward_pass(schedule_for(sc.parallel, 8))
    assert sched_pos == {(r, a.microbatch, a.chunk) for r, row in enumerate(s.actions) for a in row}
    assert all(a.kind == "F" and not a.overlap_next for row in s.actions for a in row)
    assert sorted((a.microbatch, r2, a.chunk) for r2, row in enumerate(s.actions) for a in row) == sorted(
        (mb, r2, c2) for mb in range(8) for r2, c2 in s.route(mb))
    every = simulate(sc, topo, costs=FlopCost(), every_rank=True).result
    assert every.step_time_s == pytest.approx(run.result.step_time_s, rel=1e-12)     # the classes group ranks correctly
    train = simulate(*_load(tmp_path, fast_topology, False, par, tr), costs=FlopCost()).result
    assert 0 < run.result.step_time_s < train.step_time_s
    assert run.result.schedule == train.schedule == schedule


def test_outputs_say_forward_only(tmp_path, plain_topology):
    """The result JSON carries forward_only: true (a training step leaves the key out, so its
    contract is unchanged), the run summary's header says so, and so does the trace."""
    sc, topo = _load(tmp_path, plain_topology, True)
    run = simulate(sc, topo)
    d = json.loads(json.dumps(run.result.to_dict()))
    assert d["forward_only"] is True
    train_sc, _ = _load(tmp_path, plain_topology, False)
    assert "forward_only" not in simulate(train_sc, topo).result.to_dict()
    head = summary(run.result, 0.0, sc).splitlines()[0]
    assert head.endswith("forward only")
    tr = chrome_trace(run.ops, run.timeline, run.classes, topo, forward_only=True)
    assert tr["otherData"] == {"pass": "forward only"}
    names = [e["args"]["name"] for e in tr["traceEvents"] if e.get("name") == "process_name"]
    assert names and all(n.endswith("forward only") for n in names)


def test_forward_only_key_is_a_bool(tmp_path, plain_topology):
    """training.forward_only is declared a bool: any other value is one clear error."""
    p = small_scenario(tmp_path, plain_topology, training={"forward_only": "yes"})
    with pytest.raises(ConfigError, match="training.forward_only"):
        load_scenario(p)
