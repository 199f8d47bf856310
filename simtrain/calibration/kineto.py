"""PyTorch profiler traces (Kineto Chrome-trace JSON from `torch.profiler`'s
`export_chrome_trace`, gzip or not) -> per-operator durations under simtrain's operator names.

Device activity (CUDA `kernel` / `gpu_memcpy` / `gpu_memset`; Cambricon's `mlu_*` device
categories) is joined to the CPU op that launched it through the `External id` argument both
carry, and each top-level CPU op gets the summed duration of its kernels. A CPU-only trace has no
device activity: there the CPU op's own duration is the measurement (the device is the CPU).

Roll-up to simtrain's operators (`OPERATORS`): an aten op is counted under the first matching
name, and only outermost matching ops count (aten::linear contains aten::matmul and aten::mm:
the kernels belong to linear once).
"""
from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path

from simtrain.errors import Collector

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
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def is_device_event(cat: str) -> bool:
    """CUDA device activity, or Cambricon's `mlu_*` device categories (not its runtime/driver calls)."""
    if cat in DEVICE_CATEGORIES:
        return True
    return cat.startswith("mlu_") and not cat.endswith(("runtime", "driver"))


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


def load(path: Path) -> dict:
    errs = Collector(str(path))
    raw = Path(path).read_bytes()
    try:
        text = gzip.decompress(raw).decode() if raw[:2] == b"\x1f\x8b" else raw.decode()
        doc = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        errs.add("", f"not a Chrome-trace JSON file ({e})", "give the file torch.profiler's export_chrome_trace wrote (.json or .json.gz)")
        errs.raise_if_any()
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        errs.add("traceEvents", "missing", "give the file torch.profiler's export_chrome_trace wrote")
        errs.raise_if_any()
    return doc


def operator_times(path: Path) -> list:
    """One OpTime per outermost CPU op that maps to a simtrain operator, in trace order."""
    doc = load(path)
    events = [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"
              and isinstance(e.get("dur"), (int, float)) and isinstance(e.get("ts"), (int, float))]
    thread = lambda e: (str(e.get("pid", 0)), str(e.get("tid", 0)))     # one call stack per process and thread
    cpu = sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: (thread(e), e["ts"], -e["dur"]))
    device = [e for e in events if is_device_event(str(e.get("cat", "")))]
    kernel_time: dict = {}
    for k in device:
        ext = (k.get("args") or {}).get("External id")
        if ext is not None:
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
                    next((t for t in args.get("Input type", []) if t), "?"), ext, e["dur"]])
    res = []
    for op, aten, shapes, dtype, ext, dur in out:
        dev = children.get(ext, 0.0)
        res.append(OpTime(op, aten, shapes, dtype, (dev if device else dur) * 1e-6, bool(device)))
    return res
