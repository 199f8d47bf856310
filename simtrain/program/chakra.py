"""Chakra execution traces in: MLCommons Chakra `.et` files (ASTRA-sim's workload input, one file
per rank, `<prefix>.<rank>.et`, with an optional `comm_group.json`) read with the `mlc-chakra`
package's schema and framing, checked, and lowered into a program of `EOp`s that the engine runs
like a lowered training step: one class per rank, collectives and point-to-point transfers timed
by the scenario's network backend over its topology.

How a node becomes ops (the conventions of astra-sim's `workload/Workload.cc` and of
`system/astraccl/native_collectives/collective_algorithm/Ring.cc`, and of simtrain's exporter):
  COMP_NODE        on the rank's `compute` stream (`cpu` where is_cpu_op), for duration_micros;
                   where num_ops > 0 (and durations are not forced) through the device cost model
                   instead: the square GEMM of num_ops FLOPs, bounded below by tensor_size bytes at
                   the measured memory-bound efficiency (a node with only tensor_size is memory-bound)
  COMM_COLL_NODE   on the stream of its process group (NCCL runs each communicator on its own
                   stream), a rendezvous of the group's members: the k-th collective of a group on
                   every member is one collective. comm_size is what ASTRA-sim's ring takes as
                   `data_size`: for an all-gather the rank's input (the nccl-tests buffer is
                   comm_size x group size), for the others the whole buffer. pg_name is the id of
                   a group in comm_group.json; no pg_name means every rank
  COMM_SEND_NODE   a transfer to comm_dst on a stream per destination; the k-th send from a to b
  COMM_RECV_NODE   with tag t pairs with the k-th receive at b from a with tag t. Sends are eager,
                   as ASTRA-sim's (`sim_send` does not wait for the receive to be posted): the
                   transfer starts when the send's dependencies are done, and the receive completes
                   when both its own dependencies and the transfer are done
  METADATA_NODE, INVALID_NODE  zero-time ops that keep their dependencies
data_deps and ctrl_deps are both dependencies. Each stream issues its ops in one topological
order of the rank's graph (smallest node id first among the ready ones).

This differs from ASTRA-sim's `HardwareResource` in one respect, said here and in the user
guide: ASTRA-sim runs one GPU communication op at a time per rank; simtrain runs the process
groups' collectives concurrently on their own streams (as NCCL does).
"""
from __future__ import annotations

import heapq
import io
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from simtrain.cost.roofline import ComputeCostModel
from simtrain.errors import Collector, ConfigError, Problem
from simtrain.network.backend import NetworkBackend
from simtrain.program.ir import EOp
from simtrain.workload.ir import Op

COLLECTIVES = {"ALL_REDUCE": "all_reduce", "ALL_GATHER": "all_gather", "REDUCE_SCATTER": "reduce_scatter",
               "ALL_TO_ALL": "all_to_all", "BARRIER": "barrier"}   # BROADCAST: no broadcast algorithm is modelled yet
MAX_BYTES = 2.0**50          # 1 PiB: no single transfer or tensor of a training step is larger
MAX_MICROS = 86_400e6        # one day: no single op of a step runs longer
MAX_OPS = 1e21               # a zettaFLOP: larger than a whole step of any job on record
ET_NAME = re.compile(r"^(?P<prefix>.+)\.(?P<rank>\d+)\.et$")


def chakra_modules(what: str) -> tuple:
    """(et_def_pb2, protolib) of mlc-chakra: Chakra's schema and framing, for reading and writing
    traces alike; a ConfigError saying how to install it where it is absent."""
    try:
        from chakra.schema.protobuf import et_def_pb2
        from chakra.src.third_party.utils import protolib
    except ImportError as e:
        raise ConfigError([Problem(what, "", f"needs the mlc-chakra package ({e})",
                                   "install it with `pip install 'simtrain[chakra]'` (or `pip install mlc-chakra`)")]) from None
    return et_def_pb2, protolib


def _problem(file: object, path: str, problem: str, fix: str) -> Problem:
    return Problem(str(file), path, problem, fix)


@dataclass
class Node:
    """One decoded trace node (times in seconds, sizes in bytes)."""
    id: int
    name: str
    type: str                 # comp | coll | send | recv | meta
    deps: tuple
    duration_s: float = 0.0
    num_ops: float = 0.0
    tensor_size: float = 0.0
    cpu: bool = False
    collective: str = ""
    size: float = 0.0
    group: str = ""           # pg_name ("" = every rank)
    peer: int = -1            # send: comm_dst; recv: comm_src
    tag: int = 0


@dataclass
class Trace:
    """A whole trace: every rank's nodes in issue order (`order_of`) and the communicator groups."""
    source: Path
    prefix: str
    files: list
    ranks: list               # rank -> [Node, ...]
    groups: dict              # pg_name -> tuple of ranks
    version: str = ""

    @property
    def world(self) -> int:
        return len(self.ranks)

    def node_counts(self) -> dict:
        """{node type: count over every rank}, types sorted."""
        counts: dict = {}
        for nodes in self.ranks:
            for x in nodes:
                counts[x.type] = counts.get(x.type, 0) + 1
        return dict(sorted(counts.items()))


def trace_files(spec: str | Path) -> tuple[Path, str, list]:
    """(directory, prefix, [file per rank]) of `DIR` or `DIR/PREFIX`. A directory must hold one
    prefix's files; ranks must run 0..N-1 without a gap."""
    p = Path(spec)
    if p.is_dir():
        d, want = p, None
    else:
        d, want = p.parent, p.name
        if not d.is_dir():
            raise ConfigError([_problem(p, "", "no such directory or trace prefix",
                                        "give --workload chakra:DIR (a directory of <prefix>.<rank>.et files) or chakra:DIR/PREFIX")])
    found: dict = {}
    for f in sorted(d.iterdir()):
        m = ET_NAME.match(f.name)
        if m and f.is_file():
            found.setdefault(m["prefix"], {})[int(m["rank"])] = f
    if want is not None:
        if want not in found:
            if found:
                names = sorted(found)
                held = f"the prefixes {', '.join(names)}" if len(names) > 1 else f"the prefix {names[0]} only"
                raise ConfigError([_problem(p, "", f"no trace files {want}.<rank>.et; {d} holds {held}",
                                            f"name one: chakra:{d / names[0]}")])
            raise ConfigError([_problem(p, "", "no such directory or trace prefix",
                                        "give --workload chakra:DIR (a directory of <prefix>.<rank>.et files) or chakra:DIR/PREFIX")])
        found = {want: found[want]}
    if not found:
        raise ConfigError([_problem(p, "", "no Chakra trace files (<prefix>.<rank>.et) here",
                                    "point chakra: at the directory ASTRA-sim's --workload-configuration names, or at DIR/PREFIX")])
    if len(found) > 1:
        raise ConfigError([_problem(d, "", f"holds the traces of several prefixes ({', '.join(sorted(found))})",
                                    f"name one: chakra:{d / sorted(found)[0]}")])
    prefix, by_rank = next(iter(found.items()))
    n = max(by_rank) + 1
    missing = [r for r in range(n) if r not in by_rank]
    if missing:
        raise ConfigError([_problem(d / f"{prefix}.{missing[0]}.et", "", f"missing: ranks run 0..{n - 1} but {len(missing)} files are absent "
                                    f"(first: rank {missing[0]})", "write one file per rank, as ASTRA-sim expects")])
    return d, prefix, [by_rank[r] for r in range(n)]


def rank_files(t: "Trace") -> str:
    """The file names of a trace's ranks in brace form: `all_reduce.{0..6}.et` (one rank: its name)."""
    return f"{t.prefix}.0.et" if t.world == 1 else f"{t.prefix}.{{0..{t.world - 1}}}.et"


def _capped(problems: list, where: str | Path, what: str, limit: int = 5) -> list:
    """At most `limit` of `problems`, then one line saying how many more of `what` there are."""
    if len(problems) <= limit:
        return problems
    rest = len(problems) - limit
    return problems[:limit] + [_problem(where, "", f"... and {rest} more {what}", "the same cause and fix as the lines above")]


def _attrs(node) -> dict:
    out = {}
    for a in node.attr:
        which = a.WhichOneof("value")
        out[a.name] = getattr(a, which) if which is not None else None
    return out


def _num(v, path, what, hi, c: Collector) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        c.add(path, f"{what} is {v!r}, not a number", "write a number")
        return 0.0
    if not math.isfinite(x) or x < 0 or x > hi:
        c.add(path, f"{what} = {v!r} is outside 0..{hi:.3g}", "correct the trace (a negative, infinite or absurd value cannot be simulated)")
        return 0.0
    return x


def _decode_file(f: Path, pb, protolib) -> tuple[str, list, Collector]:
    c = Collector(str(f))
    data = f.read_bytes()
    from google.protobuf.message import DecodeError  # installed with mlc-chakra
    buf = io.BytesIO(data)

    def messages():
        while buf.tell() < len(data):
            pos = buf.tell()
            try:
                size, _ = protolib._DecodeVarint32(buf)
            except Exception:
                raise ValueError(f"byte {pos}: a length prefix that is not a varint") from None
            body = buf.read(size)
            if len(body) < size:
                raise ValueError(f"byte {pos}: a message of {size} bytes but only {len(body)} left (truncated file)")
            yield pos, body
    md = pb.GlobalMetadata()
    nodes = []
    try:
        it = messages()
        first = next(it, None)
        if first is None:
            c.add("", "empty file", "write the trace again (a Chakra trace starts with a GlobalMetadata message)")
            return "", [], c
        md.ParseFromString(first[1])
        for pos, body in it:
            n = pb.Node()
            n.ParseFromString(body)
            nodes.append(n)
    except (ValueError, DecodeError) as e:
        c.add("", f"not a Chakra trace: {e}", "give files written by Chakra's tools, ASTRA-sim's generators or simtrain export chakra")
        return "", [], c
    out, seen = [], set()
    types = {pb.COMP_NODE: "comp", pb.COMM_COLL_NODE: "coll", pb.COMM_SEND_NODE: "send", pb.COMM_RECV_NODE: "recv",
             pb.METADATA_NODE: "meta", pb.INVALID_NODE: "meta"}
    for n in nodes:
        where = f"node {n.id}" + (f" ({n.name})" if n.name else "")
        if n.id in seen:
            c.add(where, "a second node with this id", "give every node of a rank its own id")
            continue
        seen.add(n.id)
        kind = types.get(n.type)
        if kind is None:
            c.add(where, f"node type {pb.NodeType.Name(n.type)} (remote memory) is not simulated",
                  "drop the MEM_LOAD/MEM_STORE nodes or replace them by COMP_NODEs with their duration")
            continue
        a = _attrs(n)
        node = Node(id=int(n.id), name=n.name, type=kind, deps=tuple(dict.fromkeys(list(n.data_deps) + list(n.ctrl_deps))),
                    cpu=bool(a.get("is_cpu_op", False)))
        if kind == "comp":
            node.duration_s = _num(n.duration_micros, f"{where}.duration_micros", "duration_micros", MAX_MICROS, c) * 1e-6
            node.num_ops = _num(a.get("num_ops", 0), f"{where}.num_ops", "num_ops", MAX_OPS, c)
            node.tensor_size = _num(a.get("tensor_size", 0), f"{where}.tensor_size", "tensor_size", MAX_BYTES, c)
        elif kind == "coll":
            ct = a.get("comm_type")
            name = pb.CollectiveCommType.Name(ct) if ct in pb.CollectiveCommType.values() else None
            if ct is None or name not in COLLECTIVES:
                c.add(f"{where}.comm_type", f"collective type {name or ct!r} is not simulated",
                      f"use one of {', '.join(sorted(COLLECTIVES))}")
                continue
            node.collective = COLLECTIVES[name]
            node.size = _num(a.get("comm_size", 0), f"{where}.comm_size", "comm_size", MAX_BYTES, c)
            group = str(a.get("pg_name", "") or "")
            node.group = "" if group == "0" else group      # ASTRA-sim reads "" and "0" as every rank
        else:
            if kind in ("send", "recv"):
                key = "comm_dst" if kind == "send" else "comm_src"
                if key not in a:
                    c.add(f"{where}.{key}", f"a {kind} without {key}", f"give the {'destination' if kind == 'send' else 'source'} rank")
                    continue
                node.peer = int(a[key])
                node.tag = int(a.get("comm_tag", 0) or 0)
                size = a.get("comm_size", a.get("tensor_size", 0))
                node.size = _num(size, f"{where}.comm_size", "comm_size", MAX_BYTES, c)
        out.append(node)
    for node in out:
        for d in node.deps:
            if d not in seen:
                c.add(f"node {node.id}", f"depends on node {d}, which the file does not hold", "remove the dependency or add the node")
                break
    return md.version, out, c


def read_trace(spec: str | Path) -> Trace:
    """Reads and checks a whole trace; every problem of every file is reported together."""
    pb, protolib = chakra_modules(str(spec))
    d, prefix, files = trace_files(spec)
    groups: dict = {}
    problems: list = []
    gfile = d / "comm_group.json"
    if gfile.is_file():
        try:
            raw = json.loads(gfile.read_text())
            if not isinstance(raw, dict):
                raise ValueError("the top level is not an object")
            for k, v in raw.items():
                if not isinstance(v, list) or not v or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                    raise ValueError(f"group {k!r} is not a non-empty list of rank numbers")
                groups[str(k)] = tuple(sorted(set(v)))
        except (ValueError, UnicodeDecodeError) as e:
            problems.append(_problem(gfile, "", f"not a communicator-group file: {e}",
                                     'write {"<group id>": [rank, ...], ...} as ASTRA-sim\'s --comm-group-configuration'))
    ranks, version = [], ""
    for f in files:
        v, nodes, c = _decode_file(f, pb, protolib)
        version = version or v
        problems += c.problems
        ranks.append(nodes)
    if problems:
        raise ConfigError(problems)
    for r, nodes in enumerate(ranks):
        try:
            ranks[r] = order_of(nodes)
        except CycleError as e:
            problems.append(_problem(files[r], f"node {e.ids[0]}", str(e), "remove one dependency of the cycle"))
    if problems:
        raise ConfigError(problems)
    n = len(files)
    absent: dict = {}              # rank >= n -> groups naming it
    for g, members in groups.items():
        neg = [x for x in members if x < 0]
        if neg:
            problems.append(_problem(gfile, g, f"rank {neg[0]} is negative", "list rank numbers 0..N-1"))
        for x in members:
            if x >= n:
                absent.setdefault(x, []).append(g)
    missing = []
    for x, gs in sorted(absent.items()):
        also = f" (and {len(gs) - 1} more group{'s' if len(gs) > 2 else ''})" if len(gs) > 1 else ""
        missing.append(_problem(d / f"{prefix}.{x}.et", "", f"missing: {gfile.name} group {gs[0]}{also} names rank {x}, "
                                f"but the trace has files for ranks 0..{n - 1} only",
                                f"copy every rank's file into {d}, or remove rank {x} from {gfile.name}"))
    problems += _capped(missing, d, f"rank files missing, up to {prefix}.{max(absent, default=0)}.et")
    if problems:
        raise ConfigError(problems)
    t = Trace(d, prefix, files, ranks, groups, version)
    _check_comm(t, problems)
    if problems:
        raise ConfigError(problems[:50])
    return t


def members(t: Trace, group: str) -> tuple:
    return t.groups[group] if group else tuple(range(t.world))


def _check_comm(t: Trace, problems: list) -> None:
    """Groups exist and hold their members; every member of a group issues the same collectives
    in the same order; every send has its receive. Problems name the file and the node."""
    seqs: dict = {}                # group -> rank -> [node]
    sends: dict = {}               # (src, dst, tag) -> [node]
    recvs: dict = {}
    beyond: dict = {}              # (rank, peer >= world) -> [(node, where, key)]
    for r, nodes in enumerate(t.ranks):
        f = t.files[r]
        for x in nodes:
            where = f"node {x.id}" + (f" ({x.name})" if x.name else "")
            if x.type == "coll":
                if x.group and x.group not in t.groups:
                    problems.append(_problem(f, f"{where}.pg_name", f"group {x.group!r} is not in {t.source / 'comm_group.json'}",
                                             "write comm_group.json beside the traces with every pg_name's ranks"))
                    continue
                if r not in members(t, x.group):
                    problems.append(_problem(f, f"{where}.pg_name", f"rank {r} is not a member of group {x.group!r}",
                                             "fix the group's member list or the node's pg_name"))
                    continue
                seqs.setdefault(x.group, {}).setdefault(r, []).append(x)
            elif x.type in ("send", "recv"):
                field = "comm_dst" if x.type == "send" else "comm_src"
                if x.peer >= t.world:
                    beyond.setdefault((r, x.peer), []).append((x, where, field))
                    continue
                if x.peer < 0 or x.peer == r:
                    problems.append(_problem(f, f"{where}.{field}", f"peer rank {x.peer} is not another rank of the trace (0..{t.world - 1})",
                                             f"fix {field}"))
                    continue
                key = (r, x.peer, x.tag) if x.type == "send" else (x.peer, r, x.tag)
                (sends if x.type == "send" else recvs).setdefault(key, []).append((r, x))
    lines = []
    for (r, peer), xs in sorted(beyond.items()):
        x, where, field = xs[0]
        fields = " / ".join(sorted({k for _, _, k in xs}))
        more = f" (as do {len(xs) - 1} more nodes of this file)" if len(xs) > 1 else ""
        lines.append(_problem(t.files[r], f"{where}.{field}", f"names peer rank {peer}{more}, but the trace has files for "
                              f"ranks 0..{t.world - 1} only", f"rank {peer}'s file {t.prefix}.{peer}.et is missing "
                              f"(copy it into {t.source}), or {fields} is wrong"))
    problems += _capped(lines, t.source, "files with sends / receives naming a rank without a file")
    for g, by in seqs.items():
        mem = members(t, g)
        counts = {r: len(by.get(r, [])) for r in mem}
        if len(set(counts.values())) > 1:
            lo = min(mem, key=lambda r: (counts[r], r))
            hi = max(mem, key=lambda r: (counts[r], -r))
            problems.append(_problem(t.files[lo], f"group {g or 'world'}",
                                     f"rank {lo} issues {counts[lo]} collectives on the group, rank {hi} {counts[hi]}",
                                     "every member of a group must issue the same collectives (a missing rank file or node?)"))
            continue
        ref = by[mem[0]]
        for r in mem[1:]:
            for k, (a, b) in enumerate(zip(ref, by[r])):
                if a.collective != b.collective or a.size != b.size:
                    problems.append(_problem(t.files[r], f"node {b.id}",
                                             f"collective #{k + 1} of group {g or 'world'} is {b.collective} of {b.size:.0f} B here "
                                             f"but {a.collective} of {a.size:.0f} B on rank {mem[0]} (node {a.id})",
                                             "the members of a group must issue matching collectives in the same order"))
                    break
    for key in sorted(set(sends) | set(recvs)):
        s, rv = sends.get(key, []), recvs.get(key, [])
        if len(s) != len(rv):
            src, dst, tag = key
            r, x = (s or rv)[0]
            problems.append(_problem(t.files[r], f"node {x.id}",
                                     f"{len(s)} sends from rank {src} to rank {dst} with tag {tag} but {len(rv)} receives",
                                     "give every send its receive (the same source, destination and comm_tag)"))
            continue
        for (ra, a), (rb, b) in zip(s, rv):
            if b.size and a.size != b.size:
                problems.append(_problem(t.files[rb], f"node {b.id}", f"receives {b.size:.0f} B but the send (rank {ra}, node {a.id}) "
                                         f"sends {a.size:.0f} B", "make the sizes agree"))


def order_of(nodes: list) -> list:
    """One topological order of a rank's nodes: the smallest ready id first. A cycle raises."""
    by = {x.id: x for x in nodes}
    indeg = {x.id: 0 for x in nodes}
    kids: dict = {}
    for x in nodes:
        for d in x.deps:
            if d in by:
                indeg[x.id] += 1
                kids.setdefault(d, []).append(x.id)
    heap = [i for i, k in indeg.items() if k == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        i = heapq.heappop(heap)
        out.append(by[i])
        for k in kids.get(i, ()):
            indeg[k] -= 1
            if indeg[k] == 0:
                heapq.heappush(heap, k)
    if len(out) < len(nodes):
        left = sorted(i for i, k in indeg.items() if k > 0)
        raise CycleError(left)
    return out


class CycleError(ValueError):
    def __init__(self, ids):
        self.ids = ids
        super().__init__(f"a dependency cycle through nodes {', '.join(map(str, ids[:8]))}")


def comp_op(x: Node) -> Op:
    """The cost-model operator of a compute node with num_ops: the square GEMM of num_ops FLOPs
    (m = n = k = (num_ops / 2)^(1/3)) reading and writing tensor_size bytes; with tensor_size
    only, a memory-bound op."""
    if x.num_ops <= 0:
        return Op(x.name or "node", "memory", "F", 0.0, x.tensor_size)
    s = (x.num_ops / 2.0) ** (1.0 / 3.0)
    return Op(x.name or "node", "gemm", "F", x.num_ops, x.tensor_size, (s, s, s))


def lower_trace(t: Trace, network: NetworkBackend, costs: ComputeCostModel,
                trace_durations: bool = False) -> tuple[list, dict]:
    """(ops, counts): the trace as EOps, class = rank, rank r on device r. `costs` prices the
    compute nodes with num_ops or tensor_size unless `trace_durations`.
    counts: {"trace_duration": n, "cost_model": n} compute nodes."""
    ops: list = []
    counts = {"trace_duration": 0, "cost_model": 0}
    done: dict = {}                 # (rank, node id) -> op id of its completion
    pending_recv = []               # (recv op, (src, dst, tag, k))
    send_of: dict = {}              # (src, dst, tag, k) -> send op id
    coll_seq: dict = {}             # (rank, group) -> collectives so far
    p2p_seq: dict = {}              # (src, dst, tag, side) -> count so far

    def new(**kw) -> EOp:
        op = EOp(id=len(ops), **kw)
        op.order = float(op.id)
        ops.append(op)
        return op
    for r, nodes in enumerate(t.ranks):
        for x in nodes:
            deps = [done[(r, d)] for d in x.deps if (r, d) in done]
            label = x.name or f"node {x.id}"
            if x.type == "comp":
                priced = not trace_durations and (x.num_ops > 0 or x.tensor_size > 0)
                dur = costs.duration(comp_op(x)) if priced else x.duration_s
                counts["cost_model" if priced else "trace_duration"] += 1
                op = new(cls=r, stream="cpu" if x.cpu else "compute", kind="compute", category="F", duration=dur,
                         label=label, deps=deps)
            elif x.type == "meta":
                op = new(cls=r, stream="meta", kind="compute", category="F", duration=0.0, label=label, deps=deps)
            elif x.type == "coll":
                mem = members(t, x.group)
                k = coll_seq[(r, x.group)] = coll_seq.get((r, x.group), 0) + 1
                nbytes = x.size * len(mem) if x.collective == "all_gather" else x.size
                coll = "all_reduce" if x.collective == "barrier" else x.collective
                if len(mem) > 1:
                    tm = network.group_collective(coll, nbytes, tuple(mem))
                    dur, load, key = tm.seconds, tm.load, tm.key
                else:
                    dur, load, key = 0.0, (), None
                op = new(cls=r, stream=f"pg:{x.group or 'world'}", kind="coll", category="dp", duration=dur,
                         label=f"{x.collective}:{label}", deps=deps, bytes=nbytes,
                         rendezvous=("pg", x.group, k) if len(mem) > 1 else None, peers=len(mem), load=load, net_key=key)
            elif x.type == "send":
                k = p2p_seq[(r, x.peer, x.tag, "s")] = p2p_seq.get((r, x.peer, x.tag, "s"), 0) + 1
                tm = network.p2p(r, x.peer, x.size)
                op = new(cls=r, stream=f"send:{x.peer}", kind="send", category="pp", duration=tm.seconds,
                         label=f"send:{label}", deps=deps, bytes=x.size, load=tm.load, net_key=tm.key)
                send_of[(r, x.peer, x.tag, k)] = op.id
            else:       # recv: done when its own dependencies and the matching send are
                k = p2p_seq[(x.peer, r, x.tag, "r")] = p2p_seq.get((x.peer, r, x.tag, "r"), 0) + 1
                op = new(cls=r, stream=f"recv:{x.peer}", kind="coll", category="pp", duration=0.0,
                         label=f"recv:{label}", deps=deps, bytes=x.size)
                pending_recv.append((op, (x.peer, r, x.tag, k)))
            done[(r, x.id)] = op.id
    for op, key in pending_recv:
        op.deps.append(send_of[key])
    return ops, counts
