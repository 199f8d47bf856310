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

With `training.forward_only` the schedule holds its forwards alone (`schedules.forward_pass`):
each F runs as in training (tp / cp / ep collectives, ZeRO-3 gathers, pipeline sends) but
allocates nothing that outlives it; its working set (`StageWork.act_forward_bytes`) is held while
its ops run, and the program has no gradient reduction, optimizer step or parameter re-gather.

Memory per microbatch and chunk: F allocates the stage's stored activations; a B that leaves its
W for later frees all but what W still needs (the wgrad inputs, `StageWork.weight_grad_bytes`);
W (or BW) frees the rest. The in-flight count (microbatch-chunks whose activations are alive)
rises at F and falls at W / BW.

Every collective and transfer is timed by the step's network backend (`network.backend`); the
lowering never asks which one it has. Where the backend's ops contend during the run
(`contended`), no collective is folded and no compute chain merged; where only some do
(`shares_links`), those are not folded.

This module walks the schedule; the program's other parts are composed in: `pipeline` (sends,
receives, split-message gathers), `gradients` (buckets, ZeRO, FSDP), `optimizer` (DualPipe's
twin exchange, the optimizer step); `ir` holds the ops, `merge` the rewrites that keep the
timeline. Takes (scenario, topology, workload, rank classes, schedule, cost models, network
backend); returns the step's list of `ir.EOp`.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from simtrain.cost.roofline import ComputeCostModel, sequence_time
from simtrain.hardware.devices import slowdown
from simtrain.hardware.topology import Topology
from simtrain.network.backend import NetworkBackend, Timing
from simtrain.network.collectives import choose
from simtrain.plan.grid import RankClass, group_shape
from simtrain.program.gradients import GradientTraffic
from simtrain.program.ir import EOp
from simtrain.program.merge import merge_chains, merge_pair
from simtrain.program.optimizer import GRAD_NORM_BYTES, optimizer_step, post_validation
from simtrain.program.pipeline import PipelineTraffic
from simtrain.schedules import Action, Schedule
from simtrain.spec.scenario import Scenario
from simtrain.workload.fp8 import delayed_amax_bytes
from simtrain.workload.ir import Comm, Op, Ring, StageWork, grad_bytes, overlapped_tp
from simtrain.workload.moe import node_limited_share


class Lowering:
    def __init__(self, sc: Scenario, topo: Topology, work: tuple[StageWork, ...], classes: list[RankClass], sched: Schedule,
                 costs: ComputeCostModel, place: Sequence[int] | None = None,
                 work_of: Callable[[int], tuple[StageWork, ...]] | None = None, fuse: bool = True,
                 class_costs: dict[int, ComputeCostModel] | None = None, link_factor: dict[int, float] | None = None,
                 *, network: NetworkBackend, interference: dict | None = None):
        """`work_of(ep_rank)`: the workload as an expert-parallel rank sees it (uneven expert
        loads); by default every rank runs `work`. `fuse`: fold class-local collectives into
        the compute op before them (`fusable`), which halves the ops of a tensor-parallel step.
        `network`: the step's network backend, which times every collective and transfer.
        `interference`: the engine's compute-under-communication table (`Device.slowdown_table`),
        which a bulk overlap folded into one op prices in its closed form (`Ring.time`)."""
        self.sc, self.topo, self.work, self.classes, self.sched, self.costs = sc, topo, work, classes, sched, costs
        self.place = place
        self.work_of = work_of or (lambda ep_rank: work)
        self.class_costs = class_costs or {}       # class id -> cost model (stragglers, mixed devices)
        self.link_factor = link_factor or {}       # class id -> time factor of its transfers
        self.network = network
        self.interference = interference or {}
        # folding and merging assume an op's time does not depend on what else runs
        self.fuse = (fuse and not network.contended
                     and not any(a.overlap_next for row in sched.actions for a in row))
        self.ops: list = []
        self.send_of: dict = {}      # (class id, F|B, mb, chunk) -> send op id
        self.pending_recv: list = [] # (op, producer class, F|B, mb, chunk) resolved after all classes
        self.grad_bytes = grad_bytes(sc.training)
        self._seg_cache: dict = {}
        self.pairs: list = []        # (first compute op of each chain) of overlapped pairs
        self._items_cache: dict = {}
        self.post_validation = post_validation(sc)   # the optimizer does not wait for the grad-norm all-reduce
        self.validation_ops: list = []               # the post-step validation all-reduces (EOps)
        t = sc.training
        self.delayed_amax = t.precision == "fp8" and t.fp8_recipe == "delayed" and sc.world_size > sc.parallel.pp
        self._small_ar: dict = {}                    # (first rank, end rank, bytes) -> seconds (`small_all_reduce_time`)
        self._stage_ids: dict = {}                   # stage -> (its classes' ids, their slowest link factor)

    def _new(self, c: RankClass, **kw) -> EOp:
        op = EOp(id=len(self.ops), cls=c.id, **kw)
        op.order = float(op.id)
        self.ops.append(op)
        return op

    def small_all_reduce_time(self, ranks: range, nbytes: float) -> float:
        """Seconds of an all-reduce of a few bytes over a contiguous range of ranks (every rank of
        the step, or of one pipeline stage: its tp x cp x dp ranks), in closed form over their
        group shape, cached per (ranks, bytes): latency, no contention to share."""
        key = (ranks.start, ranks.stop, nbytes)
        if key not in self._small_ar:
            devs = [self.place[r] for r in ranks] if self.place is not None else list(ranks)
            net = self.sc.network
            self._small_ar[key] = choose("all_reduce", nbytes, group_shape(devs, self.topo), self.topo,
                                         net.algorithm_for("all_reduce"), net.protocol).seconds
        return self._small_ar[key]

    def grad_norm_time(self) -> float:
        """Seconds of the global gradient-norm all-reduce (a few bytes over every rank of the
        step); see `optimizer.grad_norm_barrier`."""
        return self.small_all_reduce_time(range(self.sc.world_size), GRAD_NORM_BYTES)

    def costs_of(self, c: RankClass) -> ComputeCostModel:
        """The class's compute cost model (its device type, slowed by its straggler factors)."""
        return self.class_costs.get(c.id, self.costs)

    def seg_time(self, seg: tuple[Op, ...], costs: ComputeCostModel | None = None) -> tuple[float, str]:
        """(duration, label) of a fused segment, cached per segment object and cost model
        (templates repeat)."""
        costs = costs or self.costs
        key = (id(seg), id(costs))
        hit = self._seg_cache.get(key)
        if hit is None:
            label = "+".join(o.name for o in seg[:3]) + ("+..." if len(seg) > 3 else "")
            hit = self._seg_cache[key] = (sequence_time(costs, seg), label, seg)
        return hit[0], hit[1]

    def ring_piece_time(self, ring: Ring, costs: ComputeCostModel) -> tuple[float, str, float]:
        """(one piece's time, label, host issue cost paid once for the whole Ring). Transformer
        Engine's userbuffers overlaps (`ub_` transfers) are one framework call whose C++ launches
        every piece, so the profile's per-operator host cost is paid once, not per piece; ring
        attention and PyTorch's async TP issue each piece from Python and pay it per piece."""
        d, label = self.seg_time(ring.segment, costs)
        dev = getattr(costs, "device_time", None)
        if not ring.comm.name.startswith("ub_") or dev is None:
            return d, label, 0.0
        device = sum(dev(o) for o in ring.segment)
        return device, label, d - device

    def fusable(self, c: RankClass, comm: Comm) -> bool:
        """A collective can be folded into the compute op before it when nothing but that op can
        start or delay it: its whole group is this class (no rendezvous with other ranks), no
        overlapped pair shares its stream, and no other transfer contends with it (the backend
        gives its kind no link load, `shares_links`). The compute stream waits for it either way, so the step
        is the same."""
        return self.fuse and len(c.peers_of(comm.kind)) == 1 and not self.network.shares_links(comm.kind, c)

    def slowest_link(self, class_ids: Sequence[int]) -> float:
        """A collective or transfer is as slow as the slowest member's links."""
        lf = self.link_factor
        return max((lf.get(i, 1.0) for i in class_ids), default=1.0) if lf else 1.0

    def comm_cost(self, c: RankClass, comm: Comm) -> tuple:
        """(comm as timed, category, Timing) of one collective of class c."""
        shape = c.shape_of(comm.kind)
        if comm.node_limit:
            # node-limited routing: only the copies that cross nodes are timed on the network
            share = node_limited_share(shape.nodes, *comm.node_limit)
            comm = Comm(comm.kind, comm.collective, comm.size_bytes * share, comm.name)
        category = "dp" if comm.kind == "edp" else ("ep" if comm.kind == "etp" else comm.kind)
        if comm.collective == "send_recv":
            # one round of a ring exchange: every member sends one block to its ring successor at
            # once, so a round takes one block over the widest hop the group spans
            timing = Timing(self.network.transfer(comm.size_bytes, shape.span or "scale_up"))
        else:
            timing = self.network.collective(comm.collective, comm.size_bytes, comm.kind, c)
        return comm, category, timing

    def comm_op(self, c: RankClass, comm: Comm, deps: Sequence[int], mb: int, seq: int, transient: float = 0.0,
                chunk: int = 0) -> EOp:
        peers = c.peers_of(comm.kind)
        comm, category, timing = self.comm_cost(c, comm)
        dur = timing.seconds * self.slowest_link(peers)
        return self._new(c, stream=comm.kind, kind="coll", category=category, duration=dur,
                         label=f"{comm.collective}:{comm.name}", mb=mb, chunk=chunk, deps=list(deps),
                         rendezvous=(comm.kind, seq, peers) if len(peers) > 1 else None, peers=len(peers),
                         bytes=comm.size_bytes, transient=transient, load=timing.load, net_key=timing.key)

    def lower(self) -> list[EOp]:
        for c in self.classes:
            ClassLowering(self, c).run()
        for op, producer, kind, mb, chunk in self.pending_recv:
            op.deps.append(self.send_of[(producer, kind, mb, chunk)])
        for a, b in self.pairs:
            # an overlapped pair starts once both inputs are there (DeepSeek receives both first)
            a.deps += [d for d in b.deps if d not in a.deps and self.ops[d].cls != a.cls]
        if self.fuse:
            self.ops = merge_chains(self.ops)
        return self.ops


class ClassLowering:
    """The program of one rank class: its schedule row, action by action; the pipeline,
    gradient and optimizer traffic come from the composed `pipe`, `grads` and `optimizer_step`."""

    def __init__(self, low: Lowering, c: RankClass):
        self.low, self.c = low, c
        self.sc = low.sc
        self.p = low.sc.parallel
        self.rank = c.stage
        self.sched = low.sched
        self.acts = self.sched.actions[self.rank]
        self.seqs: dict = {}
        self.local_end: dict = {}        # (F|B, mb, chunk) -> last op id of that action here
        self.first_f: dict = {}          # chunk -> index of its first F
        self.final_w: dict = {}          # chunk -> index of the action completing its weight gradients
        for i, a in enumerate(self.acts):
            if a.kind == "F":
                self.first_f.setdefault(a.chunk, i)
            if a.kind in ("W", "BW"):
                self.final_w[a.chunk] = i
        # what an items() call's result depends on besides the items: the class's costs, link
        # factor, which of its groups are class-local (foldable), which share links, and their
        # shapes (their cost)
        self.cost_key = (id(low.costs_of(c)), low.link_factor.get(c.id, 1.0),
                         tuple(sorted((k, len(v)) for k, v in (c.peers or {}).items())),
                         tuple(sorted(k for k in (c.peers or {}) if low.network.shares_links(k, c))),
                         tuple(sorted((c.shapes or {}).items())))
        self.op0 = len(low.ops)          # this class's ops start here (classes are lowered one by one)
        self.forward_only = low.sc.training.forward_only
        self.pipe = PipelineTraffic(self)
        self.grads = GradientTraffic(self)

    # -- helpers --------------------------------------------------------------------------------
    def work(self, chunk: int) -> StageWork:
        return self.low.work_of(self.c.ep_rank)[self.sched.stage_of[self.rank][chunk]]

    def next_seq(self, kind: str) -> int:
        self.seqs[kind] = self.seqs.get(kind, 0) + 1
        return self.seqs[kind]

    def items(self, items: tuple, category: str, a: Action, first_deps: Sequence[int],
              transient: float = 0.0) -> EOp | None:
        """Emits the items (segments and comms) in order; returns the last op (or None).

        When a call's items all end up in one compute op (every collective folded, every segment
        merged), the op's duration and parts are remembered per (items, category, this class's
        costs and peers): the same layer program in the next microbatch, layer or class with the
        same costs is then one op without walking its items again."""
        low, c = self.low, self.c
        prefix = f"{category}{a.microbatch}" + (f".{a.chunk}" if self.sched.chunks > 1 else "") + ":"
        key = (id(items), category, transient, self.cost_key) if low.fuse else None
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
            if (isinstance(it, Ring) and (overlapped_tp(it.comm.name) or it.mode == "bulk")
                    and low.fusable(c, it.comm)):
                # an overlapped GEMM (or a collective beside a GEMM) whose group is this class:
                # nothing else can start or delay its transfers, so its pieces and transfers are
                # one compute op of the Ring's closed form, its exposed part (beyond the pieces) a
                # part of its comm kind; a plain collective slows the GEMM as the engine would
                d, label, host = low.ring_piece_time(it, low.costs_of(c))
                comm, cat, timing = low.comm_cost(c, it.comm)
                comp = it.steps * d / it.share + host
                s = 0.0 if overlapped_tp(it.comm.name) else slowdown(low.interference, "gemm", it.comm.collective)
                total = it.time(d, timing.seconds * low.slowest_link((c.id,)), s) + host
                for _ in range(it.transfers):
                    self.next_seq(comm.kind)
                folded += [comm.kind] * it.transfers
                raw = f"{it.mode}:{label}"
                parts = (("compute", category, comp, raw), (comm.kind, cat, total - comp, f"{comm.collective}:{comm.name}"))
                flops, nbytes = it.steps * sum(o.flops for o in it.segment), it.steps * sum(o.bytes for o in it.segment)
                if (not deps and last is not None and last.id == own and own == len(low.ops) - 1
                        and last.stream == "compute"):
                    last.fused = (last.fused or (("compute", last.category, last.duration, own_raw),)) + parts
                    last.duration += total
                    last.flops += flops
                    last.mem_bytes += nbytes
                    continue
                if last is not None and last.stream != "compute":
                    deps = deps + [last.id]
                last = low._new(c, stream="compute", kind="compute", category=category, duration=total,
                                label=prefix + raw, mb=a.microbatch, chunk=a.chunk, deps=list(deps), transient=transient,
                                flops=flops, mem_bytes=nbytes)
                last.fused = parts
                own, own_raw = last.id, raw
                deps = []
                continue
            if isinstance(it, Ring):
                last, deps = self.ring(it, category, a, deps, last, transient)
                continue
            if isinstance(it, Comm):
                if last is not None and last.stream == "compute" and not deps and low.fusable(c, it):
                    comm, cat, timing = low.comm_cost(c, it)
                    dur = timing.seconds * low.slowest_link((c.id,))
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
                if (low.fuse and not deps and last is not None and last.id == own and own == len(low.ops) - 1
                        and last.stream == "compute"):
                    # the next segment of this chain, nothing in between: it would start the
                    # instant `last` ends, so `last` takes it on (merge_chains does the same
                    # across calls, where it can see who else waits)
                    last.fused = (last.fused or (("compute", last.category, last.duration, own_raw),)) + (
                        ("compute", category, d, label),)
                    last.duration += d
                    last.flops += sum(o.flops for o in it)
                    last.mem_bytes += sum(o.bytes for o in it)
                    continue
                if last is not None and last.stream != "compute":
                    deps = deps + [last.id]
                last = low._new(c, stream="compute", kind="compute", category=category, duration=d,
                                label=prefix + label, mb=a.microbatch, chunk=a.chunk, deps=list(deps), transient=transient,
                                flops=sum(o.flops for o in it), mem_bytes=sum(o.bytes for o in it))
                own, own_raw = last.id, label
                deps = []
        if key is not None and last is not None and len(low.ops) == n0 + 1 and last.id == own and not deps:
            low._items_cache[key] = (last.duration, last.fused, tuple((k, folded.count(k)) for k in sorted(set(folded))), own_raw)
        if deps:
            # dependencies pending at the end (nothing emitted, or a bulk overlap last): carry them
            # forward via an empty op
            last = low._new(c, stream="compute", kind="compute", category=category, duration=0.0,
                            label=f"{category}{a.microbatch}:wait", mb=a.microbatch, chunk=a.chunk,
                            deps=list(deps) + ([last.id] if last is not None and last.stream != "compute" else []))
        return last

    def ring(self, ring: Ring, category: str, a: Action, deps: Sequence[int], last: EOp | None,
             transient: float) -> tuple[EOp | None, list]:
        """A Ring's pieces and transfers (`Ring` gives the closed form); returns (the op the next
        item follows, dependencies still pending for it). ring: piece i waits for transfer i-1;
        transfer i forwards the block that arrived with transfer i-1 (the first sends the local
        block once the work before the ring is done). pipeline: transfer i waits for piece i (and,
        on its stream, transfer i-1); the last transfer ends after everything. bulk: the transfer
        and the pieces start together; the next item waits for both. Transfers are collectives of
        the ring's group; a piece takes its segment's time over the ring's SM share."""
        low, c = self.low, self.c
        d, label, host = low.ring_piece_time(ring, low.costs_of(c))
        d /= ring.share
        kind = ring.comm.kind
        start = list(deps) + ([last.id] if last is not None else [])
        outside = [d_ for d_ in start if low.ops[d_].stream != "compute"]
        tag = f"{category}{a.microbatch}" + (f".{a.chunk}" if self.sched.chunks > 1 else "")
        flops, nbytes = sum(o.flops for o in ring.segment), sum(o.bytes for o in ring.segment)

        def piece(i: int, pdeps: list) -> EOp:
            return low._new(c, stream="compute", kind="compute", category=category, duration=d,
                            label=f"{tag}:{ring.mode}{i}:{label}", mb=a.microbatch, chunk=a.chunk, deps=pdeps,
                            transient=transient, flops=flops, mem_bytes=nbytes)

        def transfer(xdeps: list) -> EOp:
            return low.comm_op(c, ring.comm, xdeps, a.microbatch, self.next_seq(kind), chunk=a.chunk)

        if host:
            # the framework call that launches the pieces and transfers: its host cost comes first
            issue = low._new(c, stream="compute", kind="compute", category=category, duration=host,
                             label=f"{tag}:{ring.mode}-issue:{label}", mb=a.microbatch, chunk=a.chunk, deps=outside,
                             transient=transient, flops=0.0, mem_bytes=0.0)
            start, outside = [issue.id], []

        if ring.mode == "bulk":
            x = transfer(list(start))
            out = None
            for i in range(ring.steps):
                out = piece(i, outside if i == 0 else [])
            return out, [x.id]
        if ring.mode == "pipeline":
            x = None
            for i in range(ring.steps):
                p = piece(i, outside if i == 0 else [])
                x = transfer([p.id])
            return x, []
        prev_x = None
        out = None
        for i in range(ring.steps):
            x = None
            if i < ring.steps - 1:
                x = transfer([prev_x.id] if prev_x is not None else list(start))
            out = piece(i, [prev_x.id] if prev_x is not None else outside)
            prev_x = x
        return out, []

    def delayed_amax(self, a: Action, w: StageWork, last: EOp) -> EOp:
        """FP8 delayed scaling: at the end of a model chunk's forward, and of its backward, the
        amaxes of every FP8 GEMM of the chunk are all-reduced over the stage's tp x cp x dp ranks
        (`fp8.delayed_amax_bytes`), blocking the compute stream, which the rest of the action
        waits for. A rendezvous of the stage's classes; timed in closed form (a few hundred
        bytes: latency) and counted as dp communication. Returns the op the action continues
        from. Not in a recompute pass (Transformer Engine does not reduce there)."""
        low, c = self.low, self.c
        if not low.delayed_amax or not w.fp8_gemms:
            return last
        phase = "F" if a.kind == "F" else "B"
        if c.stage not in low._stage_ids:
            ids = tuple(x.id for x in low.classes if x.stage == c.stage)
            low._stage_ids[c.stage] = (ids, low.slowest_link(ids))
        ids, link = low._stage_ids[c.stage]
        nbytes = delayed_amax_bytes(w.fp8_gemms, phase)
        per = self.sc.world_size // self.p.pp
        dur = low.small_all_reduce_time(range(c.stage * per, (c.stage + 1) * per), nbytes) * link
        seq = self.next_seq("amax")
        ar = low._new(c, stream="tp", kind="coll", category="dp", duration=dur,
                      label=f"all_reduce:amax_{'forward' if phase == 'F' else 'backward'}", mb=a.microbatch,
                      chunk=a.chunk, deps=[last.id], bytes=nbytes,
                      rendezvous=("amax", seq, ids) if len(ids) > 1 else None, peers=len(ids))
        return low._new(c, stream="compute", kind="compute", category=a.kind, duration=0.0, label="after_amax",
                        mb=a.microbatch, chunk=a.chunk, deps=[ar.id])

    # -- actions ----------------------------------------------------------------------------------
    def forward(self, idx: int, a: Action) -> None:
        low, grads, w = self.low, self.grads, self.work(a.chunk)
        edge_ag = grads.edge_gather(w, a)
        pos = self.sched.position(self.rank, a.chunk, a.microbatch)
        gather = self.pipe.recv_gather(a, "F", pos - 1) if pos > 0 else None
        start = len(low.ops)
        # a forward-only pass stores nothing for a backward: its working set lives while it runs
        tr = w.act_forward_bytes if self.forward_only else 0.0
        last = self.items(w.pre.forward, "F", a, [], transient=tr) if w.pre is not None else None
        ends = []
        for l in range(w.num_layers):
            ldeps = [last.id] if last is not None and last.stream != "compute" else []
            ldeps += grads.before_forward_layer(idx == self.first_f.get(a.chunk), a, w, l, ends)
            last = self.items(w.layers[l].forward, "F", a, ldeps, transient=tr)
            ends.append(last)
        if w.num_layers:
            last = self.delayed_amax(a, w, last)
        if w.post is not None:
            last = self.items(w.post.forward, "F", a, [], transient=tr)
        first = next(o for o in low.ops[start:] if o.stream == "compute")
        if not self.forward_only:
            first.alloc += w.act_bytes
            first.inflight += 1
        if edge_ag is not None:
            first.deps.append(edge_ag)
        if gather is not None:
            first.deps.append(gather.id)
        if pos > 0:
            self.pipe.receive(gather or first, a, "F", pos - 1)
        if pos < self.sched.num_stages - 1:
            self.pipe.send(last, a, "F", pos + 1)

    def backward(self, idx: int, a: Action) -> None:
        """B (input gradients only) or BW (input and weight gradients)."""
        low, grads, w = self.low, self.grads, self.work(a.chunk)
        split = a.kind == "B"
        final = idx == self.final_w.get(a.chunk)
        edge_ag = grads.edge_gather(w, a)
        pos = self.sched.position(self.rank, a.chunk, a.microbatch)
        gather = self.pipe.recv_gather(a, "B", pos + 1) if pos < self.sched.num_stages - 1 else None
        start = len(low.ops)
        tr = w.act_working_bytes

        def part(lp):
            return lp.backward_input if split else lp.backward

        # the loss's backward holds its own buffers (`Memory.loss_working`); a layer's working set
        # (its recompute) comes after
        last = (self.items(part(w.post), a.kind, a, [], transient=w.loss_working_bytes)
                if w.post is not None else None)
        ends = []
        for l in reversed(range(w.num_layers)):
            ldeps = [last.id] if last is not None and last.stream != "compute" else []
            ldeps += grads.before_backward_layer(a, w, l, ends)
            lp = w.layers[l]
            if lp.recompute:
                last = self.items(lp.recompute, a.kind, a, ldeps, transient=tr)
                ldeps = [last.id] if last.stream != "compute" else []
            last = self.items(part(lp), a.kind, a, ldeps, transient=tr)
            ends.append(last)
            if not split:
                grads.layer_grads_done(w, l, last, a, final)
        if w.num_layers:
            last = self.delayed_amax(a, w, last)
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
            grads.edge_scatter(w, a, last)
            grads.flush_bucket(a, last, final)
        if gather is not None:
            first.deps.append(gather.id)
        if pos < self.sched.num_stages - 1:
            self.pipe.receive(gather or first, a, "B", pos + 1)
        if pos > 0:
            self.pipe.send(last, a, "B", pos - 1)
        else:
            self.local_end[("B", a.microbatch, a.chunk)] = last.id
        if not split:
            self.local_end[("W", a.microbatch, a.chunk)] = last.id
        else:
            self.local_end[("Bdone", a.microbatch, a.chunk)] = last.id

    def weight(self, idx: int, a: Action) -> None:
        """W: the deferred weight-gradient GEMMs of every layer of the chunk, after its B."""
        grads, w = self.grads, self.work(a.chunk)
        final = idx == self.final_w.get(a.chunk)
        dep = [self.local_end[("Bdone", a.microbatch, a.chunk)]]
        last = self.items(w.post.backward_weight, "W", a, dep) if w.post is not None and w.post.backward_weight else None
        for l in reversed(range(w.num_layers)):
            last = self.items(w.layers[l].backward_weight, "W", a, dep if last is None else [])
            grads.layer_grads_done(w, l, last, a, final)
        if w.pre is not None and w.pre.backward_weight:
            last = self.items(w.pre.backward_weight, "W", a, [])
        last.free += w.weight_grad_bytes
        last.inflight -= 1
        self.local_end[("W", a.microbatch, a.chunk)] = last.id
        grads.edge_scatter(w, a, last)
        grads.flush_bucket(a, last, final)

    # -- the whole program ------------------------------------------------------------------------
    def run(self) -> None:
        low = self.low
        chunks = self.sched.stage_of[self.rank]
        if not self.forward_only:
            # the previous step's updated parameters (a forward-only pass updates none)
            self.grads.prefetch_params(len(chunks))
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
        if not self.forward_only:
            # a forward-only pass ends with its last forward: no gradients, no optimizer step
            self.finish(chunks)

    def emit(self, i: int, a: Action) -> None:
        if a.kind == "F":
            self.forward(i, a)
        elif a.kind == "W":
            self.weight(i, a)
        else:
            self.backward(i, a)

    def finish(self, chunks: Sequence[int]) -> None:
        """After the schedule row: the rest of the gradient reduction, the optimizer step, the
        parameter gathers after it."""
        params = sum(self.work(ch).params for ch in range(len(chunks)))
        expert = sum(self.work(ch).expert_params for ch in range(len(chunks)))
        dense = params - expert
        last_a = self.acts[max(self.final_w.values())]
        last_op = self.local_end[("W", last_a.microbatch, last_a.chunk)]
        deps = self.grads.reduce_rest(dense, expert, last_op)
        opt = optimizer_step(self, self.grads, deps, dense, expert)
        fp8_dense = sum(self.work(ch).fp8_weight_elements[0] for ch in range(len(chunks)))
        fp8_expert = sum(self.work(ch).fp8_weight_elements[1] for ch in range(len(chunks)))
        self.grads.gather_updated(opt, self.grads.gathered(dense, fp8_dense), self.grads.gathered(expert, fp8_expert))
