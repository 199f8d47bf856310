"""PyTorch profiler traces (Kineto Chrome-trace JSON from `torch.profiler`'s
`export_chrome_trace`, gzip or not) -> per-operator durations under simtrain's operator names.

Device activity (CUDA `kernel` / `gpu_memcpy` / `gpu_memset`; torch_mlu's profiler writes MLU
kernels as `kernel` too, and copies as `mlu_memcpy` / `mlu_memset`) is joined to the CPU op that
launched it through the `External id` argument both carry, and each top-level CPU op gets the summed duration of its kernels. A CPU-only trace has no
device activity: there the CPU op's own duration is the measurement (the device is the CPU).

Roll-up to simtrain's operators (`OPERATORS`): an aten op is counted under the first matching
name, and only outermost matching ops count (aten::linear contains aten::matmul and aten::mm:
the kernels belong to linear once).
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from pathlib import Path

from simtrain.calibration.checks import MAX_TIME_S, Checker, gunzipped, read_input, tree_of
from simtrain.errors import Collector
from simtrain.spec.files import TreeError, decode_text, short

# simtrain operator -> aten op names (regex, anchored) that implement it
OPERATORS = (
    ("gemm", r"aten::(linear|matmul|mm|addmm|bmm|baddbmm|_scaled_mm)"),
    ("attention", r"aten::(scaled_dot_product_attention|_scaled_dot_product_\w+|_flash_attention_\w+|_efficient_attention_\w+)"),
    ("norm", r"aten::(layer_norm|native_layer_norm|rms_norm|_fused_rms_norm|native_layer_norm_backward)"),
    ("activation", r"aten::(gelu|silu|relu|gelu_backward|silu_backward)"),
    ("softmax", r"aten::(softmax|_softmax|log_softmax|_log_softmax|_softmax_backward_data)"),
    ("elementwise", r"aten::(add|add_|mul|mul_|div|sub|dropout|native_dropout|copy_)"),
    ("optimizer", r"aten::(_fused_adamw?_|_foreach_\w+)"),
)
_COMPILED = tuple((name, re.compile(rx + r"$")) for name, rx in OPERATORS)
# Device work. torch_mlu's Kineto (its ActivityType names: `kernel` for MLU kernels, `mlu_memcpy`,
# `mlu_memset`; `mlu_runtime`, `mlu_user_annotation`, `mlu_profiler_range` and `mlu_notifier` are
# host calls or annotations, not device time); `mlu_kernel` as older MLU traces name kernels;
# Kineto's PrivateUse1 names (`privateuse1_kernel`, ..._memcpy, ..._memset) for an out-of-tree backend.
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "mlu_memcpy", "mlu_memset", "mlu_kernel",
                     "privateuse1_kernel", "privateuse1_memcpy", "privateuse1_memset")


def is_device_event(cat: str) -> bool:
    """CUDA or MLU device activity (not runtime calls, annotations or notifiers)."""
    return cat in DEVICE_CATEGORIES


def operator_of(name: str) -> str | None:
    for op, rx in _COMPILED:
        if rx.match(name):
            return op
    return None


@dataclass(frozen=True)
class OpTime:
    operator: str          # simtrain operator name
    aten: str              # the aten op measured
    shapes: tuple          # input dims as recorded (record_shapes=True), () otherwise
    dtype: str
    seconds: float         # device time (kernels) or, on a CPU-only trace, the op's duration
    on_device: bool
    event: int = -1        # index of the CPU op in traceEvents (for error messages)


FIX = "give the file torch.profiler's export_chrome_trace wrote (.json or .json.gz)"
MAX_US = MAX_TIME_S * 1e6 * 24 * 7        # an event lasts at most a week (dur in us)


def load(path: Path, raw: bytes | None = None) -> dict:
    """The trace's JSON, read through the guarded reader: a regular file, at most
    MAX_TRACE_BYTES (decompressed, for .json.gz), no duplicate keys or runaway nesting."""
    errs = Collector(str(path))
    if raw is None:
        raw = read_input(Path(path), errs, FIX)
    if raw[:2] == b"\x1f\x8b":
        raw = gunzipped(raw, errs, FIX)
    try:
        text = decode_text(raw)
    except TreeError as e:
        errs.add("", str(e), FIX)
        errs.raise_if_any()
    doc = tree_of(text, "json", errs, FIX)
    if not isinstance(doc, dict) or "traceEvents" not in doc:
        errs.add("traceEvents", "missing: not a Chrome-trace JSON file", FIX)
    elif not isinstance(doc["traceEvents"], list):
        errs.add("traceEvents", f"expected a list of events, got {short(doc['traceEvents'], 60)}", FIX)
    errs.raise_if_any()
    return doc


def _check_events(events: list, errs: Collector) -> list:
    """(index, event) of the complete ("X") events, each checked: a name, finite ts and dur,
    args a mapping, a CPU op's input dims lists of whole numbers."""
    c = Checker(errs, FIX)
    out = []
    for i, e in enumerate(events):
        if c.full:
            break
        p = f"traceEvents[{i}]"
        if c.mapping(e, p) is None or e.get("ph") != "X":
            continue
        if "name" not in e:
            c.add(f"{p}.name", "missing: a complete (X) event names its op")
            ok = False
        else:
            ok = c.text(e["name"], f"{p}.name") is not None
        ok &= c.number(e.get("ts"), f"{p}.ts", -1e18, 1e18, what=" us") is not None
        ok &= c.number(e.get("dur"), f"{p}.dur", 0.0, MAX_US, what=" us") is not None
        args = e.get("args", {})
        if args is not None and c.mapping(args, f"{p}.args") is None:
            continue
        args = args or {}
        if e.get("cat") == "cpu_op" and "Input Dims" in args:
            dims = args["Input Dims"]
            dp = f"{p}.args.Input Dims"
            if not isinstance(dims, list):
                c.add(dp, f"expected a list of shapes, got {short(dims, 60)}")
                ok = False
            else:
                ok &= _dims_ok(dims, dp, c)
        if "Input type" in args and not isinstance(args["Input type"], list):
            c.add(f"{p}.args.Input type", f"expected a list of type names, got {short(args['Input type'], 60)}")
            ok = False
        if ok:
            out.append((i, e))
    c.finish()
    return out


def _dims_ok(dims: list, path: str, c: Checker) -> bool:
    """Whole-number dims at any depth (a tensor list argument, as aten::cat or the fused
    optimizer's take, records a list of shapes); the first bad one is a problem."""
    stack = [dims]
    while stack:
        for v in stack.pop():
            if isinstance(v, list):
                stack.append(v)
            elif c.whole(v, path, lo=0) is None:
                return False
    return True


def operator_times(path: Path, raw: bytes | None = None, doc: dict | None = None) -> list:
    """One OpTime per outermost CPU op that maps to a simtrain operator, in trace order (`doc`:
    the trace `load` read already)."""
    doc = doc if doc is not None else load(path, raw)
    errs = Collector(str(path))
    checked = _check_events(doc["traceEvents"], errs)
    index = {id(e): i for i, e in checked}
    events = [e for _, e in checked]
    thread = lambda e: (str(e.get("pid", 0)), str(e.get("tid", 0)))     # one call stack per process and thread
    cpu = sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: (thread(e), e["ts"], -e["dur"]))
    device = [e for e in events if is_device_event(str(e.get("cat", "")))]
    kernel_time: dict = {}
    for k in device:
        ext = (k.get("args") or {}).get("External id")
        if ext is not None and isinstance(ext, (int, str)):
            kernel_time[ext] = kernel_time.get(ext, 0.0) + k["dur"]
    out = []
    children: dict = {}          # external id of an outermost op -> kernel time of it and its descendants
    stack: list = []             # (end, external id of the outermost matched ancestor or None, tid)
    for e in cpu:
        tid = thread(e)
        while stack and stack[-1][0] <= e["ts"] and stack[-1][2] == tid:
            stack.pop()
        anc = next((x[1] for x in reversed(stack) if x[2] == tid and x[1] is not None), None)
        ext = (e.get("args") or {}).get("External id")
        if not isinstance(ext, (int, str)):
            ext = None
        op = operator_of(e["name"])
        if anc is not None:
            children[anc] = children.get(anc, 0.0) + kernel_time.get(ext, 0.0)
            stack.append((e["ts"] + e["dur"], anc, tid))
            continue
        if op is None or ext is None:
            stack.append((e["ts"] + e["dur"], None, tid))
            continue
        children[ext] = kernel_time.get(ext, 0.0)
        stack.append((e["ts"] + e["dur"], ext, tid))
        args = e.get("args") or {}
        out.append([op, e["name"], tuple(tuple(d) for d in args.get("Input Dims", []) if isinstance(d, list)),
                    next((str(t) for t in args.get("Input type", []) if t), "?"), ext, e["dur"], index[id(e)]])
    res = []
    for op, aten, shapes, dtype, ext, dur, i in out:
        dev = children.get(ext, 0.0)
        res.append(OpTime(op, aten, shapes, dtype, (dev if device else dur) * 1e-6, bool(device), i))
    return res


def device_names(doc: dict) -> list:
    """The device names a trace records (`deviceProperties`), if any."""
    props = doc.get("deviceProperties")
    if not isinstance(props, list):
        return []
    return [str(p["name"]) for p in props if isinstance(p, dict) and isinstance(p.get("name"), str)]


# Host-side statistics of a trace (for a framework profile, `simtrain calibrate --framework`)
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchCooperativeKernel")
BLOCKING_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy")
OPTIMIZER_KERNEL = re.compile(r"multi_tensor_apply|[Aa]dam|[Ff]oreach|multi_tensor_l2norm|l2norm|_fused_adam", re.ASCII)
NORM_KERNEL = re.compile(r"l2norm|L2Norm|norm_kernel|LpNorm", re.ASCII)


def _p50_p90_mean(xs: list) -> dict | None:
    """Median, 90th percentile (nearest rank: the smallest value with at least 90 % of the values at
    or below it) and mean of `xs` in seconds; None when empty."""
    if not xs:
        return None
    s = sorted(xs)
    n = len(s)
    mid = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
    p90 = s[max(0, -(-9 * n // 10) - 1)]
    return {"median_s": mid, "p90_s": p90, "mean_s": sum(s) / n, "count": n}


def host_stats(path: Path, raw: bytes | None = None, doc: dict | None = None) -> dict:
    """Host-side statistics of a Kineto trace, in seconds:

      issue_interval   per CPU thread, start-to-start time between consecutive kernel launch calls
                       (LAUNCH_CALLS), leaving out intervals that hold a host-blocking call
                       (BLOCKING_CALLS: the host waited for the device there, not issued work):
                       the host's time per issued kernel while it keeps the device fed
      launch_gap       the same pairs, end of one launch call to the start of the next
      launch_call      a launch call's own duration
      cpu_per_kernel   per outermost CPU op (`cpu_op`) that launched kernels: its duration over the
                       kernels it launched (the aten dispatch cost per kernel)
      optimizer        kernels whose names say a fused / multi-tensor optimizer or norm kernel
                       (OPTIMIZER_KERNEL): count, summed device time, and per profiler step
      steps            ProfilerStep#N annotations (count)
    Worked example (tests/test_kineto_host.py): launches at 0, 10, 30 us (each 4 us long) with a
    cudaStreamSynchronize between 30 and 60, next launch at 60: intervals 10, 20 (the 30..60
    one holds the synchronisation): median 15, mean 15; gaps 6, 16."""
    doc = doc if doc is not None else load(path, raw)
    errs = Collector(str(path))
    events = [e for _, e in _check_events(doc["traceEvents"], errs)]
    thread = lambda e: (str(e.get("pid", 0)), str(e.get("tid", 0)))
    runtime = sorted((e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")),
                     key=lambda e: (thread(e), e["ts"]))
    launches: dict = {}
    blocking: dict = {}
    for e in runtime:
        name = e["name"]
        if name in LAUNCH_CALLS:
            launches.setdefault(thread(e), []).append((e["ts"], e["ts"] + e["dur"]))
        elif name in BLOCKING_CALLS:
            blocking.setdefault(thread(e), []).append(e["ts"])
    intervals, gaps, calls = [], [], []
    for tid in sorted(launches):
        seq = launches[tid]
        stops = sorted(blocking.get(tid, []))
        calls.extend((b - a) * 1e-6 for a, b in seq)
        for (s0, e0), (s1, _) in zip(seq, seq[1:]):
            i = bisect.bisect_right(stops, e0)
            if i < len(stops) and stops[i] < s1:
                continue             # the host waited for the device in between
            intervals.append((s1 - s0) * 1e-6)
            gaps.append(max(0.0, s1 - e0) * 1e-6)
    # CPU time per launched kernel of each outermost CPU op
    ext_kernels: dict = {}
    kernels = [e for e in events if e.get("cat") in ("kernel", "mlu_kernel", "privateuse1_kernel")]
    for k in kernels:
        ext = (k.get("args") or {}).get("External id")
        if isinstance(ext, (int, str)):
            ext_kernels[ext] = ext_kernels.get(ext, 0) + 1
    cpu = sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: (thread(e), e["ts"], -e["dur"]))
    per_kernel, stack, top = [], [], None
    for e in cpu:
        tid = thread(e)
        while stack and (stack[-1][1] != tid or stack[-1][0] <= e["ts"]):
            stack.pop()
        ext = (e.get("args") or {}).get("External id")
        n = ext_kernels.get(ext, 0) if isinstance(ext, (int, str)) else 0
        if not stack:
            top = [e["dur"], n]
            per_kernel.append(top)
        elif top is not None:
            top[1] += n
        stack.append((e["ts"] + e["dur"], tid))
    cpu_per_kernel = [d / n * 1e-6 for d, n in per_kernel if n]
    opt = [k for k in kernels if OPTIMIZER_KERNEL.search(k["name"])]
    steps = sum(1 for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    return {"issue_interval": _p50_p90_mean(intervals), "launch_gap": _p50_p90_mean(gaps),
            "launch_call": _p50_p90_mean(calls), "cpu_per_kernel": _p50_p90_mean(cpu_per_kernel),
            "kernels": len(kernels), "launches": sum(len(v) for v in launches.values()), "steps": steps,
            "optimizer": {"kernels": len(opt), "device_s": sum(k["dur"] for k in opt) * 1e-6,
                          "norm_kernels": sum(1 for k in opt if NORM_KERNEL.search(k["name"]))},
            "devices": device_names(doc)}
