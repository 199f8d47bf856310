"""Pinned outputs of every shipped scenario and of the compare and search results the docs quote.

These are regression pins, not derivations: the values are what the simulator computed at commit
609ea45, to 4 significant figures. They guard refactorings that must not change behaviour. A change
that is meant to move a number updates the pin in its own commit and says why.
"""
import pytest
from conftest import ROOT, shipped_run, training_scenarios

from simtrain.results.step import StepResult
from simtrain.studies import compare, search

KEYS = ("step_time_s", "mfu", "bubble_fraction", "peak_memory_bytes")

# scenario stem: step time (s), MFU, bubble fraction, peak memory (bytes)
SCENARIOS = {
    "deepseek-v3-h800-2048": ("5.609", "0.2075", "0.2155", "7.474e+10"),   # the report's memory recipe; TE's cached FP8 weights
    "gpt3-175b-a100-1024": ("18.32", "0.5787", "0.08724", "2.942e+10"),
    "llama2-70b-h800-256": ("9.819", "0.3749", "0.05451", "2.763e+10"),
    "llama3-405b-h100-16384-goodput": ("11.46", "0.2372", "0.4759", "2.432e+10"),
    "llama3-405b-h100-16384": ("11.46", "0.2372", "0.4759", "2.432e+10"),
    "llama3-70b-gb200-nvl72": ("8.113", "0.3403", "0.1418", "1.576e+11"),
    "llama3-70b-a100-1024-placement": ("13.93", "0.4235", "0", "5.49e+10"),
    "llama3-70b-h100-128k-cp16": ("16.2", "0.37", "0.1647", "3.8e+10"),
    "llama3-70b-h100-512-stragglers": ("5.644", "0.3531", "0.2663", "3.8e+10"),
    "llama3-70b-h100-512": ("8.734", "0.4564", "0.1159", "3.8e+10"),
    "llama3-70b-h100-scaleout": ("32.28", "0.494", "0.05969", "3.8e+10"),
    "llama3-70b-mlu590-128": ("32.5", "0.6224", "0.07965", "4.311e+10"),
    "llama3-8b-h200-64": ("6.188", "0.6199", "0", "6.858e+10"),
    "llama3-8b-mlu370-32": ("20.25", "0.434", "0", "9.607e+09"),
    "llava-llama3-8b-h100-32": ("3.993", "0.4293", "0.2375", "3.218e+10"),
    "mixtral-8x7b-h100-64": ("2.699", "0.5089", "0.1815", "5.196e+10"),}

# docs: the schedule table for GPT-3 175B on 1,024 A100 at its 96 microbatches
SCHEDULES = {
    "gpipe": ("18.32", "0.5787", "0.087", "1.473e+11"),
    "1f1b": ("18.32", "0.5787", "0.08724", "2.942e+10"),
    "interleaved_1f1b": ("17.55", "0.6039", "0.0582", "3.394e+10"),
    "zb_h1": ("18.32", "0.5786", "0.05336", "2.942e+10"),
    "zb_h2": ("18.2", "0.5824", "0.04764", "3.843e+10"),   # with optimizer post-validation (its default)
    "zb_v": ("17.83", "0.5943", "0.03295", "3.005e+10"),
    "dualpipe": ("17.19", "0.6165", "0.04033", "4.967e+10"),
    "dualpipev": ("16.72", "0.6338", "0.05356", "3.07e+10"),
}


def sig4(result: StepResult) -> tuple:
    return tuple(f"{getattr(result, k):.4g}" for k in KEYS)


def test_every_shipped_scenario_is_pinned():
    assert sorted(SCENARIOS) == sorted(p.stem for p in training_scenarios())


@pytest.mark.parametrize("stem", sorted(SCENARIOS))
def test_shipped_scenario_pinned(stem):
    assert sig4(shipped_run(stem)[2].result) == SCENARIOS[stem]


def test_schedule_comparison_pinned():
    rows = compare.run_variants(ROOT / "scenarios" / "gpt3-175b-a100-1024.yaml",
                                ["parallel.schedule=" + ",".join(SCHEDULES)])
    got = {r.overrides[0].split("=", 1)[1]: sig4(r.result) for r in rows}
    assert got == SCHEDULES


def test_search_405b_pinned():
    """The docs' search result for Llama-3 405B on 16,384 H100: the best plan, its runner-up and the
    funnel counts (enumerated, rejected by checks, pruned by memory, estimated, simulated)."""
    res = search.search(ROOT / "scenarios" / "llama3-405b-h100-16384.yaml")
    assert (res.enumerated, res.invalid, res.memory_pruned, res.estimated, res.simulated) == (576, 24, 368, 70, 20)
    top = [(c.plan.label(), sig4(c.result)) for c in res.ranked[:3]]
    assert top == [
        ("tp8 pp32 dp64 mb1 sp rc-none z1 1f1b [3..4]", ("8.53", "0.3186", "0.4869", "7.632e+10")),
        ("tp8 pp32 dp64 mb1 sp rc-selective z1 1f1b [3..4]", ("8.75", "0.3105", "0.4873", "7.632e+10")),
        ("tp8 pp8 dp256 mb1 sp rc-full z1 1f1b [15..16]", ("11.39", "0.2386", "0.4452", "4.318e+10")),
    ]
