"""Pinned outputs of every shipped scenario and of the compare and search results the docs quote.

These are regression pins, not derivations: the values are what the simulator computed, to 4
significant figures, once per-device speed variability became part of every run by default
(`cluster.variability: auto`, the slowest-of-world factor). They guard refactorings that must not change behaviour. A change
that is meant to move a number updates the pin in its own commit and says why.
"""
import pytest
from conftest import ROOT, shipped_run, training_scenarios

from simtrain.results.step import StepResult
from simtrain.studies import compare, search

KEYS = ("step_time_s", "mfu", "bubble_fraction", "peak_memory_bytes")

# scenario stem: step time (s), MFU, bubble fraction, peak memory (bytes)
SCENARIOS = {
    "deepseek-v3-h800-2048": ("5.762", "0.202", "0.2149", "7.474e+10"),   # the report's memory recipe; TE's cached FP8 weights
    "gpt3-175b-a100-1024": ("19.05", "0.5563", "0.0873", "2.942e+10"),
    "llama2-70b-h800-256": ("10.03", "0.3671", "0.05451", "2.763e+10"),
    "llama3-405b-h100-16384-goodput": ("11.99", "0.2267", "0.4769", "2.432e+10"),
    "llama3-405b-h100-16384": ("11.99", "0.2267", "0.4769", "2.432e+10"),
    "llama3-70b-gb200-nvl72": ("8.355", "0.3304", "0.1415", "1.576e+11"),
    "llama3-70b-a100-1024-placement": ("14.37", "0.4105", "0", "5.49e+10"),
    "llama3-70b-h100-128k-cp16": ("16.86", "0.3555", "0.1646", "3.8e+10"),
    "llama3-70b-h100-512-stragglers": ("5.824", "0.3422", "0.2678", "3.8e+10"),
    "llama3-70b-h100-512": ("9.001", "0.4429", "0.116", "3.8e+10"),
    "llama3-70b-h100-scaleout": ("33.3", "0.4789", "0.05961", "3.8e+10"),
    "llama3-70b-mlu590-128": ("33.57", "0.6026", "0.07959", "4.311e+10"),
    "llama3-8b-h200-64": ("6.374", "0.6018", "0", "6.858e+10"),
    "llama3-8b-mlu370-32": ("20.72", "0.4242", "0", "9.607e+09"),
    "llava-llama3-8b-h100-32": ("4.086", "0.4196", "0.2365", "3.218e+10"),
    "mixtral-8x7b-h100-64": ("2.777", "0.4945", "0.1813", "5.196e+10"),}

# docs: the schedule table for GPT-3 175B on 1,024 A100 at its 96 microbatches
SCHEDULES = {
    "gpipe": ("19.05", "0.5563", "0.08707", "1.473e+11"),
    "1f1b": ("19.05", "0.5563", "0.0873", "2.942e+10"),
    "interleaved_1f1b": ("18.26", "0.5803", "0.05814", "3.394e+10"),
    "zb_h1": ("19.02", "0.5572", "0.05313", "2.942e+10"),
    "zb_h2": ("18.9", "0.5607", "0.04759", "3.843e+10"),   # with optimizer post-validation (its default)
    "zb_v": ("18.52", "0.5722", "0.03278", "3.005e+10"),
    "dualpipe": ("17.88", "0.5928", "0.03999", "4.967e+10"),
    "dualpipev": ("17.42", "0.6083", "0.05316", "3.07e+10"),
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
        ("tp8 pp32 dp64 mb1 sp rc-none z1 1f1b [3..4]", ("8.941", "0.3039", "0.4875", "7.632e+10")),
        ("tp8 pp32 dp64 mb1 sp rc-selective z1 1f1b [3..4]", ("9.174", "0.2962", "0.4879", "7.632e+10")),
        ("tp8 pp8 dp256 mb1 sp rc-full z1 1f1b [15..16]", ("11.89", "0.2286", "0.4472", "4.318e+10")),
    ]
