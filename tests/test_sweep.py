"""simtrain sweep: grid expansion, executors giving identical rows, resumption, failing points."""
import json
import sqlite3

import pytest
from conftest import small_scenario

from simtrain.cli.main import main
from simtrain.errors import ConfigError
from simtrain.studies.sweep import parse_grid, sweep

# 4 devices (one node), global batch 8. tp and pp change together (tp x pp = 4, dp 1): a grid axis whose
# values are YAML maps sets the whole parallel section. tp=3 does not divide the 8 heads: a failing point.
# 4 plans x micro batch 1 or 2 = 8 points, 6 good and 2 failed.
GRID = ["parallel={tp: 1, pp: 4, dp: 1, schedule: 1f1b},{tp: 2, pp: 2, dp: 1, schedule: 1f1b},"
        "{tp: 4, pp: 1, dp: 1, schedule: 1f1b},{tp: 3, pp: 1, dp: 1, schedule: 1f1b}",
        "training.micro_batch_size=1,2"]


def _scenario(tmp_path, topo):
    return small_scenario(tmp_path, topo, parallel={"tp": 1, "pp": 4})


def _run(path, out, executor="serial", client=None, on_row=None):
    return sweep(path, GRID, out=out, executor=executor, client=client, on_row=on_row, quiet=True)


def test_parse_grid_is_the_cartesian_product_first_axis_slowest():
    assert parse_grid(["a.x=1,2", "b=p,[3,4]"], ["c=0"]) == [
        ["c=0", "a.x=1", "b=p"], ["c=0", "a.x=1", "b=[3,4]"], ["c=0", "a.x=2", "b=p"], ["c=0", "a.x=2", "b=[3,4]"]]
    # keys joined by + move together: 2 points, not 4
    assert parse_grid(["n+d=32+8,64+16"]) == [["n=32", "d=8"], ["n=64", "d=16"]]
    with pytest.raises(ConfigError, match="has 1 parts for 2 keys"):
        parse_grid(["n+d=32,64+16"])


def test_serial_and_process_rows_identical_and_failures_recorded(tmp_path, plain_topology):
    path = _scenario(tmp_path, plain_topology)
    rows_s, st = _run(path, tmp_path / "s")
    # 4 plans x 2 micro batches = 8 points; tp=3 fails for both micro batch sizes (3 does not divide 8 heads)
    assert st.points == 8 and st.distinct == 8 and st.computed == 8 and st.cached == 0
    bad = [r for r in rows_s if r["status"] == "error"]
    assert len(bad) == 2 and all("tp=3 does not divide num_attention_heads=8" in r["error"] for r in bad)
    ok = [r for r in rows_s if r["status"] == "ok"]
    assert len(ok) == 6 and all(r["step_time_s"] > 0 and r["num_devices"] == 4 for r in ok)
    assert [r["key"] for r in rows_s] == sorted(r["key"] for r in rows_s)
    rows_p, _ = _run(path, tmp_path / "p", executor="process")
    assert rows_p == rows_s


def test_dask_rows_identical_to_serial(tmp_path, plain_topology):
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster
    path = _scenario(tmp_path, plain_topology)
    rows_s, _ = _run(path, tmp_path / "s")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp://", host="127.0.0.1",
                      dashboard_address=None) as cl, \
            Client(cl) as client:
        rows_d, st = _run(path, tmp_path / "d", executor="dask", client=client)
        # the command line connects to the same scheduler by its address
        assert main(["sweep", str(path), "--grid", "training.micro_batch_size=1,2", "--executor", "dask",
                     "--scheduler", cl.scheduler_address, "--out", str(tmp_path / "cli")]) == 0
    assert st.computed == 8
    assert rows_d == rows_s
    rows_cli = sqlite3.connect(tmp_path / "cli" / "sweep.sqlite").execute("select count(*) from points where status='ok'").fetchone()
    assert rows_cli == (2,)
    assert main(["sweep", str(path), "--grid", "training.micro_batch_size=1", "--executor", "dask"]) == 2


def test_interrupted_sweep_resumes_computing_only_the_missing_points(tmp_path, plain_topology):
    path = _scenario(tmp_path, plain_topology)
    full, _ = _run(path, tmp_path / "full")
    seen = []

    def stop_after_three(row):
        seen.append(row["key"])
        if len(seen) == 3:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        _run(path, tmp_path / "cut", on_row=stop_after_three)
    db = sqlite3.connect(tmp_path / "cut" / "sweep.sqlite")
    assert db.execute("select count(*) from points").fetchone()[0] == 3       # every committed row survived
    db.close()
    computed = []
    rows, st = _run(path, tmp_path / "cut", on_row=lambda r: computed.append(r["key"]))
    # 8 points, 3 stored before the interruption: exactly the other 5 are computed, none of the 3 again
    assert st.cached == 3 and st.computed == 5 and not set(computed) & set(seen)
    assert rows == full
    # a third run computes nothing
    rows3, st3 = _run(path, tmp_path / "cut", on_row=lambda r: pytest.fail("recomputed"))
    assert st3.computed == 0 and st3.cached == 8 and rows3 == full
    # deleting two rows from the store recomputes exactly those two
    db = sqlite3.connect(tmp_path / "cut" / "sweep.sqlite")
    gone = [k for (k,) in db.execute("select key from points order by key limit 2")]
    db.execute("delete from points where key in (?, ?)", gone)
    db.commit()
    db.close()
    again = []
    rows4, st4 = _run(path, tmp_path / "cut", on_row=lambda r: again.append(r["key"]))
    assert sorted(again) == sorted(gone) and rows4 == full


def test_a_default_valued_override_shares_the_key_and_runs_once(tmp_path, plain_topology):
    path = _scenario(tmp_path, plain_topology)
    # recompute "none" is the scenario's value already: both values resolve to the same scenario
    rows, st = sweep(path, ["training.recompute=none,none"], out=tmp_path / "o", quiet=True)
    assert st.points == 2 and st.distinct == 1 and st.computed == 1 and len(rows) == 1


def test_cli_sweep_writes_store_and_csv(tmp_path, plain_topology, capsys):
    path = _scenario(tmp_path, plain_topology)
    out = tmp_path / "cli"
    assert main(["sweep", str(path), "--grid", "training.micro_batch_size=1,2", "--out", str(out)]) == 0
    text = capsys.readouterr()
    assert "2 points, 2 distinct scenarios, 0 from the store, 2 computed (0 failed)" in text.out
    assert text.err == ""        # stderr is no terminal here: the progress bar stays quiet (simtrain.progress)
    csv = (out / "sweep.csv").read_text().splitlines()
    assert csv[0].startswith("key,overrides,status") and len(csv) == 3
    r = json.loads(sqlite3.connect(out / "sweep.sqlite").execute("select result from points limit 1").fetchone()[0])
    assert r["num_devices"] == 4
    assert main(["sweep", str(path), "--out", str(out)]) == 2
    assert "no grid given" in capsys.readouterr().err
