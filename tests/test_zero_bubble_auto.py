"""The searched zero-bubble schedules ZB-1p / ZB-2p (Qi et al., "Zero Bubble Pipeline
Parallelism", ICLR'24 §3.2): valid, within their memory limit, and at the paper's closed-form
bubbles when T_F = T_B = T_W and communication is free (§3.1, Table 2 / the reference README's
comparison: ZB-1p (p-1)(T_F + T_B - T_W) per rank, ZB-2p 0 once m >= 2p-1)."""
import pytest
from conftest import small_scenario

from simtrain.schedules import SCHEDULES, build_schedule, validate
from simtrain.schedules.zb_auto import rank_span, zb_auto
from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario


def _peak(s):
    """Most microbatches alive at once on a rank: +1 at F, -1 at W (or BW)."""
    best = 0
    for row in s.actions:
        n = 0
        for a in row:
            n += 1 if a.kind == "F" else -1 if a.kind in ("W", "BW") else 0
            best = max(best, n)
    return best


@pytest.mark.parametrize("p,m", [(4, 8), (4, 12), (8, 16), (2, 3)])
def test_closed_form_bubbles_with_equal_times(p, m):
    """Each rank computes 3m units (F, B, W of m microbatches, T = 1); its span from first to
    last action is 3m plus its bubble. p 4, m 8: ZB-1p 24 + 3·(1 + 1 - 1) = 27, ZB-2p 24."""
    one, two = build_schedule("zb_1p", p, m), build_schedule("zb_2p", p, m)
    assert rank_span(one, 1, 1, 1) == pytest.approx(3 * m + (p - 1) * (1 + 1 - 1))
    assert rank_span(two, 1, 1, 1) == pytest.approx(3 * m)
    assert _peak(one) <= p and _peak(two) <= 2 * p
    # the baselines under the same model: 1F1B's bubble is (p-1)(T_F + T_B + T_W)
    assert rank_span(build_schedule("1f1b", p, m), 1, 1, 1) == pytest.approx(3 * m + 3 * (p - 1))


def test_fewer_microbatches_than_stages_still_valid():
    """m < p: no steady phase; every microbatch still gets F, B and W on every rank (validate)
    and the span is bounded below by one microbatch's round trip, p·(T_F + T_B) + T_W = 9 for p 4."""
    for name in ("zb_1p", "zb_2p"):
        s = build_schedule(name, 4, 1)
        assert rank_span(s, 1, 1, 1) == pytest.approx(4 * (1 + 1) + 1)


def test_profiled_times_and_communication():
    """Unequal times (T_F 1, T_B 1.2, T_W 0.8) and 0.1 per transfer: the schedule validates, holds
    at most its limit, and is no longer than ZB-H1 with the same memory (p 4, m 8) nor 1F1B."""
    args = dict(t_f=1.0, t_b=1.2, t_w=0.8, t_comm=0.1)
    s = zb_auto(4, 8, 4, **args)
    validate(s)
    assert _peak(s) <= 4
    span = rank_span(s, 1.0, 1.2, 0.8, 0.1)
    assert span <= rank_span(build_schedule("zb_h1", 4, 8), 1.0, 1.2, 0.8, 0.1) + 1e-9
    assert span < rank_span(build_schedule("1f1b", 4, 8), 1.0, 1.2, 0.8, 0.1)
    assert zb_auto(4, 8, 4, **args).table() == s.table()          # deterministic


def test_registered_with_post_validation():
    """Like the handcrafted zero-bubble schedules they run with optimizer post-validation (§4)."""
    for name in ("zb_1p", "zb_2p", "zb_h1", "zb_h2", "zb_v"):
        assert SCHEDULES[name].post_validation
    for name in ("1f1b", "gpipe", "interleaved_1f1b", "dualpipe", "dualpipev"):
        assert not SCHEDULES[name].post_validation


def test_per_stage_times_reach_the_bottleneck_stage():
    """A last stage 1.5x slower (an LM head): the step cannot beat that stage's own work,
    m·1.5·(T_F + T_B + T_W) = 8·4.5 = 36 for p 4, m 8; ZB-2p reaches it (the faster stages keep
    the slow one fed), ZB-1p within (p-1)·1.5·(T_F + T_B - T_W) of it."""
    f = b = w = (1.0, 1.0, 1.0, 1.5)
    two = build_schedule("zb_2p", 4, 8, 1, (f, b, w))
    one = build_schedule("zb_1p", 4, 8, 1, (f, b, w))
    assert rank_span(two, f, b, w) == pytest.approx(36.0)
    assert 36.0 <= rank_span(one, f, b, w) <= 36.0 + 3 * 1.5 + 1e-9
    assert _peak(two) <= 8 and _peak(one) <= 4


def test_scenario_builds_the_search_over_its_stage_times(tmp_path, plain_topology):
    """In a scenario, zb_1p / zb_2p are searched over the stages' compute times from the cost
    model (`stage_times`) and run like any schedule; with the same memory they are no slower than
    the handcrafted ZB-H1 / ZB-H2 and faster than 1F1B (small GPT, pp 4, 8 microbatches)."""
    step = {}
    for name in ("1f1b", "zb_h1", "zb_1p", "zb_h2", "zb_2p"):
        p = small_scenario(tmp_path, plain_topology, parallel={"pp": 4, "schedule": name})
        step[name] = simulate(*load_scenario(p)).result.step_time_s
    assert step["zb_1p"] < step["1f1b"] and step["zb_2p"] < step["1f1b"]
    assert step["zb_1p"] <= step["zb_h1"] + 1e-12 and step["zb_2p"] <= step["zb_h2"] + 1e-12
