"""The global gradient-norm all-reduce before the optimizer step: in the program, in the trace,
and on the critical path (no rank's optimizer starts before the last rank has reduced its
gradients)."""
import pytest
import yaml
from conftest import small_scenario

from simtrain.program.optimizer import GRAD_NORM_BYTES
from simtrain.results.trace import chrome_trace
from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario


def _scenario(tmp_path, topo, stragglers=(), name="s.yaml"):
    # pp 2 x dp 2 on one node of 4: stage 0 is ranks 0-1, stage 1 ranks 2-3 (Megatron order tp-cp-dp-pp)
    p = small_scenario(tmp_path, topo, parallel={"tp": 1, "pp": 2, "dp": 2, "zero_stage": 1})
    doc = yaml.safe_load(p.read_text())
    if stragglers:
        doc["cluster"]["stragglers"] = list(stragglers)
    q = tmp_path / name
    q.write_text(yaml.safe_dump(doc))
    return load_scenario(q)


def _by_class(run, label):
    return {op.cls: op for op in run.ops if op.label == label}


def test_grad_norm_all_reduce_is_in_the_program_and_the_trace(tmp_path, plain_topology):
    """One `all_reduce:grad_norm` of 4 B (one fp32 value) per rank class, a rendezvous of every
    class, before that class's optimizer step; the Chrome trace shows it on every class."""
    run = simulate(*_scenario(tmp_path, plain_topology))
    norm, opt = _by_class(run, "all_reduce:grad_norm"), _by_class(run, "optimizer_step")
    classes = {c.id for c in run.classes}
    assert set(norm) == set(opt) == classes and len(classes) > 1
    for cid, op in norm.items():
        assert op.bytes == GRAD_NORM_BYTES == 4.0
        assert op.rendezvous[0] == "grad_norm" and op.peers == len(classes)
        assert op.id in opt[cid].deps
    events = chrome_trace(run.ops, run.timeline, run.classes, run.topology)["traceEvents"]
    assert {e["pid"] for e in events if e.get("name") == "all_reduce:grad_norm"} == classes


def test_every_optimizer_waits_for_the_last_rank(tmp_path, plain_topology):
    """The rule, from the timeline: every class arrives at the all-reduce when its own gradient
    reduction is done (a_c = the latest end of the op's dependencies); the all-reduce starts
    when the last arrives and lasts d, so every optimizer starts at max_c a_c + d. Under 1F1B the
    last stage finishes its backwards first, so it waits for stage 0; a straggler on stage 0
    (compute x 2) delays the optimizer of stage 1, whose own work did not change, by exactly as
    much as it delays stage 0's arrival."""
    def timing(run):
        tl, norm, opt = run.timeline, _by_class(run, "all_reduce:grad_norm"), _by_class(run, "optimizer_step")
        arrive = {c: max(tl.end[d] for d in op.deps) for c, op in norm.items()}
        start = {c: tl.start[opt[c].id] for c in opt}
        d = next(iter(norm.values())).duration
        stage = {c.id: c.stage for c in run.classes}
        return arrive, start, d, stage

    clean = simulate(*_scenario(tmp_path, plain_topology))
    arrive, start, d, stage = timing(clean)
    last = max(arrive.values())
    for c in start:
        assert start[c] == pytest.approx(last + d, rel=1e-12)
    s0 = [c for c in arrive if stage[c] == 0]
    s1 = [c for c in arrive if stage[c] == 1]
    assert max(arrive[c] for c in s1) < min(arrive[c] for c in s0)        # stage 1 is done first ...
    assert all(start[c] > arrive[c] + d for c in s1)                      # ... and waits

    slow = simulate(*_scenario(tmp_path, plain_topology, [{"devices": [0, 1], "compute": 2.0}], name="slow.yaml"))
    arrive2, start2, d2, stage2 = timing(slow)
    last2 = max(arrive2.values())
    assert last2 > last
    for c in start2:
        assert start2[c] == pytest.approx(last2 + d2, rel=1e-12)
    later = {stage2[c]: start2[c] for c in start2}
    assert later[1] - start[s1[0]] == pytest.approx(last2 - last, rel=1e-9)


def _zb(tmp_path, topo, schedule="zb_h1", post=None, name="zb.yaml"):
    tr = {} if post is None else {"optimizer_post_validation": post}
    p = small_scenario(tmp_path, topo, parallel={"tp": 1, "pp": 4, "dp": 1, "schedule": schedule}, training=tr)
    q = tmp_path / name
    q.write_text(p.read_text())
    return load_scenario(q)


def _spans(run):
    """Per class (first start, last end), the grad-norm all-reduce left out."""
    tl, out = run.timeline, {}
    for op in run.ops:
        if op.label == "all_reduce:grad_norm":
            continue
        s, e = out.get(op.cls, (tl.start[op.id], tl.end[op.id]))
        out[op.cls] = (min(s, tl.start[op.id]), max(e, tl.end[op.id]))
    return out


def test_post_validation_is_the_zero_bubble_default_and_removes_the_barrier(tmp_path, plain_topology):
    """Qi et al. (ICLR'24) §4: under a zero-bubble schedule the optimizer steps without waiting
    for the gradient-norm all-reduce, which still runs (it validates the step afterwards). By hand:
    with the barrier every optimizer starts at max_c a_c + d (a_c: class c's arrival, d: the
    all-reduce); without it each starts at its own a_c, and since nothing joins the ranks at the
    step boundary each rank starts its next step when its own ends, so the step time is the longest
    span max_c (last end_c - first start_c). With the barrier it is the whole step's span from the
    common start, max_c last end_c. 1F1B keeps the barrier unless asked."""
    on = simulate(*_zb(tmp_path, plain_topology))                      # zb_h1: on by default
    off = simulate(*_zb(tmp_path, plain_topology, post=False, name="off.yaml"))
    plain = simulate(*_zb(tmp_path, plain_topology, schedule="1f1b", name="onef.yaml"))
    for run, waits in ((on, False), (off, True), (plain, True)):
        norm, opt = _by_class(run, "all_reduce:grad_norm"), _by_class(run, "optimizer_step")
        assert set(norm) == set(opt)
        for c in opt:
            assert (norm[c].id in opt[c].deps) is waits
    tl = on.timeline
    norm, opt = _by_class(on, "all_reduce:grad_norm"), _by_class(on, "optimizer_step")
    for c, op in opt.items():
        # its own gradients, not the last rank's: it starts when its own dependencies end
        assert tl.start[op.id] == pytest.approx(max(tl.end[d] for d in op.deps), rel=1e-12)
    spans = _spans(on)
    assert on.result.step_time_s == pytest.approx(max(e - s for s, e in spans.values()), rel=1e-12)
    # with the barrier: the step from the common start, the optimizers behind the all-reduce
    d = next(iter(_by_class(off, "all_reduce:grad_norm").values())).duration
    assert off.result.step_time_s == pytest.approx(max(off.timeline.end), rel=1e-12)
    arrive = {c: max(off.timeline.end[x] for x in op.deps) for c, op in _by_class(off, "all_reduce:grad_norm").items()}
    for c, op in _by_class(off, "optimizer_step").items():
        assert off.timeline.start[op.id] == pytest.approx(max(arrive.values()) + d, rel=1e-12)
    # the saving: at least the all-reduce d (every rank's optimizer starts no later than before) and
    # at most d plus the latest rank's staggered start
    saved = off.result.step_time_s - on.result.step_time_s
    later_start = max(s for s, _ in spans.values())
    assert d - 1e-12 <= saved <= d + later_start + 1e-12
    # a user can turn it on for 1F1B too; it then saves the same all-reduce at least
    forced = simulate(*_zb(tmp_path, plain_topology, schedule="1f1b", post=True, name="forced.yaml"))
    assert forced.result.step_time_s <= plain.result.step_time_s - d + 1e-12


def test_post_validation_step_is_the_same_fused_unfused_and_per_rank(tmp_path, plain_topology):
    """Folding collectives and merging compute chains keep the timeline (lowering.py), and one
    program per class gives what every rank on its own gives: so the post-validation step, the
    longest rank span without the validation all-reduce, is the same all three ways (pp 2 x dp 2
    and zero_stage 1, where merging renumbers the ops)."""
    p = small_scenario(tmp_path, plain_topology, parallel={"tp": 1, "pp": 2, "dp": 2, "zero_stage": 1, "schedule": "zb_h2"})
    sc, topo = load_scenario(p)
    fused = simulate(sc, topo).result.step_time_s
    assert simulate(sc, topo, fuse=False).result.step_time_s == pytest.approx(fused, rel=1e-12)
    assert simulate(sc, topo, every_rank=True).result.step_time_s == pytest.approx(fused, rel=1e-12)
