"""Data-parallel traffic of one rank class's program: gradient buckets, ZeRO and FSDP.

Takes the class's schedule walk (`lowering.ClassLowering`: its class, workload, stream sequence
numbers) and adds to the step's op list, as the walk reaches each point:
  - at the step's start, under ZeRO-1/2 with overlap_param_gather, the previous step's parameter
    all-gather, layer by layer, which the first forward of each chunk waits for;
  - under ZeRO-3 (FSDP), a layer's parameter all-gather one layer ahead of its forward and its
    backward, and its gradient reduce-scatter per microbatch; the embedding / head likewise
    before and after each action;
  - otherwise, during the chunk's final backward, gradient buckets (all-reduce, or
    reduce-scatter under ZeRO >= 1) that reduce while the backward goes on, dense weights over
    dp x cp and expert weights over the expert-data-parallel group;
  - after the last backward, whatever is left of the gradients (everything without overlap);
  - after the optimizer step, under ZeRO-1/2, the updated parameters' all-gather.
It returns op ids (what the optimizer step waits for) and keeps no other output.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from simtrain.program.ir import EOp
from simtrain.schedules import Action
from simtrain.workload import fp8
from simtrain.workload.ir import ACT_BYTES, Comm, StageWork

if TYPE_CHECKING:
    from simtrain.program.lowering import ClassLowering


class GradientTraffic:
    """The gradient and parameter traffic of one class (`prog`: its ClassLowering)."""

    def __init__(self, prog: ClassLowering):
        self.prog = prog
        self.low = prog.low
        p = prog.p
        self.p = p
        self.zero = p.zero_stage
        self.dp_on = p.dp * p.cp > 1
        self.edp_on = prog.sc.expert_dp > 1 and prog.sc.model.moe is not None
        self.grad_ops: list = []         # op ids of the gradient reductions (the optimizer waits for them)
        self.param_gather: dict = {}     # (chunk, layer) -> op id of the overlapped parameter all-gather
        self.bucket_params = 0.0
        self.bucket_expert = 0.0

    def gathered(self, params: float, fp8_params: float) -> float:
        """Bytes an all-gather of `params` parameters moves, `fp8_params` of them FP8 GEMMs' weights
        (Megatron-LM --fp8-param-gather / torchtitan's FP8 all-gather move those in FP8)."""
        return fp8.gathered_bytes(self.prog.sc.training, params, fp8_params)

    def dp_comm(self, collective: str, nbytes: float, name: str, deps: list[int], mb: int, chunk: int = 0) -> EOp:
        prog = self.prog
        return self.low.comm_op(prog.c, Comm("dp", collective, nbytes, name), deps, mb, prog.next_seq("dp"), chunk=chunk)

    def _grad_collective(self) -> str:
        return "all_reduce" if self.zero == 0 else "reduce_scatter"

    # -- parameters ---------------------------------------------------------------------------
    def prefetch_params(self, num_chunks: int) -> None:
        """The previous step's parameter all-gather overlaps this step's first forward, bucket by bucket."""
        if self.zero in (1, 2) and self.dp_on and self.p.overlap_param_gather:
            for ch in range(num_chunks):
                w = self.prog.work(ch)
                for l in range(w.num_layers):
                    op = self.dp_comm("all_gather", self.gathered(w.layer_dense[l], w.layer_fp8[l][0]),
                                      f"param_ag_l{l}", [], -1, ch)
                    self.param_gather[(ch, l)] = op.id

    def before_forward_layer(self, first: bool, a: Action, w: StageWork, l: int, ends: list) -> list:
        """Op ids layer l's forward waits for: its prefetched parameters on the chunk's `first`
        forward; under FSDP its gather, prefetched one layer ahead (once layer l-2 is done)."""
        deps = []
        if first and (a.chunk, l) in self.param_gather:
            deps.append(self.param_gather[(a.chunk, l)])
        if self.zero == 3 and self.dp_on:
            ag = self.dp_comm("all_gather", self._layer_gathered(w, l), f"fsdp_ag_l{l}",
                              [ends[-2].id] if len(ends) >= 2 else [], a.microbatch, a.chunk)
            deps.append(ag.id)
        return deps

    def before_backward_layer(self, a: Action, w: StageWork, l: int, ends: list) -> list:
        """Op ids layer l's backward waits for: under FSDP its gather, one layer ahead."""
        if not (self.zero == 3 and self.dp_on):
            return []
        ag = self.dp_comm("all_gather", self._layer_gathered(w, l), f"fsdp_ag_bwd_l{l}",
                          [ends[-2].id] if len(ends) >= 2 else [], a.microbatch, a.chunk)
        return [ag.id]

    def _layer_gathered(self, w: StageWork, l: int) -> float:
        """Bytes of layer l's FSDP gather (dense and expert parameters)."""
        return self.gathered(w.layer_dense[l] + w.layer_expert[l], sum(w.layer_fp8[l]))

    def _edge_params(self, w: StageWork) -> float:
        return w.params - sum(w.layer_dense) - sum(w.layer_expert) if self.zero == 3 and self.dp_on else 0.0

    def edge_gather(self, w: StageWork, a: Action) -> int | None:
        """ZeRO-3 also shards the embedding / LM head: they are gathered before the action (issued
        first, so it precedes the action's layer gathers on the dp stream); returns the op id."""
        edge = self._edge_params(w)
        if edge <= 0:
            return None
        return self.dp_comm("all_gather", ACT_BYTES * edge, "fsdp_ag_edge", [], a.microbatch, a.chunk).id

    def gather_updated(self, opt: EOp, dense_bytes: float, expert_bytes: float) -> None:
        """ZeRO-1/2: the updated parameter shards are all-gathered after the optimizer step
        (unless the next step's forward overlaps that gather); the bytes are `gathered`'s."""
        prog = self.prog
        if self.zero in (1, 2) and self.dp_on and not self.p.overlap_param_gather:
            self.dp_comm("all_gather", dense_bytes, "param_all_gather", [opt.id], -1)
        if self.zero in (1, 2) and self.edp_on:
            self.low.comm_op(prog.c, Comm("edp", "all_gather", expert_bytes, "expert_param_all_gather"), [opt.id], -1,
                             prog.next_seq("edp"))

    # -- gradients ----------------------------------------------------------------------------
    def edge_scatter(self, w: StageWork, a: Action, last: EOp) -> None:
        """... and their gradient is reduce-scattered after the action, per microbatch like the layers."""
        edge = self._edge_params(w)
        if edge > 0:
            rs = self.dp_comm("reduce_scatter", self.low.grad_bytes * edge, "fsdp_rs_edge", [last.id], a.microbatch, a.chunk)
            self.grad_ops.append(rs.id)

    def flush_bucket(self, a: Action, last: EOp, final: bool) -> None:
        """The chunk's gradients are complete: its partial bucket goes now, not with the next chunk."""
        if final and self.dp_on and self.zero < 3 and self.p.overlap_grad_reduce and self.bucket_params > 0:
            g = self.dp_comm(self._grad_collective(), self.low.grad_bytes * self.bucket_params, "grad_bucket",
                             [last.id], a.microbatch, a.chunk)
            self.grad_ops.append(g.id)
            self.bucket_params = 0.0
        if final and self.edp_on and self.p.overlap_grad_reduce and self.bucket_expert > 0:
            self.grad_ops.append(self.expert_reduce(self.bucket_expert, [last.id], a).id)
            self.bucket_expert = 0.0

    def expert_reduce(self, nparams: float, deps: list[int], a: Action | None) -> EOp:
        """Expert gradients are reduced over the expert-data-parallel group (Megatron-core)."""
        prog = self.prog
        mb, ch = (a.microbatch, a.chunk) if a is not None else (-1, 0)
        return self.low.comm_op(prog.c, Comm("edp", self._grad_collective(), self.low.grad_bytes * nparams, "expert_grad_bucket"),
                                deps, mb, prog.next_seq("edp"), chunk=ch)

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
                g = self.dp_comm(self._grad_collective(), self.low.grad_bytes * self.bucket_params, "grad_bucket",
                                 [last.id], a.microbatch, a.chunk)
                self.grad_ops.append(g.id)
                self.bucket_params = 0.0

    def reduce_rest(self, dense: float, expert: float, last_op: int) -> list:
        """The remaining gradients (embedding / head and any partial bucket, or everything without
        overlap, in buckets) after the last backward `last_op`; returns what the optimizer step
        waits for: every gradient reduction, or the last backward where there is none."""
        low, p = self.low, self.p
        for on, stream, total in ((self.dp_on and self.zero < 3, "dp", dense), (self.edp_on, "edp", expert)):
            if not on:
                continue
            sent = sum(low.ops[g].bytes for g in self.grad_ops if low.ops[g].stream == stream) / low.grad_bytes
            left = total - sent if p.overlap_grad_reduce else total
            while left > 1e-6:
                take = left if p.overlap_grad_reduce else min(left, p.bucket_size_params)
                if stream == "dp":
                    g = self.dp_comm(self._grad_collective(), low.grad_bytes * take, "grad_bucket", [last_op], -1)
                else:
                    g = self.expert_reduce(take, [last_op], None)
                self.grad_ops.append(g.id)
                left -= take
        return list(self.grad_ops) or [last_op]
