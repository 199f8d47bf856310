"""Per-rank programs (fifth pipeline stage): lowering (workload, plan, schedule) -> ops on streams.

One program per equivalence class of ranks. Streams, like CUDA streams, issue their ops in order:
  compute   forward / backward segments, optimizer step (waits for tensor-parallel collectives,
            which Megatron issues synchronously between the column- and row-parallel GEMMs)
  tp        tensor-parallel collectives
  dp        data-parallel gradient reduction and parameter gathering
  pp        pipeline sends (the receiver's compute op depends on the matching send)
Consecutive operators between two communication points are fused into one compute op whose
duration is the sum of its operators' durations (the per-operator list stays in the workload).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from simtrain.collectives import collective_time, p2p_time
from simtrain.parallel import RankClass
from simtrain.spec import Scenario
from simtrain.topology import Topology
from simtrain.workload import ACT_BYTES, Comm, StageWork

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
    category: str             # F | BW | opt | tp | dp | pp
    duration: float
    label: str
    mb: int = -1
    deps: list = field(default_factory=list)
    rendezvous: tuple | None = None
    peers: int = 1            # number of classes that must arrive at the rendezvous
    alloc: float = 0.0        # activation bytes allocated when the op starts
    free: float = 0.0         # activation bytes freed when the op ends
    transient: float = 0.0    # bytes held only while the op runs
    bytes: float = 0.0        # communication size (for the trace)


class Lowering:
    def __init__(self, sc: Scenario, topo: Topology, work: tuple, classes: list, sched: tuple, costs):
        self.sc, self.topo, self.work, self.classes, self.sched, self.costs = sc, topo, work, classes, sched, costs
        self.ops: list = []
        self.send_of: dict = {}      # (class id, action kind, mb) -> send op id
        self.pending_recv: list = [] # (op, producer class, kind, mb) resolved after all classes
        p, t = sc.parallel, sc.training
        self.grad_bytes = 2.0 if t.precision == "fp16" else 4.0
        tokens = t.micro_batch_size * sc.model.seq_length
        self.pp_msg = ACT_BYTES * tokens * sc.model.hidden_size / (p.tp if p.sequence_parallel and p.tp > 1 else 1)
        self.algo = sc.network.all_reduce
        self._seg_cache: dict = {}
        self._coll_cache: dict = {}

    def _new(self, c: RankClass, **kw) -> EOp:
        op = EOp(id=len(self.ops), cls=c.id, **kw)
        self.ops.append(op)
        return op

    def seg_time(self, seg) -> tuple:
        """(duration, label) of a fused segment, cached per segment object (templates repeat)."""
        hit = self._seg_cache.get(id(seg))
        if hit is None:
            label = "+".join(o.name for o in seg[:3]) + ("+..." if len(seg) > 3 else "")
            hit = self._seg_cache[id(seg)] = (sum(self.costs.duration(o) for o in seg), label, seg)
        return hit[0], hit[1]

    def comm_op(self, c: RankClass, comm: Comm, deps, mb, seq, transient=0.0) -> EOp:
        shape = c.tp_shape if comm.kind == "tp" else c.dp_shape
        peers = c.tp_peers if comm.kind == "tp" else c.dp_peers
        key = (comm.collective, comm.size_bytes, shape)
        dur = self._coll_cache.get(key)
        if dur is None:
            dur = self._coll_cache[key] = collective_time(comm.collective, comm.size_bytes, shape, self.topo, self.algo)
        return self._new(c, stream=comm.kind, kind="coll", category=comm.kind, duration=dur,
                         label=f"{comm.collective}:{comm.name}", mb=mb, deps=list(deps),
                         rendezvous=(comm.kind, seq, peers) if len(peers) > 1 else None, peers=len(peers),
                         bytes=comm.size_bytes, transient=transient)

    def lower(self) -> list:
        for c in self.classes:
            self._lower_class(c)
        for op, producer, kind, mb in self.pending_recv:
            op.deps.append(self.send_of[(producer, kind, mb)])
        return self.ops

    def _run_items(self, c, items, category, mb, first_deps, seqs, transient=0.0):
        """Emits the items (segments and comms) in order; returns the last op (or None)."""
        last = None
        deps = list(first_deps)
        for it in items:
            if isinstance(it, Comm):
                if last is not None:
                    deps = deps + [last.id]
                seqs[it.kind] = seqs.get(it.kind, 0) + 1
                last = self.comm_op(c, it, deps, mb, seqs[it.kind])
                deps = []
            else:
                d, label = self.seg_time(it)
                if d == 0.0 and not deps and last is not None:
                    continue
                if last is not None and last.stream != "compute":
                    deps = deps + [last.id]
                last = self._new(c, stream="compute", kind="compute", category=category, duration=d,
                                 label=f"{category}{mb}:{label}", mb=mb, deps=list(deps), transient=transient)
                deps = []
        if deps and last is None:
            # nothing emitted but dependencies pending: carry them forward via an empty op
            last = self._new(c, stream="compute", kind="compute", category=category, duration=0.0,
                             label=f"{category}{mb}:wait", mb=mb, deps=list(deps))
        return last

    def _lower_class(self, c: RankClass) -> None:
        p = self.sc.parallel
        w: StageWork = self.work[c.stage]
        acts = self.sched[c.stage]
        pp = p.pp
        seqs: dict = {}
        act_mb = w.act_bytes_per_layer * w.num_layers + w.act_bytes_pre + w.act_bytes_post
        last_bw = max(i for i, a in enumerate(acts) if a.kind == "BW")
        zero = p.zero_stage
        dp_on = p.dp > 1
        bucket_params = 0.0
        grad_ops: list = []
        dp_grad_coll = "all_reduce" if zero == 0 else "reduce_scatter"
        layer_p = w.layer_params
        stage_params = w.params
        param_gather_ops: dict = {}

        if zero >= 1 and dp_on and p.overlap_param_gather and zero < 3:
            # the previous step's parameter all-gather overlaps this step's first forward, bucket by bucket
            for l in range(w.num_layers):
                seqs["dp"] = seqs.get("dp", 0) + 1
                op = self.comm_op(c, Comm("dp", "all_gather", ACT_BYTES * layer_p, f"param_ag_l{l}"), [], -1, seqs["dp"])
                param_gather_ops[l] = op.id

        for idx, a in enumerate(acts):
            if a.kind == "F":
                start_len = len(self.ops)
                last = None
                if w.pre is not None:
                    last = self._run_items(c, w.pre.forward, "F", a.microbatch, [], seqs)
                ends = []                      # last op of each layer, for ZeRO-3 prefetch depth
                for l in range(w.num_layers):
                    ldeps = [last.id] if last is not None and last.stream != "compute" else []
                    if a.microbatch == acts[0].microbatch and l in param_gather_ops:
                        ldeps.append(param_gather_ops[l])
                    if zero == 3 and dp_on:
                        # FSDP prefetches one layer ahead: gather layer l once layer l-2 is done
                        seqs["dp"] = seqs.get("dp", 0) + 1
                        ag = self.comm_op(c, Comm("dp", "all_gather", ACT_BYTES * layer_p, f"fsdp_ag_l{l}"),
                                          [ends[-2].id] if len(ends) >= 2 else [], a.microbatch, seqs["dp"])
                        ldeps.append(ag.id)
                    last = self._run_items(c, w.layer.forward, "F", a.microbatch, ldeps, seqs)
                    ends.append(last)
                if w.post is not None:
                    last = self._run_items(c, w.post.forward, "F", a.microbatch, [], seqs)
                self.ops[start_len].alloc += act_mb
                if c.stage > 0:
                    # first compute op of this forward waits for the activation from the previous stage
                    first_compute = next(o for o in self.ops[start_len:] if o.stream == "compute")
                    self.pending_recv.append((first_compute, c.pp_prev, "F", a.microbatch))
                if c.stage < pp - 1:
                    snd = self._new(c, stream="pp", kind="send", category="pp",
                                    duration=p2p_time(self.pp_msg, c.link_next, self.topo),
                                    label=f"send_act{a.microbatch}", mb=a.microbatch, deps=[last.id], bytes=self.pp_msg)
                    self.send_of[(c.id, "F", a.microbatch)] = snd.id
            else:
                start_len = len(self.ops)
                final = idx == last_bw
                last = None
                if w.post is not None:
                    last = self._run_items(c, w.post.backward, "BW", a.microbatch, [], seqs, transient=w.act_working_bytes)
                ends = []
                for l in reversed(range(w.num_layers)):
                    ldeps = [last.id] if last is not None and last.stream != "compute" else []
                    if zero == 3 and dp_on:
                        seqs["dp"] = seqs.get("dp", 0) + 1
                        ag = self.comm_op(c, Comm("dp", "all_gather", ACT_BYTES * layer_p, f"fsdp_ag_bwd_l{l}"),
                                          [ends[-2].id] if len(ends) >= 2 else [], a.microbatch, seqs["dp"])
                        ldeps.append(ag.id)
                    if w.layer.recompute:
                        last = self._run_items(c, w.layer.recompute, "BW", a.microbatch, ldeps, seqs, transient=w.act_working_bytes)
                        ldeps = [last.id] if last.stream != "compute" else []
                    last = self._run_items(c, w.layer.backward, "BW", a.microbatch, ldeps, seqs, transient=w.act_working_bytes)
                    ends.append(last)
                    if dp_on and zero == 3:
                        seqs["dp"] = seqs.get("dp", 0) + 1
                        rs = self.comm_op(c, Comm("dp", "reduce_scatter", self.grad_bytes * layer_p, f"fsdp_rs_l{l}"),
                                          [last.id], a.microbatch, seqs["dp"])
                        grad_ops.append(rs.id)
                    elif dp_on and final and p.overlap_grad_reduce:
                        bucket_params += layer_p
                        if bucket_params >= p.bucket_size_params:
                            seqs["dp"] = seqs.get("dp", 0) + 1
                            g = self.comm_op(c, Comm("dp", dp_grad_coll, self.grad_bytes * bucket_params, "grad_bucket"),
                                             [last.id], a.microbatch, seqs["dp"])
                            grad_ops.append(g.id)
                            bucket_params = 0.0
                if w.pre is not None:
                    last = self._run_items(c, w.pre.backward, "BW", a.microbatch, [], seqs)
                last.free += act_mb
                if c.stage < pp - 1:
                    first_compute = next(o for o in self.ops[start_len:] if o.stream == "compute")
                    self.pending_recv.append((first_compute, c.pp_next, "BW", a.microbatch))
                if c.stage > 0:
                    snd = self._new(c, stream="pp", kind="send", category="pp",
                                    duration=p2p_time(self.pp_msg, c.link_prev, self.topo),
                                    label=f"send_grad{a.microbatch}", mb=a.microbatch, deps=[last.id], bytes=self.pp_msg)
                    self.send_of[(c.id, "BW", a.microbatch)] = snd.id
                if final:
                    last_compute = last
        # remaining gradients (embedding/head and any partial bucket, or everything without overlap)
        if dp_on and zero < 3:
            remaining = stage_params if not p.overlap_grad_reduce else stage_params - sum(
                self.ops[g].bytes for g in grad_ops) / self.grad_bytes
            buckets = []
            left = remaining
            while left > 1e-6:
                take = min(left, p.bucket_size_params) if not p.overlap_grad_reduce else left
                buckets.append(take)
                left -= take
            for bp in buckets:
                seqs["dp"] = seqs.get("dp", 0) + 1
                g = self.comm_op(c, Comm("dp", dp_grad_coll, self.grad_bytes * bp, "grad_bucket"),
                                 [last_compute.id], -1, seqs["dp"])
                grad_ops.append(g.id)
        # optimizer step over the local (possibly sharded) parameters
        local = stage_params / (p.dp if zero >= 1 else 1)
        opt = self._new(c, stream="compute", kind="compute", category="opt",
                        duration=self.costs.memory_time(OPT_BYTES_PER_PARAM * local), label="optimizer_step",
                        deps=list(grad_ops))
        if zero in (1, 2) and dp_on and not p.overlap_param_gather:
            seqs["dp"] = seqs.get("dp", 0) + 1
            self.comm_op(c, Comm("dp", "all_gather", ACT_BYTES * stage_params, "param_all_gather"), [opt.id], -1, seqs["dp"])
