"""Bad input: one clear error per problem, all of a file's problems together, exit code 2, no traceback."""
import json
import subprocess
import sys

import pytest
import yaml
from conftest import small_scenario, write

from simtrain.cli.main import main
from simtrain.errors import ConfigError
from simtrain.spec.loading import load_scenario


def test_all_problems_reported_together(tmp_path, fast_topology, capsys):
    p = small_scenario(tmp_path, fast_topology, parallel={"tp": 3, "pp": 3, "dp": 1})
    d = yaml.safe_load(p.read_text())
    d["training"]["global_batch_size"] = 7
    d["training"]["micro_batch_size"] = 2
    d["training"]["precisoin"] = "bf16"
    d["model"]["seq_length"] = "long"
    p.write_text(yaml.safe_dump(d))
    rc = main(["run", str(p)])
    err = capsys.readouterr().err
    assert rc == 2
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert all(line.startswith(str(p) + ": ") for line in lines)
    text = "\n".join(lines)
    assert "training.precisoin: unknown key; did you mean `precision`?" in text
    assert "model.seq_length: expected a whole number >= 1" in text
    assert "parallel.tp: tp=3 does not divide num_attention_heads=8" in text
    assert "parallel.pp: num_layers=8 does not divide into 3 model stages (1f1b on pp=3)" in text
    assert "training.global_batch_size: 7 is not divisible by micro_batch_size x dp = 2 x 1 = 2" in text
    assert "parallel: tp x pp x dp x cp = 3 x 3 x 1 x 1 = 9, but the cluster has 1 node x 4 = 4 devices" in text


def test_a_misspelled_required_key_is_one_error(tmp_path, fast_topology, capsys):
    """`num_layer` for the required `num_layers`: one line, the unknown key with its fix, not a
    second line saying the required key is missing. A misspelling of an optional key or of a key
    that is also present keeps the plain hint."""
    p = small_scenario(tmp_path, fast_topology)
    d = yaml.safe_load(p.read_text())
    d["model"]["num_layer"] = d["model"].pop("num_layers")
    d["training"]["precisoin"] = "bf16"
    p.write_text(yaml.safe_dump(d))
    assert main(["check", str(p)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"{p}: model.num_layer: unknown key; did you mean `num_layers` (a required key)?",
                     f"{p}: training.precisoin: unknown key; did you mean `precision`?"]
    t = write(tmp_path / "t.yaml", """
        name: t
        kind: two_tier
        devices_per_nod: 8
        scale_up: {bandwidth: "300 GB/s", latency: "3 us"}
        scale_out: {nics_per_node: 8, nic_bandwidth: "200 Gb/s", latency: "5 us"}
    """)
    from simtrain.hardware.topology import load_topology
    with pytest.raises(ConfigError) as e:
        load_topology(t, 1)
    assert [str(q) for q in e.value.problems] == [f"{t}: devices_per_nod: unknown key; did you mean `devices_per_node` (a required key)?"]


def test_bare_number_for_a_unit_names_file_key_and_spelled_form(tmp_path):
    t = write(tmp_path / "t.yaml", """
        name: t
        kind: two_tier
        devices_per_node: 8
        scale_up: {bandwidth: 300, latency: "3 us"}
        scale_out: {nics_per_node: 8, nic_bandwidth: "200 Gb/s", latency: "5 us"}
    """)
    with pytest.raises(ConfigError) as e:
        from simtrain.hardware.topology import load_topology
        load_topology(t, 1)
    msg = str(e.value)
    assert msg.startswith(f"{t}: scale_up.bandwidth: ")
    assert '"300 GB/s"' in msg


def test_missing_section_and_unknown_device(tmp_path, fast_topology):
    p = small_scenario(tmp_path, fast_topology)
    d = yaml.safe_load(p.read_text())
    del d["training"]
    d["cluster"]["device"] = "a100"
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(ConfigError) as e:
        load_scenario(p)
    text = str(e.value)
    assert "training: missing required section; add `training:`" in text
    assert "cluster.device: unknown device 'a100'; use one of:" in text


def test_cli_exit_code_and_no_traceback_in_subprocess(tmp_path):
    bad = write(tmp_path / "bad.yaml", "name: x\nmodel: {preset: nope}\n")
    r = subprocess.run([sys.executable, "-m", "simtrain", "check", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert f"{bad}: model.preset: unknown preset 'nope'; use one of:" in r.stderr


def test_set_overrides_and_json_contract(tmp_path, fast_topology, capsys):
    p = small_scenario(tmp_path, fast_topology)
    rc = main(["run", str(p), "--json", "--set", "parallel.schedule=gpipe", "--set", "training.global_batch_size=16"])
    assert rc == 0
    out = capsys.readouterr().out
    r = json.loads(out)            # exactly one JSON object
    for k in ("step_time_s", "tokens_per_s", "mfu", "model_flops_per_step", "bubble_fraction", "peak_memory_bytes",
              "fits_in_memory", "num_devices", "breakdown", "memory", "sim_wall_s"):
        assert k in r
    assert set(r["breakdown"]["exposed_comm_s"]) == {"tp", "cp", "ep", "pp", "dp"}
    assert set(r["memory"][0]) >= {"weights", "gradients", "optimizer", "activations", "total"}
    assert r["num_microbatches"] == 16


def test_hf_config_with_aliases(tmp_path, fast_topology):
    cfg = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 8, "num_attention_heads": 8,
           "num_key_value_heads": 2, "intermediate_size": 704, "vocab_size": 1024, "max_position_embeddings": 128}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    p = small_scenario(tmp_path, fast_topology)
    d = yaml.safe_load(p.read_text())
    d["model"] = {"hf_config": "config.json", "seq_length": 64}
    p.write_text(yaml.safe_dump(d))
    sc, _ = load_scenario(p)
    m = sc.model
    assert (m.architecture, m.num_layers, m.num_key_value_heads, m.ffn_hidden_size, m.seq_length) == ("llama", 8, 2, 704, 64)


def test_hf_config_needs_the_training_sequence_length(tmp_path, fast_topology, capsys):
    """A config.json's max_position_embeddings is the model's context limit (131,072 for
    Llama-3.1-70B), not the training length: without `model.seq_length` the loader refuses, names
    the limit and says how to give the length, instead of simulating 131,072-token sequences."""
    cfg = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 8, "num_attention_heads": 8,
           "num_key_value_heads": 2, "intermediate_size": 704, "vocab_size": 1024, "max_position_embeddings": 131072}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    p = small_scenario(tmp_path, fast_topology)
    d = yaml.safe_load(p.read_text())
    d["model"] = {"hf_config": "config.json"}
    p.write_text(yaml.safe_dump(d))
    assert main(["check", str(p)]) == 2
    err = capsys.readouterr().err
    assert "model.seq_length: not given" in err and "131,072" in err and "seq_length: 8192" in err
    assert "Traceback" not in err and "missing required key" not in err      # one line says it, once
    assert main(["check", str(p), "--set", "model.seq_length=64"]) == 0
    assert "sequences of 64 tokens" in capsys.readouterr().out


def test_out_dir_files(tmp_path, fast_topology):
    p = small_scenario(tmp_path, fast_topology)
    out = tmp_path / "out"
    assert main(["run", str(p), "--out", str(out)]) == 0
    names = sorted(x.name for x in out.iterdir())
    assert names == ["report.html", "result.json", "run_info.json", "scenario.resolved.yaml", "timeline.png", "trace.json"]
    trace = json.loads((out / "trace.json").read_text())
    phases = {e["ph"] for e in trace["traceEvents"]}
    assert {"X", "M", "s", "f"} <= phases          # slices, names, and pipeline flow arrows
    resolved = yaml.safe_load((out / "scenario.resolved.yaml").read_text())
    assert resolved["parallel"]["zero_stage"] == 0 and resolved["training"]["flash_attention"] is True
    first = (out / "result.json").read_bytes()
    assert main(["run", str(p), "--out", str(out)]) == 0
    assert (out / "result.json").read_bytes() == first


def test_list_commands(capsys):
    for what in ("devices", "profiles", "topologies", "schedules", "collectives", "models"):
        assert main(["list", what]) == 0
    out = capsys.readouterr().out
    assert "a100-sxm4-80gb" in out and "dgx-a100" in out and "1f1b" in out and "ring" in out and "llama3-405b" in out


def test_a_plugged_in_network_backend_is_nameable_in_yaml(tmp_path, fast_topology, monkeypatch):
    """network.backend accepts every registered backend (a plug-in's too), and only those."""
    from simtrain.network.registry import BACKENDS
    monkeypatch.setitem(BACKENDS, "my_backend", BACKENDS["analytical"])
    p = small_scenario(tmp_path, fast_topology)
    d = yaml.safe_load(p.read_text())
    d["network"] = {"backend": "my_backend"}
    p.write_text(yaml.safe_dump(d))
    sc, _ = load_scenario(p)
    assert sc.network.backend == "my_backend"
    d["network"] = {"backend": "nope"}
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(ConfigError) as e:
        load_scenario(p)
    assert "network.backend: 'nope' is not one of analytical, flow, my_backend" in str(e.value)


def test_a_duplicate_key_names_its_own_fix_only(tmp_path, fast_topology, capsys):
    """A duplicate YAML key is reported with its own fix (remove one), not with the loader's
    general advice about the scenario path appended."""
    p = small_scenario(tmp_path, fast_topology)
    p.write_text(p.read_text().replace("parallel:\n", "parallel:\n  tp: 1\n  tp: 1\n", 1))
    assert main(["check", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert "duplicate key 'tp'" in err and err.endswith("remove one") and "give the path" not in err


def test_keys_the_run_does_not_use_are_warned_of(tmp_path, fast_topology):
    """A key the file gives that its run cannot use (Megatron-LM switches these off) is named in one
    warning and the run goes on without it; the same defaults left unset say nothing."""
    import warnings as w
    p = small_scenario(tmp_path, fast_topology, parallel={"tp": 1, "pp": 1, "dp": 4})
    with pytest.warns(UserWarning, match=r"training\.fp8_recipe mxfp8 is used only with training\.precision: fp8; this run is bf16"):
        sc, _ = load_scenario(p, ["training.precision=bf16", "training.fp8_recipe=mxfp8"])
    assert sc.training.precision == "bf16"
    with pytest.warns(UserWarning, match=r"parallel\.sequence_parallel has no effect with tp 1"):
        load_scenario(p, ["parallel.sequence_parallel=true"])
    with pytest.warns(UserWarning, match=r"parallel\.tp_comm_overlap async_tp has no effect with tp 1"):
        load_scenario(p, ["parallel.tp_comm_overlap=async_tp"])
    with w.catch_warnings():
        w.simplefilter("error")
        load_scenario(p)


def test_exponent_without_a_dot_is_a_number_in_files_and_overrides(tmp_path, fast_topology):
    """YAML 1.1 reads `5e-2` as a string (its float form needs a dot); simtrain reads it as YAML 1.2
    and JSON do, in a file and in --set alike: 5e-2 is the same reserve as 0.05."""
    p = small_scenario(tmp_path, fast_topology)
    p.write_text(p.read_text().replace("cluster:\n", "cluster:\n  memory_reserve: 5e-2\n", 1))
    sc, _ = load_scenario(p)
    assert sc.cluster.memory_reserve == 0.05
    sc2, _ = load_scenario(small_scenario(tmp_path, fast_topology), overrides=["cluster.memory_reserve=5E-2"])
    assert sc2.cluster.memory_reserve == 0.05
    import yaml
    assert yaml.safe_load("5e-2") == "5e-2"      # the library's own loader is left as it is


def test_a_whole_number_may_be_written_with_an_exponent(tmp_path, fast_topology, capsys):
    """`global_batch_size: 1.6e1` is 16; 8.5 and 1e30 are refused, the second as out of range."""
    p = small_scenario(tmp_path, fast_topology)
    sc, _ = load_scenario(p, overrides=["training.global_batch_size=1.6e1"])
    assert sc.training.global_batch_size == 16 and isinstance(sc.training.global_batch_size, int)
    assert main(["check", str(p), "--set", "training.global_batch_size=8.5"]) == 2
    assert "expected a whole number >= 1, got 8.5" in capsys.readouterr().err
    assert main(["check", str(p), "--set", "training.global_batch_size=1e30"]) == 2
    assert "1e+30 is out of range" in capsys.readouterr().err


def test_sweep_plot_x_reads_exponents_as_numbers():
    """--plot-x checks and reads the grid's values with simtrain's loader: 5e-2 is a number."""
    import json as _json

    from simtrain.studies.sweep import check_plot_x, scaling_points
    check_plot_x(["cluster.memory_reserve=5e-2,1e-1"], "cluster.memory_reserve")
    rows = [{"status": "ok", "overrides": _json.dumps([f"cluster.memory_reserve={v}"]), "num_devices": 8,
             "tokens_per_s": 1.0, "step_time_s": 2.0, "mfu": 0.5} for v in ("1e-1", "5e-2")]
    assert [p[0] for p in scaling_points(rows, "cluster.memory_reserve")] == [0.05, 0.1]
