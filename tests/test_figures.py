"""The figures people read, checked without eyes: what the builders return (texts, artists, sizes)."""
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from conftest import small_scenario  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from simtrain.results.figures import plain, timeline_figure  # noqa: E402
from simtrain.simulate import simulate  # noqa: E402
from simtrain.spec.loading import load_scenario  # noqa: E402
from simtrain.studies.compare import Row, compare_figure, compute_spans  # noqa: E402
from simtrain.studies.reliability.plots import sweep_figure  # noqa: E402
from simtrain.studies.reliability.plots import timeline_figure as trial_timeline  # noqa: E402
from simtrain.studies.search import search_figure  # noqa: E402
from simtrain.studies.sweep import build_scaling_figure  # noqa: E402

GiB = 2.0**30


def texts(fig) -> list:
    fig.canvas.draw()        # tick labels exist only once drawn
    return [t for t in fig.findobj(Text) if t.get_text() and t.get_visible()]


def assert_no_mathtext(fig):
    """No text of the figure starts mathtext: every `$` is escaped (or math is off for that text)."""
    for t in texts(fig):
        s = t.get_text()
        if "$" in s and t.get_parse_math():
            assert s.count("$") == s.count("\\$"), f"unescaped $ in {s!r}"
    plt.close(fig)


def test_plain_escapes_dollars_once():
    assert plain("US$ per M tokens (at $2/device-h)") == "US\\$ per M tokens (at \\$2/device-h)"
    assert plain(plain("$2")) == "\\$2"
    assert plain("no money") == "no money"


def step_run(tmp_path, fast_topology, gbs: int):
    path = small_scenario(tmp_path, fast_topology, training={"global_batch_size": gbs})
    sc, topo = load_scenario(path)
    return simulate(sc, topo)


def test_timeline_at_96_microbatches_summarises_the_middle_ranks_and_zooms(tmp_path, fast_topology):
    run = step_run(tmp_path, fast_topology, 96)
    fig = timeline_figure(run.ops, run.timeline, run.classes, "small")
    overview, warm, tail = fig.axes
    fig.canvas.draw()
    rows = [t.get_text() for t in overview.get_yticklabels()]
    assert [("summarised" in r) for r in rows] == [False, True, True, False]     # stages 0..3: ends in full
    assert "96 microbatches" in overview.get_title()
    # zoom windows: the warm-up from 0, the tail up to the step's end, both well inside the step
    step_ms = run.timeline.step_time * 1e3
    assert warm.get_xlim()[0] == 0 and warm.get_xlim()[1] < 0.4 * step_ms
    assert tail.get_xlim()[1] == pytest.approx(step_ms) and tail.get_xlim()[0] > 0.6 * step_ms
    # the optimizer is drawn on every row of the full-step panel, at least 1/300 of the step wide
    for ax in (overview, tail):
        opt = [c for c in ax.collections if (c.get_gid() or "").startswith("opt:")]
        assert len(opt) == 4
        lo, hi = ax.get_xlim()
        for c in opt:
            assert all(p.get_extents().width >= (hi - lo) / 300 * 0.999 for p in c.get_paths())
    # a summarised row is one busy-fraction profile, not one block per action
    busy = [c for c in overview.collections if (c.get_gid() or "").startswith("busy:")]
    assert len(busy) == 2 and all(len(c.get_paths()) == 1 for c in busy)
    plt.close(fig)


def test_timeline_at_16_microbatches_draws_every_row_in_full(tmp_path, fast_topology):
    run = step_run(tmp_path, fast_topology, 16)
    fig = timeline_figure(run.ops, run.timeline, run.classes, "small")
    assert len(fig.axes) == 1
    assert not any("summarised" in t.get_text() for t in texts(fig))
    plt.close(fig)


def fake_row(label: str, pp: int, step: float, mem_gib: float, fits: bool = True) -> Row:
    spans = [(r, cat, (2 * i + (cat == "B")) * 0.01 + r * 0.01, (2 * i + (cat == "B")) * 0.01 + r * 0.01 + 0.009, i, 0, 0)
             for r in range(pp) for i in range(8) for cat in ("F", "B")]
    spans += [(r, "dp", 0.2, step - 0.01, -1, 0, 3) for r in range(pp)] + [(r, "opt", step - 0.01, step, -1, 0, 0) for r in range(pp)]
    res = SimpleNamespace(step_time_s=step, bubble_fraction=0.1, peak_memory_bytes=mem_gib * GiB, fits_in_memory=fits,
                          memory_capacity_bytes=80 * GiB, num_microbatches=8)
    return Row(label, [], result=res, spans=spans, step=step, pp=pp)


def fig_px(fig) -> tuple:
    w, h = fig.get_size_inches() * fig.dpi
    return w, h


def test_compare_figure_height_follows_the_content_and_stays_bounded():
    heights = {}
    for pp in (1, 4, 8, 16, 32):
        fig = compare_figure([fake_row(f"schedule=s{i}", pp, 0.3 + 0.01 * i, 30) for i in range(5)], "t")
        heights[pp] = fig_px(fig)[1]
        plt.close(fig)
    assert heights[1] < heights[4] < heights[8] < heights[16] < heights[32]
    assert heights[32] < 2600            # five 32-stage panels and the bars, no blank bands
    assert heights[32] / heights[8] < 1.3


def test_compare_bars_carry_their_values_and_the_labels_stay_left():
    rows = [fake_row("placement=megatron topology=dgx-a100", 1, 14.224, 51.1),
            fake_row("placement=scattered topology=dgx-a100-2to1", 1, 19.72, 90.0, fits=False)]
    fig = compare_figure(rows, "placement: US$ 2/h")
    axs = next(a for a in fig.axes if any(p.get_gid() == "step" for p in a.patches))
    axm = next(a for a in fig.axes if any(p.get_gid() == "memory" for p in a.patches))
    fig.canvas.draw()
    assert [t.get_text() for t in axs.texts] == ["14.224 s", "19.720 s"]
    assert [t.get_text() for t in axm.texts if "GiB" in t.get_text() and "capacity" not in t.get_text()] == ["51.1 GiB", "90.0 GiB"]
    # the memory bars share the variants' labels with the step bars; none of their own to run over them
    assert not any(t.get_visible() and t.get_text() for t in axm.get_yticklabels())
    # the dp tail and the optimizer are drawn in every panel
    panels = [a for a in fig.axes if a not in (axs, axm)]
    assert all({"dp", "opt"} <= {c.get_gid() for c in a.collections} for a in panels)
    assert_no_mathtext(fig)


def test_compute_spans_carry_the_data_parallel_tail(tmp_path):
    path = small_scenario(tmp_path, "dgx-a100", parallel={"pp": 4, "dp": 2})
    sc, topo = load_scenario(path)
    spans = compute_spans(simulate(sc, topo))
    dp = [s for s in spans if s[1] == "dp"]
    assert dp and all(s[6] == 3 for s in dp)
    last_b = max(s[3] for s in spans if s[1] in ("B", "BW"))
    assert max(s[3] for s in dp) > last_b        # the gradient reduction ends after the last backward


def test_search_figure_keeps_dollar_signs():
    plan = SimpleNamespace(label=lambda: "tp 4 pp 8 ($0.69/Mtok)")
    res = SimpleNamespace(ranked=[SimpleNamespace(plan=plan, result=SimpleNamespace(
        peak_memory_bytes=(30 + i) * GiB, step_time_s=10.0 - i, fits_in_memory=True, memory_capacity_bytes=80 * GiB,
        usable_memory_bytes=76 * GiB))
        for i in range(3)])
    assert_no_mathtext(search_figure(res, "cost objective: US$ per million tokens at $2/device-h"))


def test_scaling_figure_axis_is_the_grid_key_with_devices_and_no_mathtext():
    pts = [(n, 64.0 / n, 0.5 - 0.01 * n, 1e5 * n, 0.5 + 0.01 * n, 8 * n) for n in (32, 64, 128, 256)]
    fig = build_scaling_figure(pts, "cluster.nodes", "s.yaml: against cluster.nodes", price=2.0)
    fig.canvas.draw()
    for ax in fig.axes:
        assert ax.get_xlabel().startswith("cluster.nodes")
        assert [t.get_text() for t in ax.get_xticklabels()] == ["32\n256", "64\n512", "128\n1,024", "256\n2,048"]
    assert any("per million tokens" in a.get_ylabel() for a in fig.axes)
    assert_no_mathtext(fig)


def test_goodput_sweep_is_in_percent():
    sweep = {"intervals_s": [120, 300, 600, 1200], "goodput_mean": [0.88, 0.91, 0.914, 0.9],
             "goodput_p5": [0.87, 0.90, 0.907, 0.89], "goodput_p95": [0.89, 0.92, 0.92, 0.91],
             "goodput_ci95": [0.001] * 4, "trials": 10, "closed_form": [0.885, 0.912, 0.916, 0.902],
             "refined_optimum_s": 530.0, "young_s": 534.0, "daly_s": 528.0}
    fig = sweep_figure(sweep, "g")
    ax = fig.axes[0]
    assert "%" in ax.get_ylabel()
    mean = next(line for line in ax.lines if "Monte-Carlo" in line.get_label())
    assert list(mean.get_ydata()) == pytest.approx([88.0, 91.0, 91.4, 90.0])
    assert 80 < ax.get_ylim()[0] < ax.get_ylim()[1] < 100
    assert_no_mathtext(fig)


def test_30_day_trial_timeline_rows_are_solid_bars():
    day, iv, ck = 86400.0, 530.0, 20.0
    events, t = [], 0.0
    while t < 30 * day:                       # train 510 s, checkpoint 20 s, ... for 30 days
        events.append((t, t + iv - ck, "train"))
        events.append((t + iv - ck, t + iv, "checkpoint"))
        t += iv
    events.append((10 * day, 10 * day + 300, "restart"))
    fig = trial_timeline(events, [(10 * day, "hardware")], 30 * day, "30 days")
    ax = fig.axes[0]
    bars = {c.get_gid(): c for c in ax.collections if c.get_gid()}
    assert len(bars["train"].get_paths()) <= 3 and len(bars["checkpoint"].get_paths()) <= 3
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert "train 96.2 %" in labels and "checkpoint 3.8 %" in labels
    plt.close(fig)
