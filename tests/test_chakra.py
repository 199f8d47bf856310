"""Chakra export (`simtrain export chakra`): the files read back with Chakra's own decoder
(mlc-chakra) match the simulated program. Scenario: the small GPT (h 256, seq 128, bf16) at
tp 2, pp 2, dp 2 on 8 ranks, micro batch 1, global batch 8, so 8 / (1 x dp 2) = 4 microbatches."""
import json

import pytest
from conftest import small_scenario

from simtrain.cli.main import main

pytest.importorskip("chakra.schema.protobuf.et_def_pb2", reason="mlc-chakra is not installed (pip install 'simtrain[chakra]')")

from chakra.schema.protobuf import et_def_pb2 as pb  # noqa: E402

from simtrain.results.chakra import read_chakra  # noqa: E402


def attrs(n) -> dict:
    return {a.name: getattr(a, a.WhichOneof("value")) for a in n.attr}


def test_export_reads_back_with_chakra(tmp_path, plain_topology):
    path = small_scenario(tmp_path, plain_topology, parallel={"tp": 2, "pp": 2, "dp": 2, "sequence_parallel": True,
                                                              "zero_stage": 1}, nodes=2)
    out = tmp_path / "et"
    assert main(["export", "chakra", str(path), "-o", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["comm_group.json"] + sorted(f"simtrain.{r}.et" for r in range(8))
    groups = json.loads((out / "comm_group.json").read_text())
    # Megatron order tp-cp-dp-pp: tp groups (0,1) (2,3) (4,5) (6,7), dp groups (0,2) (1,3) (4,6) (5,7), plus the world
    assert groups["1"] == list(range(8))
    assert sorted(map(tuple, groups.values())) == sorted([tuple(range(8)), (0, 1), (2, 3), (4, 5), (6, 7),
                                                          (0, 2), (1, 3), (4, 6), (5, 7)])
    gid = {tuple(v): k for k, v in groups.items()}
    traces = {r: read_chakra(out / f"simtrain.{r}.et") for r in range(8)}
    sends = {}
    for r, (md, nodes) in traces.items():
        assert attrs(md)["rank"] == r and attrs(md)["world_size"] == 8
        assert [n.id for n in nodes] == list(range(len(nodes)))
        ids = set()
        for n in nodes:
            # every dependency names an earlier node (the file is in topological order)
            assert all(d in ids for d in list(n.data_deps) + list(n.ctrl_deps))
            ids.add(n.id)
        stage = r // 4
        s = [n for n in nodes if n.type == pb.COMM_SEND_NODE]
        v = [n for n in nodes if n.type == pb.COMM_RECV_NODE]
        # 1F1B over 2 stages: stage 0 sends 4 activations and receives 4 gradients, stage 1 the reverse
        assert len(s) == len(v) == 4
        # one microbatch's activations, sequence-parallel so each tp rank holds seq / tp of them:
        # 128 / 2 x h 256 x 2 bytes (bf16)
        assert {attrs(n)["comm_size"] for n in s + v} == {128 // 2 * 256 * 2}
        peer = r + 4 if stage == 0 else r - 4
        assert all(attrs(n)["comm_src"] == r and attrs(n)["comm_dst"] == peer for n in s)
        assert all(attrs(n)["comm_src"] == peer and attrs(n)["comm_dst"] == r for n in v)
        for n in s:
            sends[(r, peer, attrs(n)["comm_tag"])] = n
        colls = [n for n in nodes if n.type == pb.COMM_COLL_NODE]
        tp_pg = gid[(r - r % 2, r - r % 2 + 1)]
        dp_pg = gid[tuple(sorted((r, r ^ 2)))]
        assert {attrs(n)["pg_name"] for n in colls} <= {tp_pg, dp_pg, "1"}
        # the gradient-norm all-reduce over every rank: one fp32 value
        world = [n for n in colls if attrs(n)["pg_name"] == "1"]
        assert [(attrs(n)["comm_type"], attrs(n)["comm_size"]) for n in world] == [(pb.ALL_REDUCE, 4)]
        comp = [n for n in nodes if n.type == pb.COMP_NODE]
        assert comp and all(n.duration_micros >= 0 for n in comp)
        # a receive comes before the compute that consumes it
        for n in v:
            assert any(n.id in m.data_deps for m in comp)
    # every receive has its matching send (src, dst, tag) on the peer
    for r, (_, nodes) in traces.items():
        for n in nodes:
            if n.type == pb.COMM_RECV_NODE:
                a = attrs(n)
                assert (a["comm_src"], a["comm_dst"], a["comm_tag"]) in sends
    # ranks of one class carry the same program but their own groups
    n0, n2 = traces[0][1], traces[2][1]
    assert len(n0) == len(n2) and [n.name for n in n0] == [n.name for n in n2]


def test_same_input_gives_byte_identical_traces(tmp_path, plain_topology):
    """Same scenario, two exports: every file byte for byte the same (no wall-clock time in them)."""
    path = small_scenario(tmp_path, plain_topology, parallel={"tp": 2, "pp": 2, "dp": 1}, training={"global_batch_size": 4})
    for d in ("a", "b"):
        assert main(["export", "chakra", str(path), "-o", str(tmp_path / d), "--prefix", "x"]) == 0
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == ["comm_group.json", "x.0.et", "x.1.et", "x.2.et", "x.3.et"]
    assert all((tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes() for n in names)


def test_wrote_line_names_the_directory_once(tmp_path, plain_topology, capsys):
    """`-o DIR/` (a trailing slash) prints `wrote DIR/:`, not `DIR//:`."""
    path = small_scenario(tmp_path, plain_topology, parallel={"tp": 2, "pp": 2, "dp": 1}, training={"global_batch_size": 4})
    out = tmp_path / "et"
    assert main(["export", "chakra", str(path), "-o", f"{out}/"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"wrote {out}/: 4 files simtrain.<rank>.et") and "//" not in printed
