"""Device memory: capacity (preset or cluster.memory_capacity), the reserve held back
(cluster.memory_reserve) and what is left (usable), applied by the one fit rule; search's
headroom margin. Expected values are hand derivations in binary units (GiB = 2**30 B)."""
from types import SimpleNamespace

import pytest
import yaml
from conftest import small_scenario

from simtrain.cli.main import main
from simtrain.errors import ConfigError
from simtrain.results.memory import budget_of, memory_fit
from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario
from simtrain.spec.scenario import MEMORY_RESERVE_DEFAULT
from simtrain.studies.search import Candidate, Plan, check_margin, rank, table, to_csv

GiB = 2**30


def test_reserve_is_applied_by_the_fit_rule():
    """80 GiB with a 0.05 reserve: 4 GiB held back, 76 GiB usable. 78 GiB needed -> 2 GiB short;
    76 GiB fits exactly; a 6 GiB size reserve on a 141 GiB device leaves 135 GiB."""
    frac = SimpleNamespace(memory_capacity=None, reserve_of=lambda cap: 0.05 * cap)
    assert memory_fit([(78 * GiB, 80 * GiB)], frac.reserve_of).shortfall_bytes == pytest.approx(2 * GiB)
    assert not memory_fit([(78 * GiB, 80 * GiB)], frac.reserve_of).fits
    assert memory_fit([(76 * GiB, 80 * GiB)], frac.reserve_of).fits
    assert memory_fit([(78 * GiB, 80 * GiB)]).fits          # no reserve: the capacity itself
    size = SimpleNamespace(memory_capacity=None, reserve_of=lambda cap: 6.0 * GiB)
    b = budget_of(size, 141 * GiB)
    assert (b.capacity, b.reserve, b.usable) == (141 * GiB, 6 * GiB, 135 * GiB)


def test_simulated_fit_uses_capacity_minus_reserve(tmp_path, plain_topology):
    """The result reports capacity, reserve and usable (A100 80GB: 80 GiB, default 0.05 -> 4 GiB,
    76 GiB), and the shortfall is measured against usable. With memory_capacity "1 GiB" and a
    "0.5 GiB" reserve the small model's peak (above 0.5 GiB: weights + grads + Adam state of
    ~6.6M parameters and a vocab-1024 head at 18 B each are ~0.12 GiB, activations and buffers
    the rest) is compared with 0.5 GiB."""
    path = small_scenario(tmp_path, plain_topology)
    sc, topo = load_scenario(path)
    assert sc.cluster.memory_reserve == MEMORY_RESERVE_DEFAULT == 0.05
    r = simulate(sc, topo).result
    assert r.memory_capacity_bytes == 80 * GiB == 85_899_345_920
    assert r.memory_reserve_bytes == pytest.approx(4 * GiB)
    assert r.usable_memory_bytes == pytest.approx(76 * GiB)
    assert r.fits_in_memory
    # an override of the capacity and a size reserve; the peak itself does not move
    sc2, topo2 = load_scenario(path, ['cluster.memory_capacity="1 GiB"', 'cluster.memory_reserve="1023.9 MiB"'])
    r2 = simulate(sc2, topo2).result
    assert r2.memory_capacity_bytes == GiB and r2.memory_reserve_bytes == pytest.approx(1023.9 * 2**20)
    assert r2.peak_memory_bytes == r.peak_memory_bytes
    assert not r2.fits_in_memory
    assert r2.memory_shortfall_bytes == pytest.approx(r.peak_memory_bytes - 0.1 * 2**20)
    # a reserve of 0 and the capacity as large as the peak: fits exactly
    sc3, topo3 = load_scenario(path, [f'cluster.memory_capacity="{r.peak_memory_bytes:.17g} B"', "cluster.memory_reserve=0"])
    assert simulate(sc3, topo3).result.fits_in_memory


def test_a_percentage_reserve_is_that_fraction_of_the_capacity(tmp_path, plain_topology):
    """"10%" of A100 80GB's 80 GiB holds back 8 GiB, as 0.1 does."""
    path = small_scenario(tmp_path, plain_topology)
    for v in ('"10%"', '" 10 % "', "0.1"):
        sc, topo = load_scenario(path, [f"cluster.memory_reserve={v}"])
        assert sc.cluster.memory_reserve == pytest.approx(0.1)
        assert simulate(sc, topo).result.memory_reserve_bytes == pytest.approx(8 * GiB)


def test_resolved_scenario_round_trips_the_memory_keys(tmp_path, plain_topology):
    """A size is dumped with its unit (bytes) so that the resolved file loads to the same scenario."""
    path = small_scenario(tmp_path, plain_topology)
    sc, _ = load_scenario(path, ['cluster.memory_capacity="64 GiB"', 'cluster.memory_reserve="3 GiB"'])
    d = sc.resolved()
    assert d["cluster"]["memory_capacity"] == "68719476736 B" and d["cluster"]["memory_reserve"] == "3221225472 B"
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(d, sort_keys=False))
    assert load_scenario(again)[0].resolved() == d


def test_run_and_check_show_capacity_reserve_and_usable(tmp_path, plain_topology, capsys):
    path = small_scenario(tmp_path, plain_topology)
    assert main(["check", str(path), "--set", 'cluster.memory_reserve="2 GiB"']) == 0
    out = capsys.readouterr().out
    assert "device memory 80.00 GiB (a100-sxm4-80gb) - reserve 2.00 GiB (cluster.memory_reserve) = 78.00 GiB usable" in out
    assert main(["run", str(path)]) == 0
    out = capsys.readouterr().out
    assert "of 76.00 GiB usable" in out and "capacity 80.00 GiB - reserve 4.00 GiB" in out


def _cand(label_tp: int, step: float, peak_gib: float, usable_gib: float = 74.5) -> Candidate:
    plan = Plan(nodes=1, tp=label_tp, cp=1, pp=1, dp=1, ep=1, schedule="1f1b", vpp=1, micro_batch_size=1,
                sequence_parallel=False, recompute="none", zero_stage=0)
    ex = {k: 0.0 for k in ("tp", "cp", "ep", "pp", "dp")}
    r = SimpleNamespace(step_time_s=step, peak_memory_bytes=peak_gib * GiB, usable_memory_bytes=usable_gib * GiB,
                        fits_in_memory=peak_gib <= usable_gib, mfu=0.5, bubble_fraction=0.0, tokens_per_s=1.0,
                        breakdown=SimpleNamespace(exposed_comm_s=ex))
    return Candidate(plan, result=r, objective=step)


def test_search_ranks_tight_plans_after_plans_with_headroom():
    """74.07 of 74.5 GiB usable is 0.43 GiB (0.6 %) of headroom: within a 5 % margin (3.725 GiB),
    so it ranks after a plan at 38 GiB that is 0.1 % slower; with margin 0 the faster one leads.
    A plan over the usable memory ranks last whatever its step time."""
    tight, roomy, over = _cand(1, 10.00, 74.07), _cand(2, 10.01, 38.0), _cand(4, 5.0, 80.0)
    assert [c.plan.tp for c in rank([tight, roomy, over], 0.05)] == [2, 1, 4]
    assert [c.plan.tp for c in rank([tight, roomy, over], 0.0)] == [1, 2, 4]
    assert tight.tight(0.05) and not roomy.tight(0.05) and not over.tight(0.05)
    assert tight.headroom() == pytest.approx((74.5 - 74.07) * GiB)
    # the boundary, in exact binary numbers: 64 GiB usable x 0.25 = 16 GiB; a peak of 48 GiB leaves
    # exactly the margin (not tight), 48.5 GiB leaves less (tight)
    assert not _cand(1, 1.0, 48.0, 64.0).tight(0.25) and _cand(1, 1.0, 48.5, 64.0).tight(0.25)


def test_search_table_and_csv_show_headroom():
    res = SimpleNamespace(ranked=[_cand(2, 10.01, 38.0), _cand(1, 10.0, 74.07)], objective="step_time", memory_margin=0.05, price=None)
    t = table(res, 10)
    assert "headroom" in t.splitlines()[0]
    assert "36.50 GiB" in t and "0.43 GiB" in t and "tight" in t
    rows = to_csv(res).splitlines()
    head = rows[0].split(",")
    assert head[-4:] == ["usable_memory_bytes", "headroom_bytes", "tight", "error"]
    assert rows[2].split(",")[-2] == "True" and rows[1].split(",")[-2] == "False"


@pytest.mark.parametrize("bad", [-0.1, 1.0, float("nan"), 2])
def test_search_refuses_a_margin_outside_0_1(bad):
    with pytest.raises(ConfigError, match="--memory-margin"):
        check_margin(bad)
