"""`simtrain bench`: operator and collective microbenchmarks on PyTorch, written as a calibration
file that `simtrain calibrate` turns into a device profile.

Runs where the accelerator is: CUDA (`torch.cuda`), Cambricon MLU (`torch_mlu`, `torch.mlu`,
collectives on `cncl`) or the CPU (collectives on `gloo`). Each measurement is warmed up, then
repeated; on an accelerator every repetition is timed with device events (start/end events
recorded around the op, elapsed time read after synchronising), on the CPU with a monotonic clock.
The median and the 10th/90th percentiles are kept.

What it measures:
  gemm        (m, n, k) shapes: exactly those a scenario's workload runs (`--for scenario.yaml`),
              or a generic grid of square and transformer-like shapes
  attention   scaled_dot_product_attention forward + backward over (batch, heads, seq, head_dim,
              causal), as FlashAttention's benchmarks time it
  memory      memory-bound operators over sizes: layer_norm, rms_norm, gelu, silu (SwiGLU's),
              softmax, add, and a fused Adam update
  collectives (launched with torchrun, one process per device) all_reduce, all_gather,
              reduce_scatter, all_to_all and send/recv over message sizes, printed as
              nccl-tests-style rows
  interference (`--interference`, CUDA only) a GEMM and a memory-bound add timed alone and
              while an all_reduce / all_gather runs on another stream (torchrun, 2+ GPUs), or,
              on one GPU, while a memory-bound copy runs on another stream (a proxy, recorded as
              collective `copy`); `simtrain calibrate` turns the rows into the profile's
              `interference` table (s = 1 - alone / overlapped)

Calibration file (YAML, `schema: simtrain-calibration/1`):
  provenance: device, backend, torch / CUDA / driver / torch_mlu versions, host, date (UTC),
              dtype, command line
  gemm:        [{m, n, k, dtype, median_s, p10_s, p90_s, reps}]
  attention:   [{batch, heads, seq, head_dim, causal, dtype, median_s, p10_s, p90_s, reps}]
  memory:      [{op, elements, bytes, dtype, median_s, p10_s, p90_s, reps}]
  collectives: [{collective, ranks, nodes, bytes, dtype, median_s, p10_s, p90_s, reps, algbw, busbw}]
  interference: [{op, collective, m, n, k, elements, bytes, ranks, dtype, alone_s, median_s, p10_s,
              p90_s, reps, s}]  (median_s and the percentiles: the op's time overlapped)
Torch is needed only here (`pip install simtrain[bench]`), never to simulate.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import yaml

from simtrain import progress
from simtrain.calibration.nccl_tests import bus_factor
from simtrain.errors import ConfigError, Problem
from simtrain.results.io import check_out_file, write_atomic
from simtrain.schedules import schedule_for
from simtrain.spec.loading import load_scenario
from simtrain.workload.build import build_workload
from simtrain.workload.ir import Ring

SCHEMA = "simtrain-calibration/1"
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
GENERIC_GEMMS = tuple((s, s, s) for s in (256, 512, 1024, 2048, 4096, 8192)) + (
    (4096, 4096 * 3, 4096), (4096, 4096, 4096 * 4), (4096, 4096 * 4, 4096))
MEMORY_OPS = ("layer_norm", "rms_norm", "gelu", "silu", "softmax", "add", "adam")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "sendrecv")


def torch_or_exit() -> ModuleType:
    try:
        import torch
    except ImportError:
        raise ConfigError([Problem("simtrain bench", "torch", "PyTorch is not installed",
                                   "pip install 'simtrain[bench]' (torch is needed only to measure, never to simulate)")])
    return torch


class Accelerator:
    """The device the suite runs on and how to time an op there."""

    def __init__(self, torch: ModuleType, kind: str | None = None):
        self.torch = torch
        mlu = self._mlu(torch)
        if kind is None:
            kind = "cuda" if torch.cuda.is_available() else ("mlu" if mlu is not None and mlu.is_available() else "cpu")
        self.kind = kind
        self.api = {"cuda": getattr(torch, "cuda", None), "mlu": mlu}.get(kind)
        self.device = torch.device(kind if kind != "cpu" else "cpu")
        if kind != "cpu" and (self.api is None or not self.api.is_available()):
            raise ConfigError([Problem("simtrain bench", "--device", f"no {kind} device is available here",
                                       "run on a machine with the accelerator, or use --device cpu")])

    @staticmethod
    def _mlu(torch):
        try:
            import torch_mlu  # noqa: F401  (registers torch.mlu)
        except ImportError:
            return None
        return getattr(torch, "mlu", None)

    def name(self) -> str:
        if self.kind in ("cuda", "mlu"):
            return str(self.api.get_device_name(0))
        return platform.processor() or platform.machine()

    def sync(self) -> None:
        if self.api is not None:
            self.api.synchronize()

    def once(self, fn: Callable[[], object]) -> float:
        """Seconds one call of fn takes: device events around it on an accelerator, else a clock."""
        if self.api is not None:
            start, end = self.api.Event(enable_timing=True), self.api.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e-3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def time(self, fn: Callable[[], object], warmup: int, reps: int,
             before: Callable[[], object] | None = None) -> list[float]:
        """`reps` timed repetitions after `warmup` untimed ones; `before` runs ahead of each
        timed one (a barrier, for collectives)."""
        for _ in range(warmup):
            fn()
        self.sync()
        out = []
        for _ in range(reps):
            if before is not None:
                before()
            out.append(self.once(fn))
        return out


def summarize(times: list) -> dict:
    ts = sorted(times)
    q = statistics.quantiles(ts, n=10, method="inclusive") if len(ts) > 1 else [ts[0]] * 9
    return {"median_s": statistics.median(ts), "p10_s": q[0], "p90_s": q[-1], "reps": len(ts)}


def provenance(acc: Accelerator, dtype: str, command: str) -> dict:
    torch = acc.torch
    p = {"device": acc.name(), "backend": acc.kind, "torch": str(torch.__version__), "host": socket.gethostname(),
         "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "dtype": dtype,
         "command": command, "python": platform.python_version()}
    if acc.kind == "cuda":
        p["cuda"] = str(torch.version.cuda)
        p["cudnn"] = str(torch.backends.cudnn.version())
        try:
            p["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:       # an optional library detail: absent on some builds
            pass
        p["driver"] = _nvidia_driver()
    if acc.kind == "mlu":
        import torch_mlu
        p["torch_mlu"] = getattr(torch_mlu, "__version__", "?")
    return p


def _nvidia_driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "?"
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "?"


# ---------------------------------------------------------------------------------------------
# what to measure

def scenario_shapes(path: str, overrides: Sequence[str] = ()) -> tuple:
    """(gemm (m, n, k) shapes, attention (b, heads, seq, head_dim, causal) shapes) that the
    scenario (with its `--set` overrides) runs on one rank, each once."""
    sc, _ = load_scenario(path, overrides)
    work = build_workload(sc, schedule_for(sc.parallel, sc.num_microbatches).num_stages)
    gemms, attn = [], []
    m = sc.model
    heads = max(1, m.num_attention_heads // sc.parallel.tp)
    for w in work:
        for prog in (w.layer, w.pre, w.post):
            if prog is None:
                continue
            for seq in (prog.forward, prog.backward):
                for item in seq:
                    for op in (item if isinstance(item, tuple) else item.segment if isinstance(item, Ring) else ()):
                        if op.kind == "gemm":
                            shape = tuple(int(x) for x in op.shape)
                            if shape not in gemms:
                                gemms.append(shape)
                        elif op.kind == "attention":
                            a = (sc.training.micro_batch_size, heads, int(op.shape[0]), m.head_dim, True)
                            if a not in attn:
                                attn.append(a)
    return gemms, attn


def run_compute(acc: Accelerator, dtype: str, gemms: Sequence[tuple[int, int, int]],
                attention: Sequence[tuple[int, int, int, int, bool]], memory_sizes: Sequence[int], warmup: int,
                reps: int, report: Callable[[str], None] | None = None) -> dict:
    """Times every shape; `report` is called once per shape measured (a GEMM, an attention
    shape, one memory size over all the memory-bound ops) with a line saying what it took."""
    torch = acc.torch
    dt = getattr(torch, DTYPES[dtype])
    dev = acc.device
    out = {"gemm": [], "attention": [], "memory": []}
    for (m, n, k) in gemms:
        a = torch.randn(m, k, device=dev, dtype=dt)
        b = torch.randn(k, n, device=dev, dtype=dt)
        r = summarize(acc.time(lambda: torch.matmul(a, b), warmup, reps))
        out["gemm"].append({"m": m, "n": n, "k": k, "dtype": dtype, **r})
        if report:
            report(f"gemm {m}x{n}x{k}: {r['median_s'] * 1e6:.1f} us")
        del a, b
    F = torch.nn.functional
    for (bsz, heads, seq, hd, causal) in attention:
        q = torch.randn(bsz, heads, seq, hd, device=dev, dtype=dt, requires_grad=True)
        g = torch.randn(bsz, heads, seq, hd, device=dev, dtype=dt)

        def fwd_bwd():
            F.scaled_dot_product_attention(q, q, q, is_causal=causal).backward(g)
            q.grad = None
        r = summarize(acc.time(fwd_bwd, warmup, reps))
        out["attention"].append({"batch": bsz, "heads": heads, "seq": seq, "head_dim": hd, "causal": causal,
                                 "pass": "fwd+bwd", "dtype": dtype, **r})
        if report:
            report(f"attention b{bsz} h{heads} s{seq} d{hd}: {r['median_s'] * 1e6:.1f} us")
        del q, g
    for n in memory_sizes:
        hidden = 1024 if n >= 1024 else n
        x = torch.randn(n // hidden, hidden, device=dev, dtype=dt)
        y = torch.randn_like(x)
        w = torch.ones(hidden, device=dev, dtype=dt)
        fp32 = [torch.randn(n, device=dev, dtype=torch.float32) for _ in range(4)]
        ops = {
            "layer_norm": (lambda: F.layer_norm(x, (hidden,), w, w), 2 * n * x.element_size()),
            "rms_norm": (lambda: _rms_norm(torch, x, w), 2 * n * x.element_size()),
            "gelu": (lambda: F.gelu(x), 2 * n * x.element_size()),
            "silu": (lambda: F.silu(x) * y, 3 * n * x.element_size()),
            "softmax": (lambda: torch.softmax(x, -1), 2 * n * x.element_size()),
            "add": (lambda: x + y, 3 * n * x.element_size()),
            "adam": (lambda: _adam(torch, *fp32), 7 * n * 4),
        }
        for name in MEMORY_OPS:
            fn, nbytes = ops[name]
            r = summarize(acc.time(fn, warmup, reps))
            out["memory"].append({"op": name, "elements": n, "bytes": nbytes, "dtype": dtype, **r})
        if report:
            report(f"memory-bound ops at {n} elements")
        del x, y, w, fp32
    return out


def _rms_norm(torch, x, w):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w


def _adam(torch, p, g, m, v, lr=1e-4, b1=0.9, b2=0.95, eps=1e-8):
    """One Adam step in place (read p, g, m, v; write p, m, v: 7 fp32 streams)."""
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    p.addcdiv_(m, v.sqrt().add_(eps), value=-lr)


# ---------------------------------------------------------------------------------------------
# collectives (one process per device, started by torchrun)

def run_collectives(acc: Accelerator, dtype: str, sizes: Sequence[int], warmup: int, reps: int,
                    printer: Callable[..., None] = print) -> list[dict]:
    """Every rank runs this; rank 0 returns the rows. Sizes follow nccl-tests: the whole buffer
    (for all-gather / reduce-scatter the per-rank count x ranks)."""
    torch = acc.torch
    import torch.distributed as dist

    backend = {"cuda": "nccl", "mlu": "cncl", "cpu": "gloo"}[acc.kind]
    if not dist.is_initialized():
        if acc.kind != "cpu":
            acc.api.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    dev = torch.device(acc.kind, int(os.environ.get("LOCAL_RANK", 0))) if acc.kind != "cpu" else torch.device("cpu")
    dt = getattr(torch, DTYPES[dtype])
    esize = torch.tensor([], dtype=dt).element_size()
    hosts = [None] * n
    dist.all_gather_object(hosts, socket.gethostname())
    nodes = len(set(hosts))
    # torch >= 2.10 renames reduce_scatter_tensor (same arguments)
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    rows = []
    if rank == 0:
        printer(f"# simtrain bench collectives: {n} ranks on {nodes} node(s), backend {backend}, dtype {dtype}")
        printer(f"# {'size':>12} {'count':>12} {'type':>8} {'redop':>6} {'root':>6} {'time':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6}")
        printer(f"# {'(B)':>12} {'(elements)':>12} {'':>8} {'':>6} {'':>6} {'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7}")
    todo = [c for c in COLLECTIVES if c != "sendrecv" or n >= 2]
    bar = progress.bar(len(todo) * len(sizes) if rank == 0 else 0, "bench collectives", "size")
    for coll in todo:
        for size in sizes:
            if rank == 0:
                bar.update(1)
            count = max(1, size // esize)
            if coll in ("all_gather", "reduce_scatter", "all_to_all"):
                count = max(n, count // n * n)
            full = torch.ones(count, device=dev, dtype=dt)
            part = torch.ones(count // n, device=dev, dtype=dt) if coll in ("all_gather", "reduce_scatter") else None
            out = torch.empty_like(full)
            fns = {
                "all_reduce": lambda: dist.all_reduce(full),
                "all_gather": lambda: dist.all_gather_into_tensor(out, part),
                "reduce_scatter": lambda: reduce_scatter(part, full),
                "all_to_all": lambda: dist.all_to_all_single(out, full),
                "sendrecv": lambda: _sendrecv(dist, full, out, rank, n),
            }
            fn = fns[coll]
            dist.barrier()
            r = _time_collective(acc, dist, fn, warmup, reps)
            nbytes = count * esize
            alg = nbytes / r["median_s"] if r["median_s"] > 0 else 0.0
            bus = alg * bus_factor(coll, n)
            row = {"collective": coll, "ranks": n, "nodes": nodes, "bytes": nbytes, "dtype": dtype, **r,
                   "algbw": alg, "busbw": bus}
            rows.append(row)
            if rank == 0:
                printer(f"  {nbytes:>12} {count:>12} {DTYPES[dtype]:>8} {'sum':>6} {-1:>6} {r['median_s'] * 1e6:>9.2f} "
                        f"{alg / 1e9:>7.2f} {bus / 1e9:>7.2f} {'N/A':>6}   {coll}")
            del full, part, out
    bar.close()
    dist.barrier()
    return rows if rank == 0 else []


def _sendrecv(dist, send, recv, rank, n):
    """Each rank sends to the next and receives from the previous (nccl-tests sendrecv_perf's ring)."""
    reqs = [dist.isend(send, (rank + 1) % n), dist.irecv(recv, (rank - 1) % n)]
    for q in reqs:
        q.wait()


def _time_collective(acc: Accelerator, dist, fn, warmup: int, reps: int) -> dict:
    """Like timing an operator, but each repetition starts after a barrier and counts the slowest
    rank's time (all-reduced max)."""
    torch = acc.torch
    times = acc.time(fn, warmup, reps, before=dist.barrier)
    worst = torch.tensor(times, dtype=torch.float64, device=acc.device if acc.kind != "cpu" else "cpu")
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return summarize(worst.tolist())


# ---------------------------------------------------------------------------------------------
# interference: compute alone vs with communication on another stream

INTERFERENCE_GEMM = (8192, 8192, 8192)
INTERFERENCE_ELEMENTS = 2 ** 27
INTERFERENCE_BYTES = (2 ** 26, 2 ** 28)


def run_interference(acc: Accelerator, dtype: str, warmup: int, reps: int, tiny: bool = False,
                     printer: Callable[..., None] = print) -> list[dict]:
    """Every rank runs this; rank 0 returns the rows. Per op (a GEMM, a memory-bound add) and
    per communication (all_reduce and all_gather of each size over every rank under torchrun;
    on one process, a device-to-device copy of that size, the proxy): the op's time alone, then
    with the communication issued first on a side stream, repeated back to back so that it
    outlasts the op (k launches for k x its own time >= 2 x the op's), each repetition after a
    barrier. s = 1 - alone / overlapped. Needs CUDA: on another backend the streams do not run
    kernels side by side the way a GPU does."""
    if acc.kind != "cuda":
        raise ConfigError([Problem("simtrain bench", "--interference", f"needs a CUDA GPU (this backend: {acc.kind})",
                                   "run it on an NVIDIA GPU; on two or more, under torchrun, for a real collective")])
    torch = acc.torch
    dt = getattr(torch, DTYPES[dtype])
    dist = None
    rank, n = 0, 1
    if all(k in os.environ for k in TORCHRUN_ENV) and int(os.environ["WORLD_SIZE"]) > 1:
        import torch.distributed as dist
        if not dist.is_initialized():
            acc.api.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            dist.init_process_group("nccl")
        rank, n = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if dist is not None else acc.device
    m, nn, k = (1024, 1024, 1024) if tiny else INTERFERENCE_GEMM
    elems = 2 ** 22 if tiny else INTERFERENCE_ELEMENTS
    a, b = torch.randn(m, k, device=dev, dtype=dt), torch.randn(k, nn, device=dev, dtype=dt)
    x, y = torch.randn(elems, device=dev, dtype=dt), torch.randn(elems, device=dev, dtype=dt)
    esize = a.element_size()
    ops = {"gemm": (lambda: torch.matmul(a, b), {"m": m, "n": nn, "k": k}),
           "memory": (lambda: torch.add(x, y), {"elements": elems})}
    side = acc.api.Stream()
    barrier = dist.barrier if dist is not None else acc.sync
    rows = []
    for nbytes in ((2 ** 22,) if tiny else INTERFERENCE_BYTES):
        count = max(n, nbytes // esize // n * n)
        full, out = torch.ones(count, device=dev, dtype=dt), torch.empty(count, device=dev, dtype=dt)
        part = torch.ones(count // n, device=dev, dtype=dt)
        if dist is not None:
            comms = {"all_reduce": lambda: dist.all_reduce(full), "all_gather": lambda: dist.all_gather_into_tensor(out, part)}
        else:
            comms = {"copy": lambda: out.copy_(full)}
        for coll, launch in comms.items():
            t_comm = statistics.median(acc.time(launch, warmup, max(3, reps // 4), before=barrier))
            for op, (fn, shape) in ops.items():
                alone = summarize(acc.time(fn, warmup, reps, before=barrier))
                times = _overlapped(acc, fn, launch, side, t_comm, alone["median_s"], warmup, reps, barrier)
                r = summarize(times)
                row = {"op": op, "collective": coll, **shape, "bytes": count * esize, "ranks": n, "dtype": dtype,
                       "alone_s": alone["median_s"], **r, "s": round(1.0 - alone["median_s"] / r["median_s"], 4)}
                rows.append(row)
                if rank == 0:
                    printer(f"# interference {op:>6} under {coll:>10} {count * esize:>12} B: alone {alone['median_s'] * 1e6:9.1f} us, "
                            f"overlapped {r['median_s'] * 1e6:9.1f} us, s {row['s']:.3f}")
        del full, out, part
    if dist is not None:
        dist.barrier()
    return rows if rank == 0 else []


def _overlapped(acc: Accelerator, fn: Callable[[], object], launch: Callable[[], object], side: Any, t_comm: float,
                t_op: float, warmup: int, reps: int, barrier: Callable[[], object]) -> list[float]:
    """The op's times with `launch` issued first, back to back on `side`, so that it runs for at
    least twice the op's time."""
    api = acc.api
    times_k = max(1, min(256, int(2.0 * t_op / max(t_comm, 1e-9)) + 1))

    def one() -> float:
        with api.stream(side):
            for _ in range(times_k):
                launch()
        t = acc.once(fn)
        api.synchronize()
        return t

    for _ in range(warmup):
        one()
    out = []
    for _ in range(reps):
        barrier()
        out.append(one())
    return out


def sizes_between(lo: int, hi: int, factor: int = 2) -> list:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def check_args(args: argparse.Namespace) -> None:
    """The arguments that can be wrong before anything is measured (seconds, not a benchmark's run)."""
    probs = []
    if args.reps < 1:
        probs.append(Problem("--reps", "", f"must be >= 1, got {args.reps}", "give the number of timed repetitions, e.g. --reps 20"))
    if args.warmup < 0:
        probs.append(Problem("--warmup", "", f"must be >= 0, got {args.warmup}", "give e.g. --warmup 5"))
    if args.min_bytes < 1 or args.max_bytes < args.min_bytes:
        probs.append(Problem("--min-bytes", "", f"need 1 <= --min-bytes <= --max-bytes, got {args.min_bytes} and {args.max_bytes}",
                             "give e.g. --min-bytes 1048576 --max-bytes 1073741824"))
    if getattr(args, "interference", False) and args.collectives:
        probs.append(Problem("--interference", "", "measures compute under communication; --collectives measures communication alone",
                             "give one of them per run"))
    if args.collectives and not all(k in os.environ for k in TORCHRUN_ENV):
        probs.append(Problem("--collectives", "", "needs one process per device, started by torchrun (RANK, WORLD_SIZE and "
                             "LOCAL_RANK are not set)", "run torchrun --nproc_per_node N -m simtrain bench --collectives -o FILE"))
    if args.device == "mlu" and importlib.util.find_spec("torch_mlu") is None:
        probs.append(Problem("--device", "mlu", "torch_mlu (Cambricon's PyTorch extension) is not installed",
                             "install torch_mlu from Cambricon's SDK, or use --device auto, cuda or cpu"))
    if probs:
        raise ConfigError(probs)
    check_out_file(args.out, "-o")


def main(args: argparse.Namespace) -> int:
    """The `simtrain bench` command (see cli)."""

    check_args(args)
    torch = torch_or_exit()
    acc = Accelerator(torch, None if args.device == "auto" else args.device)
    say = (lambda msg: print(msg, file=sys.stderr)) if not args.quiet else None
    doc = {"schema": SCHEMA, "provenance": provenance(acc, args.dtype, getattr(args, "command_line", "simtrain bench"))}
    if getattr(args, "interference", False):
        rows = run_interference(acc, args.dtype, args.warmup, args.reps, args.tiny)
        if not rows:
            return 0                      # not rank 0: rank 0 writes the file
        doc["interference"] = rows
    elif args.collectives:
        sizes = sizes_between(args.min_bytes, args.max_bytes)
        rows = run_collectives(acc, args.dtype, sizes, args.warmup, args.reps)
        if not rows:
            return 0                      # not rank 0: rank 0 writes the file
        doc["collectives"] = rows
    else:
        if args.for_scenario:
            gemms, attn = scenario_shapes(args.for_scenario, getattr(args, "set", None) or ())
        else:
            gemms = list(GENERIC_GEMMS if not args.tiny else ((64, 64, 64), (128, 128, 128), (128, 256, 64)))
            attn = [(1, 8, s, 64, True) for s in ((512, 1024, 2048, 4096) if not args.tiny else (64, 128))]
        mem = sizes_between(2 ** 16, 2 ** 26, 4) if not args.tiny else [2 ** 12, 2 ** 14]
        total = len(gemms) + len(attn) + len(mem)
        if say:
            say(f"measuring {total} shapes: {len(gemms)} GEMM, {len(attn)} attention, {len(mem)} memory-bound sizes "
                f"x {len(MEMORY_OPS)} ops ({args.warmup} warm-up + {args.reps} timed repetitions each, on {acc.kind})")
        with progress.bar(total, "bench", "shape") as b:
            def tick(msg: str) -> None:
                b.update(1)
                if say:
                    b.write(msg, file=sys.stderr)
            doc.update(run_compute(acc, args.dtype, gemms, attn, mem, args.warmup, args.reps, tick))
    write_atomic(args.out, yaml.safe_dump(doc, sort_keys=False).encode())
    print(f"wrote {args.out} ({acc.kind}: {acc.name()})", file=sys.stderr)
    return 0
