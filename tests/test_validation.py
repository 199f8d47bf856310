"""Validation against measured iteration times (vTrain artifact, 109 Megatron-DeepSpeed runs on
64-512 A100s). Slow (about a minute): run with `python -m pytest -m slow`. Skipped when
../shared/data is absent. Tolerances: issue 5's target for the multi-node set, a MAPE of at most
8 % with the shipped A100 profile (vTrain's own published MAPE on this set is 14.73 %); and, as a
floor that catches regressions of the compute side, the single-node set's 9.68 % today, rounded
up to 10 % (that set has no published target)."""
import importlib.util

import pytest
from conftest import ROOT, SHARED

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (SHARED / "vtrain" / "ground_truth_multi.csv").is_file(),
                                 reason="shared/data/vtrain not available")]


def _validation():
    spec = importlib.util.spec_from_file_location("vv", ROOT / "benchmarks" / "vtrain_validation.py")
    vv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vv)
    return vv


def test_multi_node_mape_meets_the_target():
    res = _validation().evaluate("multi", None)
    assert len(res) == 109
    mape = sum(r[4] for r in res) / len(res)
    assert mape <= 0.08


def test_single_node_mape_holds():
    res = _validation().evaluate("single", None)
    assert len(res) == 1440
    mape = sum(r[4] for r in res) / len(res)
    assert mape < 0.10
