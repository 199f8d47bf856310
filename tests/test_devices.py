import math

import pytest

from simtrain.devices import get_device, preset_names


def test_gemm_curve_worked_example():
    """A100 cublasLt FP16 sweep (Azure ND A100 v4): 228.0 TFLOP/s at 4096³, 253.7 at 8192³, peak 312."""
    c = get_device("a100-sxm4-80gb").gemm["16bit"]
    assert c.at(2048)[0] == pytest.approx(221.8 / 312)
    side = (2048 * 4608 * 12288) ** (1 / 3)
    e4, e8 = 228.0 / 312, 253.7 / 312
    assert c.at(side) == (pytest.approx(e4 + (e8 - e4) * math.log2(side / 4096)), True)
    eff, inside = c.at(300)          # below the sweep: nearest end, flagged
    assert eff == pytest.approx(119.4 / 312) and inside is False


def test_every_preset_has_sources_and_curves():
    for k in preset_names():
        d = get_device(k)
        assert d.source and d.memory_bytes > 0 and d.memory_bw > 0
        assert "16bit" in d.gemm and 0 < d.mem_efficiency <= 1
        for c in d.gemm.values():
            assert c.source and all(0 < e <= 1 for _, e in c.points)
