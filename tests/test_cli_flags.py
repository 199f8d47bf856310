"""The command line's shared flags: `--set` on every command that reads a scenario, one axis syntax
for compare and sweep (`k=v1,v2`, `a+b=1+2,3+4`), topology keys overridable as
`cluster.topology.<key>`, paths given on the command line taken from the current directory and
paths written in a file from the file's directory, tables that never cut the column telling rows
apart, and progress bars on the long commands."""
from __future__ import annotations

import csv
import json
import re

import pytest
import yaml
from conftest import ROOT, small_scenario, write

from simtrain import progress
from simtrain.cli.main import main
from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario
from simtrain.spec.overrides import parse_axes
from simtrain.studies import compare, sweep, validate
from simtrain.studies.textable import Column, render

OVERSUB = "cluster.topology.scale_out.oversubscription"


# --- --set means the same on every command ---------------------------------------------------------

def _commands(path, tmp_path):
    """(name, argv) of every command that reads a scenario, each with a bad --set of parallel.tp."""
    bad = ["--set", "parallel.tp=zero"]
    s = str(path)
    return [
        ("run", ["run", s] + bad),
        ("check", ["check", s] + bad),
        ("schedule", ["schedule", s] + bad),
        ("compare", ["compare", s] + bad),
        ("sweep", ["sweep", s, "--grid", "training.recompute=none", "--out", str(tmp_path / "sw")] + bad),
        ("search", ["search", s] + bad),
        ("reliability", ["reliability", s, "--days", "1", "--trials", "1"] + bad),
        ("bench --for", ["bench", "--for", s, "-o", str(tmp_path / "bench.yaml"), "--tiny", "--device", "cpu"] + bad),
        ("validate vtrain", ["validate", "vtrain", "--limit", "1"] + bad),
    ]


COMMANDS = ("run", "check", "schedule", "compare", "sweep", "search", "reliability", "bench --for", "validate vtrain")


@pytest.mark.parametrize("i", range(len(COMMANDS)), ids=COMMANDS)
def test_set_reaches_the_scenario_of_every_command(i, tmp_path, fast_topology, capsys):
    """A wrong value given with --set is the scenario's error on every command: exit 2, the key path
    named, no traceback (so the flag is wired to the scenario, with the same meaning)."""
    path = small_scenario(tmp_path, fast_topology)
    name, argv = _commands(path, tmp_path)[i]
    assert name == COMMANDS[i]
    if name == "bench --for":
        pytest.importorskip("torch")
    assert main(argv) == 2, name
    cap = capsys.readouterr()
    err = cap.err + (cap.out if name in ("compare", "sweep") else "")     # these two report a bad point in its row
    assert "parallel.tp:" in err and "Traceback" not in err, (name, err)


def test_set_changes_what_schedule_and_check_show(tmp_path, fast_topology, capsys):
    path = small_scenario(tmp_path, fast_topology)
    assert main(["schedule", str(path), "--set", "parallel.schedule=gpipe"]) == 0
    assert capsys.readouterr().out.startswith("gpipe:")
    # `a+b=1+2` sets both keys in a single-scenario command too
    assert main(["check", str(path), "--set", "parallel.tp+parallel.pp=2+2"]) == 0
    assert "tp 2 x cp 1 x dp 1 x pp 2" in capsys.readouterr().out


def test_validate_vtrain_set_overrides_every_run_and_runs_selects(capsys):
    """--set is an override there too; --runs selects the set (the former `--set both` still works)."""
    assert main(["validate", "vtrain", "--limit", "1", "--runs", "single"]) == 0
    assert capsys.readouterr().out.startswith("single: 1 runs")
    assert main(["validate", "vtrain", "--limit", "1", "--set", "single"]) == 0
    assert capsys.readouterr().out.startswith("single: 1 runs")
    # the first multi-node run with a 2x slower scale-out fabric cannot be faster than without
    base = validate.evaluate_vtrain("multi", 1)[0].predicted_s
    slow = validate.evaluate_vtrain("multi", 1, overrides=["cluster.topology.scale_out.nic_bandwidth=100 Gb/s"])[0].predicted_s
    assert slow > base


# --- one axis syntax for compare and sweep ---------------------------------------------------------

def test_axis_parser_is_shared_and_zips_joined_keys():
    """`a+b=1+2,3+4` is one axis of two points (hand-listed), the same for compare's --set and sweep's --grid."""
    fixed, axes = parse_axes(["parallel.tp+parallel.pp=1+4,2+2", "training.recompute=none"])
    assert fixed == ["training.recompute=none"]
    assert [a.values for a in axes] == [[["parallel.tp=1", "parallel.pp=4"], ["parallel.tp=2", "parallel.pp=2"]]]
    assert [o for _, o in compare.variants(["parallel.tp+parallel.pp=1+4,2+2"])] == \
        sweep.parse_grid(["parallel.tp+parallel.pp=1+4,2+2"])
    # sweep's --set with several values is an axis, as in compare
    assert sweep.parse_grid(["parallel.tp=1,2"], ["training.recompute=none,full"]) == [
        ["parallel.tp=1", "training.recompute=none"], ["parallel.tp=1", "training.recompute=full"],
        ["parallel.tp=2", "training.recompute=none"], ["parallel.tp=2", "training.recompute=full"]]


def test_compare_zipped_axis_rows_equal_separate_runs(tmp_path, fast_topology, capsys):
    path = small_scenario(tmp_path, fast_topology)
    out = tmp_path / "cmp"
    assert main(["compare", str(path), "--set", "parallel.tp+parallel.pp=1+4,2+2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "parallel.tp=1 parallel.pp=4" in text and "parallel.tp=2 parallel.pp=2" in text
    rows = list(csv.DictReader((out / "compare.csv").open()))
    assert [r["variant"] for r in rows] == ["parallel.tp=1 parallel.pp=4", "parallel.tp=2 parallel.pp=2"]
    for r, over in zip(rows, (["parallel.tp=1", "parallel.pp=4"], ["parallel.tp=2", "parallel.pp=2"])):
        alone = simulate(*load_scenario(path, over)).result
        assert float(r["step_time_s"]) == pytest.approx(alone.step_time_s, rel=1e-9)


def test_compare_bad_joined_axis_exits_2_naming_it(tmp_path, fast_topology, capsys):
    path = small_scenario(tmp_path, fast_topology)
    assert main(["compare", str(path), "--set", "parallel.tp+parallel.pp=1+4,2"]) == 2
    err = capsys.readouterr().err
    assert "--set parallel.tp+parallel.pp: value '2' has 1 parts for 2 keys" in err and "Traceback" not in err


def test_compare_labels_the_unmodified_scenario_by_what_it_is(tmp_path, fast_topology, capsys):
    path = small_scenario(tmp_path, fast_topology)
    assert main(["compare", str(path)]) == 0
    assert "small.yaml as written" in capsys.readouterr().out


# --- topology keys from the scenario and the command line -----------------------------------------

def test_topology_key_override_equals_a_copy_of_the_file_with_that_value(tmp_path, plain_topology):
    """--set cluster.topology.scale_out.oversubscription=4 gives exactly the fabric of a copy of the
    file with `oversubscription: 4` (plain_topology says 2), and the scenario-file mapping form too."""
    path = small_scenario(tmp_path, plain_topology, nodes=4, parallel={"tp": 1, "pp": 4, "dp": 4},
                          training={"global_batch_size": 16})
    doc = yaml.safe_load(plain_topology.read_text())
    doc["scale_out"]["oversubscription"] = 4
    copy = tmp_path / "copy.yaml"
    copy.write_text(yaml.safe_dump(doc))
    _, t_copy = load_scenario(path, [f"cluster.topology={copy}"])
    _, t_set = load_scenario(path, [f"{OVERSUB}=4"])
    _, t_file = load_scenario(path)
    a, c = 0, 2 * 4        # node 0 and node 2: different leaves (2 nodes per leaf)
    assert t_set.link(a, c).bw == t_copy.link(a, c).bw
    assert t_set.describe() == t_copy.describe() and "4:1 at the leaves" in t_set.describe()
    assert "2:1 at the leaves" in t_file.describe()
    d = yaml.safe_load(path.read_text())
    d["cluster"]["topology"] = {"file": plain_topology.name, "scale_out": {"oversubscription": 4}}
    path.write_text(yaml.safe_dump(d))
    sc, t_map = load_scenario(path)
    assert t_map.describe() == t_copy.describe()
    # the resolved scenario keeps the override and loads back to the same fabric
    assert sc.resolved()["cluster"]["topology"]["scale_out"] == {"oversubscription": 4}
    back = tmp_path / "resolved.yaml"
    back.write_text(yaml.safe_dump(sc.resolved()))
    assert load_scenario(back)[1].describe() == t_copy.describe()


def test_topology_key_errors_name_the_argument_and_key(tmp_path, plain_topology, capsys):
    path = small_scenario(tmp_path, plain_topology)
    assert main(["check", str(path), "--set", f"{OVERSUB}=0.5"]) == 2
    err = capsys.readouterr().err
    # the value came from --set, so the message names that argument (and the key) beside the file
    assert err.startswith(f"{path} (--set {OVERSUB}=0.5): {OVERSUB}: must be >= 1") and "Traceback" not in err


def test_topology_keys_as_compare_and_sweep_axes(tmp_path, plain_topology, capsys):
    path = small_scenario(tmp_path, plain_topology)
    assert main(["compare", str(path), "--set", f"{OVERSUB}=1,2,4"]) == 0
    text = capsys.readouterr().out
    assert all(f"{OVERSUB}={v}" in text for v in (1, 2, 4))
    rows, st = sweep.sweep(path, [f"{OVERSUB}=1,2,4"], out=tmp_path / "sw", quiet=True)
    # three fabrics: three resolved scenarios, three keys of the store
    assert st.distinct == 3 and all(r["status"] == "ok" for r in rows)


def test_search_fix_sets_any_key(tmp_path, plain_topology, capsys):
    """--fix on a key that is no plan axis is an override of every plan, topology keys included."""
    path = small_scenario(tmp_path, plain_topology)
    out = tmp_path / "o"
    assert main(["search", str(path), "--fix", "parallel.placement=scattered", "--fix", f"{OVERSUB}=4",
                 "--fix", "network.protocol=Simple", "--max-candidates", "2", "--out", str(out)]) == 0
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["parallel"]["placement"] == "scattered" and best["network"]["protocol"] == "Simple"
    assert best["cluster"]["topology"]["scale_out"] == {"oversubscription": 4}
    sc, topo = load_scenario(out / "best.yaml")
    assert "4:1 at the leaves" in topo.describe()


# --- paths: from the current directory on the command line, from the file's directory in a file ---

def _two_dirs(tmp_path, monkeypatch):
    """Directory a/ holds the scenario, b/ is the current directory; each has a t.yaml, a cfg.json
    and a sched.csv of the same names but different content."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    for d, layers in ((a, 8), (b, 4)):
        write(d / "t.yaml", f"""
            name: in-{d.name}
            kind: two_tier
            devices_per_node: 4
            scale_up: {{bandwidth: "100 GB/s", latency: "2 us"}}
            scale_out: {{nics_per_node: 4, nic_bandwidth: "80 Gb/s", latency: "5 us"}}
        """)
        (d / "cfg.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": layers, "hidden_size": 256,
                                                "num_attention_heads": 8, "intermediate_size": 512, "vocab_size": 1024}))
    path = small_scenario(a, a / "t.yaml")
    d = yaml.safe_load(path.read_text())
    d["cluster"]["topology"] = "t.yaml"
    path.write_text(yaml.safe_dump(d))
    monkeypatch.chdir(b)
    assert main(["schedule", str(path), "--csv", str(a / "sched.csv")]) == 0
    assert main(["schedule", str(path), "--csv", str(b / "sched.csv")]) == 0
    return a, b, path


def test_paths_in_the_file_from_its_directory_on_the_command_line_from_cwd(tmp_path, monkeypatch, capsys):
    a, b, path = _two_dirs(tmp_path, monkeypatch)
    _, topo = load_scenario(path)
    assert topo.name == "in-a"                                  # written in the file: beside it
    _, topo = load_scenario(path, ["cluster.topology=t.yaml"])
    assert topo.name == "in-b"                                  # given on the command line: the cwd
    _, topo = load_scenario(path, ["cluster.topology.file=t.yaml", f"{OVERSUB}=2"])
    assert topo.name == "in-b"
    # schedule_csv
    d = yaml.safe_load(path.read_text())
    d["parallel"]["schedule_csv"] = "sched.csv"
    path.write_text(yaml.safe_dump(d))
    sc, _ = load_scenario(path)
    assert sc.parallel.schedule_csv == str((a / "sched.csv").resolve())
    sc, _ = load_scenario(path, ["parallel.schedule_csv=sched.csv"])
    assert sc.parallel.schedule_csv == str((b / "sched.csv").resolve())
    # model.hf_config: a/cfg.json has 8 layers, b/cfg.json 4
    d["model"] = {"hf_config": "cfg.json", "seq_length": 128}
    del d["parallel"]["schedule_csv"]
    path.write_text(yaml.safe_dump(d))
    assert load_scenario(path)[0].model.num_layers == 8
    assert load_scenario(path, ["model.hf_config=cfg.json"])[0].model.num_layers == 4
    # the same through the command line, as a user types it
    assert main(["check", str(path), "--set", "cluster.topology=t.yaml"]) == 0
    assert "topology in-b:" in capsys.readouterr().out


def test_a_mapping_topology_file_in_a_file_is_found_beside_it(tmp_path, monkeypatch):
    a, b, path = _two_dirs(tmp_path, monkeypatch)
    d = yaml.safe_load(path.read_text())
    d["cluster"]["topology"] = {"file": "t.yaml", "scale_out": {"oversubscription": 2}}
    path.write_text(yaml.safe_dump(d))
    assert load_scenario(path)[1].name == "in-a"


# --- tables never cut the distinguishing column ----------------------------------------------------

LONG = "model.moe.routing.a_key_that_is_quite_long_indeed"


def test_render_keeps_the_key_column_whole_and_leaves_others_out():
    cols = [Column("point", key=True), Column("step", ">", drop=2), Column("MFU", ">", drop=1), Column("per rank", drop=0)]
    rows = [[f"{LONG}=1 parallel.tp=2 parallel.pp=4", "1.000 s", "40.0%", "10 20 30"]]
    wide = render(cols, rows, None)
    assert wide[2].split() == [f"{LONG}=1", "parallel.tp=2", "parallel.pp=4", "1.000", "s", "40.0%", "10", "20", "30"]
    # 70 columns: the key column wrapped to its longest item (52) leaves room for step (7) only
    narrow = render(cols, rows, 70)
    assert all(len(line) <= 70 for line in narrow)
    assert narrow[2].split() == [f"{LONG}=1", "1.000", "s"] and narrow[3].split() == ["parallel.tp=2", "parallel.pp=4"]
    assert narrow[0].split() == ["point", "step"]     # MFU and per rank left out, the least important first


def test_compare_and_sweep_tables_with_a_long_key_and_many_axes_on_a_narrow_terminal(tmp_path, fast_topology,
                                                                                      monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "60")
    path = small_scenario(tmp_path, fast_topology)
    axes = ["--set", f"{OVERSUB}=1,2", "--set", "parallel.schedule=1f1b,gpipe", "--set", "training.recompute=none,full"]
    assert main(["compare", str(path)] + axes) == 0
    text = capsys.readouterr().out
    labels = [label for label, _ in compare.variants([a for a in axes if a != "--set"])]
    assert len(labels) == 8
    for label in labels:
        for item in label.split():
            assert item in text              # every key=value whole
    table = text.splitlines()[1:]
    assert all(len(line) <= 60 for line in table)
    # one row per variant, each with its step time
    assert sum(1 for ln in table if re.search(r"\d us", ln)) == 8
    assert main(["sweep", str(path), "--grid", f"{OVERSUB}=1,2", "--grid", "parallel.schedule=1f1b,gpipe",
                 "--grid", "training.recompute=none,full", "--out", str(tmp_path / "sw")]) == 0
    text = capsys.readouterr().out
    table = text.splitlines()[1:text.splitlines().index("")]
    assert sum(1 for ln in table if re.search(r"\d us", ln)) == 8 and all(len(ln) <= 60 for ln in table)
    assert text.count(f"{OVERSUB}=") == 8


# --- progress bars ---------------------------------------------------------------------------------

class _Bars:
    """Records the bars the commands open: [desc, total, units done]."""

    def __init__(self):
        self.made = []

    def __call__(self, total, desc, unit="it"):
        rec = [desc, total, 0]
        self.made.append(rec)

        class B:
            def update(self, n=1):
                rec[2] += n

            def set_postfix_str(self, *a, **k):
                pass

            def close(self):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *a):
                return False
        return B()


def test_long_commands_advance_a_bar_per_unit_of_work(tmp_path, fast_topology, monkeypatch, capsys):
    bars = _Bars()
    monkeypatch.setattr(progress, "bar", bars)
    path = small_scenario(tmp_path, fast_topology)
    assert main(["compare", str(path), "--set", "parallel.schedule=1f1b,gpipe,zb_h1"]) == 0
    assert main(["sweep", str(path), "--grid", "parallel.schedule=1f1b,gpipe", "--out", str(tmp_path / "sw")]) == 0
    assert main(["search", str(path), "--max-candidates", "2"]) == 0
    assert main(["validate", "vtrain", "--limit", "2"]) == 0
    got = {d: (t, n) for d, t, n in bars.made}
    assert got["compare"] == (3, 3)          # variants
    assert got["sweep"] == (2, 2)            # points
    assert got["search"] == (2, 2)           # candidates simulated
    assert got["vtrain multi"] == (2, 2)     # cases
    capsys.readouterr()


def test_no_progress_text_off_a_terminal(tmp_path, fast_topology, capsys):
    path = small_scenario(tmp_path, fast_topology)
    assert main(["sweep", str(path), "--grid", "parallel.schedule=1f1b,gpipe", "--out", str(tmp_path / "sw")]) == 0
    assert capsys.readouterr().err == ""


def test_a_run_into_a_used_out_says_it_replaced_the_earlier_run(tmp_path, capsys):
    """The second run into the same --out replaces the first run's files, and its `wrote` line
    says so; the first does not."""
    scen = str(ROOT / "scenarios" / "llama3-70b-h100-512.yaml")
    out = str(tmp_path / "o")
    assert main(["run", scen, "--out", out]) == 0
    first = capsys.readouterr().out.strip().splitlines()[-1]
    assert main(["run", scen, "--out", out]) == 0
    second = capsys.readouterr().out.strip().splitlines()[-1]
    assert "replacing" not in first and second.endswith("(replacing an earlier run's)")
