"""Pipeline schedules: validity of every registered schedule, and the bubble / memory closed forms
of the schedule papers reproduced by the full simulation with uniform costs and free communication.

Notation: p pipeline ranks, m microbatches, v chunks per rank; T_F, T_B, T_W the time of one
stage's forward, input-gradient and weight-gradient backward for one microbatch.
"""

import pytest
from conftest import small_scenario

from simtrain.errors import ScheduleError
from simtrain.schedules import SCHEDULES, Action, build_schedule, make, timed_execution, validate
from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario
from simtrain.workload.build import build_workload

EDGE = {"embedding", "embedding.bwd", "final_norm", "final_norm.bwd", "lm_head", "lm_head.dgrad",
        "lm_head.wgrad", "cross_entropy", "cross_entropy.bwd"}


class PhaseCosts:
    """Each layer's forward costs uf, its input-gradient part ub, its weight-gradient part uw
    (spread evenly over the layer's operators of that phase); embedding, head and optimizer free."""

    def __init__(self, sc, uf, ub, uw):
        lay = build_workload(sc)[0].layer
        ops = [o for x in lay.forward + lay.backward if isinstance(x, tuple) for o in x]
        self.n = {ph: sum(1 for o in ops if o.phase == ph) for ph in "FBW"}
        self.u = {"F": uf, "B": ub, "W": uw}
        self.coverage = set()

    def duration(self, op):
        if op.name.split("/")[0] in EDGE:   # unfused edge ops run as "name/kernel"
            return 0.0
        return self.u[op.phase] / self.n[op.phase]

    def memory_time(self, nbytes):
        return 0.0


def run(tmp_path, topo, schedule, m, pp=4, layers=8, uf=1e-3, ub=1e-3, uw=1e-3, post=None, **par):
    parallel = {"schedule": schedule, "pp": pp}
    parallel.update(par)
    path = small_scenario(tmp_path, topo, parallel=parallel, training={"global_batch_size": m})
    import yaml
    d = yaml.safe_load(path.read_text())
    d["model"]["num_layers"] = layers
    d["cluster"]["nodes"] = max(1, pp // 4)
    if post is not None:
        d["training"]["optimizer_post_validation"] = post
    if pp < 4:
        d["parallel"]["dp"] = 4 // pp
        d["training"]["global_batch_size"] = m * (4 // pp)
    path.write_text(yaml.safe_dump(d))
    sc, t = load_scenario(path)
    return sc, simulate(sc, t, costs=PhaseCosts(sc, uf, ub, uw))


def own_span_idle(r, cls_id):
    """Idle time of a rank between its own first and last compute op (the zero-bubble paper's accounting)."""
    ops = [o for o in r.ops if o.cls == cls_id and o.stream == "compute" and o.category != "opt"]
    s = [r.timeline.start[o.id] for o in ops]
    e = [r.timeline.end[o.id] for o in ops]
    return max(e) - min(s) - sum(b - a for a, b in zip(s, e))


# ------------------------------------------------------------------------------------------------
# validity, over every registered schedule and a grid of (p, m, v)

GRID = [(p, m, v) for p in (1, 2, 3, 4, 6) for m in (1, 2, 4, 6, 8, 12, 16) for v in (1, 2, 3)]


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_every_schedule_is_valid_or_refused_with_a_reason(name):
    d = SCHEDULES[name]
    built = 0
    for p, m, v in GRID:
        if v > 1 and name != "interleaved_1f1b":
            continue
        problems = d.check(p, m, v)
        if problems:
            with pytest.raises(ScheduleError, match=problems[0][1][:30]):
                build_schedule(name, p, m, v)
            continue
        s = build_schedule(name, p, m, v)     # validates: every action once, dependencies, no deadlock
        built += 1
        assert s.num_stages == d.num_stages(p, v)
        # each microbatch visits every model stage: exactly one F, and one BW or one B + one W, per stage
        n_f = sum(1 for acts in s.actions for a in acts if a.kind == "F")
        assert n_f == m * s.num_stages
        # step time >= critical path: one microbatch's forward and backward through every stage,
        # and every rank's own work
        tf, tb, tw = 1.0, 1.3, 0.7
        cost = {"F": tf, "B": tb, "W": tw, "BW": tb + tw}
        start, end = timed_execution(s, lambda r, a: cost[a.kind])
        step = max(end.values())
        chain = s.num_stages * (tf + tb) + (tw if s.split_backward else 0.0)
        if not s.split_backward:
            chain = s.num_stages * (tf + tb + tw)
        work = max(sum(cost[a.kind] for a in acts) for acts in s.actions)
        assert step >= max(chain, work) - 1e-9
    assert built > 0


def test_validator_rejects_missing_duplicate_and_deadlocking_schedules():
    ok = build_schedule("1f1b", 2, 2)
    missing = make("x", 2, 2, [ok.actions[0][:-1], ok.actions[1]])
    with pytest.raises(ScheduleError, match="rank 0 chunk 0 microbatch 1 has F×1; it needs exactly one F"):
        validate(missing)
    dup = make("x", 2, 2, [ok.actions[0] + (Action("F", 0),), ok.actions[1]])
    with pytest.raises(ScheduleError, match="F×2"):
        validate(dup)
    # rank 1 runs its backward of microbatch 0 before its forward: waits on itself forever
    swapped = make("x", 2, 2, [ok.actions[0], (Action("BW", 0), Action("F", 0), Action("F", 1), Action("BW", 1))])
    with pytest.raises(ScheduleError, match="deadlocks: rank 0 at 0BW0, rank 1 at 0BW0"):
        validate(swapped)


def test_interleaving_constraint_is_reported_on_load(tmp_path, fast_topology):
    from simtrain.errors import ConfigError
    path = small_scenario(tmp_path, fast_topology, parallel={"schedule": "interleaved_1f1b", "vpp": 2},
                          training={"global_batch_size": 6})
    with pytest.raises(ConfigError, match="6 microbatches is not a multiple of pp=4"):
        load_scenario(path)
    path = small_scenario(tmp_path, fast_topology, parallel={"schedule": "1f1b", "vpp": 2})
    with pytest.raises(ConfigError, match="vpp=2 applies only to interleaved_1f1b"):
        load_scenario(path)
    path = small_scenario(tmp_path, fast_topology, parallel={"schedule": "zb_v", "layers_per_stage": [2, 2, 2, 2]})
    with pytest.raises(ConfigError, match="has 4 entries; the plan has 8 model stages"):
        load_scenario(path)


# ------------------------------------------------------------------------------------------------
# bubble closed forms (full simulation: lowering + SimPy engine)

@pytest.mark.parametrize("m,v", [(4, 2), (8, 2), (8, 4)])
def test_interleaved_bubble(tmp_path, fast_topology, m, v):
    """Megatron interleaving (Narayanan et al. SC'21 §2.2.2): each rank holds v chunks of L/(pv)
    layers, so a chunk's forward+backward takes (f+b)/v and the warm-up/cool-down idle shrinks to
    (p-1)(f+b)/v; the step is m(f+b) + (p-1)(f+b)/v = (v·m + p - 1)(f+b)/v and the bubble
    fraction (p-1)/(v·m + p - 1). Here p = 4, L = 16, f = 4 layers x 1 ms, b = 4 x 2 ms."""
    p, L = 4, 16
    f, b = L / p * 1e-3, L / p * 2e-3
    sc, r = run(tmp_path, fast_topology, "interleaved_1f1b", m, layers=L, vpp=v)
    res = r.result
    assert res.step_time_s == pytest.approx((v * m + p - 1) * (f + b) / v, rel=1e-9)
    assert res.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1), rel=1e-9)


@pytest.mark.parametrize("tf,tb,tw", [(1.0, 1.0, 1.0), (1.0, 1.5, 0.7), (1.2, 2.0, 1.0)])
def test_zb_h1_bubble(tmp_path, fast_topology, tf, tb, tw):
    """ZB-H1 (Qi et al. ICLR'24 §3.1, Table 2): bubble (p-1)(T_F + T_B - T_W) against 1F1B's
    (p-1)(T_F + T_B + T_W), for T_W <= T_F (the paper's setting). Derivation: 1F1B idles (p-1) hops
    of F + B + W. With W split off, the backward wave returns at T_B per hop instead of T_B + T_W
    (saving (p-1)T_W), and each rank slots its deferred W's into the waits a forward leaves,
    which a W fits into while T_W <= T_F (saving another (p-1)T_W). Every rank still does
    m(T_F + T_B + T_W) of work, so the step is that plus the bubble, on every rank."""
    p, m, L = 4, 8, 8
    per = L / p * 1e-3
    F, B, W = tf * per, tb * per, tw * per
    _, r = run(tmp_path, fast_topology, "zb_h1", m, uf=tf * 1e-3, ub=tb * 1e-3, uw=tw * 1e-3)
    _, r1 = run(tmp_path, fast_topology, "1f1b", m, uf=tf * 1e-3, ub=tb * 1e-3, uw=tw * 1e-3)
    work = m * (F + B + W)
    assert r.result.step_time_s - work == pytest.approx((p - 1) * (F + B - W), rel=1e-9)
    assert r1.result.step_time_s - work == pytest.approx((p - 1) * (F + B + W), rel=1e-9)
    for st in r.result.stages:
        assert st.bubble_s == pytest.approx((p - 1) * (F + B - W), rel=1e-9)


@pytest.mark.parametrize("schedule,chunks", [("zb_h2", 1), ("zb_v", 2)])
@pytest.mark.parametrize("m", [7, 8, 12])
def test_zb_h2_and_zb_v_have_no_bubble_inside_each_rank(tmp_path, fast_topology, schedule, chunks, m):
    """ZB-H2 and ZB-V (Qi et al. ICLR'24 §3.1, §6): with T_F = T_B = T_W and m >= 2p - 1 every
    rank runs without a gap from its first to its last operation (the paper's zero bubble). The
    last rank cannot begin before the first forward reaches it, (p-1) chunk forwards after the
    first. With a synchronous optimizer step (post-validation off) every rank waits for the last,
    so the step is (p-1)·T_F(chunk) + chunks·m·3·T(chunk); with the paper's post-validation (§4,
    these schedules' default) each rank starts its next step when its own ends and the stagger
    goes: the step is chunks·m·3·T(chunk), the parallelogram."""
    p, L = 4, 8
    chunk = L / p / chunks * 1e-3
    _, r = run(tmp_path, fast_topology, schedule, m)
    for c in r.classes:
        assert own_span_idle(r, c.id) == pytest.approx(0.0, abs=1e-9 * r.result.step_time_s)
    assert r.result.step_time_s == pytest.approx(chunks * m * 3 * chunk, rel=1e-9)
    _, sync = run(tmp_path, fast_topology, schedule, m, post=False)
    assert sync.result.step_time_s == pytest.approx((p - 1) * chunk + chunks * m * 3 * chunk, rel=1e-9)


@pytest.mark.parametrize("schedule", ["zb_h2", "zb_v"])
def test_zero_bubble_needs_2p_minus_1_microbatches(tmp_path, fast_topology, schedule):
    """The bound is tight: with m = 2p - 2 the warm-up cannot be filled and some rank idles
    inside its own span (the orders stay valid, they just stop being bubble-free)."""
    _, r = run(tmp_path, fast_topology, schedule, 6)
    assert max(own_span_idle(r, c.id) for c in r.classes) > 1e-4


@pytest.mark.parametrize("pp,m", [(4, 8), (4, 16), (8, 16)])
def test_dualpipe_bubble(tmp_path, fast_topology, pp, m):
    """DualPipe (DeepSeek-V3 report Table 2): bubble (PP/2 - 1)(F&B + B - 3W), where B is a full
    backward chunk and F&B an overlapped forward+backward pair. With T_F = T_B = T_W = T and free
    communication, F&B = F + B + W = 3T and full B = 2T, so the bubble is (PP/2-1)·2T on top of
    each rank's m·3T of work (m microbatches, half in each direction)."""
    T = 8 / pp * 1e-3
    _, r = run(tmp_path, fast_topology, "dualpipe", m, pp=pp)
    assert r.result.step_time_s == pytest.approx(m * 3 * T + (pp / 2 - 1) * 2 * T, rel=1e-9)


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (4, 12)])
def test_dualpipev_bubble(tmp_path, fast_topology, pp, m):
    """DualPipeV: the same (PP/2 - 1)(F&B + B - 3W) with PP = 2·pp stages of L/(2pp) layers:
    (pp - 1)·2T on top of 2·m·3T of work per rank (T per chunk)."""
    T = 8 / (2 * pp) * 1e-3
    _, r = run(tmp_path, fast_topology, "dualpipev", m, pp=pp)
    assert r.result.step_time_s == pytest.approx(2 * m * 3 * T + (pp - 1) * 2 * T, rel=1e-9)


def test_uneven_stages_show_in_the_bubble(tmp_path, fast_topology):
    """1F1B with stage times t_s where the last stage is the slowest: it runs without a gap once
    its first forward arrives, so the step is sum_s t_s + (m - 1)·t_last. Layers [1, 2, 2, 3] at
    3 ms per layer (f + b): 8·3 + 7·9 = 87 ms for m = 8, and stage 0 idles 87 - 8·3 = 63 ms."""
    sc, r = run(tmp_path, fast_topology, "1f1b", 8, ub=1e-3, uw=1e-3, layers_per_stage=[1, 2, 2, 3])
    assert r.result.step_time_s == pytest.approx(87e-3, rel=1e-9)
    assert r.result.stages[0].bubble_s == pytest.approx(87e-3 - 8 * 3e-3, rel=1e-9)
    assert [s.layers for s in r.result.stages] == [1, 2, 2, 3]


def test_megatron_first_and_last_stage_layer_counts(tmp_path, fast_topology):
    """first/last_stage_layers fix the ends and spread the rest: 8 layers, pp 4, first 1, last 1
    -> [1, 3, 3, 1]."""
    sc, r = run(tmp_path, fast_topology, "1f1b", 8, first_stage_layers=1, last_stage_layers=1)
    assert [s.layers for s in r.result.stages] == [1, 3, 3, 1]


def test_embedding_and_head_weigh_on_the_end_stages(tmp_path, fast_topology):
    """With calibrated costs the LM head (vocab GEMM + loss) makes the last stage the slowest of an
    even split, and the first stage holds the embedding's parameters."""
    path = small_scenario(tmp_path, fast_topology)
    sc, t = load_scenario(path)
    res = simulate(sc, t).result
    comp = [s.compute_s for s in res.stages]
    assert comp[-1] > max(comp[:-1])
    mem = res.memory
    assert mem[0].weights > mem[1].weights and mem[-1].weights > mem[1].weights


# ------------------------------------------------------------------------------------------------
# activation memory: what is in flight in the simulated timeline

def test_inflight_per_schedule(tmp_path, fast_topology):
    """Peak microbatch-chunks alive per rank (F start to W / BW end), rank 0 first:
    1F1B p - r; GPipe m; interleaved 2(p-1) + (v-1)p + 1 chunks on rank 0, i.e. p(1 + (p-1)/(pv))
    whole-rank microbatches (Korthikanti et al. §4.2.3); ZB-H1 p on every rank (p - r awaiting B,
    r awaiting W); ZB-H2 2p - 1; DualPipe PP + 1 chunks and DualPipeV 2pp + 1 (DeepSeek-V3 Table 2)."""
    p, m = 4, 8
    expect = {
        "1f1b": [4, 3, 2, 1], "gpipe": [8] * 4, "zb_h1": [4] * 4, "zb_h2": [7] * 4,
        "dualpipe": [p + 1] * 4, "dualpipev": [2 * p + 1] * 4,
    }
    for name, want in expect.items():
        _, r = run(tmp_path, fast_topology, name, m)
        assert [x.inflight_peak for x in r.result.memory] == want, name
    v = 2
    _, r = run(tmp_path, fast_topology, "interleaved_1f1b", m, layers=16, vpp=v)
    mem = r.result.memory[0]
    assert mem.inflight_peak == 2 * (p - 1) + (v - 1) * p + 1
    assert mem.inflight_microbatches_peak == pytest.approx(p * (1 + (p - 1) / (p * v)))


def test_zero_bubble_keeps_the_weight_gradient_inputs_alive(tmp_path, fast_topology):
    """ZB-H1 rank r peaks at (p - r)·M_B + r·M_W (Qi et al. Table 2): p - r microbatches with their
    full activations waiting for B, r that finished B and keep only W's inputs. M_B is the stage's
    stored activation per microbatch (Korthikanti), M_W the wgrad GEMM inputs (32sbh per layer for
    GPT without TP). The first rank matches 1F1B's p·M_B. The last rank's peak is in the loss's
    backward, which holds the loss's own buffers besides (`Memory.loss_working`: 2 bytes per logit)."""
    p, m = 4, 8
    sc, r = run(tmp_path, fast_topology, "zb_h1", m)
    _, r1 = run(tmp_path, fast_topology, "1f1b", m)
    work = build_workload(sc)
    s, b, h = 128, 1, 256
    assert work[1].layer.weight_grad_inputs == 32 * s * b * h
    for rank, mem in enumerate(r.result.memory):
        w = work[rank]
        assert mem.activations == pytest.approx((p - rank) * w.act_bytes + rank * w.weight_grad_bytes
                                                + w.loss_working_bytes, rel=1e-12)
    assert r.result.memory[0].activations == pytest.approx(r1.result.memory[0].activations, rel=1e-12)


def test_dualpipe_holds_the_parameters_twice(tmp_path, fast_topology):
    """Every DualPipe rank holds stage r and stage p-1-r, so weights, gradients and optimizer state
    per rank are those of two stages (DeepSeek-V3 Table 2: parameters 2x)."""
    sc, r = run(tmp_path, fast_topology, "dualpipe", 8)
    _, r1 = run(tmp_path, fast_topology, "1f1b", 8)
    w = build_workload(sc)
    for rank, mem in enumerate(r.result.memory):
        both = w[rank].params + w[3 - rank].params
        assert mem.weights == pytest.approx(2 * both)          # 2 bytes per bf16 parameter
    assert r.result.memory[1].weights == pytest.approx(2 * r1.result.memory[1].weights)


# What the 405B plan (126 layers, pp 16, 16 microbatches) needs for each schedule: 2pp-stage
# schedules need the layers split into 32 stages (3 + 30 x 4 + 3), DualPipe at least 2pp = 32
# microbatches (global batch 4096 instead of 2048).
BIG = {
    "gpt3-175b-a100-1024.yaml": {"interleaved_1f1b": ["parallel.vpp=2"]},
    "llama3-405b-h100-16384.yaml": {
        "interleaved_1f1b": ["parallel.vpp=2", "parallel.layers_per_stage=null", "parallel.first_stage_layers=3", "parallel.last_stage_layers=3"],
        "zb_v": ["parallel.layers_per_stage=null", "parallel.first_stage_layers=3", "parallel.last_stage_layers=3"],
        "dualpipev": ["parallel.layers_per_stage=null", "parallel.first_stage_layers=3", "parallel.last_stage_layers=3",
                      "training.global_batch_size=4096"],
        "dualpipe": ["training.global_batch_size=4096"],
    },
}


def test_every_schedule_loads_and_validates_on_both_big_scenarios():
    """The issue's done-criterion, checked cheaply: every schedule loads and validates on the
    shipped GPT-3 175B and Llama-3 405B plans (full runs: benchmarks/schedules.py)."""
    from conftest import ROOT
    for scen, extra in BIG.items():
        for name in SCHEDULES:
            over = [f"parallel.schedule={name}"] + extra.get(name, [])
            sc, _ = load_scenario(ROOT / "scenarios" / scen, over)
            s = build_schedule(name, sc.parallel.pp, sc.num_microbatches, sc.parallel.vpp)
            assert s.num_stages == SCHEDULES[name].num_stages(sc.parallel.pp, sc.parallel.vpp)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("zero,overlap_gather", [(0, False), (1, True), (3, False)])
def test_every_schedule_runs_with_tp_sp_dp_and_zero(tmp_path, plain_topology, name, zero, overlap_gather):
    """Real costs and a real fabric: tensor parallel with SP, data parallel with ZeRO 0/1/3 and
    overlapped parameter gathering all lower and run to the end (no deadlock) under every
    schedule, and the time splits exactly into compute + bubble + exposed communication."""
    path = small_scenario(tmp_path, plain_topology, nodes=4,
                          parallel={"schedule": name, "tp": 2, "pp": 4, "dp": 2, "sequence_parallel": True,
                                    "zero_stage": zero, "overlap_param_gather": overlap_gather,
                                    "bucket_size_params": 200_000},
                          training={"global_batch_size": 16})
    sc, topo = load_scenario(path)
    res = simulate(sc, topo).result
    assert res.step_time_s > 0
    for st in res.stages:
        total = st.compute_s + st.bubble_s + sum(st.exposed_comm_s.values())
        assert total == pytest.approx(res.step_time_s, rel=1e-9)


def test_dualpipe_sums_the_twin_copies_gradients(tmp_path, plain_topology):
    """Rank r and rank pp-1-r hold the same two stages; their gradients (both chunks, 4 bytes per
    parameter in bf16 training, no dp) meet in one 2-rank all-reduce that waits for both ranks."""
    path = small_scenario(tmp_path, plain_topology, parallel={"schedule": "dualpipe"})
    sc, topo = load_scenario(path)
    run = simulate(sc, topo)
    w = build_workload(sc)
    ex = [o for o in run.ops if o.label == "twin_grad_all_reduce"]
    assert len(ex) == 4
    for o in ex:
        rank = next(c.stage for c in run.classes if c.id == o.cls)
        assert o.bytes == pytest.approx(4 * (w[rank].params + w[3 - rank].params))
        assert o.rendezvous is not None and o.peers == 2
    # both sides of a pair start together (the rendezvous), after both have their gradients
    by = {next(c.stage for c in run.classes if c.id == o.cls): o for o in ex}
    assert run.timeline.start[by[0].id] == run.timeline.start[by[3].id]
    assert run.result.memory[0].inflight_microbatches_peak == 5      # PP + 1, full-stage chunks


def test_first_and_last_counts_may_cover_every_stage(tmp_path, fast_topology):
    path = small_scenario(tmp_path, fast_topology, parallel={"schedule": "zb_v", "pp": 1, "dp": 4,
                                                            "first_stage_layers": 3, "last_stage_layers": 5},
                          training={"global_batch_size": 8})
    sc, topo = load_scenario(path)
    assert [s.layers for s in simulate(sc, topo).result.stages] == [8]


def _megatron_interleaved_rows(p, v, m):
    """Megatron-LM's interleaved order, re-derived from its description
    (megatron/core/pipeline_parallel/schedules.py: get_schedule_table, get_pp_rank_microbatches,
    forward_backward_pipelining_with_interleaving; default microbatch_group_size_per_vp_stage = pp):
    virtual microbatch k runs table[k] = (microbatch, chunk), the table listing for each group of
    pp microbatches every chunk in turn over the group; a rank runs (p - r - 1)·2 + (v - 1)·p
    warm-up forwards (at most m·v), then forward k + warm-up and backward k in turn, then the
    remaining backwards; a backward runs chunk v - 1 - table[k].chunk."""
    g = p
    table = [(mb, c) for lo in range(0, m, g) for c in range(v) for mb in range(lo, min(lo + g, m))]
    rows = []
    for r in range(p):
        warm = min((p - r - 1) * 2 + (v - 1) * g, m * v)
        fw = [("F", *table[k]) for k in range(m * v)]
        bw = [("BW", table[k][0], v - 1 - table[k][1]) for k in range(m * v)]
        row = fw[:warm]
        for k in range(m * v - warm):
            row += [fw[warm + k], bw[k]]
        row += bw[m * v - warm:]
        rows.append(row)
    return rows


@pytest.mark.parametrize("p,v,m", [(2, 2, 4), (4, 2, 8), (4, 3, 8), (2, 3, 6), (4, 2, 4)])
def test_interleaved_order_is_megatrons(p, v, m):
    """The interleaved builder runs Megatron-LM's order: the same warm-up count, microbatch groups
    of pp per chunk and chunk reversal in the backward (by hand for p 2, v 2, m 4, rank 1: warm-up
    (2-1-1)·2 + 1·2 = 2 forwards 0F0 0F1, then 1F0 1B0 1F1 1B1 0F2 0B0 0F3 0B1 1F2 1B2 1F3 1B3,
    then 0B2 0B3)."""
    s = build_schedule("interleaved_1f1b", p, m, v)
    got = [[(a.kind, a.microbatch, a.chunk) for a in row] for row in s.actions]
    assert got == _megatron_interleaved_rows(p, v, m)
    if (p, v, m) == (2, 2, 4):
        assert " ".join(str(a) for a in s.actions[1]) == "0F0 0F1 1F0 1BW0 1F1 1BW1 0F2 0BW0 0F3 0BW1 1F2 1BW2 1F3 1BW3 0BW2 0BW3"
