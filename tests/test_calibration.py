"""The calibration workflow: simtrain bench on the CPU (a tiny grid, seconds), its collective part
on two gloo processes, simtrain calibrate, and a scenario run with the resulting profile; the
profile's interpolation against hand-derived values."""
import math
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simtrain.calibration.fit import fit_alpha_beta
from simtrain.cli.main import main
from simtrain.hardware.devices import ShapeCurve, load_profile

ROOT = Path(__file__).resolve().parent.parent


def test_shape_curve_reproduces_measured_points_and_is_monotone_along_a_level():
    """The docstring's example: levels y = 6 {x 20: 0.4, x 30: 0.8} and y = 8 {x 20: 0.5, x 30: 0.9}
    give 0.6 and 0.7 at x = 25. Then square GEMMs s³ (intensity 2s³ / (2 bytes · 3s²) = s/3, so
    each size is its own level): every measured shape returns its measured efficiency, sizes in
    between are monotone like the data, and a shape beyond the sweep gets the nearest value and
    is flagged."""
    c = ShapeCurve(levels=((6.0, ((20.0, 0.4), (30.0, 0.8))), (8.0, ((20.0, 0.5), (30.0, 0.9)))),
                   origin="t", source="", esize=2.0)
    # query by coordinates (bypassing m, n, k): level values and the bilinear midpoint
    along = ShapeCurve._along
    assert along(c.levels[0][1], 25.0)[0] == pytest.approx(0.6)
    assert along(c.levels[1][1], 25.0)[0] == pytest.approx(0.7)
    # real shapes: every measured point comes back exactly, and efficiency rises with size
    pts = [(s, s, s, 1e12 * e) for s, e in ((256, 0.2), (512, 0.35), (1024, 0.6), (2048, 0.7))]
    sc = ShapeCurve.from_points(pts, peak=1e12, esize=2.0, origin="t", source="")
    for m, n, k, f in pts:
        e, inside = sc.at_shape(m, n, k)
        assert e == pytest.approx(f / 1e12, rel=1e-12) and inside
    mids = [sc.at_shape(s, s, s)[0] for s in (256, 362, 512, 724, 1024, 1448, 2048)]
    assert mids == sorted(mids)
    assert sc.at_shape(8192, 8192, 8192) == (pytest.approx(0.7), False)   # outside: nearest, flagged


def test_alpha_beta_fit_recovers_a_closed_form():
    """t = 10 us + x / 100 GB/s exactly: the fit gives alpha 10 us and peak 100 GB/s."""
    pts = [(x, 10e-6 + x / 100e9) for x in (2 ** 20, 2 ** 24, 2 ** 28, 2 ** 30)]
    a, b = fit_alpha_beta(pts)
    assert a == pytest.approx(10e-6, rel=1e-9) and b == pytest.approx(100e9, rel=1e-9)


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it), so that two test runs on one machine
    do not meet at a fixed rendezvous port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def bench_files(tmp_path_factory):
    pytest.importorskip("torch")
    d = tmp_path_factory.mktemp("bench")
    comp, coll = d / "compute.yaml", d / "coll.yaml"
    assert main(["bench", "--device", "cpu", "--dtype", "bf16", "--tiny", "--warmup", "1", "--reps", "3", "--quiet",
                 "-o", str(comp)]) == 0
    # Two gloo workers on a loaded 2-core machine can lose their rendezvous (a worker dies with
    # SIGABRT, or the free port is taken before torchrun binds it): such a start is retried on a
    # fresh port, up to three times; a bench that fails every time still fails the test.
    for _ in range(3):
        r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                            "--master_port", str(free_port()),
                            "-m", "simtrain", "bench", "--collectives", "--device", "cpu", "--dtype", "fp32",
                            "--min-bytes", "4096", "--max-bytes", "65536", "--warmup", "1", "--reps", "3", "-o", str(coll)],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
        if r.returncode == 0:
            break
    assert r.returncode == 0, r.stderr[-2000:]
    return comp, coll, r.stdout


def test_bench_writes_a_calibration_file_with_provenance(bench_files):
    comp, coll, out = bench_files
    doc = yaml.safe_load(comp.read_text())
    assert doc["schema"] == "simtrain-calibration/1"
    prov = doc["provenance"]
    assert prov["backend"] == "cpu" and prov["dtype"] == "bf16" and prov["torch"] and prov["date"].endswith("Z")
    assert "--tiny" in prov["command"]
    assert {(g["m"], g["n"], g["k"]) for g in doc["gemm"]} == {(64, 64, 64), (128, 128, 128), (128, 256, 64)}
    for g in doc["gemm"]:
        assert 0 < g["p10_s"] <= g["median_s"] <= g["p90_s"] and g["reps"] == 3
    assert {m["op"] for m in doc["memory"]} == {"layer_norm", "rms_norm", "gelu", "silu", "softmax", "add", "adam"}
    assert all(a["pass"] == "fwd+bwd" for a in doc["attention"])


def test_collectives_run_on_two_gloo_processes(bench_files):
    _, coll, out = bench_files
    doc = yaml.safe_load(coll.read_text())
    rows = doc["collectives"]
    assert {r["collective"] for r in rows} == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "sendrecv"}
    for r in rows:
        assert r["ranks"] == 2
        factor = {"all_reduce": 1.0, "sendrecv": 1.0}.get(r["collective"], 0.5)   # 2(n-1)/n = 1, (n-1)/n = 1/2
        assert r["busbw"] == pytest.approx(r["bytes"] / r["median_s"] * factor, rel=1e-12)
    assert "# " in out and "busbw" in out          # nccl-tests-style rows on stdout


def test_calibrate_accepts_bench_output_and_a_scenario_runs_with_the_profile(bench_files, tmp_path):
    comp, coll, _ = bench_files
    prof = tmp_path / "cpu.yaml"
    assert main(["calibrate", str(comp), str(coll), str(ROOT / "tests/data/nccl/all_reduce_2.17.txt"),
                 "--device", "cpu-test", "--base", "a100-sxm4-80gb", "-o", str(prof)]) == 0
    doc = yaml.safe_load(prof.read_text())
    assert doc["schema"] == "simtrain-profile/1" and doc["base"] == "a100-sxm4-80gb"
    assert {c["ranks"] for c in doc["collectives"]} == {2, 8}
    dev = load_profile(str(prof))
    # the measured points come back exactly: a 128^3 bf16 GEMM's efficiency is its TFLOP/s / 312
    g = next(p for p in doc["gemm"][0]["points"] if (p["m"], p["n"], p["k"]) == (128, 128, 128))
    e, inside = dict(dev.gemm_shapes)["16bit"].at_shape(128, 128, 128)
    assert inside and e == pytest.approx(g["tflops"] / 312, rel=1e-12)
    b = doc["memory_bound"]["points"][0]
    assert dev.mem_curve.at(b["bytes"])[0] == pytest.approx(b["bandwidth_GBps"] / 2039, rel=1e-12)
    out = tmp_path / "run"
    assert main(["run", str(ROOT / "scenarios/llama3-8b-h200-64.yaml"), "--set", "cluster.device=a100-sxm4-80gb",
                 "--set", f"cluster.device_profile={prof}", "--out", str(out)]) == 0
    import json
    res = json.loads((out / "result.json").read_text())
    assert any("measured profile" in n for n in res["coverage"])
    assert any("outside the measured" in n for n in res["coverage"])      # tiny grid: flagged, not extrapolated
    warn = res["calibration_warnings"]        # operator curves and collective tables stretched beyond what was measured
    assert any("outside the measured" in n for n in warn) and any("beyond the largest measured size" in n for n in warn)
    assert all("measured" in n for n in warn) and not any("measured profile" in n for n in warn)
    assert math.isfinite(res["step_time_s"]) and res["step_time_s"] > 0


def test_a_profile_for_another_device_is_refused(bench_files, tmp_path, capsys):
    comp, _, _ = bench_files
    prof = tmp_path / "p.yaml"
    assert main(["calibrate", str(comp), "--device", "x", "--base", "a100-sxm4-80gb", "-o", str(prof)]) == 0
    assert main(["check", str(ROOT / "scenarios/llama3-8b-h200-64.yaml"), "--set", f"cluster.device_profile={prof}"]) == 2
    err = capsys.readouterr().err
    assert "cluster.device_profile" in err and "a100-sxm4-80gb" in err


def test_a_bad_profile_gets_errors_at_key_paths(tmp_path, capsys):
    f = tmp_path / "p.yaml"
    f.write_text("schema: simtrain-profile/1\ndevice: x\nbase: a100-sxm4-80gb\ngemm: [bf16]\n"
                 "memory_bound: {points: [{bytes: 1000, bandwidth_GBps: 0}]}\n"
                 "collectives: [{collective: all_reduce, nodes: 1, points: [{bytes: 8}]}]\n")
    assert main(["check", str(ROOT / "scenarios/llama3-8b-h200-64.yaml"), "--set", "cluster.device=a100-sxm4-80gb",
                 "--set", f"cluster.device_profile={f}"]) == 2
    err = capsys.readouterr().err
    for path in ("gemm[0]", "memory_bound.points[0].bandwidth_GBps", "collectives[0].ranks", "collectives[0].points[0].time_us"):
        assert path in err


def test_two_tests_in_one_nccl_log_count_their_own_devices(tmp_path):
    """Two 4-rank all_gather tables one after the other: each sweep has 4 ranks, not 4 then 8."""
    from simtrain.calibration.nccl_tests import read
    text = (ROOT / "tests/data/nccl/all_gather_2.10.txt").read_text()
    f = tmp_path / "all_gather_twice.txt"
    f.write_text(text + text)
    assert [sw.ranks for sw in read(f)] == [4, 4]


def test_permuted_gemm_shapes_share_their_mean():
    """(8192, 1024, 4096) and (1024, 8192, 4096) have the same FLOPs and intensity: one point."""
    sc = ShapeCurve.from_points([(8192, 1024, 4096, 0.6e12), (1024, 8192, 4096, 0.4e12)], peak=1e12, esize=2.0,
                                origin="t", source="")
    assert sc.at_shape(8192, 1024, 4096)[0] == pytest.approx(0.5)


def test_bench_says_how_many_shapes_it_will_measure(tmp_path, capsys):
    """--tiny measures 3 GEMMs, 2 attention shapes and 2 memory sizes (bench.py's tiny grid):
    7 shapes, announced before the first is timed (and counted by a progress bar on a terminal)."""
    pytest.importorskip("torch")
    assert main(["bench", "--device", "cpu", "--dtype", "fp32", "--tiny", "--warmup", "0", "--reps", "1",
                 "-o", str(tmp_path / "b.yaml")]) == 0
    err = capsys.readouterr().err
    assert "measuring 7 shapes: 3 GEMM, 2 attention, 2 memory-bound sizes x 7 ops" in err.splitlines()[0]
