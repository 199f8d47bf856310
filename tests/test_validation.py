"""Validation against measured iteration times (vTrain artifact, 109 Megatron-DeepSpeed runs on
64-512 A100s). Slow (about two minutes): run with `python -m pytest -m slow`. Skipped when
../shared/data is absent. Tolerance: vTrain's own published MAPE on this set, 14.73 % (issue 5's
target, 8 %, is not met: see the README's validation section)."""
import importlib.util

import pytest

from conftest import ROOT, SHARED

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (SHARED / "vtrain" / "ground_truth_multi.csv").is_file(),
                                 reason="shared/data/vtrain not available")]


def test_multi_node_mape_below_vtrain():
    spec = importlib.util.spec_from_file_location("vv", ROOT / "benchmarks" / "vtrain_validation.py")
    vv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vv)
    res = vv.evaluate("multi", None)
    assert len(res) == 109
    mape = sum(r[4] for r in res) / len(res)
    assert mape < 0.1473
