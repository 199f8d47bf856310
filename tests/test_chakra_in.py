"""Chakra execution traces in (`simtrain run SCENARIO --workload chakra:DIR`): ASTRA-sim's own
example traces (tests/data/astra-sim, MIT) replayed on a one-node fabric of round numbers, their
step derived by hand; a simtrain export replayed back; the flow backend; broken traces."""
import json
import shutil

import pytest
from conftest import ROOT, node_topology, small_scenario

from simtrain.cli.main import main

pytest.importorskip("chakra.schema.protobuf.et_def_pb2", reason="mlc-chakra is not installed (pip install 'simtrain[chakra]')")

from chakra.schema.protobuf import et_def_pb2 as pb  # noqa: E402
from chakra.src.third_party.utils import protolib  # noqa: E402

from simtrain.errors import ConfigError  # noqa: E402
from simtrain.program.chakra import read_trace  # noqa: E402
from simtrain.replay import replay_chakra  # noqa: E402
from simtrain.simulate import simulate  # noqa: E402
from simtrain.spec.loading import load_scenario  # noqa: E402

ASTRA = ROOT / "tests" / "data" / "astra-sim"
US = 1e-6
B = 100e9                      # node_topology: 100 GB/s scale-up links, efficiency 1


def cluster(tmp_path, ring_simple=True, backend="analytical"):
    """A scenario whose cluster is one node of 8 devices, 100 GB/s / 2 us, no protocol latencies."""
    topo = node_topology(tmp_path, 8)
    net = {"backend": backend}
    if ring_simple:
        net.update({"nccl_algo": "Ring", "nccl_proto": "Simple"})
    path = small_scenario(tmp_path, topo, parallel={"tp": 1, "pp": 1, "dp": 8}, network=net)
    return load_scenario(path)


def test_astra_sim_all_reduce_microbenchmark(tmp_path):
    sc, topo = cluster(tmp_path)
    r = replay_chakra(ASTRA / "all_reduce_8npus_1MB", sc, topo).result
    assert r.ranks == 8 and r.nodes == {"coll": 8}
    # ring all-reduce without protocol latency: 2 (p - 1) / p x 1 MiB / 100 GB/s
    assert r.step_time_s == pytest.approx(2 * 7 / 8 * 2**20 / B, rel=1e-9)
    assert [(c.collective, c.nbytes, c.group_size, c.algorithm) for c in r.collectives] == [("all_reduce", 2**20, 8, "ring")]
    assert all(x.exposed_comm_s == pytest.approx(r.step_time_s) and x.compute_s == 0 for x in r.per_rank)


def test_astra_sim_all_gather_size_is_per_rank(tmp_path):
    """ASTRA-sim's ring takes an all-gather's comm_size as each rank's part (Ring.cc:
    final_data_size = data_size x nodes), so the gathered buffer is 8 MiB."""
    sc, topo = cluster(tmp_path)
    r = replay_chakra(ASTRA / "all_gather_8npus_1MB", sc, topo).result
    assert r.collectives[0].nbytes == 8 * 2**20
    assert r.step_time_s == pytest.approx(7 / 8 * 8 * 2**20 / B, rel=1e-9)


def test_astra_sim_ring_of_sends_and_receives(tmp_path):
    """ASTRA-sim's custom ring all-reduce: per rank 14 sends of 1 MiB / 8 to the next rank, each
    after the previous step's receive (and, on alternate steps, a 7 us reduction node). Every rank
    runs the same chain, so the step is 14 transfers of 2 us + 128 KiB / 100 GB/s plus 7 x 7 us."""
    sc, topo = cluster(tmp_path)
    run = replay_chakra(ASTRA / "custom_allreduce_8npus_1MB", sc, topo)
    r = run.result
    assert r.nodes == {"comp": 56, "recv": 112, "send": 112}
    assert r.compute_from == {"trace_duration": 56, "cost_model": 0}
    transfer = 2 * US + 2**17 / B
    assert r.step_time_s == pytest.approx(14 * transfer + 7 * 7 * US, rel=1e-9)
    for x in r.per_rank:
        assert x.compute_s == pytest.approx(49 * US, rel=1e-9)
        assert x.compute_s + x.exposed_comm_s + x.idle_s == pytest.approx(r.step_time_s, rel=1e-9)


def test_flow_backend_replays_the_same_uncontended_ring(tmp_path):
    sc, topo = cluster(tmp_path, backend="flow")
    r = replay_chakra(ASTRA / "custom_allreduce_8npus_1MB", sc, topo).result
    assert r.network_backend == "flow"
    # one flow per link at a time: the flow backend's time is the closed form's
    assert r.step_time_s == pytest.approx(14 * (2 * US + 2**17 / B) + 49 * US, rel=1e-6)


def test_export_then_replay_gives_the_simulated_step(tmp_path, plain_topology):
    """simtrain's own export, replayed on the cluster it was simulated on: the compute nodes keep
    their exported durations (--trace-durations) and every collective and send is timed again by
    the same backend, so the replayed step is the simulated one (to the microsecond rounding of
    Chakra's duration_micros)."""
    path = small_scenario(tmp_path, plain_topology, parallel={"tp": 2, "pp": 2, "dp": 2}, nodes=2)
    out = tmp_path / "et"
    assert main(["export", "chakra", str(path), "-o", str(out)]) == 0
    sc, topo = load_scenario(path)
    step = simulate(sc, topo, fuse=False).result.step_time_s
    r = replay_chakra(out, sc, topo, trace_durations=True).result
    n_comp = r.compute_from["trace_duration"]
    assert r.ranks == 8 and n_comp > 0 and r.compute_from["cost_model"] == 0
    assert abs(r.step_time_s - step) <= n_comp / 8 * 0.5e-6 + 1e-9
    # without the flag the exported num_ops / tensor_size go through the cost model instead
    priced = replay_chakra(out, sc, topo).result
    assert priced.compute_from["cost_model"] > 0


def test_export_writes_flops_and_bytes_of_compute_nodes(tmp_path, plain_topology):
    """Every exported compute node carries num_ops and tensor_size, and over the files they add
    up to the FLOPs of the simulated program's compute ops (the sum of its operators' FLOPs: tp 2
    x dp 2 ranks, every rank writing its own file) -- and come within 5 % of the step's hardware-FLOP
    count, a closed form over the model rather than a sum over the program's operators."""
    path = small_scenario(tmp_path, plain_topology, parallel={"tp": 2, "pp": 1, "dp": 2})
    out = tmp_path / "et"
    assert main(["export", "chakra", str(path), "-o", str(out)]) == 0
    sc, topo = load_scenario(path)
    run = simulate(sc, topo, fuse=False)
    per_class = {c.id: c.multiplicity for c in run.classes}
    program = sum(o.flops * per_class[o.cls] for o in run.ops if o.kind == "compute")
    total = 0
    for f in sorted(out.glob("*.et")):
        with open(f, "rb") as fh:
            protolib.decodeMessage(fh, pb.GlobalMetadata())
            while True:
                n = pb.Node()
                if not protolib.decodeMessage(fh, n):
                    break
                if n.type == pb.COMP_NODE:
                    a = {x.name: getattr(x, x.WhichOneof("value")) for x in n.attr}
                    assert "num_ops" in a and "tensor_size" in a
                    total += a["num_ops"]
    assert total == pytest.approx(program, rel=1e-9)
    assert total == pytest.approx(run.result.hardware_flops_per_step, rel=0.05)


def test_cli_run_json_and_out(tmp_path):
    topo = node_topology(tmp_path, 8)
    path = small_scenario(tmp_path, topo, parallel={"tp": 1, "pp": 1, "dp": 8})
    out = tmp_path / "out"
    assert main(["run", str(path), "--workload", f"chakra:{ASTRA / 'custom_allreduce_8npus_1MB'}", "--out", str(out)]) == 0
    d = json.loads((out / "result.json").read_text())
    assert d["workload"] == "chakra" and d["ranks"] == 8 and len(d["per_rank"]) == 8
    page = (out / "report.html").read_text()
    assert "replayed step" in page and "http" not in page.split("<body>")[1].replace("https://", "")
    ev = json.loads((out / "trace.json").read_text())["traceEvents"]
    assert sum(1 for e in ev if e["ph"] == "X") == 280


def _write(path, nodes, version="0.0.4"):
    with open(path, "wb") as f:
        protolib.encodeMessage(f, pb.GlobalMetadata(version=version))
        for n in nodes:
            protolib.encodeMessage(f, n)


def _coll(i, size, pg=None, deps=()):
    n = pb.Node(id=i, name=f"ar{i}", type=pb.COMM_COLL_NODE, data_deps=list(deps))
    n.attr.extend([pb.AttributeProto(name="comm_type", int64_val=pb.ALL_REDUCE), pb.AttributeProto(name="comm_size", int64_val=size)])
    if pg is not None:
        n.attr.append(pb.AttributeProto(name="pg_name", string_val=pg))
    return n


def test_groups_from_comm_group_json_and_priced_compute(tmp_path):
    """Two groups of 4 all-reduce 1 MiB at once; a compute node with num_ops goes through the
    device cost model (the scenario's A100) unless durations are forced."""
    d = tmp_path / "t"
    d.mkdir()
    (d / "comm_group.json").write_text(json.dumps({"1": [0, 1, 2, 3], "2": [4, 5, 6, 7]}))
    for r in range(8):
        comp = pb.Node(id=0, name="gemm", type=pb.COMP_NODE, duration_micros=5)
        comp.attr.extend([pb.AttributeProto(name="num_ops", int64_val=2 * 4096**3),
                          pb.AttributeProto(name="tensor_size", uint64_val=3 * 4096 * 4096 * 2)])
        _write(d / f"w.{r}.et", [comp, _coll(1, 2**20, "1" if r < 4 else "2", deps=[0])])
    sc, topo = cluster(tmp_path)
    t = read_trace(d)
    assert t.groups == {"1": (0, 1, 2, 3), "2": (4, 5, 6, 7)}
    fixed = replay_chakra(d, sc, topo, trace_durations=True).result
    assert fixed.step_time_s == pytest.approx(5 * US + 2 * 3 / 4 * 2**20 / B, rel=1e-9)
    priced = replay_chakra(d, sc, topo).result
    assert priced.compute_from == {"trace_duration": 0, "cost_model": 8}
    # 137 GFLOP on an A100 (312 TFLOP/s bf16 peak) takes at least 0.44 ms
    assert priced.compute_s > 2 * 4096**3 / 312e12


@pytest.mark.parametrize("case,needle", [
    ("truncated", "truncated file"),
    ("unknown_group", "group '9' is not in"),
    ("mismatch", "collective #1 of group world is all_reduce of 2048 B here"),
    ("missing_rank", "missing: ranks run 0..2"),
    ("dangling_dep", "depends on node 7"),
    ("cycle", "a dependency cycle"),
    ("unmatched_send", "1 sends from rank 0 to rank 1 with tag 0 but 0 receives"),
    ("absurd", "comm_size = "),
])
def test_broken_traces_get_one_clear_error(tmp_path, capsys, case, needle):
    d = tmp_path / "t"
    d.mkdir()
    ranks = [[_coll(0, 1024)], [_coll(0, 1024)]]
    if case == "unknown_group":
        ranks = [[_coll(0, 1024, "9")], [_coll(0, 1024, "9")]]
    elif case == "mismatch":
        ranks[1] = [_coll(0, 2048)]
    elif case == "dangling_dep":
        ranks[0] = [_coll(0, 1024, deps=[7])]
    elif case == "cycle":
        ranks[0] = [_coll(0, 1024, deps=[1]), pb.Node(id=1, type=pb.COMP_NODE, data_deps=[0])]
    elif case == "unmatched_send":
        s = pb.Node(id=1, type=pb.COMM_SEND_NODE)
        s.attr.extend([pb.AttributeProto(name="comm_dst", int32_val=1), pb.AttributeProto(name="comm_size", int64_val=8)])
        ranks[0].append(s)
    elif case == "absurd":
        ranks = [[_coll(0, 2**62)], [_coll(0, 2**62)]]
    for r, nodes in enumerate(ranks):
        _write(d / f"w.{r}.et", nodes)
    if case == "truncated":
        data = (d / "w.1.et").read_bytes()
        (d / "w.1.et").write_bytes(data[:-3])
    if case == "missing_rank":
        shutil.copy(d / "w.1.et", d / "w.2.et")
        (d / "w.1.et").unlink()
    with pytest.raises(ConfigError) as e:
        read_trace(d)
    assert needle in str(e.value)
    # the command line: one message naming the file, exit code 2, no traceback
    path = small_scenario(tmp_path, node_topology(tmp_path, 4))
    assert main(["run", str(path), "--workload", f"chakra:{d}"]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and str(d) in err


def test_bad_workload_source_and_too_few_devices(tmp_path, capsys):
    topo = node_topology(tmp_path, 4)
    path = small_scenario(tmp_path, topo)
    assert main(["run", str(path), "--workload", "astra:x"]) == 2
    assert "is not a workload source" in capsys.readouterr().err
    assert main(["run", str(path), "--workload", f"chakra:{ASTRA / 'all_reduce_8npus_1MB'}"]) == 2
    assert "the trace has 8 ranks but the topology" in capsys.readouterr().err
    assert main(["run", str(path), "--trace-durations"]) == 2
    assert "only applies to a replayed trace" in capsys.readouterr().err


def test_pg_name_zero_is_every_rank(tmp_path):
    """ASTRA-sim's Workload::extract_comm_group reads pg_name "" and "0" alike as the group of every
    rank, with or without a comm_group.json: a 1 MiB all-reduce named "0" over 8 ranks takes the
    ring's 2 x 7/8 x 2^20 / 100e9 s, the same as one with no pg_name."""
    d = tmp_path / "t"
    d.mkdir()
    (d / "comm_group.json").write_text(json.dumps({"1": [0, 1, 2, 3]}))
    for r in range(8):
        _write(d / f"w.{r}.et", [_coll(0, 2**20, "0")])
    sc, topo = cluster(tmp_path)
    assert replay_chakra(d, sc, topo).result.step_time_s == pytest.approx(2 * 7 / 8 * 2**20 / B, rel=1e-9)


def test_missing_chakra_package_is_a_config_error(monkeypatch, tmp_path):
    """Without mlc-chakra, reading a trace says how to install it (exit 2), as the export does."""
    import builtins
    real = builtins.__import__

    def no_chakra(name, *a, **k):
        if name.startswith("chakra"):
            raise ImportError("No module named 'chakra'")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_chakra)
    with pytest.raises(ConfigError, match="pip install 'simtrain\\[chakra\\]'"):
        read_trace(ASTRA / "all_reduce_8npus_1MB")


def _ranks_of_coll(d, n, pg=None):
    d.mkdir()
    for r in range(n):
        _write(d / f"w.{r}.et", [_coll(0, 1024, pg)])


def test_missing_last_file_named_by_comm_group(tmp_path, capsys):
    """comm_group.json lists ranks 0..3 but only w.0..w.2 exist: N = 2 + 1 = 3 ranks are read, and
    the group names rank 3, whose file w.3.et is the one missing. One line, exit 2, no traceback."""
    d = tmp_path / "t"
    _ranks_of_coll(d, 3, "1")
    (d / "comm_group.json").write_text(json.dumps({"1": [0, 1, 2, 3]}))
    with pytest.raises(ConfigError) as e:
        read_trace(d)
    (p,) = e.value.problems
    assert p.file == str(d / "w.3.et")
    assert p.problem == "missing: comm_group.json group 1 names rank 3, but the trace has files for ranks 0..2 only"
    assert "remove rank 3 from comm_group.json" in p.fix
    path = small_scenario(tmp_path, node_topology(tmp_path, 4))
    assert main(["run", str(path), "--workload", f"chakra:{d}"]) == 2
    err = capsys.readouterr().err
    assert "w.3.et: missing: comm_group.json group 1 names rank 3" in err and "Traceback" not in err


def test_many_missing_files_are_capped(tmp_path):
    """Groups name ranks 0..11 over 4 files: ranks 4..11, 8 files, are missing; rank 4 is named by
    both groups. The first 5 (ranks 4..8) get a line each, then one line for the other 3."""
    d = tmp_path / "t"
    _ranks_of_coll(d, 4, "1")
    (d / "comm_group.json").write_text(json.dumps({"1": list(range(12)), "2": [0, 4]}))
    with pytest.raises(ConfigError) as e:
        read_trace(d)
    ps = e.value.problems
    assert [p.file for p in ps[:5]] == [str(d / f"w.{r}.et") for r in range(4, 9)]
    assert ps[0].problem.startswith("missing: comm_group.json group 1 (and 1 more group) names rank 4")
    assert len(ps) == 6 and ps[5].file == str(d) and ps[5].problem.startswith("... and 3 more rank files missing")


def test_missing_last_file_of_a_ring_of_sends(tmp_path):
    """ASTRA-sim's custom ring with rank 7's file removed: rank r sends to r + 1 and receives from
    r - 1 (mod 8), 14 of each per rank (112 / 8). So rank 6's 14 sends and rank 0's 14 receives
    name rank 7, beyond the 7 files: two lines, each naming the missing file, nothing else."""
    d = tmp_path / "ring"
    shutil.copytree(ASTRA / "custom_allreduce_8npus_1MB", d)
    (d / "custom_allreduce.7.et").unlink()
    with pytest.raises(ConfigError) as e:
        read_trace(d)
    ps = e.value.problems
    assert [p.file for p in ps] == [str(d / "custom_allreduce.0.et"), str(d / "custom_allreduce.6.et")]
    assert ps[0].path.endswith(".comm_src") and ps[1].path.endswith(".comm_dst")
    for p in ps:
        assert "names peer rank 7 (as do 13 more nodes of this file), but the trace has files for ranks 0..6 only" in p.problem
        assert p.fix.startswith("rank 7's file custom_allreduce.7.et is missing")
    assert ps[1].fix.endswith("or comm_dst is wrong")


def test_sends_to_a_missing_rank_are_capped(tmp_path):
    """Ranks 0..6 each send once to rank 9 (beyond 7 files): 7 lines of the same cause, shown as
    the first 5 and `... and 2 more`."""
    d = tmp_path / "t"
    d.mkdir()
    for r in range(7):
        s = pb.Node(id=0, type=pb.COMM_SEND_NODE)
        s.attr.extend([pb.AttributeProto(name="comm_dst", int32_val=9), pb.AttributeProto(name="comm_size", int64_val=8)])
        _write(d / f"w.{r}.et", [s])
    with pytest.raises(ConfigError) as e:
        read_trace(d)
    ps = e.value.problems
    assert len(ps) == 6 and [p.file for p in ps[:5]] == [str(d / f"w.{r}.et") for r in range(5)]
    assert ps[5].problem == "... and 2 more files with sends / receives naming a rank without a file"


def test_summary_says_how_many_ranks_were_read(tmp_path, capsys):
    """ASTRA-sim's all-reduce without its last file: collectives of every rank, no comm_group.json,
    nothing that names a rank, so 7 ranks are read and the summary says so and that nothing could
    tell. The ring of sends names its ranks: the count alone."""
    d = tmp_path / "ar"
    shutil.copytree(ASTRA / "all_reduce_8npus_1MB", d)
    (d / "all_reduce.7.et").unlink()
    path = small_scenario(tmp_path, node_topology(tmp_path, 8), parallel={"tp": 1, "pp": 1, "dp": 8})
    assert main(["run", str(path), "--workload", f"chakra:{d}"]) == 0
    out = capsys.readouterr().out
    assert "  ranks              replayed 7 ranks from all_reduce.{0..6}.et (nothing in the trace names a rank: check the job had 7)\n" in out
    assert main(["run", str(path), "--workload", f"chakra:{ASTRA / 'custom_allreduce_8npus_1MB'}"]) == 0
    out = capsys.readouterr().out
    assert "  ranks              replayed 8 ranks from custom_allreduce.{0..7}.et\n" in out


def test_workload_path_messages(tmp_path, capsys):
    """A path whose directory does not exist, a name that is no prefix of an existing directory of
    other traces (the prefixes found are listed), and the one-prefix case."""
    path = small_scenario(tmp_path, node_topology(tmp_path, 8), parallel={"tp": 1, "pp": 1, "dp": 8})
    two = tmp_path / "two"
    two.mkdir()
    for src in ("all_reduce_8npus_1MB", "all_gather_8npus_1MB"):
        for f in (ASTRA / src).iterdir():
            shutil.copy(f, two)
    cases = [(tmp_path / "nonexistent", "nonexistent: no such directory or trace prefix"),
             (tmp_path / "nodir" / "x", "x: no such directory or trace prefix"),
             (two / "nosuch", f"no trace files nosuch.<rank>.et; {two} holds the prefixes all_gather, all_reduce; "
                              f"name one: chakra:{two / 'all_gather'}"),
             (ASTRA / "all_reduce_8npus_1MB" / "nosuch", "holds the prefix all_reduce only")]
    for spec, needle in cases:
        assert main(["run", str(path), "--workload", f"chakra:{spec}"]) == 2
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err and err.count("\n") == 1


def test_replay_out_with_trailing_slash(tmp_path, capsys):
    """`--out DIR/` prints `wrote DIR/:` once, not `DIR//:`."""
    path = small_scenario(tmp_path, node_topology(tmp_path, 8), parallel={"tp": 1, "pp": 1, "dp": 8})
    out = tmp_path / "out"
    assert main(["run", str(path), "--workload", f"chakra:{ASTRA / 'all_reduce_8npus_1MB'}", "--out", f"{out}/"]) == 0
    printed = capsys.readouterr().out
    assert f"  wrote {out}/: result.json trace.json run_info.json report.html" in printed and "//" not in printed
