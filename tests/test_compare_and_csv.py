"""`simtrain compare` (sweeps, table, CSV, figure) and the torchtitan CSV schedule interchange."""
import csv

import pytest
import yaml
from conftest import small_scenario

from simtrain.cli.main import main
from simtrain.errors import ConfigError, ScheduleError
from simtrain.schedules import SCHEDULES, build_schedule
from simtrain.schedules.csvio import read_csv, to_csv
from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario
from simtrain.studies.compare import split_values, variants


def test_sweep_values_and_cartesian_product():
    assert split_values("1f1b,zb_v, [1,3,3,1] ,x") == ["1f1b", "zb_v", "[1,3,3,1]", "x"]
    v = variants(["parallel.schedule=1f1b,zb_h1", "training.micro_batch_size=1", "parallel.tp=1,2"])
    # a label names each varied key by its whole path and its value
    assert [label for label, _ in v] == ["parallel.schedule=1f1b parallel.tp=1", "parallel.schedule=1f1b parallel.tp=2",
                                         "parallel.schedule=zb_h1 parallel.tp=1", "parallel.schedule=zb_h1 parallel.tp=2"]
    assert v[1][1] == ["training.micro_batch_size=1", "parallel.schedule=1f1b", "parallel.tp=2"]
    # the unmodified scenario is labelled by what it is, a single variant by its overrides
    assert variants(None) == [("as written", [])]
    assert variants(None, "s.yaml as written") == [("s.yaml as written", [])]
    assert variants(["parallel.tp=4"]) == [("parallel.tp=4", ["parallel.tp=4"])]


def test_compare_writes_table_csv_and_figure(tmp_path, fast_topology, capsys):
    path = small_scenario(tmp_path, fast_topology)
    out = tmp_path / "cmp"
    rc = main(["compare", str(path), "--set", "parallel.schedule=1f1b,zb_h1,zb_v", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "schedule=zb_v" in text
    rows = list(csv.DictReader((out / "compare.csv").open()))
    assert [r["schedule"] for r in rows] == ["1f1b", "zb_h1", "zb_v"]
    # each row is exactly what a separate run of that variant gives
    for r in rows:
        sc, topo = load_scenario(path, [f"parallel.schedule={r['schedule']}"])
        alone = simulate(sc, topo).result
        assert float(r["step_time_s"]) == pytest.approx(alone.step_time_s, rel=1e-6)
        assert float(r["rank0_peak_gib"]) == pytest.approx(alone.memory[0].total / 2**30, rel=1e-4)
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_reports_an_invalid_variant_in_its_row_and_exits_2(tmp_path, fast_topology, capsys):
    path = small_scenario(tmp_path, fast_topology, training={"global_batch_size": 6})
    rc = main(["compare", str(path), "--set", "parallel.schedule=1f1b,interleaved_1f1b"])
    out = capsys.readouterr()
    assert rc == 2
    assert "schedule=interleaved_1f1b" in out.out and "invalid:" in out.out and "not a multiple of pp=4" in out.out
    assert "Traceback" not in out.err


# ------------------------------------------------------------------------------------------------
# torchtitan CSV

def test_csv_export_format():
    """The docstring's worked example: 1F1B, 2 ranks, 2 microbatches; full backward is 'B'."""
    assert to_csv(build_schedule("1f1b", 2, 2)) == "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"
    zb = to_csv(build_schedule("zb_h1", 2, 3)).splitlines()
    assert zb[0] == "0F0,0F1,0I0,0W0,0F2,0I1,0W1,0I2,0W2"      # split backward: I then W
    v = to_csv(build_schedule("zb_v", 2, 3)).splitlines()
    assert v[0].startswith("0F0,") and "3F0" in v[0]              # rank 0 holds stages 0 and 3


@pytest.mark.parametrize("name", sorted(n for n in SCHEDULES if n != "dualpipe"))
def test_csv_round_trip(tmp_path, name):
    s = build_schedule(name, 4, 8, 2 if name == "interleaved_1f1b" else 1)
    f = tmp_path / "s.csv"
    f.write_text(to_csv(s))
    back = read_csv(f)
    assert back.actions == s.actions
    assert [tuple(a.overlap_next for a in acts) for acts in back.actions] == [tuple(a.overlap_next for a in acts) for acts in s.actions]
    assert back.stage_of == s.stage_of and back.route(0) == s.route(0)


def test_dualpipe_cannot_be_exported():
    with pytest.raises(ScheduleError, match="holds some model stages on two ranks"):
        to_csv(build_schedule("dualpipe", 4, 8))


def test_hand_written_csv_simulates_like_the_builtin(tmp_path, fast_topology):
    """A CSV with torchtitan's communication actions mixed in runs exactly like the built-in 1F1B."""
    rows = to_csv(build_schedule("1f1b", 4, 8)).splitlines()
    rows[0] = rows[0].replace("0F0,", "0F0,0SEND_F0,,")            # comm actions and an empty slot are skipped
    (tmp_path / "mine.csv").write_text("\n".join(rows) + "\n")
    path = small_scenario(tmp_path, fast_topology)
    d = yaml.safe_load(path.read_text())
    del d["parallel"]["schedule"]
    d["parallel"]["schedule_csv"] = "mine.csv"
    path.write_text(yaml.safe_dump(d))
    sc, topo = load_scenario(path)
    r = simulate(sc, topo).result
    assert r.schedule == "csv:mine"
    sc1, topo1 = load_scenario(small_scenario(tmp_path, fast_topology))
    assert r.step_time_s == simulate(sc1, topo1).result.step_time_s


def test_bad_csv_is_one_clear_error(tmp_path, fast_topology, capsys):
    (tmp_path / "bad.csv").write_text("0F0,0X1\n")
    with pytest.raises(ConfigError, match=r"bad.csv: row 1, cell 2: '0X1' is not an action; write <stage><F\|I\|W\|B><microbatch>"):
        read_csv(tmp_path / "bad.csv")
    (tmp_path / "dead.csv").write_text("0F0,0B0\n")     # a single stage whose B has no F first is fine; a missing B is not
    (tmp_path / "short.csv").write_text("0F0,0F1,0B0\n")
    with pytest.raises(ConfigError, match="microbatch 1 has F×1"):
        read_csv(tmp_path / "short.csv")
    path = small_scenario(tmp_path, fast_topology)
    d = yaml.safe_load(path.read_text())
    del d["parallel"]["schedule"]
    d["parallel"]["schedule_csv"] = "dead.csv"
    path.write_text(yaml.safe_dump(d))
    rc = main(["run", str(path)])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert "parallel.schedule_csv: the schedule has 1 rows, the plan pp=4" in err


def test_schedule_command_prints_and_exports(tmp_path, fast_topology, capsys):
    path = small_scenario(tmp_path, fast_topology, parallel={"schedule": "zb_h1"})
    rc = main(["schedule", str(path), "--csv", str(tmp_path / "out.csv")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "rank 0: 0F0 0F1 0F2 0F3 0B0 0W0 0F4" in out
    assert read_csv(tmp_path / "out.csv").actions == build_schedule("zb_h1", 4, 8).actions


def test_csv_without_compute_or_not_text_is_a_clear_error(tmp_path):
    (tmp_path / "comm.csv").write_text("0SEND_F0\n,,\n")
    with pytest.raises(ConfigError, match="no compute actions"):
        read_csv(tmp_path / "comm.csv")
    (tmp_path / "bin.csv").write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="not a UTF-8 text file"):
        read_csv(tmp_path / "bin.csv")


def test_overlapped_pair_must_be_independent(tmp_path):
    """A pair runs both actions at once, so one cannot need the other (here B0 needs F0)."""
    (tmp_path / "pair.csv").write_text("0F0,(1F0;1B0)OVERLAP_F_B,0B0\n")
    with pytest.raises(ConfigError, match="depend on each other"):
        read_csv(tmp_path / "pair.csv")


def test_schedule_csv_set_from_the_command_line_replaces_the_schedule(tmp_path, fast_topology):
    """`--set parallel.schedule_csv=FILE` works on a scenario that names a schedule: the CSV wins."""
    (tmp_path / "zb.csv").write_text(to_csv(build_schedule("zb_h1", 4, 8)))
    path = small_scenario(tmp_path, fast_topology, parallel={"schedule": "gpipe"})
    sc, topo = load_scenario(path, [f"parallel.schedule_csv={tmp_path / 'zb.csv'}"])
    assert simulate(sc, topo).result.schedule == "csv:zb"


def test_exporting_dualpipe_names_the_scenario_and_key(tmp_path, fast_topology, capsys):
    path = small_scenario(tmp_path, fast_topology, parallel={"schedule": "dualpipe"})
    rc = main(["schedule", str(path), "--csv", str(tmp_path / "x.csv")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(f"{path}: parallel.schedule: ") and not (tmp_path / "x.csv").exists()


def test_compare_names_the_variant_a_warning_is_about_and_labels_fp8_mfu(capsys):
    """An FP8 recipe with precision bf16,fp8: the recipe is unused on the bf16 variant only, so the
    warning names that variant's overrides; the FP8 row's MFU is of the FP8 peak and says so."""
    from conftest import ROOT
    path = ROOT / "scenarios" / "llama3-8b-h200-64.yaml"
    assert main(["compare", str(path), "--set", "training.precision=bf16,fp8", "--set", "training.fp8_recipe=current",
                 "--set", "training.global_batch_size=64"]) == 0
    cap = capsys.readouterr()
    assert f"{path} (--set training.fp8_recipe=current --set training.global_batch_size=64 --set training.precision=bf16): " \
           "training.fp8_recipe current is used only with training.precision: fp8" in cap.err
    assert "training.precision=fp8)" not in cap.err
    fp8_row = next(line for line in cap.out.splitlines() if line.lstrip().startswith("training.precision=fp8"))
    bf16_row = next(line for line in cap.out.splitlines() if line.lstrip().startswith("training.precision=bf16"))
    assert "%*" in fp8_row and "%*" not in bf16_row
    assert "* MFU of the FP8 peak" in cap.out
    from simtrain.studies.compare import run_variants, to_csv
    rows = list(csv.DictReader(to_csv(run_variants(path, ["training.precision=bf16,fp8",
                                                          "training.global_batch_size=64"])).splitlines()))
    assert [r["mfu_peak"] for r in rows] == ["bf16", "fp8"]
