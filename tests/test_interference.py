"""Compute slowed by concurrent communication on the same device (simtrain.engine.core.Interference)
and the profile's `interference` table (simtrain.hardware.devices)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from simtrain.engine.core import run
from simtrain.errors import ConfigError
from simtrain.hardware.devices import find_profile, load_profile, slowdown
from simtrain.program.ir import EOp

MS = 1e-3


def _ops(coll_cls: int = 0) -> list[EOp]:
    """Class 0: a 10 ms GEMM segment on `compute` from 0; a 2 ms op on `pre` then a 4 ms
    all-reduce on `dp` (class `coll_cls`) that starts when `pre` ends, at 2 ms."""
    return [
        EOp(0, 0, "compute", "compute", "F", 10 * MS, "gemm"),
        EOp(1, coll_cls, "pre", "compute", "F", 2 * MS, "pre"),
        EOp(2, coll_cls, "dp", "coll", "dp", 4 * MS, "all_reduce:grads", deps=[1]),
    ]


def test_closed_form_piecewise_rate():
    """Hand derivation, s = 0.2: the GEMM runs alone 0-2 ms (2 ms of its 10 ms done); the
    all-reduce runs 2-6 ms, during which the GEMM progresses at 0.8, so 4 x 0.8 = 3.2 ms more
    (5.2 ms done by 6 ms); the remaining 4.8 ms run at full rate: 6 + 4.8 = 10.8 ms. The
    collective itself is not slowed: it ends at 6 ms."""
    tl = run(_ops(), [0], {("gemm", "all_reduce"): 0.2})
    assert tl.end[0] == pytest.approx(10.8 * MS, rel=1e-12)
    assert tl.end[2] == pytest.approx(6 * MS, rel=1e-12)


def test_two_collectives_take_the_larger_s():
    """Two collectives of different kinds 2-6 ms (s 0.2 and 0.5): the larger, 0.5, applies,
    so 2 + 4 x 0.5 = 4 ms done by 6 ms and 6 ms left: 12 ms. Then an `any` entry covers a kind
    without its own: all_gather under {any: 0.25}: 2 + 3 = 5 done by 6, 5 left: 11 ms."""
    ops = _ops() + [EOp(3, 0, "tp", "coll", "tp", 4 * MS, "all_gather:x", deps=[1])]
    tl = run(ops, [0], {("gemm", "all_reduce"): 0.2, ("gemm", "all_gather"): 0.5})
    assert tl.end[0] == pytest.approx(12 * MS, rel=1e-12)
    ops = _ops()
    ops[2].label = "all_gather:x"
    tl = run(ops, [0], {("gemm", "any"): 0.25, ("gemm", "all_reduce"): 0.9})
    assert tl.end[0] == pytest.approx(11 * MS, rel=1e-12)


def test_no_slowdown_when_s_is_zero():
    """s = 0 (or no table): the GEMM takes its 10 ms as when alone."""
    for table in ({("gemm", "all_reduce"): 0.0}, None, {}):
        assert run(_ops(), [0], table).end[0] == pytest.approx(10 * MS, rel=1e-12)


def test_collective_on_another_device_does_not_slow():
    """The all-reduce runs on class 1 (another device): class 0's GEMM keeps its 10 ms."""
    tl = run(_ops(coll_cls=1), [0, 1], {("gemm", "all_reduce"): 0.2})
    assert tl.end[0] == pytest.approx(10 * MS, rel=1e-12)
    assert tl.end[2] == pytest.approx(6 * MS, rel=1e-12)


def test_slowdown_lookup_rules():
    t = {("gemm", "all_reduce"): 0.2, ("gemm", "any"): 0.1}
    assert slowdown(t, "gemm", "all_reduce") == 0.2
    assert slowdown(t, "gemm", "all_to_all") == 0.1
    assert slowdown(t, "memory", "all_reduce") == 0.0


def _profile(tmp_path: Path, rows: list) -> str:
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump({"schema": "simtrain-profile/1", "base": "h100-sxm5-80gb", "interference": rows}))
    return str(p)


def test_profile_table_loads(tmp_path: Path):
    dev = load_profile(_profile(tmp_path, [{"op": "gemm", "collective": "all_reduce", "s": 0.15, "source": "measured: x"}]))
    assert dev.slowdown_table() == {("gemm", "all_reduce"): 0.15}


@pytest.mark.parametrize("row, key", [
    ({"op": "gemm", "collective": "all_reduce", "s": 1.0, "source": "x"}, "interference[0].s"),
    ({"op": "gemm", "collective": "all_reduce", "s": -0.1, "source": "x"}, "interference[0].s"),
    ({"op": "gemm", "collective": "all_reduce", "s": 0.1, "source": " "}, "interference[0].source"),
    ({"op": "conv", "collective": "all_reduce", "s": 0.1, "source": "x"}, "interference[0].op"),
    ({"op": "gemm", "collective": "bcast", "s": 0.1, "source": "x"}, "interference[0].collective"),
])
def test_profile_table_rejects(tmp_path: Path, row: dict, key: str):
    """Each bad entry is reported with the file, the key path and a fix."""
    path = _profile(tmp_path, [row])
    with pytest.raises(ConfigError) as e:
        load_profile(path)
    text = str(e.value)
    assert path in text and key in text


def test_shipped_tables():
    """Shipped values (sources in the profiles): Lee et al. 2025's 18.9 % average compute slowdown
    gives s = 1 - 1/1.189 = 0.159 for any collective; the A100 GEMM under AllGather of the NCCL
    issue's profile (1.18 ms alone, 2.08 ms overlapped) gives 1 - 1.18/2.08 = 0.433."""

    h100 = load_profile(str(find_profile("h100-public", None))).slowdown_table()
    assert slowdown(h100, "gemm", "all_reduce") == pytest.approx(1 - 1 / 1.189, abs=5e-4)
    a100 = load_profile(str(find_profile("a100-megatron-deepspeed", None))).slowdown_table()
    assert slowdown(a100, "gemm", "all_gather") == pytest.approx(1 - 1.18 / 2.08, abs=5e-4)
    assert slowdown(a100, "gemm", "reduce_scatter") == pytest.approx(0.159)


def test_bench_refuses_without_cuda():
    """The measurement needs CUDA streams running side by side: on the CPU it is refused with a
    fix, before anything is timed."""
    from types import SimpleNamespace

    from simtrain.calibration.bench import run_interference
    with pytest.raises(ConfigError) as e:
        run_interference(SimpleNamespace(kind="cpu"), "bf16", 1, 1)
    assert "--interference" in str(e.value) and "CUDA" in str(e.value)


def _bench_file(tmp_path: Path, rows: list) -> str:
    p = tmp_path / "bench.yaml"
    p.write_text(yaml.safe_dump({"schema": "simtrain-calibration/1", "provenance": {"device": "NVIDIA H100 80GB HBM3", "backend": "cuda"},
                                 "interference": rows}))
    return str(p)


def _row(op: str, coll: str, alone: float, over: float) -> dict:
    return {"op": op, "collective": coll, "m": 8192, "n": 8192, "k": 8192, "bytes": 2 ** 26, "ranks": 2, "dtype": "bf16",
            "alone_s": alone, "median_s": over, "p10_s": over, "p90_s": over, "reps": 20}


def test_calibrate_reads_interference(tmp_path: Path):
    """Hand values: GEMM alone 10 ms, 12.5 ms under all_reduce: s = 1 - 10/12.5 = 0.2; two rows
    (s 0.2 and 0.0) have the median 0.1; the copy proxy's row (8 -> 10 ms, s 0.2) becomes the
    op's `any` entry; an overlapped run faster than alone (noise) is kept at 0. The profile loads."""
    from simtrain.calibration.fit import build_profile
    f = _bench_file(tmp_path, [_row("gemm", "all_reduce", 0.010, 0.0125), _row("gemm", "all_gather", 0.010, 0.0125),
                               _row("gemm", "all_gather", 0.010, 0.010), _row("memory", "copy", 0.008, 0.010),
                               _row("gemm", "copy", 0.010, 0.009)])
    prof = build_profile([f], "h100-test", "h100-sxm5-80gb", "test")
    got = {(r["op"], r["collective"]): r["s"] for r in prof["interference"]}
    assert got == {("gemm", "all_reduce"): 0.2, ("gemm", "all_gather"): 0.1, ("memory", "any"): 0.2, ("gemm", "any"): 0.0}
    assert all(r["source"].startswith("measured: bench.yaml") for r in prof["interference"])
    out = tmp_path / "p.yaml"
    out.write_text(yaml.safe_dump(prof, sort_keys=False))
    assert load_profile(str(out)).slowdown_table()[("gemm", "all_reduce")] == 0.2


def test_calibrate_rejects_bad_interference_row(tmp_path: Path):
    """A row without the op's time alone, or with an unknown collective, is named at its key."""
    from simtrain.calibration.fit import build_profile
    bad = _row("gemm", "bcast", 0.01, 0.02)
    del bad["alone_s"]
    f = _bench_file(tmp_path, [bad])
    with pytest.raises(ConfigError) as e:
        build_profile([f], "x", "h100-sxm5-80gb", "test")
    text = str(e.value)
    assert "interference[0].collective" in text and "interference[0].alone_s" in text


def test_op_starting_under_or_ending_inside_a_collective():
    """A 10 ms GEMM and a 4 ms all-reduce both from 0, s = 0.5: 4 x 0.5 = 2 ms done by 4 ms,
    8 ms left at full rate: 12 ms. A 2 ms GEMM inside a 10 ms all-reduce, s = 0.2: all of it at
    0.8: 2 / 0.8 = 2.5 ms."""
    ops = [EOp(0, 0, "compute", "compute", "F", 10 * MS, "gemm"),
           EOp(1, 0, "dp", "coll", "dp", 4 * MS, "all_reduce:g")]
    assert run(ops, [0], {("gemm", "all_reduce"): 0.5}).end[0] == pytest.approx(12 * MS, rel=1e-12)
    ops = [EOp(0, 0, "compute", "compute", "F", 2 * MS, "gemm"),
           EOp(1, 0, "dp", "coll", "dp", 10 * MS, "all_reduce:g")]
    tl = run(ops, [0], {("gemm", "all_reduce"): 0.2})
    assert tl.end[0] == pytest.approx(2.5 * MS, rel=1e-12) and tl.end[1] == pytest.approx(10 * MS, rel=1e-12)
