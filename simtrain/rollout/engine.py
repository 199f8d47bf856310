"""Continuous batching as vLLM V1 schedules it, one scheduler iteration at a time.

Takes a model, a device, a topology, an `EngineConfig` and `Request`s; returns a
`GenerationResult` (see the package docstring). `simulate_generation` is the entry point.

The scheduler (vLLM V1, vllm/v1/core/sched/scheduler.py; SGLang's is alike). Every request has
num_tokens = prompt + generated tokens and num_computed tokens whose KV is cached; each
iteration, with a budget of `max_num_batched_tokens`:
  1. running requests, in admission order, each get min(num_tokens - num_computed, budget left)
     new tokens (1 for a decoding request; a prefill chunk otherwise). Their KV blocks
     (`block_size` tokens each) are allocated for num_computed + new tokens; when the cache has
     too few free blocks, the most recently admitted running request is preempted (its blocks
     freed, num_computed reset to 0, put back at the head of the waiting queue: recompute) until
     the allocation fits or the request itself was preempted;
  2. if nothing was preempted, waiting requests (arrived, FIFO) are admitted while fewer than
     `max_num_seqs` run, budget is left and their blocks fit: a prompt longer than the budget is
     cut into chunks (chunked prefill) and the rest follows in later iterations.
  A request whose computed tokens reach num_tokens samples one token. It finishes when it has
  generated its response length; its blocks are freed at the end of that iteration.
With `chunked_prefill` off (vLLM V0's default scheduler) an iteration is either prefills of whole
prompts (when a waiting one can be admitted) or one decode step of every running request.

Bulk advance: when every running request decodes, nothing can be admitted (the batch is at
`max_num_seqs`, the budget is spent, or the waiting head's blocks do not fit, which stays so
while the batch only grows) and no request finishes or needs a block that is not free, the next k
iterations have the same shape and only their KV reads grow by n tokens each. They are advanced
at once: k = min(iterations to the first finish, iterations until the cache is full, iterations
until the next arrival), time = k·(t_1 + t_k)/2, exact when the step time is linear in the KV
read (as the roofline's memory-bound terms are), and a close approximation otherwise.

Decode stretches: when, in addition, nothing waits and no request can still arrive, the bulk
advances from one finish to the next are taken together (`_Replica._stretch`): the running
requests are sorted by remaining tokens once, each stretch's batch size, first KV read (a suffix
sum of computed tokens) and end-of-stretch blocks come from array operations, and only the two
step prices per stretch are computed one by one. The records are the bulk advance's, bit for
bit (`stretch=False` turns it off; tests/test_rollout_fast.py compares all three paths).
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from simtrain.cost.roofline import ComputeCostModel
from simtrain.errors import SimtrainError
from simtrain.hardware.devices import Device
from simtrain.hardware.topology import Topology
from simtrain.rollout.cost import IterationCost
from simtrain.spec.scenario import ModelSpec
from simtrain.workload.generation import DTYPE_BYTES, KERNEL_INVENTORIES, Batch, GenerationDims

GiB = 2 ** 30


INT_FIELDS = ("tp", "ep", "dp", "max_num_seqs", "max_num_batched_tokens", "block_size", "cuda_graph_max_batch")
"""EngineConfig's whole-number fields."""


@dataclass(frozen=True)
class EngineConfig:
    """A rollout engine (one vLLM / SGLang instance per dp replica). Defaults follow vLLM's
    engine arguments where it has one (block 16, gpu_memory_utilization 0.9, max_num_seqs 256,
    chunked prefill on in V1, CUDA graphs captured up to 512 tokens per iteration (a decode token
    per sequence), vllm/config and vllm/engine/arg_utils.py); `max_num_batched_tokens` 8192 is V1's default for the OpenAI
    server on large GPUs (it varies by version and usage context). `launch_overhead_s`, the host
    time per kernel when the engine runs eagerly, is 23 us: the median start-to-start interval
    between consecutive kernel launches of one CPU thread in a PyTorch eager step, measured with
    `simtrain.calibration.kineto.host_stats` on an A100 trace (HolisticTraceAnalysis test data,
    docs/modelling/framework-host.md); it covers the Python and aten dispatch between kernels as
    well as the launch call (4 us median). `cpu_overhead_s` and `reserved_bytes` are assumptions
    (1 ms of scheduling and input preparation per iteration, 1 GiB of CUDA context, NCCL and graph
    memory), not measurements: set them from a profile of the engine when you have one.
    `kernels` names the engine's kernel inventory (`workload.generation.KERNEL_INVENTORIES`): how
    many kernels the small steps of a layer take where the engine does not fuse them (Qwen3's
    q/k norms, the KV-cache write, MoE routing and expert sorting), read from vLLM's released
    source; `minimal` is one kernel per operator."""
    tp: int = 1
    ep: int = 1
    dp: int = 1
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    chunked_prefill: bool = True
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    cuda_graphs: bool = True
    cuda_graph_max_batch: int = 512
    cpu_overhead_s: float = 1e-3
    overlap_cpu: bool = False
    launch_overhead_s: float = 23e-6
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    reserved_bytes: float = 1.0 * GiB
    kernels: str = "vllm-0.10.1"

    def __post_init__(self):
        probs = []
        for k in INT_FIELDS:
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 2 ** 31:
                probs.append(f"engine: {k}: {v!r} is not a whole number in 1..2^31; give a positive integer")
        for k, hi in (("cpu_overhead_s", 10.0), ("launch_overhead_s", 1.0), ("reserved_bytes", 2.0 ** 50)):
            v = getattr(self, k)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or not 0 <= v <= hi:
                probs.append(f"engine: {k}: {v!r} is not a finite number in [0, {hi:g}]; give a value in range")
        for k in ("chunked_prefill", "cuda_graphs", "overlap_cpu"):
            v = getattr(self, k)
            if not isinstance(v, bool):
                probs.append(f"engine: {k}: {v!r} is not true or false; write true or false")
        u = self.gpu_memory_utilization
        if not isinstance(u, (int, float)) or not math.isfinite(u) or not 0 < u <= 1:
            probs.append(f"engine: gpu_memory_utilization: {u!r} is not in (0, 1]; give a fraction such as 0.9")
        for k in ("weight_dtype", "kv_dtype"):
            if getattr(self, k) not in DTYPE_BYTES:
                probs.append(f"engine: {k}: unknown {getattr(self, k)!r}; use one of {', '.join(DTYPE_BYTES)}")
        if not isinstance(self.kernels, str) or self.kernels not in KERNEL_INVENTORIES:
            probs.append(f"engine: kernels: unknown {self.kernels!r}; use one of {', '.join(KERNEL_INVENTORIES)} "
                         "(the read release nearest yours)")
        if not probs and self.ep not in (1, self.tp):
            probs.append(f"engine: ep: {self.ep} must be 1 or equal tp ({self.tp}); expert parallelism spans the engine's tp group")
        if probs:
            raise SimtrainError("\n".join(probs))


@dataclass(frozen=True)
class Request:
    """One generation request: prompt tokens, response tokens to generate, arrival time."""
    prompt_tokens: int
    output_tokens: int
    arrival_s: float = 0.0


@dataclass(frozen=True)
class Iteration:
    """`steps` consecutive scheduler iterations of the same shape (1 unless bulk-advanced)."""
    start_s: float
    duration_s: float
    steps: int
    num_seqs: int
    num_tokens: int          # tokens computed per iteration (decode + prefill chunk tokens)
    prefill_tokens: int
    kv_blocks_used: int      # at the end of the last iteration
    preemptions: int
    replica: int = 0


@dataclass(frozen=True)
class GenerationResult:
    makespan_s: float
    finish_s: np.ndarray            # per request (input order)
    first_token_s: np.ndarray
    iterations: tuple               # Iteration records, replica by replica
    num_steps: int
    preemptions: int
    kv_blocks_total: int            # per replica
    kv_blocks_peak: int
    kv_bytes_per_block: float
    weight_bytes: float             # per rank
    output_tokens: int
    prompt_tokens: int
    notes: tuple = field(default=())

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.makespan_s if self.makespan_s else 0.0

    @property
    def total_tokens_per_s(self) -> float:
        return (self.output_tokens + self.prompt_tokens) / self.makespan_s if self.makespan_s else 0.0

    @property
    def kv_peak_bytes(self) -> float:
        return self.kv_blocks_peak * self.kv_bytes_per_block


def kv_cache_blocks(dims: GenerationDims, device: Device, engine: EngineConfig) -> int:
    """KV blocks of one replica: (utilization x memory - weights - activation workspace -
    reserved) / (block_size x KV bytes per token), per rank (every tp rank holds its heads'
    share of every block). Worked example in tests/test_generation.py."""
    free = (engine.gpu_memory_utilization * device.memory_bytes - dims.weight_bytes()
            - dims.workspace_bytes(engine.max_num_batched_tokens, engine.max_num_seqs) - engine.reserved_bytes)
    per_block = engine.block_size * dims.kv_bytes_per_token()
    return max(int(free // per_block), 0)


class _Replica:
    """The scheduler state of one engine replica."""

    def __init__(self, reqs: list, cost: IterationCost, engine: EngineConfig, total_blocks: int, replica: int, bulk: bool,
                 stretch: bool = True):
        self.P = np.array([r.prompt_tokens for r in reqs], dtype=np.int64)
        self.R = np.array([r.output_tokens for r in reqs], dtype=np.int64)
        self.arr = [float(r.arrival_s) for r in reqs]
        n = len(reqs)
        self.comp = np.zeros(n, dtype=np.int64)
        self.gen = np.zeros(n, dtype=np.int64)
        self.blk = np.zeros(n, dtype=np.int64)
        self.finish = np.full(n, np.nan)
        self.first = np.full(n, np.nan)
        self.cost, self.e, self.total, self.replica, self.bulk = cost, engine, total_blocks, replica, bulk
        self.stretch = bulk and stretch
        self.order = sorted(range(n), key=lambda i: (self.arr[i], i))
        self.records: list = []
        self.preemptions = 0
        self.steps = 0
        self.peak = 0

    # -- scheduling ---------------------------------------------------------------------------

    def _schedule(self, running: list, waiting: deque, free: int) -> tuple:
        """One iteration's (scheduled request ids, their new tokens, free blocks, preempted, admitted)."""
        e, bs = self.e, self.e.block_size
        budget = e.max_num_batched_tokens
        ids: list = []
        news: list = []
        preempted = 0
        if not e.chunked_prefill and waiting:
            admitted, free, budget = self._admit(running, waiting, free, budget, True, ids, news)
            if admitted:
                return np.array(ids, dtype=np.int64), np.array(news, dtype=np.int64), free, 0, admitted
        sel = new = np.zeros(0, dtype=np.int64)
        if running:
            run = np.fromiter(running, dtype=np.int64, count=len(running))
            need = self.P[run] + self.gen[run] - self.comp[run]
            start = np.cumsum(need) - need
            new = np.clip(budget - start, 0, need)
            L = int(np.count_nonzero(new))
            nb = -(-(self.comp[run[:L]] + new[:L]) // bs) - self.blk[run[:L]]
            C = np.cumsum(nb)
            m = L
            if L and int(C[-1]) > free:
                # preemption (module docstring): victims from the end of `running`, as few as let
                # each request in order allocate; v[i] = victims needed once request i is allocated
                N = len(running)
                sfx = np.concatenate(([0], np.cumsum(self.blk[run][::-1])))
                v = np.searchsorted(sfx, C - free, side="left")
                bad = np.nonzero(np.arange(L) >= N - v)[0]
                if len(bad):
                    m = int(bad[0])
                    preempted = N - m
                else:
                    preempted = int(v[-1])
                victims = running[N - preempted:]
                del running[N - preempted:]
                vic = np.array(victims, dtype=np.int64)
                free += int(self.blk[vic].sum())
                self.blk[vic] = 0
                self.comp[vic] = 0
                waiting.extendleft(reversed(victims))
            sel, new = run[:m], new[:m]
            self.blk[sel] += nb[:m]
            free -= int(C[m - 1]) if m else 0
            budget -= int(new.sum())
        admitted = 0
        if not preempted and waiting and e.chunked_prefill:
            admitted, free, budget = self._admit(running, waiting, free, budget, False, ids, news)
            if admitted:
                sel = np.concatenate((sel, np.array(ids, dtype=np.int64)))
                new = np.concatenate((new, np.array(news, dtype=np.int64)))
        return sel, new, free, preempted, admitted

    def _admit(self, running: list, waiting: deque, free: int, budget: int, whole: bool, ids: list, news: list) -> tuple:
        bs, e = self.e.block_size, self.e
        admitted = 0
        while waiting and budget > 0 and len(running) < e.max_num_seqs:
            rid = waiting[0]
            need = int(self.P[rid] + self.gen[rid] - self.comp[rid])
            if whole and need > budget:
                break
            n = min(need, budget)
            nb = -(-(int(self.comp[rid]) + n) // bs) - int(self.blk[rid])
            if nb > free:
                break
            waiting.popleft()
            running.append(rid)
            free -= nb
            self.blk[rid] += nb
            ids.append(rid)
            news.append(n)
            budget -= n
            admitted += 1
        return admitted, free, budget

    # -- the run ------------------------------------------------------------------------------

    def _batch(self, ids: np.ndarray, new: np.ndarray) -> Batch:
        c = self.comp[ids]
        dec = (new == 1) & (c > 0)
        pre = ~dec
        sampled = int(np.count_nonzero(c + new == self.P[ids] + self.gen[ids]))
        prefill = tuple(zip(c[pre].tolist(), new[pre].tolist()))
        return Batch(int(np.count_nonzero(dec)), float((c[dec] + 1).sum()), prefill, sampled)

    def run(self) -> float:
        now = 0.0
        running: list = []
        waiting: deque = deque()
        nxt = 0                                 # next request (in arrival order) not yet arrived
        free = self.total
        order, arr = self.order, self.arr
        n = len(order)
        done = 0
        while done < n:
            while nxt < n and arr[order[nxt]] <= now:
                waiting.append(order[nxt])
                nxt += 1
            if not running and not waiting:
                now = arr[order[nxt]]
                continue
            ids, new, free, pre, admitted = self._schedule(running, waiting, free)
            self.preemptions += pre
            if not len(ids):
                if nxt < n:                     # nothing fits until the next arrival (cannot happen with a free cache)
                    now = max(now, arr[order[nxt]])
                    continue
                raise SimtrainError("rollout: a request cannot be scheduled with an empty cache; "
                                    "raise gpu_memory_utilization or shorten the requests")
            b = self._batch(ids, new)
            k = 1
            if (self.bulk and not pre and not admitted and b.decode == len(running) == len(ids) == b.sampled
                    and (not waiting or self._admission_blocked(running, waiting, free))):
                if self.stretch and not waiting and nxt == n:
                    out = self._stretch(running, now, free)
                    if out is not None:
                        now, free, gone = out
                        done += gone
                        continue
                k = self._bulk_steps(running, nxt, now, b)
            if k > 1:
                t, t1, tk = self._bulk_time(b, k, len(running))
                run = np.fromiter(running, dtype=np.int64, count=len(running))
                fresh = run[self.gen[run] == 0]         # a prompt whose last chunk was one token samples its first now
                self.first[fresh] = now + t1
                self.comp[run] += k
                self.gen[run] += k
                blk = -(-self.comp[run] // self.e.block_size)
                # blocks: step 1 already allocated for comp+1; the remaining k-1 steps allocate the rest
                add = blk - self.blk[run]
                free -= int(add.sum())
                self.blk[run] = blk
                fin = run[self.gen[run] >= self.R[run]]
                steps_tokens = len(running)
                used = self.total - free
                self.peak = max(self.peak, used)
                self.records.append(Iteration(now, t, k, len(running), steps_tokens, 0, used, 0, self.replica))
                now += t
                self.steps += k
            else:
                t = self.cost.seconds(b)
                self.comp[ids] += new
                smp = ids[self.comp[ids] == self.P[ids] + self.gen[ids]]
                self.gen[smp] += 1
                firsts = smp[self.gen[smp] == 1]
                self.first[firsts] = now + t
                fin = smp[self.gen[smp] >= self.R[smp]]
                used = self.total - free
                self.peak = max(self.peak, used)
                self.records.append(Iteration(now, t, 1, b.seqs, b.tokens, sum(x for _, x in b.prefill), used, pre, self.replica))
                now += t
                self.steps += 1
            if len(fin):
                gone = set(int(x) for x in fin)
                for rid in gone:
                    free += int(self.blk[rid])
                    self.blk[rid] = 0
                    self.finish[rid] = now
                running[:] = [r for r in running if r not in gone]
                done += len(gone)
        return now

    def _stretch(self, running: list, now: float, free: int) -> tuple | None:
        """Decode-only stretches back to back, while nothing waits or can arrive: every running
        request decodes one token per iteration until the shortest remaining one finishes, the
        batch shrinks, and so on. Each stretch between finishes is what the bulk advance would
        record (same k, same trapezoid, same block counts), computed from arrays sorted by
        remaining tokens instead of one scheduler pass per stretch. Stops before the first
        stretch whose KV blocks would not fit (the scheduler then preempts). Returns (now, free
        blocks, requests finished), or None when even the first stretch does not fit. The first
        iteration's blocks were allocated by `_schedule`; they are recounted here from the
        computed tokens (blocks = ceil(computed / block_size) for every running request)."""
        bs, total = self.e.block_size, self.total
        run = np.fromiter(running, dtype=np.int64, count=len(running))
        N = len(run)
        rem = self.R[run] - self.gen[run]
        order = np.argsort(rem, kind="stable")
        rs = rem[order]
        cs = self.comp[run][order]
        u, starts = np.unique(rs, return_index=True)      # stretch m ends after u[m] iterations in all
        M = len(u)
        # blocks in use at the end of stretch m (before its finishers free theirs): sum over the
        # requests alive in it (sorted positions >= starts[m]) of ceil((computed + u[m]) / bs)
        used = np.empty(M, dtype=np.int64)
        col = np.arange(N)
        rows = max(1, (1 << 20) // max(N, 1))
        for a in range(0, M, rows):
            z = slice(a, a + rows)
            mat = (cs[None, :] + (u[z, None] + (bs - 1))) // bs
            used[a:a + rows] = np.where(col[None, :] >= starts[z, None], mat, 0).sum(axis=1)
        over = np.nonzero(used > total)[0]
        m_end = int(over[0]) if len(over) else M
        if m_end == 0:
            return None
        fresh = run[self.gen[run] == 0]                    # a prompt whose last chunk was one token
        alive_comp = np.concatenate((np.cumsum(cs[::-1])[::-1], [0]))   # computed tokens of sorted positions >= i
        cost, rec, rep = self.cost, self.records, self.replica
        u_l, st_l, used_l, sc_l = u.tolist(), starts.tolist(), used.tolist(), alive_comp[starts].tolist()
        ends = []
        prev = 0
        peak = self.peak
        for m in range(m_end):
            nm = N - st_l[m]
            k = u_l[m] - prev
            ctx = float(sc_l[m] + nm * (prev + 1))        # first iteration: each reads computed + 1 tokens
            t1 = cost.decode_seconds(nm, ctx, nm)
            if m == 0 and len(fresh):
                self.first[fresh] = now + t1
            if k > 1:
                tk = cost.decode_seconds(nm, ctx + nm * (k - 1), nm)
                t = k * (t1 + tk) / 2
            else:
                t = t1
            um = used_l[m]
            if um > peak:
                peak = um
            rec.append(Iteration(now, t, k, nm, nm, 0, um, 0, rep))
            now += t
            ends.append(now)
            prev = u_l[m]
        self.peak = peak
        self.steps += prev
        last = st_l[m_end] if m_end < M else N           # sorted positions < last have finished
        gone = run[order[:last]]
        self.finish[gone] = np.repeat(ends, np.diff(st_l[:m_end] + [last]))
        self.comp[run] += np.minimum(rem, prev)
        self.gen[run] += np.minimum(rem, prev)
        self.blk[gone] = 0
        keep = np.ones(N, dtype=bool)
        keep[order[:last]] = False
        alive = run[keep]
        self.blk[alive] = -(-self.comp[alive] // bs)
        running[:] = alive.tolist()
        return now, total - int(self.blk[alive].sum()), last

    def _admission_blocked(self, running: list, waiting: deque, free: int) -> bool:
        """Whether the waiting head stays unadmittable while the batch only decodes."""
        e = self.e
        if len(running) >= e.max_num_seqs:
            return True
        budget = e.max_num_batched_tokens - len(running)
        if budget <= 0:
            return True
        rid = waiting[0]
        need = int(self.P[rid] + self.gen[rid] - self.comp[rid])
        if not e.chunked_prefill and need > budget:
            return True
        nb = -(-(int(self.comp[rid]) + min(need, budget)) // e.block_size) - int(self.blk[rid])
        return nb > free

    def _bulk_steps(self, running: list, nxt: int, now: float, b: Batch) -> int:
        run = np.fromiter(running, dtype=np.int64, count=len(running))
        comp, bs = self.comp[run], self.e.block_size
        k = int((self.R[run] - self.gen[run]).min())          # iterations to the first finish
        if k <= 1:
            return 1
        # largest j <= k with sum ceil((comp + j) / bs) <= total blocks (step j computes token comp + j - 1)
        lo, hi = 1, k
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if int((-(-(comp + mid) // bs)).sum()) <= self.total:
                lo = mid
            else:
                hi = mid - 1
        k = lo
        if k > 1 and nxt < len(self.order) and len(running) < self.e.max_num_seqs:
            until = self.arr[self.order[nxt]] - now             # stop at the first iteration ending at or after the arrival
            t1 = self.cost.seconds(b)
            tk = self.cost.seconds(Batch(b.decode, b.decode_ctx + b.decode * (k - 1), (), b.sampled))
            slope = (tk - t1) / (k - 1)
            lo, hi = 1, k
            while lo < hi:
                mid = (lo + hi) // 2
                if mid * t1 + slope * mid * (mid - 1) / 2 >= until:
                    hi = mid
                else:
                    lo = mid + 1
            k = lo
        return k

    def _bulk_time(self, b: Batch, k: int, nseq: int) -> tuple:
        t1 = self.cost.seconds(b)
        tk = self.cost.seconds(Batch(b.decode, b.decode_ctx + b.decode * (k - 1), (), b.sampled))
        return k * (t1 + tk) / 2, t1, tk


def simulate_generation(model: ModelSpec, device: Device, topology: Topology | None, engine: EngineConfig,
                        requests: Sequence[Request], costs: ComputeCostModel | None = None,
                        bulk: bool = True, stretch: bool = True) -> GenerationResult:
    """Simulates `requests` on `engine.dp` independent replicas (request i goes to replica
    i mod dp), each with `engine.tp` ranks on devices 0..tp-1 of `topology` (None when tp = 1).
    `costs`: any compute cost model (default the device's CalibratedRoofline); `bulk`: advance
    iterations of unchanging shape together (off: one iteration at a time, for checking);
    `stretch`: with `bulk`, run decode-only stretches finish to finish from sorted arrays (off:
    one scheduler pass per bulk advance, for checking; the records are the same)."""
    dims = GenerationDims(model, engine.tp, engine.ep, engine.weight_dtype, engine.kv_dtype, kernels=engine.kernels)
    total = kv_cache_blocks(dims, device, engine)
    reqs = list(requests)
    probs = []
    for i, r in enumerate(reqs):
        for k in ("prompt_tokens", "output_tokens"):
            v = getattr(r, k)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= 2 ** 31:
                probs.append(f"requests[{i}]: {k}: {v!r} is not a whole number >= 1; give a token count")
        a = r.arrival_s
        if not isinstance(a, (int, float)) or not math.isfinite(a) or a < 0:
            probs.append(f"requests[{i}]: arrival_s: {a!r} is not a finite time >= 0; give seconds")
        if len(probs) > 20:
            break
    if probs:
        raise SimtrainError("\n".join(probs[:20]))
    if total < 1:
        raise SimtrainError(f"engine: gpu_memory_utilization: no memory is left for the KV cache ({dims.weight_bytes() / 1e9:.1f} GB "
                            f"of weights per rank on {device.memory_bytes / 1e9:.0f} GB); raise tp or gpu_memory_utilization")
    longest = max((r.prompt_tokens + r.output_tokens for r in reqs), default=0)
    if -(-longest // engine.block_size) > total:
        raise SimtrainError(f"requests: a request of {longest} tokens needs more than the {total} KV blocks of the cache; "
                            "raise tp or gpu_memory_utilization, or shorten the request")
    if not engine.chunked_prefill:
        over = max((r.prompt_tokens + r.output_tokens for r in reqs), default=0)
        if over > engine.max_num_batched_tokens:
            raise SimtrainError(f"engine: max_num_batched_tokens: {engine.max_num_batched_tokens} is below a request's {over} "
                                "tokens, which must fit one prefill without chunked prefill; raise it or enable chunked_prefill")
    cost = IterationCost(dims, device, topology, engine, costs)
    finish = np.full(len(reqs), np.nan)
    first = np.full(len(reqs), np.nan)
    records, steps, pre, peak, makespan = [], 0, 0, 0, 0.0
    for rep in range(engine.dp):
        idx = list(range(rep, len(reqs), engine.dp))
        if not idx:
            continue
        sim = _Replica([reqs[i] for i in idx], cost, engine, total, rep, bulk, stretch)
        makespan = max(makespan, sim.run())
        finish[idx] = sim.finish
        first[idx] = sim.first
        records += sim.records
        steps += sim.steps
        pre += sim.preemptions
        peak = max(peak, sim.peak)
    notes = tuple(sorted(getattr(cost.costs, "coverage", set())))
    return GenerationResult(
        makespan_s=makespan, finish_s=finish, first_token_s=first, iterations=tuple(records), num_steps=steps,
        preemptions=pre, kv_blocks_total=total, kv_blocks_peak=peak,
        kv_bytes_per_block=engine.block_size * dims.kv_bytes_per_token(), weight_bytes=dims.weight_bytes(),
        output_tokens=int(sum(r.output_tokens for r in reqs)), prompt_tokens=int(sum(r.prompt_tokens for r in reqs)),
        notes=notes)
