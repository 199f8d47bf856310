"""Bad output paths and faults: each case exits 2 with one `<path>: <what>; <fix>` line, no
traceback, and leaves nothing behind (the files under the test directory are as before)."""
import importlib.util
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import small_scenario

import simtrain.cli.run as run_cli
from simtrain.cli.main import main
from simtrain.results import io as rio
from simtrain.studies import runner

ROOT = os.geteuid() == 0 if hasattr(os, "geteuid") else False
REPO = Path(__file__).resolve().parents[1]


def _tree(d: Path) -> dict:
    return {str(p.relative_to(d)): (p.is_dir(), p.stat().st_size if p.is_file() else 0) for p in sorted(d.rglob("*"))}


@pytest.fixture
def ctx(tmp_path, plain_topology):
    sc = small_scenario(tmp_path, plain_topology)
    (tmp_path / "afile").write_text("keep me\n")
    (tmp_path / "hasdir").mkdir()
    (tmp_path / "hasdir" / "result.json").mkdir()
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "sweep.sqlite").mkdir()
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "sweep.sqlite").write_bytes(b"this is not a database at all" * 100)
    (tmp_path / "foreign").mkdir()
    db = sqlite3.connect(tmp_path / "foreign" / "sweep.sqlite")
    db.execute("create table points (a, b)")
    db.commit()
    db.close()
    ro = tmp_path / "readonly"
    ro.mkdir()
    os.chmod(ro, 0o500)
    yield {"sc": str(sc), "t": str(tmp_path), "file": str(tmp_path / "afile"), "ro": str(ro)}
    os.chmod(ro, 0o700)


SWEEP = ["--grid", "training.micro_batch_size=1,2"]

# (case, command with {sc} {t} {file} {ro}, words the one error line must hold)
CASES = [
    ("run --out is a file", "run {sc} --out {file}", ["afile", "--out expects a directory", "this is a file"]),
    ("run --out under a file", "run {sc} --out {file}/sub", ["afile/sub", "is a file, not a directory"]),
    ("run --out /dev/null", "run {sc} --out /dev/null", ["/dev/null", "expects a directory"]),
    ("run --out under /proc", "run {sc} --out /proc/simtrain-out", ["/proc/simtrain-out", "cannot be written"]),
    ("run --out read-only dir", "run {sc} --out {ro}/x", ["readonly/x", "cannot be written"]),
    ("run --out file is a dir", "run {sc} --out {t}/hasdir", ["hasdir/result.json", "is a directory"]),
    ("compare --out is a file", "compare {sc} --set training.micro_batch_size=1,2 --out {file}", ["afile", "expects a directory"]),
    ("compare --out under /proc", "compare {sc} --out /proc/simtrain-out", ["/proc/simtrain-out", "cannot be written"]),
    ("search --out under a file", "search {sc} --out {file}/s", ["afile/s", "is a file, not a directory"]),
    ("reliability --out is a file", "reliability {sc} --days 1 --trials 2 --out {file}", ["afile", "expects a directory"]),
    ("reliability --out /dev/null", "reliability {sc} --days 1 --trials 2 --out /dev/null", ["/dev/null", "expects a directory"]),
    ("sweep --out is a file", "sweep {sc} --grid training.micro_batch_size=1,2 --out {file}", ["afile", "expects a directory"]),
    ("sweep store is a dir", "sweep {sc} --grid training.micro_batch_size=1,2 --out {t}/store", ["sweep.sqlite", "is a directory"]),
    ("sweep --out under /proc", "sweep {sc} --grid training.micro_batch_size=1,2 --out /proc/x", ["/proc/x", "cannot be written"]),
    ("sweep store corrupted", "sweep {sc} --grid training.micro_batch_size=1,2 --out {t}/garbage",
     ["garbage/sweep.sqlite", "is not a sweep store", "start the sweep afresh"]),
    ("sweep store foreign table", "sweep {sc} --grid training.micro_batch_size=1,2 --out {t}/foreign",
     ["foreign/sweep.sqlite", "is not a sweep store", "columns a, b"]),
    ("sweep --plot-x list values", "sweep {sc} --grid parallel.device_of_rank=[0,1,2,3],[3,2,1,0] --plot-x parallel.device_of_rank --out {t}/p",
     ["--plot-x", "is a list", "needs numbers"]),
    ("sweep --plot-x not a grid key", "sweep {sc} --grid training.micro_batch_size=1,2 --plot-x cluster.nodes --out {t}/p",
     ["--plot-x: cluster.nodes", "not a key of the grid", "training.micro_batch_size"]),
    ("sweep --plot-x with another varying axis",
     "sweep {sc} --grid cluster.nodes=1,2 --grid training.micro_batch_size=1,2 --plot-x cluster.nodes --out {t}/p",
     ["--plot-x: cluster.nodes", "also varies training.micro_batch_size (2 values)", "hold the others with --set"]),
    ("sweep --workers 0", "sweep {sc} --grid training.micro_batch_size=1,2 --executor process --workers 0 --out {t}/w",
     ["--workers", "must be >= 1"]),
    ("schedule --csv is a dir", "schedule {sc} --csv {t}", ["--csv expects a file", "this is a directory"]),
    ("schedule --csv /dev/null", "schedule {sc} --csv /dev/null", ["/dev/null", "not a regular file"]),
    ("schedule --csv under a file", "schedule {sc} --csv {file}/x.csv", ["afile/x.csv", "is a file, not a directory"]),
    ("schedule --csv under /proc", "schedule {sc} --csv /proc/x.csv", ["/proc/x.csv", "cannot be written"]),
    ("bench -o is a dir", "bench --tiny --device cpu -o {t}", ["-o expects a file"]),
    ("bench -o /dev/null", "bench --tiny --device cpu -o /dev/null", ["/dev/null", "not a regular file"]),
    ("bench --reps 0", "bench --tiny --device cpu --reps 0 -o {t}/b.yaml", ["--reps", "must be >= 1"]),
    ("bench --collectives without torchrun", "bench --collectives -o {t}/b.yaml", ["--collectives", "torchrun"]),
    ("bench --device mlu without torch_mlu", "bench --tiny --device mlu -o {t}/b.yaml", ["--device: mlu", "torch_mlu"]),
    ("calibrate -o is a dir", "calibrate {file} --device x --base a100-sxm4-80gb -o {t}", ["-o expects a file"]),
    ("calibrate -o under a file", "calibrate {file} --device x --base a100-sxm4-80gb -o {file}/p.yaml", ["afile/p.yaml", "not a directory"]),
]


@pytest.mark.parametrize("case,command,words", CASES, ids=[c[0] for c in CASES])
def test_bad_output_is_one_clear_line(case, command, words, ctx, capsys, monkeypatch):
    if case == "run --out read-only dir" and ROOT:
        pytest.skip("root writes into a 0500 directory; the /proc cases cover an unwritable place")
    if "mlu" in case and importlib.util.find_spec("torch_mlu") is not None:
        pytest.skip("torch_mlu is installed here")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    t = Path(ctx["t"])
    before = _tree(t)
    t0 = time.perf_counter()
    rc = main(command.format(**ctx).split())
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "; " in lines[0], err
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert _tree(t) == before                     # nothing created, nothing half-written
    assert time.perf_counter() - t0 < 30          # checked before simulating


def test_truncated_sweep_store_is_named(ctx, capsys):
    out = Path(ctx["t"]) / "cut"
    assert main(["sweep", ctx["sc"], *SWEEP, "--out", str(out)]) == 0
    db = out / "sweep.sqlite"
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 3])
    for f in out.glob("sweep.sqlite-*"):
        f.unlink()
    capsys.readouterr()
    before = _tree(out)
    assert main(["sweep", ctx["sc"], *SWEEP, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"{db}: is not a sweep store" in err and "afresh" in err
    assert _tree(out) == before


def test_unreachable_dask_scheduler_fails_fast(ctx):
    pytest.importorskip("distributed")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "simtrain", "sweep", ctx["sc"], *SWEEP, "--executor", "dask",
                        "--scheduler", "tcp://127.0.0.1:9", "--out", ctx["t"] + "/dask"],
                       capture_output=True, text=True, timeout=60, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "--scheduler: tcp://127.0.0.1:9: cannot reach the Dask scheduler" in p.stderr
    assert time.perf_counter() - t0 < 20
    assert not (Path(ctx["t"]) / "dask").exists()


def _bug_at_mb2(real):
    def simulate(sc, topo, *a, **k):
        if sc.training.micro_batch_size == 2:
            raise RuntimeError("boom at mb 2")
        return real(sc, topo, *a, **k)
    return simulate


def test_compare_keeps_valid_variants_when_one_hits_a_bug(ctx, capsys, monkeypatch):
    monkeypatch.setattr(runner, "simulate", _bug_at_mb2(runner.simulate))
    out = Path(ctx["t"]) / "cmp"
    rc = main(["compare", ctx["sc"], "--set", "training.micro_batch_size=1,2", "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 2 and "Traceback" not in cap.err
    assert "internal error with training.micro_batch_size=2: RuntimeError: boom at mb 2" in cap.out
    csv = (out / "compare.csv").read_text().splitlines()
    assert len(csv) == 3 and "boom at mb 2" in csv[2] and csv[1].split(",")[3]      # the valid variant has a step time


@pytest.mark.parametrize("executor", ["serial", "process"])
def test_sweep_records_a_bug_as_a_failed_row_and_goes_on(executor, ctx, capsys, monkeypatch):
    monkeypatch.setattr(runner, "simulate", _bug_at_mb2(runner.simulate))      # forked workers inherit it
    out = Path(ctx["t"]) / f"sw-{executor}"
    rc = main(["sweep", ctx["sc"], *SWEEP, "--executor", executor, "--workers", "2", "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 2 and "Traceback" not in cap.err and "1 of 2 points have no result" in cap.err
    rows = sqlite3.connect(out / "sweep.sqlite").execute("select status, error from points order by status").fetchall()
    assert [r[0] for r in rows] == ["failed", "ok"] and "RuntimeError: boom at mb 2" in rows[0][1]
    # a rerun keeps the good row and tries the failed point again
    monkeypatch.undo()
    assert main(["sweep", ctx["sc"], *SWEEP, "--out", str(out)]) == 0
    assert "1 from the store, 1 computed (0 failed)" in capsys.readouterr().out


def test_sweep_whose_every_point_fails_exits_2(ctx, capsys):
    rc = main(["sweep", ctx["sc"], "--grid", "parallel.tp=3,5", "--out", ctx["t"] + "/allbad"])
    cap = capsys.readouterr()
    assert rc == 2 and "2 of 2 points have no result" in cap.err and "Traceback" not in cap.err


def test_a_failure_while_writing_leaves_out_as_it_was(ctx, capsys, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("figure failed")
    out = Path(ctx["t"]) / "runout"
    monkeypatch.setattr(run_cli, "timeline_png", broken)
    with pytest.raises(RuntimeError):
        main(["run", ctx["sc"], "--out", str(out)])
    assert not out.exists()
    assert not [p for p in Path(ctx["t"]).iterdir() if p.name.endswith(".tmp")]
    monkeypatch.undo()
    assert main(["run", ctx["sc"], "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(run_cli.OUT_FILES)


def test_a_refused_run_into_a_used_out_says_its_files_are_an_earlier_runs(ctx, capsys):
    """A run refused before it writes leaves --out as it was, and says that what is there is not
    this run's; into an empty or new directory the error stands alone."""
    out = Path(ctx["t"]) / "used"
    assert main(["run", ctx["sc"], "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert main(["run", ctx["sc"], "--out", str(out), "--set", "parallel.tp=0"]) == 2
    err = capsys.readouterr().err
    assert f"nothing was written: {out}/ keeps the files of an earlier run (run_info.json there names that run)" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert main(["run", ctx["sc"], "--out", str(Path(ctx["t"]) / "fresh"), "--set", "parallel.tp=0"]) == 2
    assert "nothing was written" not in capsys.readouterr().err


def test_stale_temporaries_of_a_killed_run_are_removed(ctx, capsys):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = Path(ctx["t"]) / "stale"
    out.mkdir()
    left = out / f".result.json.{dead.pid}.abcd1234.tmp"
    left.write_bytes(b"")
    beside = Path(ctx["t"]) / f".stale.{dead.pid}.zz99.tmp"
    beside.mkdir()
    mine = out / f".result.json.{os.getpid()}.live.tmp"          # a live writer's temporary stays
    mine.write_bytes(b"")
    assert main(["run", ctx["sc"], "--out", str(out)]) == 0
    assert not left.exists() and not beside.exists() and mine.exists()
    # -o files too
    csv = Path(ctx["t"]) / "s.csv"
    old = Path(ctx["t"]) / f".s.csv.{dead.pid}.q1.tmp"
    old.write_bytes(b"")
    assert main(["schedule", ctx["sc"], "--csv", str(csv)]) == 0
    assert csv.is_file() and not old.exists()


def test_publishers_into_one_directory_take_turns(tmp_path):
    """Two staged runs published into one directory: the result is one run's files, not a mix."""
    target = tmp_path / "out"
    for tag in ("a", "b"):
        with rio.staged_dir(target) as d:
            (d / "x.txt").write_text(tag)
            (d / "y.txt").write_text(tag)
    assert (target / "x.txt").read_text() == (target / "y.txt").read_text() == "b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


KILL_SCRIPT = """
import sys, time
from simtrain.studies import runner
def slow(*a, **k):
    time.sleep(120)
runner.simulate = slow
import simtrain.cli.run as run_cli
from simtrain.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _children(pid: int) -> list:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                st = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(st[1]) == pid:
                out.append(int(d.name))
    return out


def _alive(pid: int) -> bool:
    try:
        st = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return st[0] != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killing_a_process_sweep_ends_its_workers(sig, ctx):
    p = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, "sweep", ctx["sc"], *SWEEP, "--executor", "process",
                          "--workers", "2", "--out", ctx["t"] + "/killed"],
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        workers = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(workers) < 2:
            time.sleep(0.2)
            workers = [c for c in _children(p.pid) if _alive(c)]
        assert workers, "the sweep started no workers"
        time.sleep(0.5)
        p.send_signal(sig)
        p.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(w) for w in workers):
            time.sleep(0.2)
        assert not [w for w in workers if _alive(w)]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for w in _children(p.pid):
            try:
                os.kill(w, signal.SIGKILL)
            except OSError:
                pass
