"""MLCommons Chakra execution traces of a simulated step: one `<prefix>.<rank>.et` file per rank
and ASTRA-sim's communicator-group file (`comm_group.json`), encoded with the `mlc-chakra`
package's own protobuf schema (`chakra.schema.protobuf.et_def_pb2`) and framing
(`chakra.src.third_party.utils.protolib`), never by hand.

Field conventions, from mlcommons/chakra (schema/protobuf/et_def.proto, src/feeder/et_feeder_node.cpp)
and astra-sim/astra-sim (astra-sim/workload/Workload.cc):
  COMP_NODE       duration_micros; attrs is_cpu_op (bool), num_ops (int64: the op's FLOPs),
                  tensor_size (uint64: the bytes its operators read and write)
  COMM_COLL_NODE  comm_type (int64, CollectiveCommType), comm_size (int64: the rank's input buffer,
                  as Chakra's PyTorch converter counts it, so an all-gather's is the shard),
                  pg_name (string holding the integer group id of comm_group.json; ids start at 1,
                  since ASTRA-sim reads "0" as every rank)
  COMM_SEND_NODE / COMM_RECV_NODE  comm_src, comm_dst, comm_tag (int32), comm_size (int64)
  data_deps       what an op waits for (its inputs; a receive before the op that consumes it)
  ctrl_deps       the previous op on the same simtrain stream (streams issue in order)

The programs are per equivalence class of ranks; each class is encoded once. What differs between
the ranks of a class (the group id of a collective, the peer of a send) goes in a second small
message appended to the node's bytes: protobuf merges concatenated messages, appending repeated
fields, so the decoder sees one node with all its attrs.
"""
from __future__ import annotations

import heapq
import io
import json
from pathlib import Path

from simtrain.engine.core import Timeline
from simtrain.errors import SimulationError
from simtrain.plan.grid import RankClass, RankGrid
from simtrain.program.chakra import chakra_modules
from simtrain.program.ir import EOp, stream_sequences
from simtrain.workload.ir import overlapped_tp

COMM_TYPES = {"all_reduce": "ALL_REDUCE", "all_gather": "ALL_GATHER", "reduce_scatter": "REDUCE_SCATTER",
              "all_to_all": "ALL_TO_ALL", "broadcast": "BROADCAST"}


def _us(seconds: float) -> int:
    return max(0, int(round(seconds * 1e6)))


def comm_groups(grid: RankGrid, kinds: list[str], mirror: bool) -> tuple[dict, dict]:
    """({group id: ranks}, {(kind, group index): group id}); ids from 1 in a fixed order: the world,
    then each kind's groups in rank order, then DualPipe's twin pairs."""
    groups = {1: tuple(range(grid.world))}
    ids = {("world", 0): 1}
    for k in kinds:
        members, _ = grid.group_arrays(k)
        for g, row in enumerate(members):
            ids[(k, g)] = len(groups) + 1
            groups[len(groups) + 1] = tuple(int(r) for r in row)
    if mirror:
        per = grid.per_stage
        for r in range(grid.world):
            s = r // per
            t = (grid.pp - 1 - s) * per + r % per
            if r < t:
                ids[("twin", r)] = ids[("twin", t)] = len(groups) + 1
                groups[len(groups) + 1] = (r, t)
    return groups, ids


def _group_kind(op: EOp) -> str:
    if op.label == "all_reduce:grad_norm":
        return "world"
    if op.label == "twin_grad_all_reduce":
        return "twin"
    return op.stream


def write_chakra(ops: list[EOp], tl: Timeline, classes: list[RankClass], grid: RankGrid, out: Path,
                 prefix: str = "simtrain", mirror: bool = False, meta: dict | None = None) -> dict:
    """Writes `<prefix>.<rank>.et` for every rank and `comm_group.json` into `out`; returns
    {"files": n, "nodes": {class id: nodes per rank}, "groups": n}. `ops` must come from an
    unfused run (`simulate(..., fuse=False)`): a folded collective has no node of its own."""
    pb, protolib = chakra_modules(str(out))
    kinds = [k for k in ("tp", "cp", "dp", "ep", "etp", "edp") if any(o.kind == "coll" and o.stream == k for o in ops)]
    groups, gid = comm_groups(grid, kinds, mirror)
    index = {k: grid.group_arrays(k)[1] for k in kinds}
    per = grid.per_stage
    by_id = {c.id: c for c in classes}
    seqs = stream_sequences(ops)
    Attr = pb.AttributeProto
    cpu = Attr(name="is_cpu_op", bool_val=False)
    counts = {}
    out.mkdir(parents=True, exist_ok=True)
    for c in classes:
        mine = [o for o in ops if o.cls == c.id]
        if any(x[0] != "compute" for o in mine for x in o.fused):
            raise SimulationError("Chakra export needs every collective as its own op; simulate with fuse=False")
        prev = {}
        for (cid, _), seq in seqs.items():
            if cid == c.id:
                for a, b in zip(seq, seq[1:]):
                    prev[b.id] = a.id
        # receives: one per (send of another class) an op of this class waits for
        recvs = {}
        for o in mine:
            for d in o.deps:
                if ops[d].cls != c.id and ops[d].kind == "send":
                    recvs.setdefault(d, o)
        # topological order, earliest simulated start first
        items = [("op", o.id) for o in mine] + [("recv", s) for s in sorted(recvs)]
        indeg, kids = {}, {}
        for it in items:
            if it[0] == "op":
                o = ops[it[1]]
                ps = [("op", d) for d in o.deps if ops[d].cls == c.id] + [("recv", d) for d in o.deps if d in recvs]
                if o.id in prev and ops[prev[o.id]].cls == c.id:
                    ps.append(("op", prev[o.id]))
            else:
                ps = []
            indeg[it] = len(set(ps))
            for p in set(ps):
                kids.setdefault(p, []).append(it)

        def key(it):
            t = tl.start[it[1]] if it[0] == "op" else tl.start[recvs[it[1]].id]
            return (t, 0 if it[0] == "recv" else 1, it[1])
        heap = [(key(it), it) for it in items if indeg[it] == 0]
        heapq.heapify(heap)
        order = []
        while heap:
            _, it = heapq.heappop(heap)
            order.append(it)
            for k in kids.get(it, ()):
                indeg[k] -= 1
                if indeg[k] == 0:
                    heapq.heappush(heap, (key(k), k))
        nid = {it: i for i, it in enumerate(order)}
        # per node: (base bytes, rank-dependent part or None)
        nodes = []
        for it in order:
            n = pb.Node(id=nid[it])
            n.attr.append(cpu)
            if it[0] == "recv":
                s = ops[it[1]]
                n.name, n.type = f"recv:{s.label}", pb.COMM_RECV_NODE
                n.start_time_micros = _us(tl.start[s.id])
                n.attr.extend([Attr(name="comm_size", int64_val=int(round(s.bytes))),
                               Attr(name="comm_tag", int32_val=s.id)])
                nodes.append((n.SerializeToString(), ("recv", by_id[s.cls].stage)))
                continue
            o = ops[it[1]]
            n.name = o.label
            n.start_time_micros = _us(tl.start[o.id])
            n.duration_micros = _us(tl.end[o.id] - tl.start[o.id])
            n.data_deps.extend(sorted({nid[("op", d)] for d in o.deps if ops[d].cls == c.id}
                                      | {nid[("recv", d)] for d in o.deps if d in recvs}))
            p = prev.get(o.id)
            if p is not None and ("op", p) in nid and nid[("op", p)] not in n.data_deps:
                n.ctrl_deps.append(nid[("op", p)])
            dep = None
            if o.kind == "compute":
                n.type = pb.COMP_NODE
                # what the op computes and moves, for ASTRA-sim's roofline and simtrain's replay
                # (the unfused ops of the export are one segment of operators each)
                n.attr.extend([Attr(name="num_ops", int64_val=int(round(o.flops))),
                               Attr(name="tensor_size", uint64_val=int(round(o.mem_bytes)))])
            elif o.kind == "send":
                n.type = pb.COMM_SEND_NODE
                n.attr.extend([Attr(name="comm_size", int64_val=int(round(o.bytes))), Attr(name="comm_tag", int32_val=o.id)])
                dep = ("send", o.stream)
            else:
                coll = o.label.split(":")[0] if o.label != "twin_grad_all_reduce" else "all_reduce"
                if coll not in COMM_TYPES and overlapped_tp(o.label):
                    raise SimulationError(f"Chakra export: {o.label} is one hop of a tensor-parallel ring exchange "
                                          "(parallel.tp_comm_overlap), which has no Chakra collective type; "
                                          "export with --set parallel.tp_comm_overlap=none")
                if coll not in COMM_TYPES:
                    raise SimulationError(f"Chakra export: collective {coll} ({o.label}) has no Chakra type "
                                          "(ring context parallelism is not exported); use parallel.cp_kind: all_gather or a2a")
                gk = _group_kind(o)
                size = len(groups[1]) if gk == "world" else (2 if gk == "twin" else grid.size(gk))
                b = o.bytes / size if coll == "all_gather" else o.bytes
                n.type = pb.COMM_COLL_NODE
                n.attr.extend([Attr(name="comm_type", int64_val=getattr(pb, COMM_TYPES[coll])),
                               Attr(name="comm_size", int64_val=int(round(b)))])
                dep = ("pg", gk)
            nodes.append((n.SerializeToString(), dep))
        counts[c.id] = len(nodes)
        extra_cache: dict = {}

        def extra(spec, r):
            what, arg = spec
            if what == "pg":
                g = gid[("world", 0)] if arg == "world" else gid[("twin", r)] if arg == "twin" else gid[(arg, int(index[arg][r]))]
                k = ("pg", g)
                if k not in extra_cache:
                    extra_cache[k] = pb.Node(attr=[Attr(name="pg_name", string_val=str(g))]).SerializeToString()
                return extra_cache[k]
            s = r // per
            if what == "send":
                t = (s + 1) % grid.pp if arg == "pp_next" else (s - 1) % grid.pp
                src, dst = r, r + (t - s) * per
            else:
                src, dst = r + (arg - s) * per, r
            k = ("p2p", src, dst)
            if k not in extra_cache:
                extra_cache[k] = pb.Node(attr=[Attr(name="comm_src", int32_val=src),
                                               Attr(name="comm_dst", int32_val=dst)]).SerializeToString()
            return extra_cache[k]
        for r in c.ranks:
            buf = io.BytesIO()
            md = pb.GlobalMetadata(version="1.0.0")
            md.attr.extend([Attr(name="schema", string_val="simtrain"), Attr(name="rank", uint64_val=r),
                            Attr(name="world_size", uint64_val=grid.world)]
                           + [Attr(name=k, string_val=str(v)) for k, v in sorted((meta or {}).items())])
            protolib.encodeMessage(buf, md)
            for base, spec in nodes:
                body = base if spec is None else base + extra(spec, r)
                protolib._EncodeVarint32(buf, len(body))
                buf.write(body)
            (out / f"{prefix}.{r}.et").write_bytes(buf.getvalue())
    text = json.dumps({str(k): list(v) for k, v in groups.items()}, indent=1) + "\n"
    (out / "comm_group.json").write_text(text)
    return {"files": grid.world, "nodes": counts, "groups": len(groups)}


def read_chakra(path: Path) -> tuple:
    """(GlobalMetadata, [Node, ...]) of one .et file, read with Chakra's own decoder."""
    pb, protolib = chakra_modules(str(path))
    with open(path, "rb") as f:
        md = pb.GlobalMetadata()
        protolib.decodeMessage(f, md)
        nodes = []
        while True:
            n = pb.Node()
            if not protolib.decodeMessage(f, n):
                break
            nodes.append(n)
    return md, nodes
