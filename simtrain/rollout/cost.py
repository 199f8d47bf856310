"""The time of one engine iteration: GPU kernels, tensor-parallel collectives, kernel launches and
the engine's CPU (scheduling) overhead.

Takes the per-rank generation operators (`workload.generation.GenerationDims`), a compute cost
model (default `CalibratedRoofline` of the device), the topology for the tp group's collectives
(`network.collectives.choose`, NCCL's closed forms) and the engine settings; `IterationCost.seconds`
returns the wall time of one iteration of a `Batch`:

    gpu  = sum of kernel times (GEMMs and memory-bound operators by the roofline; decode attention
           max(KV bytes / (HBM bw x efficiency), FLOPs / (16-bit peak x FlashAttention efficiency));
           prefill attention by the FlashAttention curve) + tp collectives
    launch: CUDA graphs on and at most `cuda_graph_max_batch` tokens: one graph launch;
           otherwise every kernel is issued by the host, one per `launch_overhead_s`, and the device
           runs each once issued (`cost.roofline.host_queue`, evaluated per layer kind by
           `grouped_host_queue`): launches hide behind long kernels and dominate short ones
    step = cpu_overhead_s + gpu   (or max(cpu, gpu) when the engine overlaps scheduling with the
           GPU: vLLM's async scheduling, SGLang's and TRT-LLM's overlap schedulers)

A decode-only batch under CUDA graphs (the bulk of a rollout) is priced without building its
operators: everything but attention is cached per (tokens, sampled rows), and the decode
attention kernel's bytes and FLOPs are the same closed forms `GenerationDims.attention_ops`
uses, evaluated on scalars (`decode_seconds`). The result is bit-for-bit the operator path's
(`seconds_from_ops`; tests/test_rollout_fast.py compares them on dense, GQA-replicated and MLA
models, with graphs on and off).

vLLM's v0.6.0 performance post (blog.vllm.ai/2024/09/05/perf-update.html) is the reason the CPU
term exists: profiling Llama 3 8B on one H100 found the HTTP API server at 33 % of the execution
time and scheduling (with output processing) at 29 %, the GPU busy for only 38 %: for small
models CPU overhead, not the GPU, sets the iteration time.
"""
from __future__ import annotations

from simtrain.cost.roofline import CalibratedRoofline, ComputeCostModel
from simtrain.hardware.devices import Device
from simtrain.hardware.topology import Topology
from simtrain.network.collectives import choose
from simtrain.plan.grid import group_shape
from simtrain.workload.generation import Batch, GenerationDims
from simtrain.workload.ir import ACT_BYTES, Comm, Op

ATTENTION = ("decode_attn", "prefill_attn")

# (collective, bytes, group shape, topology) -> seconds: `choose` without measured tables is a
# pure function of these, so its values are kept across engines (an RL job builds one per
# iteration); cleared when it grows past _COMM_MAX entries
_COMM: dict = {}
_COMM_MAX = 1 << 16


def grouped_host_queue(groups: list, c: float) -> float:
    """`host_queue` of the kernels of `groups` ((count, kernel times), the kernel times
    repeated count times, in order) without expanding them: within a repeated group the value
    (k+1)·c + (time of kernels k..end) is linear in the repeat index, so its maximum is at the
    first or the last repeat: max over the group's kernels j of (p0 + j + 1)·c + (rest of the
    group from j) + (time after the group) + (count - 1)·max(group time, group length · c).
    Equal to `host_queue` of the expanded list up to rounding (tests/test_rollout_fast.py)."""
    if not c:
        return sum(count * sum(seq) for count, seq in groups)
    end = sum(count * len(seq) for count, seq in groups)
    tail = best = 0.0
    for count, seq in reversed(groups):
        n = len(seq)
        if not n or not count:
            continue
        p0 = end - count * n
        loc = 0.0
        top = float("-inf")
        for j in range(n - 1, -1, -1):
            loc += seq[j]
            v = (p0 + j + 1) * c + loc
            if v > top:
                top = v
        best = max(best, top + tail + (count - 1) * max(loc, n * c))
        tail += count * loc
        end = p0
    return best


class IterationCost:
    """Prices iterations of one engine replica (tp ranks on devices 0..tp-1 of the topology)."""

    def __init__(self, dims: GenerationDims, device: Device, topology: Topology | None, engine: object,
                 costs: ComputeCostModel | None = None):
        self.dims, self.dev, self.engine = dims, device, engine
        self.costs = costs or CalibratedRoofline(device, dims.compute_dtype)
        self.topo = topology
        self.shape = None
        if dims.tp > 1:
            if topology is None:
                raise ValueError("tp > 1 needs a topology for the tensor-parallel collectives")
            self.shape = group_shape(list(range(dims.tp)), topology)
        self._comm: dict = {}
        self._fixed_cache: dict = {}
        self._vector = "bf16" if "bf16" in device.peak_flop_per_s else "fp16"
        # decode attention's closed forms (GenerationDims.attention_ops), per layer
        self._kvl = dims.kv_bytes_per_token_layer()
        self._per = dims.qk_dim + dims.v_dim
        self._fl_width = (2 * dims.mla.kv_lora_rank + dims.mla.qk_rope_head_dim) if dims.mla is not None else self._per

    def comm_time(self, c: Comm) -> float:
        key = (c.collective, c.size_bytes)
        t = self._comm.get(key)
        if t is None:
            if self.shape is None:
                t = 0.0
            else:
                shared = (c.collective, c.size_bytes, self.shape, self.topo)
                t = _COMM.get(shared)
                if t is None:
                    if len(_COMM) >= _COMM_MAX:
                        _COMM.clear()
                    t = _COMM[shared] = choose(c.collective, c.size_bytes, self.shape, self.topo).seconds
            self._comm[key] = t
        return t

    def op_time(self, o: Op) -> float:
        """Device time of one operator (no host issue cost: launches are the engine's term)."""
        if o.name == "decode_attn":
            mem = self.costs.memory_time(o.bytes)
            flash = self.dev.flash
            eff = flash.at(max(o.shape[0], 1.0))[0] if flash is not None else 1.0
            return max(mem, o.flops / (self.dev.peak(self._vector) * eff))
        f = getattr(self.costs, "device_time", None)
        return f(o) if f is not None else self.costs.duration(o)

    def kernel_groups(self, b: Batch) -> list:
        """[(count, device times of one layer kind's kernels)] in issue order (`step_items`)."""
        out: list = []
        for count, items in self.dims.step_items(b):
            one = []
            for it in items:
                if isinstance(it, Comm):
                    one.append(self.comm_time(it))
                else:
                    one.extend(self.op_time(o) for o in it)
            out.append((count, one))
        return out

    def kernels(self, b: Batch) -> list:
        """Device times of the iteration's kernels (operators and collectives) in issue order."""
        out: list = []
        for count, one in self.kernel_groups(b):
            out.extend(one * count)
        return out

    def _fixed(self, b: Batch) -> tuple:
        """(time of every kernel but attention, attention kernels per layer): the first depends
        only on the tokens and sampled rows, so it is computed once per (tokens, sampled)."""
        key = (b.tokens, b.sampled)
        hit = self._fixed_cache.get(key)
        if hit is None:
            tot = 0.0
            for count, items in self.dims.step_items(b):
                for it in items:
                    if isinstance(it, Comm):
                        tot += count * self.comm_time(it)
                    else:
                        tot += count * sum(self.op_time(o) for o in it if o.name not in ATTENTION)
            hit = self._fixed_cache[key] = tot
        return hit

    def gpu_seconds(self, b: Batch) -> float:
        """Kernels plus launches (see the module docstring)."""
        e = self.engine
        launch = e.launch_overhead_s
        if e.cuda_graphs and b.tokens <= e.cuda_graph_max_batch:
            attn = sum(self.op_time(o) for o in self.dims.attention_ops(b)) * self.dims.L
            return launch + self._fixed(b) + attn
        return grouped_host_queue(self.kernel_groups(b), launch)

    def seconds_from_ops(self, b: Batch) -> float:
        """Wall time of one iteration of batch `b`, from its operators."""
        if b.seqs == 0:
            return 0.0
        gpu = self.gpu_seconds(b)
        cpu = self.engine.cpu_overhead_s
        return max(cpu, gpu) if self.engine.overlap_cpu else cpu + gpu

    def seconds(self, b: Batch) -> float:
        """Wall time of one iteration of batch `b` (decode-only batches by `decode_seconds`)."""
        if b.prefill or not b.decode:
            return self.seconds_from_ops(b)
        return self.decode_seconds(b.decode, b.decode_ctx, b.sampled)

    def decode_seconds(self, n: int, ctx: float, sampled: int) -> float:
        """`seconds_from_ops(Batch(n, ctx, (), sampled))` without building operators: n decode
        tokens reading `ctx` cached-plus-new tokens of KV in all. The arithmetic is the operator
        path's, in the same order, so the result is identical."""
        e = self.engine
        if not (e.cuda_graphs and n <= e.cuda_graph_max_batch):
            return self.seconds_from_ops(Batch(n, ctx, (), sampled))
        fixed = self._fixed_cache.get((n, sampled))
        if fixed is None:
            fixed = self._fixed(Batch(n, ctx, (), sampled))
        d = self.dims
        nbytes = ctx * self._kvl + ACT_BYTES * n * d.heads * self._per
        fl = 2.0 * d.heads * ctx * self._fl_width
        mem = self.costs.memory_time(nbytes)
        flash = self.dev.flash
        eff = flash.at(max(ctx / n, 1.0))[0] if flash is not None else 1.0
        gpu = e.launch_overhead_s + fixed + max(mem, fl / (self.dev.peak(self._vector) * eff)) * d.L
        cpu = e.cpu_overhead_s
        return max(cpu, gpu) if e.overlap_cpu else cpu + gpu
