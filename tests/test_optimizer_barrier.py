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
