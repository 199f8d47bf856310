"""simtrain search: the plan space, pruning against exhaustive simulation, --fix, the written best plan."""
import itertools
import re

import pytest
import yaml
from conftest import small_scenario

from simtrain.cli.main import main
from simtrain.errors import Collector, ConfigError
from simtrain.simulate import simulate
from simtrain.spec.loading import build_scenario, load_scenario
from simtrain.studies.search import Plan, closed_form, enumerate_plans, memory_bounds, pareto, plan_raw, search

FIX4 = ["parallel.sequence_parallel=false", "training.recompute=none", "parallel.zero_stage=0", "parallel.schedule=1f1b"]


def test_enumeration_matches_the_hand_listed_plans(tmp_path, plain_topology):
    # 4 devices, 8 layers, 8 heads (8 KV heads), global batch 8; sp / recompute / ZeRO / schedule fixed.
    # tp x pp x dp = 4 with tp | 8 heads and tp <= 4 devices per node; micro batch | 8 / dp:
    #   (tp, pp, dp) = (1,1,4): mb 1,2   (1,2,2): 1,2,4   (1,4,1): 1,2,4,8
    #                  (2,1,2): 1,2,4    (2,2,1): 1,2,4,8  (4,1,1): 1,2,4,8      -> 20 plans
    path = small_scenario(tmp_path, plain_topology)
    sc, _ = load_scenario(path)
    hand = {(1, 1, 4): (1, 2), (1, 2, 2): (1, 2, 4), (1, 4, 1): (1, 2, 4, 8),
            (2, 1, 2): (1, 2, 4), (2, 2, 1): (1, 2, 4, 8), (4, 1, 1): (1, 2, 4, 8)}
    want = {(t, p, d, m) for (t, p, d), mbs in hand.items() for m in mbs}
    from simtrain.studies.search import parse_fixes
    plans = enumerate_plans(sc.model, 8, 4, [1], parse_fixes(FIX4, str(path)))
    assert {(x.tp, x.pp, x.dp, x.micro_batch_size) for x in plans} == want and len(plans) == 20
    # every one of them passes the loader (1F1B takes any microbatch count, 8 layers split over pp 1, 2, 4)
    res = search(path, fixes=FIX4, exhaustive=True)
    assert res.enumerated == 20 and res.invalid == 0 and res.memory_pruned == 0 and res.simulated == 20


def _big(tmp_path, topo):
    # hidden 8192, 8 layers: 8 x 12 x 8192^2 = 6.4e9 parameters + embeddings; at 18 B / parameter (ZeRO 0) a
    # rank needs tp x pp >= 2 to fit 80 GB, so the memory bound has work to do
    return small_scenario(tmp_path, topo, model={"architecture": "gpt", "num_layers": 8, "hidden_size": 8192,
                                                 "num_attention_heads": 8, "vocab_size": 1024, "seq_length": 128})


def test_valid_plans_equal_a_brute_force_filter_over_the_box(tmp_path, plain_topology):
    """Brute force: every (tp, pp, dp) of product 4 (the loader rejects other world sizes), mb 1..8,
    sp on / off, 1F1B or interleaved with vpp 2..8, kept when the loader accepts it and the static
    memory lower bound fits; the search's surviving plans must be exactly those."""
    path = _big(tmp_path, plain_topology)
    raw = yaml.safe_load(path.read_text())
    fixes = ["training.recompute=none", "parallel.zero_stage=0"]
    res = search(path, fixes=fixes, schedules=("1f1b", "interleaved_1f1b"), exhaustive=True)
    brute = set()
    for tp, pp, dp in [(t, p, 4 // (t * p)) for t in (1, 2, 4) for p in (1, 2, 4) if 4 % (t * p) == 0]:
        for mb, sp, (sch, v) in itertools.product(range(1, 9), (False, True),
                                                   [("1f1b", 1)] + [("interleaved_1f1b", v) for v in range(2, 9)]):
            if sp and tp == 1:
                continue        # sequence parallel over one tp rank is the plain plan: the enumerator lists it once, off
            plan = Plan(1, tp, 1, pp, dp, 1, sch, v, mb, sp, "none", 0)
            try:
                sc, topo = build_scenario(plan_raw(raw, plan), path, Collector(str(path)))
            except ConfigError:
                continue
            if memory_bounds(sc, topo)[0] <= 80 * 2**30:
                brute.add(plan)
    got = {c.plan for c in res.ranked}
    assert got == brute
    assert res.memory_pruned > 0 and all(c.plan.tp * c.plan.pp >= 2 for c in res.ranked)


def test_pruned_search_finds_the_exhaustive_best(tmp_path, plain_topology):
    path = _big(tmp_path, plain_topology)
    fixes = ["parallel.zero_stage=1"]
    full = search(path, fixes=fixes, exhaustive=True)
    fast = search(path, fixes=fixes, max_candidates=5)
    assert full.simulated > 5 * 4 and fast.simulated == 5
    best = full.ranked[0]
    assert best.result.fits_in_memory
    assert fast.ranked[0].plan == best.plan and fast.ranked[0].result.step_time_s == best.result.step_time_s
    # every reported plan fits, as simulated: nothing above the lower bound got through as fitting wrongly
    assert all(c.result.peak_memory_bytes >= c.mem_lower for c in full.ranked)


def test_fix_is_respected(tmp_path, plain_topology, capsys):
    path = _big(tmp_path, plain_topology)
    res = search(path, fixes=["parallel.tp=2", "parallel.placement=scattered"], max_candidates=4)
    assert res.ranked and all(c.plan.tp == 2 and c.scenario.parallel.placement == "scattered" for c in res.ranked)
    assert main(["search", str(path), "--fix", "parallel.tp=two"]) == 2
    assert "parallel.tp: --fix value 'two' is not valid; give a whole number >= 1" in capsys.readouterr().err


def test_uneven_split_puts_the_lighter_stages_at_the_ends():
    from simtrain.studies.search import uneven_split
    # 126 = 16 x 7 + 14: 14 stages of 8, the other 2 (first and last) of 7 -- the shipped 405B split
    assert uneven_split(126, 16) == (7,) + (8,) * 14 + (7,)
    # 10 = 4 x 2 + 2: two light stages at the ends; 8 over 4 divides evenly (no split needed)
    assert uneven_split(10, 4) == (2, 3, 3, 2) and uneven_split(8, 4) is None


def test_closed_form_interleaved_term_tracks_the_simulation(tmp_path, fast_topology):
    # free communication: the step is the pipeline term (plus a tiny optimizer step). pp 2, vpp 2,
    # 8 microbatches: (m v + p - 1) chunk = 17 chunk-passes, within a few % of the simulated step
    # (the stages differ by the embedding / head). The uncorrected estimate would be half of it.
    path = small_scenario(tmp_path, fast_topology, parallel={"tp": 2, "pp": 2, "dp": 1, "schedule": "interleaved_1f1b", "vpp": 2})
    sc, topo = load_scenario(path)
    sim = simulate(sc, topo).result.step_time_s
    assert closed_form(sc, topo) == pytest.approx(sim, rel=0.10)


def test_pareto_front_by_hand():
    # (3, 4) is beaten by (2, 3) in both; the other three trade memory for time
    assert pareto([(1, 5), (2, 3), (3, 4), (4, 1)]) == [0, 1, 3]


def test_cli_writes_a_best_scenario_that_reproduces_its_step_time(tmp_path, plain_topology, capsys):
    path = _big(tmp_path, plain_topology)
    out = tmp_path / "out"
    assert main(["search", str(path), "--max-candidates", "4", "--top", "3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "plans enumerated" in text and "why: best" in text
    best_row = next(l for l in text.splitlines() if l.strip().startswith("1 "))
    sc, topo = load_scenario(out / "best.yaml")
    r = simulate(sc, topo).result
    from simtrain.units import fmt_time
    assert fmt_time(r.step_time_s) in best_row
    import csv
    rows = list(csv.DictReader((out / "search.csv").open()))
    assert float(rows[0]["step_time_s"]) == r.step_time_s and rows[0]["tp"] == str(sc.parallel.tp)
    assert (out / "search.png").stat().st_size > 0
    # the same input gives the same bytes
    assert main(["search", str(path), "--max-candidates", "4", "--top", "3", "--out", str(tmp_path / "again")]) == 0
    for f in ("best.yaml", "search.csv", "search.png"):
        assert (out / f).read_bytes() == (tmp_path / "again" / f).read_bytes()


def test_cost_objective_needs_and_uses_the_price(tmp_path, plain_topology, capsys):
    path = _big(tmp_path, plain_topology)
    assert main(["search", str(path), "--objective", "cost", "--max-candidates", "2"]) == 2
    assert "cost.price_per_device_hour" in capsys.readouterr().err
    doc = yaml.safe_load(path.read_text())
    doc["cost"] = {"price_per_device_hour": 3.6}
    path.write_text(yaml.safe_dump(doc))
    res = search(path, objective="cost", max_candidates=3)
    c = res.ranked[0]
    # $3.6 / device-hour x 4 devices x step / 3600 s / (8 x 128 tokens) x 1e6 = 4e-3 x step / 1.024e-3 $/Mtok
    assert c.objective == pytest.approx(3.6 * 4 * c.result.step_time_s / 3600 / 1024 * 1e6)
    doc["cost"] = {"price_per_device_hour": -1}
    path.write_text(yaml.safe_dump(doc))
    assert main(["search", str(path), "--objective", "cost"]) == 2
    assert "must be > 0" in capsys.readouterr().err


def test_set_applies_to_every_plan_as_in_run(tmp_path, plain_topology, capsys):
    """`--set` means what it means in `run`: the value for every plan; on a plan axis it holds the
    axis. Every ranked row of the table then shows tp2 and the scenario carries the placement."""
    path = _big(tmp_path, plain_topology)
    assert main(["search", str(path), "--set", "parallel.tp=2", "--set", "parallel.placement=scattered",
                 "--max-candidates", "3", "--out", str(tmp_path / "o")]) == 0
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines() if re.match(r"\s+\d+\s+tp\d", ln)]
    assert rows and all(r[1] == "tp2" for r in rows)
    best = yaml.safe_load((tmp_path / "o" / "best.yaml").read_text())
    assert best["parallel"]["tp"] == 2 and best["parallel"]["placement"] == "scattered"
