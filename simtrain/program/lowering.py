"""Per-rank programs (fifth pipeline stage): lowering (workload, plan, schedule) -> ops on streams.

One program per equivalence class of ranks. Streams, like CUDA streams, issue their ops in order:
  compute   forward / backward segments, optimizer step (waits for tensor-parallel collectives,
            which Megatron issues synchronously between the column- and row-parallel GEMMs)
  tp        tensor-parallel collectives
  dp        data-parallel gradient reduction and parameter gathering (dense weights over dp x cp,
            expert weights over the expert-data-parallel group)
  cp        context-parallel KV exchange (ring rounds overlap the attention rounds on compute)
  ep, etp   MoE token dispatch / combine over the expert-parallel group, gathers over etp
  pp_next   pipeline sends to the next rank, pp_prev to the previous one (the receiver's compute
            op depends on the matching send; a hand-over between two chunks of one rank is a
            plain dependency)
Consecutive operators between two communication points are fused into one compute op whose
duration is their sequence time (`costs.sequence_time`: the sum of their durations, or with a
profile's host issue cost the host queue; the per-operator list stays in the workload).

The schedule is executed as data: each action becomes a chain of ops (F: the stage's forward; B:
input gradients with recompute; W: weight gradients; BW: both in Megatron's order). An action
marked `overlap_next` is merged with the next one unit by unit (a unit is one compute op and the
communication it issues), so one chain's communication runs under the other's compute, as in
DeepSeek's overlapped forward/backward pairs. Ops carry an `order` that fixes their place on
their stream; merging only reorders within the pair and keeps a topological order.

Memory per microbatch and chunk: F allocates the stage's stored activations; a B that leaves its
W for later frees all but what W still needs (the wgrad inputs, `StageWork.weight_grad_bytes`);
W (or BW) frees the rest. The in-flight count (microbatch-chunks whose activations are alive)
rises at F and falls at W / BW.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from simtrain.cost.roofline import sequence_time
from simtrain.hardware.topology import Topology
from simtrain.network.collectives import choose, p2p_time
from simtrain.plan.grid import RankClass
from simtrain.schedules import Action, Schedule
from simtrain.spec.scenario import Scenario
from simtrain.workload.ir import ACT_BYTES, Comm, Ring, StageWork
from simtrain.workload.moe import node_limited_share

OPT_BYTES_PER_PARAM = 34.0
"""Adam step with fp32 master weights, memory-bound: read grad, master, m, v (4 x 4 B), write
master, m, v (3 x 4 B) and the 16-bit weight (2 B), plus one 4 B read of the gradient for the
global-norm clip: 16 + 14 + 4 = 34 bytes per local parameter."""

@dataclass
class EOp:
    """One op of a program. `deps` are op ids; `rendezvous` names a collective across classes."""
    id: int
    cls: int
    stream: str
    kind: str                 # compute | coll | send
    category: str             # F | B | W | BW | opt | tp | dp | pp
    duration: float
    label: str
    mb: int = -1
    chunk: int = 0
    deps: list = field(default_factory=list)
    rendezvous: tuple | None = None
    peers: int = 1            # number of classes that must arrive at the rendezvous
    alloc: float = 0.0        # activation bytes allocated when the op starts
    free: float = 0.0         # activation bytes freed when the op ends (negative: allocated)
    transient: float = 0.0    # bytes held only while the op runs
    inflight: int = 0         # +1 at start (a microbatch-chunk's activations come alive), -1 at end
    bytes: float = 0.0        # communication size (for the trace)
    order: float = -1.0       # position on its stream (defaults to the id)
    load: tuple = ()          # ((link, fraction of its capacity used when alone), ...): flow backend only
    fused: tuple = ()         # ((stream, category, seconds, label), ...): the parts of a compute op that absorbed
                              # collectives or the compute ops after it, in order (empty: the op is one part)


def stream_sequences(ops: list) -> dict:
    """(class, stream) -> its ops in issue order."""
    streams: dict = {}
    for op in ops:
        streams.setdefault((op.cls, op.stream), []).append(op)
    for seq in streams.values():
        seq.sort(key=lambda o: (o.order, o.id))
    return streams


class Lowering:
    def __init__(self, sc: Scenario, topo: Topology, work: tuple, classes: list, sched: Schedule, costs, place=None,
                 work_of=None, fuse: bool = True, class_costs=None, link_factor=None):
        """`work_of(ep_rank)`: the workload as an expert-parallel rank sees it (uneven expert
        loads); by default every rank runs `work`. `fuse`: fold class-local collectives into
        the compute op before them (`fusable`), which halves the ops of a tensor-parallel step."""
        self.sc, self.topo, self.work, self.classes, self.sched, self.costs = sc, topo, work, classes, sched, costs
        self.work_of = work_of or (lambda ep_rank: work)
        self.class_costs = class_costs or {}       # class id -> cost model (stragglers, mixed devices)
        self.link_factor = link_factor or {}       # class id -> time factor of its transfers
        self.fuse = fuse and not any(a.overlap_next for row in sched.actions for a in row)
        self.ops: list = []
        self.send_of: dict = {}      # (class id, F|B, mb, chunk) -> send op id
        self.pending_recv: list = [] # (op, producer class, F|B, mb, chunk) resolved after all classes
        self.grad_bytes = 2.0 if sc.training.precision == "fp16" else 4.0
        self.network = sc.network
        # measured collective tables of a calibrated device profile (analytical backend)
        self.measured = getattr(getattr(costs, "dev", None), "collectives", ()) or ()
        self.comm_notes: set = set()
        self.chosen: dict = {}       # (kind, collective, bytes, group shape) -> collectives.Cost (analytical)
        self._seg_cache: dict = {}
        self.pairs: list = []        # (first compute op of each chain) of overlapped pairs
        self.flow = None             # the flow backend's StepFlows, when the scenario asks for it
        if sc.network.backend == "flow":
            from simtrain.network.flows import StepFlows
            self.flow = StepFlows(sc, topo, place)
        self.merge = self.fuse and self.flow is None   # compute chains merged while lowering
        self._items_cache: dict = {}

    def _new(self, c: RankClass, **kw) -> EOp:
        op = EOp(id=len(self.ops), cls=c.id, **kw)
        op.order = float(op.id)
        self.ops.append(op)
        return op

    def costs_of(self, c: RankClass):
        """The class's compute cost model (its device type, slowed by its straggler factors)."""
        return self.class_costs.get(c.id, self.costs)

    def seg_time(self, seg, costs=None) -> tuple:
        """(duration, label) of a fused segment, cached per segment object and cost model
        (templates repeat)."""
        costs = costs or self.costs
        key = (id(seg), id(costs))
        hit = self._seg_cache.get(key)
        if hit is None:
            label = "+".join(o.name for o in seg[:3]) + ("+..." if len(seg) > 3 else "")
            hit = self._seg_cache[key] = (sequence_time(costs, seg), label, seg)
        return hit[0], hit[1]

    def fusable(self, c: RankClass, comm: Comm) -> bool:
        """A collective can be folded into the compute op before it when nothing but that op can
        start or delay it: its whole group is this class (no rendezvous with other ranks), no
        overlapped pair shares its stream, and no other transfer contends with it (analytical
        backend). The compute stream waits for it either way, so the step is the same."""
        return self.fuse and self.flow is None and len(c.peers_of(comm.kind)) == 1

    def slowest_link(self, class_ids) -> float:
        """A collective or transfer is as slow as the slowest member's links."""
        lf = self.link_factor
        return max((lf.get(i, 1.0) for i in class_ids), default=1.0) if lf else 1.0

    def comm_cost(self, c: RankClass, comm: Comm) -> tuple:
        """(comm as timed, category, key, seconds) of one collective of class c."""
        shape = c.shape_of(comm.kind)
        if comm.node_limit:
            # node-limited routing: only the copies that cross nodes are timed on the network
            share = node_limited_share(shape.nodes, *comm.node_limit)
            comm = Comm(comm.kind, comm.collective, comm.size_bytes * share, comm.name)
        category = "dp" if comm.kind == "edp" else ("ep" if comm.kind == "etp" else comm.kind)
        if comm.collective == "send_recv":
            # one round of a ring exchange: every member sends one block to its ring successor at
            # once, so a round takes one block over the widest hop the group spans
            key = (comm.kind, comm.collective, comm.size_bytes, shape)
            dur = p2p_time(comm.size_bytes, shape.span or "scale_up", self.topo)
        elif self.flow is not None:
            key, dur = self.flow.duration(comm.collective, comm.size_bytes, comm.kind, c.stage)
        else:
            key = (comm.kind, comm.collective, comm.size_bytes, shape)
            pick = self.chosen.get(key)
            if pick is None:
                net = self.network
                pick = self.chosen[key] = choose(comm.collective, comm.size_bytes, shape, self.topo,
                                                 net.algorithm_for(comm.collective), net.protocol, self.measured, self.comm_notes)
            dur = pick.seconds
        return comm, category, key, dur

    def comm_op(self, c: RankClass, comm: Comm, deps, mb, seq, transient=0.0, chunk=0) -> EOp:
        peers = c.peers_of(comm.kind)
        comm, category, key, dur = self.comm_cost(c, comm)
        dur *= self.slowest_link(peers)
        op = self._new(c, stream=comm.kind, kind="coll", category=category, duration=dur,
                       label=f"{comm.collective}:{comm.name}", mb=mb, chunk=chunk, deps=list(deps),
                       rendezvous=(comm.kind, seq, peers) if len(peers) > 1 else None, peers=len(peers),
                       bytes=comm.size_bytes, transient=transient)
        if self.flow is not None and comm.collective != "send_recv":
            self.flow.key_of[op.id] = key
            op.load = self.flow.load(key, c.multiplicity / self.flow.per_stage)
        return op

    def lower(self) -> list:
        for c in self.classes:
            _ClassLowering(self, c).run()
        for op, producer, kind, mb, chunk in self.pending_recv:
            op.deps.append(self.send_of[(producer, kind, mb, chunk)])
        for a, b in self.pairs:
            # an overlapped pair starts once both inputs are there (DeepSeek receives both first)
            a.deps += [d for d in b.deps if d not in a.deps and self.ops[d].cls != a.cls]
        if self.fuse and self.flow is None:
            self.ops = merge_chains(self.ops)
        return self.ops


def merge_chains(ops: list) -> list:
    """Merges runs of compute ops that nothing can separate: b follows a on a's compute stream,
    waits for nothing but a, and nothing else waits for a (no send, bucket or gather hangs on
    a's end), within one action (same category, microbatch, chunk). b would start the instant a
    ends, so one op of both durations gives the same timeline. Memory is kept: the merged op
    allocates what a allocated at its start and frees what b freed at its end (a run never spans
    a microbatch's first allocation and its last free, checked by `inflight`). Returns the new
    list, ids renumbered in order."""
    refs = [0] * len(ops)
    for op in ops:
        for d in op.deps:
            refs[d] += 1
    streams = stream_sequences(ops)
    gone: dict = {}                      # absorbed op id -> the op that absorbed it

    def root(i):
        while i in gone:
            i = gone[i]
        return i
    for (cls, stream), seq in streams.items():
        if stream != "compute":
            continue
        head = None
        for b in seq:
            a = head
            bd = [root(d) for d in b.deps]
            ok = (a is not None and bd in ([], [a.id]) and refs[a.id] == len(bd)
                  and a.category == b.category and a.mb == b.mb and a.chunk == b.chunk
                  and not (a.inflight > 0 and b.inflight < 0) and b.alloc == 0 and a.free == 0
                  and b.transient == a.transient)
            if not ok:
                head = b
                continue
            a.fused = (a.fused or (("compute", a.category, a.duration, a.label),)) + (
                b.fused or (("compute", b.category, b.duration, b.label),))
            a.duration += b.duration
            a.free += b.free
            a.inflight += b.inflight
            refs[a.id] = refs[b.id]
            gone[b.id] = a.id
    if not gone:
        return ops
    keep = [op for op in ops if op.id not in gone]
    new_id = {op.id: i for i, op in enumerate(keep)}
    for op in keep:
        op.deps = sorted({new_id[root(d)] for d in op.deps})
        op.order = float(new_id[op.id]) if op.order == float(op.id) else op.order
    for op in keep:
        op.id = new_id[op.id]
    return keep


class _ClassLowering:
    """The program of one rank class: its schedule row, action by action."""

    def __init__(self, low: Lowering, c: RankClass):
        self.low, self.c = low, c
        self.sc = low.sc
        self.p = low.sc.parallel
        self.rank = c.stage
        self.sched = low.sched
        self.acts = self.sched.actions[self.rank]
        self.seqs: dict = {}
        self.local_end: dict = {}        # (F|B, mb, chunk) -> last op id of that action here
        self.grad_ops: list = []
        self.param_gather: dict = {}     # (chunk, layer) -> op id of the overlapped parameter all-gather
        self.first_f: dict = {}          # chunk -> index of its first F
        self.final_w: dict = {}          # chunk -> index of the action completing its weight gradients
        for i, a in enumerate(self.acts):
            if a.kind == "F":
                self.first_f.setdefault(a.chunk, i)
            if a.kind in ("W", "BW"):
                self.final_w[a.chunk] = i
        self.bucket_params = 0.0
        self.bucket_expert = 0.0
        # what an items() call's result depends on besides the items: the class's costs, link
        # factor, which of its groups are class-local (foldable) and their shapes (their cost)
        self.cost_key = (id(low.costs_of(c)), low.link_factor.get(c.id, 1.0),
                         tuple(sorted((k, len(v)) for k, v in (c.peers or {}).items())),
                         tuple(sorted((c.shapes or {}).items())))
        self.dp_on = self.p.dp * self.p.cp > 1
        self.edp_on = self.sc.expert_dp > 1 and self.sc.model.moe is not None
        self.zero = self.p.zero_stage

    # -- helpers --------------------------------------------------------------------------------
    def work(self, chunk: int) -> StageWork:
        return self.low.work_of(self.c.ep_rank)[self.sched.stage_of[self.rank][chunk]]

    def next_seq(self, kind: str) -> int:
        self.seqs[kind] = self.seqs.get(kind, 0) + 1
        return self.seqs[kind]

    def dp_comm(self, collective, nbytes, name, deps, mb, chunk=0):
        return self.low.comm_op(self.c, Comm("dp", collective, nbytes, name), deps, mb, self.next_seq("dp"), chunk=chunk)

    def items(self, items, category, a: Action, first_deps, transient=0.0):
        """Emits the items (segments and comms) in order; returns the last op (or None).

        When a call's items all end up in one compute op (every collective folded, every segment
        merged), the op's duration and parts are remembered per (items, category, this class's
        costs and peers): the same layer program in the next microbatch, layer or class with the
        same costs is then one op without walking its items again."""
        low, c = self.low, self.c
        prefix = f"{category}{a.microbatch}" + (f".{a.chunk}" if self.sched.chunks > 1 else "") + ":"
        key = (id(items), category, transient, self.cost_key) if low.merge else None
        hit = low._items_cache.get(key) if key is not None else None
        if hit is not None:
            dur, parts, seqs, raw = hit
            sq = self.seqs
            for k, n in seqs:
                sq[k] = sq.get(k, 0) + n
            prev = low.ops[-1] if low.ops else None
            if (not first_deps and prev is not None and prev.cls == c.id and prev.stream == "compute"
                    and prev.category == category and prev.mb == a.microbatch and prev.chunk == a.chunk
                    and prev.transient == transient and prev.free == 0 and prev.inflight >= 0):
                # the previous layer's op of this action, and nothing created since that could
                # wait for its end: this layer continues it (as merge_chains would)
                prev.fused = (prev.fused or (("compute", prev.category, prev.duration, prev.label),)) + parts
                prev.duration += dur
                return prev
            op = low._new(c, stream="compute", kind="compute", category=category, duration=dur, label=prefix + raw,
                          mb=a.microbatch, chunk=a.chunk, deps=list(first_deps), transient=transient)
            op.fused = parts
            return op
        n0 = len(low.ops)
        last = None
        deps = list(first_deps)
        own, own_raw = -1, ""             # the last compute op this call created, and its segment label
        folded = []                       # kinds of the collectives folded in this call
        for it in items:
            if isinstance(it, Ring):
                last = self.ring(it, category, a, deps, last, transient)
                deps = []
                continue
            if isinstance(it, Comm):
                if last is not None and last.stream == "compute" and not deps and low.fusable(c, it):
                    comm, cat, _, dur = low.comm_cost(c, it)
                    dur *= low.slowest_link((c.id,))
                    self.next_seq(it.kind)
                    folded.append(it.kind)
                    last.fused = (last.fused or (("compute", last.category, last.duration, own_raw),)) + (
                        (comm.kind, cat, dur, f"{comm.collective}:{comm.name}"),)
                    last.duration += dur
                    continue
                if last is not None:
                    deps = deps + [last.id]
                last = low.comm_op(c, it, deps, a.microbatch, self.next_seq(it.kind), chunk=a.chunk)
                deps = []
            else:
                d, label = low.seg_time(it, low.costs_of(c))
                if d == 0.0 and not deps and last is not None:
                    continue
                if (low.merge and not deps and last is not None and last.id == own and own == len(low.ops) - 1
                        and last.stream == "compute"):
                    # the next segment of this chain, nothing in between: it would start the
                    # instant `last` ends, so `last` takes it on (merge_chains does the same
                    # across calls, where it can see who else waits)
                    last.fused = (last.fused or (("compute", last.category, last.duration, own_raw),)) + (
                        ("compute", category, d, label),)
                    last.duration += d
                    continue
                if last is not None and last.stream != "compute":
                    deps = deps + [last.id]
                last = low._new(c, stream="compute", kind="compute", category=category, duration=d,
                                label=prefix + label, mb=a.microbatch, chunk=a.chunk, deps=list(deps), transient=transient)
                own, own_raw = last.id, label
                deps = []
        if key is not None and last is not None and len(low.ops) == n0 + 1 and last.id == own and not deps:
            low._items_cache[key] = (last.duration, last.fused, tuple((k, folded.count(k)) for k in sorted(set(folded))), own_raw)
        if deps and last is None:
            # nothing emitted but dependencies pending: carry them forward via an empty op
            last = low._new(c, stream="compute", kind="compute", category=category, duration=0.0,
                            label=f"{category}{a.microbatch}:wait", mb=a.microbatch, chunk=a.chunk, deps=list(deps))
        return last

    def ring(self, ring: Ring, category, a: Action, deps, last, transient):
        """Ring attention rounds: round i's compute waits for transfer i-1; transfer i forwards
        the block that arrived in transfer i-1 (the first sends the local K, V once the
        projections before the ring are done). Transfers are cp-group collectives."""
        low, c = self.low, self.c
        d, label = low.seg_time(ring.segment, low.costs_of(c))
        start = list(deps) + ([last.id] if last is not None else [])
        prev_x = None
        out = None
        for i in range(ring.steps):
            if i < ring.steps - 1:
                xdeps = [prev_x.id] if prev_x is not None else list(start)
                x = low.comm_op(c, ring.comm, xdeps, a.microbatch, self.next_seq("cp"), chunk=a.chunk)
            cdeps = ([prev_x.id] if prev_x is not None else [d_ for d_ in start if low.ops[d_].stream != "compute"])
            out = low._new(c, stream="compute", kind="compute", category=category, duration=d,
                           label=f"{category}{a.microbatch}" + (f".{a.chunk}" if self.sched.chunks > 1 else "") + f":ring{i}:{label}",
                           mb=a.microbatch, chunk=a.chunk, deps=cdeps, transient=transient)
            prev_x = x if i < ring.steps - 1 else None
        return out

    def _neighbour(self, r: int):
        """(class id, link class, send stream) of pipeline rank r seen from this rank; the two ends
        of the pipeline are neighbours too (interleaving goes from the last rank back to the first)."""
        c = self.c
        if r == self.rank + 1:
            return c.pp_next, c.link_next, "pp_next"
        if r == self.rank - 1:
            return c.pp_prev, c.link_prev, "pp_prev"
        if {r, self.rank} == {0, self.sched.pp - 1}:
            return c.pp_wrap, c.link_wrap, ("pp_next" if self.rank == self.sched.pp - 1 else "pp_prev")
        raise AssertionError("routes move between neighbouring ranks (checked by schedules.validate)")

    def recv_gather(self, a: Action, kind: str, pos: int) -> EOp | None:
        """The tp all-gather that rebuilds a pipeline message sent split over the tp group
        (`parallel.pp_scatter_gather`), or None where the input is local or not split. It is
        created before the action's own ops, so it comes first on the tp stream, and it waits for
        this rank's last compute op: the framework issues it after the previous action, behind
        that action's tp collectives on the same communicator (whether or not they were folded)."""
        r, _ = self.sched.route(a.microbatch)[pos]
        if r == self.rank:
            return None
        ms = self.sched.stage_of[self.rank][a.chunk]
        n = self.low.work_of(self.c.ep_rank)[ms - 1 if kind == "F" else ms].recv_gather_bytes
        if not n:
            return None
        ops = self.low.ops
        prev = next((ops[i].id for i in range(len(ops) - 1, self.op0 - 1, -1) if ops[i].stream == "compute"), None)
        name = f"pp_gather_{'act' if kind == 'F' else 'grad'}{a.microbatch}"
        op = self.low.comm_op(self.c, Comm("tp", "all_gather", n, name), [] if prev is None else [prev],
                              a.microbatch, self.next_seq("tp"), chunk=a.chunk)
        op.category = "pp"          # pipeline communication in the breakdown, on the tp stream
        return op

    def receive(self, first_op: EOp, a: Action, kind: str, pos: int) -> None:
        """Makes the action's first compute op wait for the input produced at route position pos."""
        r, ch = self.sched.route(a.microbatch)[pos]
        if r == self.rank:
            first_op.deps.append(self.local_end[(kind, a.microbatch, ch)])
        else:
            producer, _, _ = self._neighbour(r)
            self.low.pending_recv.append((first_op, producer, kind, a.microbatch, ch))

    def send(self, last: EOp, a: Action, kind: str, pos: int) -> None:
        r, _ = self.sched.route(a.microbatch)[pos]
        self.local_end[(kind, a.microbatch, a.chunk)] = last.id
        if r == self.rank:
            return
        _, link, stream = self._neighbour(r)
        flow, load = self.low.flow, ()
        # activations go to the next model stage, their gradients come back: the size of what the
        # earlier of the two stages produces (the same for every language-model stage)
        ms = self.sched.stage_of[self.rank][a.chunk]
        nbytes = self.low.work_of(self.c.ep_rank)[ms if kind == "F" else ms - 1].send_bytes
        if flow is not None:
            key, dur, load = flow.p2p(self.c, r, nbytes, link)
        else:
            dur = p2p_time(nbytes, link, self.low.topo)
        dur *= self.low.slowest_link((self.c.id, self._neighbour(r)[0]))
        snd = self.low._new(self.c, stream=stream, kind="send", category="pp", duration=dur, load=load,
                            label=f"send_{'act' if kind == 'F' else 'grad'}{a.microbatch}" + (f".{a.chunk}" if self.sched.chunks > 1 else ""),
                            mb=a.microbatch, chunk=a.chunk, deps=[last.id], bytes=nbytes)
        self.low.send_of[(self.c.id, kind, a.microbatch, a.chunk)] = snd.id
        if flow is not None:
            flow.key_of[snd.id] = key

    # -- actions ----------------------------------------------------------------------------------
    def forward(self, idx: int, a: Action) -> None:
        low, w = self.low, self.work(a.chunk)
        edge_ag = self.edge_gather(w, a)
        pos = self.sched.position(self.rank, a.chunk, a.microbatch)
        gather = self.recv_gather(a, "F", pos - 1) if pos > 0 else None
        start = len(low.ops)
        last = self.items(w.pre.forward, "F", a, []) if w.pre is not None else None
        ends = []
        for l in range(w.num_layers):
            layer_p = w.layer_dense[l] + w.layer_expert[l]
            ldeps = [last.id] if last is not None and last.stream != "compute" else []
            if idx == self.first_f.get(a.chunk) and (a.chunk, l) in self.param_gather:
                ldeps.append(self.param_gather[(a.chunk, l)])
            if self.zero == 3 and self.dp_on:
                # FSDP prefetches one layer ahead: gather layer l once layer l-2 is done
                ag = self.dp_comm("all_gather", ACT_BYTES * layer_p, f"fsdp_ag_l{l}",
                                  [ends[-2].id] if len(ends) >= 2 else [], a.microbatch, a.chunk)
                ldeps.append(ag.id)
            last = self.items(w.layers[l].forward, "F", a, ldeps)
            ends.append(last)
        if w.post is not None:
            last = self.items(w.post.forward, "F", a, [])
        first = next(o for o in low.ops[start:] if o.stream == "compute")
        first.alloc += w.act_bytes
        first.inflight += 1
        if edge_ag is not None:
            first.deps.append(edge_ag)
        if gather is not None:
            first.deps.append(gather.id)
        if pos > 0:
            self.receive(gather or first, a, "F", pos - 1)
        if pos < self.sched.num_stages - 1:
            self.send(last, a, "F", pos + 1)

    def backward(self, idx: int, a: Action) -> None:
        """B (input gradients only) or BW (input and weight gradients)."""
        low, w = self.low, self.work(a.chunk)
        split = a.kind == "B"
        final = idx == self.final_w.get(a.chunk)
        edge_ag = self.edge_gather(w, a)
        pos = self.sched.position(self.rank, a.chunk, a.microbatch)
        gather = self.recv_gather(a, "B", pos + 1) if pos < self.sched.num_stages - 1 else None
        start = len(low.ops)
        tr = w.act_working_bytes

        def part(lp):
            return lp.backward_input if split else lp.backward

        last = self.items(part(w.post), a.kind, a, [], transient=tr) if w.post is not None else None
        ends = []
        for l in reversed(range(w.num_layers)):
            ldeps = [last.id] if last is not None and last.stream != "compute" else []
            if self.zero == 3 and self.dp_on:
                ag = self.dp_comm("all_gather", ACT_BYTES * (w.layer_dense[l] + w.layer_expert[l]), f"fsdp_ag_bwd_l{l}",
                                  [ends[-2].id] if len(ends) >= 2 else [], a.microbatch, a.chunk)
                ldeps.append(ag.id)
            lp = w.layers[l]
            if lp.recompute:
                last = self.items(lp.recompute, a.kind, a, ldeps, transient=tr)
                ldeps = [last.id] if last.stream != "compute" else []
            last = self.items(part(lp), a.kind, a, ldeps, transient=tr)
            ends.append(last)
            if not split:
                self.layer_grads_done(w, l, last, a, final)
        if w.pre is not None and part(w.pre):
            last = self.items(part(w.pre), a.kind, a, []) or last
        if split:
            last.free += w.act_bytes - w.weight_grad_bytes
        else:
            last.free += w.act_bytes
            last.inflight -= 1
        first = next(o for o in low.ops[start:] if o.stream == "compute")
        if edge_ag is not None:
            first.deps.append(edge_ag)
        if not split:
            self.edge_scatter(w, a, last)
        if not split:
            self.flush_bucket(a, last, final)
        if gather is not None:
            first.deps.append(gather.id)
        if pos < self.sched.num_stages - 1:
            self.receive(gather or first, a, "B", pos + 1)
        if pos > 0:
            self.send(last, a, "B", pos - 1)
        else:
            self.local_end[("B", a.microbatch, a.chunk)] = last.id
        if not split:
            self.local_end[("W", a.microbatch, a.chunk)] = last.id
        else:
            self.local_end[("Bdone", a.microbatch, a.chunk)] = last.id

    def weight(self, idx: int, a: Action) -> None:
        """W: the deferred weight-gradient GEMMs of every layer of the chunk, after its B."""
        w = self.work(a.chunk)
        final = idx == self.final_w.get(a.chunk)
        dep = [self.local_end[("Bdone", a.microbatch, a.chunk)]]
        last = self.items(w.post.backward_weight, "W", a, dep) if w.post is not None and w.post.backward_weight else None
        for l in reversed(range(w.num_layers)):
            last = self.items(w.layers[l].backward_weight, "W", a, dep if last is None else [])
            self.layer_grads_done(w, l, last, a, final)
        if w.pre is not None and w.pre.backward_weight:
            last = self.items(w.pre.backward_weight, "W", a, [])
        last.free += w.weight_grad_bytes
        last.inflight -= 1
        self.local_end[("W", a.microbatch, a.chunk)] = last.id
        self.edge_scatter(w, a, last)
        self.flush_bucket(a, last, final)

    def _edge_params(self, w: StageWork) -> float:
        return w.params - sum(w.layer_dense) - sum(w.layer_expert) if self.zero == 3 and self.dp_on else 0.0

    def edge_gather(self, w: StageWork, a: Action):
        """ZeRO-3 also shards the embedding / LM head: they are gathered before the action (issued
        first, so it precedes the action's layer gathers on the dp stream); returns the op id."""
        edge = self._edge_params(w)
        if edge <= 0:
            return None
        return self.dp_comm("all_gather", ACT_BYTES * edge, "fsdp_ag_edge", [], a.microbatch, a.chunk).id

    def edge_scatter(self, w: StageWork, a: Action, last: EOp) -> None:
        """... and their gradient is reduce-scattered after the action, per microbatch like the layers."""
        edge = self._edge_params(w)
        if edge > 0:
            rs = self.dp_comm("reduce_scatter", self.low.grad_bytes * edge, "fsdp_rs_edge", [last.id], a.microbatch, a.chunk)
            self.grad_ops.append(rs.id)

    def flush_bucket(self, a: Action, last: EOp, final: bool) -> None:
        """The chunk's gradients are complete: its partial bucket goes now, not with the next chunk."""
        if final and self.dp_on and self.zero < 3 and self.p.overlap_grad_reduce and self.bucket_params > 0:
            g = self.dp_comm("all_reduce" if self.zero == 0 else "reduce_scatter",
                             self.low.grad_bytes * self.bucket_params, "grad_bucket", [last.id], a.microbatch, a.chunk)
            self.grad_ops.append(g.id)
            self.bucket_params = 0.0
        if final and self.edp_on and self.p.overlap_grad_reduce and self.bucket_expert > 0:
            self.grad_ops.append(self.expert_reduce(self.bucket_expert, [last.id], a).id)
            self.bucket_expert = 0.0

    def expert_reduce(self, nparams: float, deps, a: Action | None):
        """Expert gradients are reduced over the expert-data-parallel group (Megatron-core)."""
        mb, ch = (a.microbatch, a.chunk) if a is not None else (-1, 0)
        return self.low.comm_op(self.c, Comm("edp", "all_reduce" if self.zero == 0 else "reduce_scatter",
                                             self.low.grad_bytes * nparams, "expert_grad_bucket"),
                                deps, mb, self.next_seq("edp"), chunk=ch)

    def layer_grads_done(self, w: StageWork, l: int, last: EOp, a: Action, final: bool) -> None:
        """A layer's weight gradient is complete: ZeRO-3 reduce-scatters it per microbatch; otherwise
        the chunk's final backward fills gradient buckets that reduce while the backward goes on."""
        if final and self.edp_on and self.p.overlap_grad_reduce and w.layer_expert[l] > 0:
            self.bucket_expert += w.layer_expert[l]
            if self.bucket_expert >= self.p.bucket_size_params:
                self.grad_ops.append(self.expert_reduce(self.bucket_expert, [last.id], a).id)
                self.bucket_expert = 0.0
        if not self.dp_on:
            return
        if self.zero == 3:
            rs = self.dp_comm("reduce_scatter", self.low.grad_bytes * w.layer_dense[l], f"fsdp_rs_l{l}", [last.id], a.microbatch, a.chunk)
            self.grad_ops.append(rs.id)
        elif final and self.p.overlap_grad_reduce:
            self.bucket_params += w.layer_dense[l]
            if self.bucket_params >= self.p.bucket_size_params:
                g = self.dp_comm("all_reduce" if self.zero == 0 else "reduce_scatter",
                                 self.low.grad_bytes * self.bucket_params, "grad_bucket", [last.id], a.microbatch, a.chunk)
                self.grad_ops.append(g.id)
                self.bucket_params = 0.0

    # -- the whole program ------------------------------------------------------------------------
    def run(self) -> None:
        low, p = self.low, self.p
        self.op0 = len(low.ops)      # this class's ops start here (classes are lowered one by one)
        chunks = self.sched.stage_of[self.rank]
        if self.zero in (1, 2) and self.dp_on and p.overlap_param_gather:
            # the previous step's parameter all-gather overlaps this step's first forward, bucket by bucket
            for ch in range(len(chunks)):
                w = self.work(ch)
                for l in range(w.num_layers):
                    op = self.dp_comm("all_gather", ACT_BYTES * w.layer_dense[l], f"param_ag_l{l}", [], -1, ch)
                    self.param_gather[(ch, l)] = op.id
        i = 0
        acts = self.acts
        while i < len(acts):
            a = acts[i]
            if a.overlap_next:
                s0 = len(low.ops)
                self.emit(i, a)
                s1 = len(low.ops)
                self.emit(i + 1, acts[i + 1])
                low.pairs.append(merge_pair(low.ops, s0, s1, len(low.ops)))
                i += 2
            else:
                self.emit(i, a)
                i += 1
        self.finish(chunks)

    def emit(self, i: int, a: Action) -> None:
        if a.kind == "F":
            self.forward(i, a)
        elif a.kind == "W":
            self.weight(i, a)
        else:
            self.backward(i, a)

    def finish(self, chunks) -> None:
        low, p, c = self.low, self.p, self.c
        params = sum(self.work(ch).params for ch in range(len(chunks)))
        expert = sum(self.work(ch).expert_params for ch in range(len(chunks)))
        dense = params - expert
        dpcp, edp = p.dp * p.cp, self.sc.expert_dp
        last_idx = max(self.final_w.values())
        last_a = self.acts[last_idx]
        last_op = self.local_end[("W", last_a.microbatch, last_a.chunk)]
        # remaining gradients (embedding/head and any partial bucket, or everything without overlap)
        for on, stream, total in ((self.dp_on and self.zero < 3, "dp", dense), (self.edp_on, "edp", expert)):
            if not on:
                continue
            sent = sum(low.ops[g].bytes for g in self.grad_ops if low.ops[g].stream == stream) / low.grad_bytes
            left = total - sent if p.overlap_grad_reduce else total
            while left > 1e-6:
                take = left if p.overlap_grad_reduce else min(left, p.bucket_size_params)
                if stream == "dp":
                    g = self.dp_comm("all_reduce" if self.zero == 0 else "reduce_scatter", low.grad_bytes * take,
                                     "grad_bucket", [last_op], -1)
                else:
                    g = self.expert_reduce(take, [last_op], None)
                self.grad_ops.append(g.id)
                left -= take
        opt_deps = list(self.grad_ops) or [last_op]
        shard = (dense / (dpcp if self.zero >= 1 and self.dp_on else 1)
                 + expert / (edp if self.zero >= 1 and self.edp_on else 1))
        if self.sched.duplicated_stages and c.pp_mirror is not None:
            # DualPipe: rank r and rank pp-1-r hold the same two stages, so their gradients are
            # summed: a 2-rank all-reduce of the rank's gradients (both chunks; the local shard
            # after the dp reduce-scatter under ZeRO >= 1). A 2-rank ring all-reduce of N bytes
            # sends N/2 twice each way: N / B, one exchange of N.
            n = low.grad_bytes * shard
            peers = tuple(sorted({c.id, c.pp_mirror}))
            ex = low._new(c, stream="dp", kind="coll", category="dp", duration=p2p_time(n, c.link_mirror, low.topo) * low.slowest_link(peers),
                          label="twin_grad_all_reduce", deps=list(opt_deps), bytes=n,
                          rendezvous=("twin", 1, peers) if len(peers) > 1 else None, peers=len(peers))
            opt_deps = [ex.id]
        local = dense / (dpcp if self.zero >= 1 else 1) + expert / (edp if self.zero >= 1 else 1)
        opt = low._new(c, stream="compute", kind="compute", category="opt",
                       duration=low.costs_of(c).memory_time(OPT_BYTES_PER_PARAM * local), label="optimizer_step", deps=opt_deps)
        if self.zero in (1, 2) and self.dp_on and not p.overlap_param_gather:
            self.dp_comm("all_gather", ACT_BYTES * dense, "param_all_gather", [opt.id], -1)
        if self.zero in (1, 2) and self.edp_on:
            low.comm_op(c, Comm("edp", "all_gather", ACT_BYTES * expert, "expert_param_all_gather"), [opt.id], -1, self.next_seq("edp"))


def merge_pair(ops: list, s0: int, s1: int, s2: int) -> tuple:
    """Interleaves two chains (ops[s0:s1] and ops[s1:s2]) unit by unit on every stream.

    A unit starts at a compute op and takes the communication issued after it. The merged order
    alternates units (a1 b1 a2 b2 ...); the ids of both chains are handed out again in that order
    as `order` keys, so each stream runs the pair in one consistent topological order. Returns the
    first compute op of each chain (the caller makes the pair wait for both inputs)."""
    def units(lo, hi):
        out = []
        for op in ops[lo:hi]:
            if op.stream == "compute" or not out:
                out.append([op])
            else:
                out[-1].append(op)
        return out

    ua, ub = units(s0, s1), units(s1, s2)
    merged = []
    for i in range(max(len(ua), len(ub))):
        if i < len(ua):
            merged += ua[i]
        if i < len(ub):
            merged += ub[i]
    keys = sorted(op.order for op in ops[s0:s2])
    for op, k in zip(merged, keys):
        op.order = k
    first_a = next(o for o in ops[s0:s1] if o.stream == "compute")
    first_b = next(o for o in ops[s1:s2] if o.stream == "compute")
    return first_a, first_b
