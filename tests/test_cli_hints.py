"""The fixes an error suggests must work: pasting a world-size hint's `--set` makes the scenario load."""
from __future__ import annotations

import re

import pytest
from conftest import ROOT

from simtrain.errors import ConfigError
from simtrain.spec.loading import load_scenario

SCEN = ROOT / "scenarios" / "llama3-8b-h200-64.yaml"      # tp 2 x dp 32 on 8 nodes of 8 H200


def hint(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as e:
        load_scenario(SCEN, overrides)
    return str(e.value)


def test_world_size_hint_lists_pasteable_fixes_that_load():
    """On 4 nodes (32 devices) the 64-rank plan does not fit. By hand: dp = 32 / (tp 2) = 16 fills
    the cluster; tp+dp pairs with tp dividing Llama-3-8B's 32 heads and 8 KV heads and tp x dp = 32:
    1+32, 4+8, 8+4. Each suggested `--set` must make the scenario load."""
    msg = hint(["cluster.nodes=4"])
    assert "set cluster.nodes to 8" in msg
    assert "--set parallel.dp=16" in msg
    sets = re.findall(r"--set (parallel\.\S+=[0-9+]+)(?=[;) ]|$)", msg)
    assert "parallel.dp=16" in sets and "parallel.tp+parallel.dp=1+32" in sets, msg
    assert "parallel.tp+parallel.dp=1+32,4+8,8+4" in msg
    for s in sets:
        keys, vals = s.split("=")
        ov = [f"{k}={v}" for k, v in zip(keys.split("+"), vals.split("+"))]
        sc, topo = load_scenario(SCEN, ["cluster.nodes=4", *ov])
        p = sc.parallel
        assert p.tp * p.pp * p.dp * p.cp == topo.num_devices == 32


def test_world_size_hint_keeps_the_batch_divisible():
    """With global_batch_size 48 and micro batch 1, dp must divide 48. Of the 32-device plans
    above, dp 16 (3 microbatches), tp 4 x dp 8 (6) and tp 8 x dp 4 (12) keep it whole; tp 1 x
    dp 32 does not (48 / 32 = 1.5), so it must not be suggested."""
    msg = hint(["cluster.nodes=4", "training.global_batch_size=48", "training.micro_batch_size=1"])
    assert "1+32" not in msg and "4+8" in msg and "8+4" in msg
    assert "--set parallel.dp=16" in msg
