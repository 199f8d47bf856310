"""`simtrain calibrate`: measurements -> a device profile.

Inputs (any mix): calibration files written by `simtrain bench`, nccl-tests logs or `-J` JSON
files, and PyTorch profiler traces. Output: a profile YAML (`schema: simtrain-profile/1`) that a
scenario uses with `cluster.device_profile: FILE`:

  device, base          the profile's name and the preset it refines (peaks, capacity, datasheet
                        bandwidth, and any curve not measured come from the base preset)
  provenance            every input file with its own provenance, and the calibrate command
  gemm                  per dtype: measured (m, n, k) -> TFLOP/s points; the cost model
                        interpolates efficiency over (log2 FLOPs, log2 arithmetic intensity)
  memory_bound          measured (bytes -> achieved bytes/s) points, the median over the
                        memory-bound operators at each size; efficiency vs size
  flash_attention       causal attention (seq -> TFLOP/s) points
  collectives           per (collective, ranks, nodes): measured (bytes -> bus bandwidth) points
                        and the alpha/beta of t = alpha + bytes x factor / busbw_peak fitted to them
                        (least squares on the sizes from 1 MiB up)

Only operator- and collective-level measurements go in; nothing is fitted to end-to-end step
times.
"""
from __future__ import annotations

import argparse
import datetime
import statistics
import sys
from pathlib import Path

import yaml

from simtrain.calibration import kineto, nccl_tests
from simtrain.calibration.nccl_tests import bus_factor
from simtrain.errors import Collector
from simtrain.hardware.devices import preset_names
from simtrain.results.io import check_out_file, write_atomic

PROFILE_SCHEMA = "simtrain-profile/1"


def attention_flops(b: int, h: int, s: int, d: int, causal: bool, passes: str = "fwd+bwd") -> float:
    """FLOPs of scaled-dot-product attention as FlashAttention-2's benchmarks count them: forward
    4·b·h·s²·d, halved when causal (the kernel skips the masked half); backward 2.5 x forward, so
    forward + backward is 3.5 x forward."""
    f = 4.0 * b * h * s * s * d
    f = f / 2 if causal else f
    return 3.5 * f if passes == "fwd+bwd" else f


def _gemm_from_dims(name: str, dims: tuple) -> tuple | None:
    """(m, n, k) of an aten GEMM from its recorded input dims."""
    try:
        if name.endswith("linear"):
            x, w = dims[0], dims[1]
            m = 1
            for v in x[:-1]:
                m *= v
            return m, w[0], x[-1]
        if name.endswith("addmm"):
            a, b = dims[1], dims[2]
            return a[0], b[1], a[1]
        if name.endswith(("::mm", "matmul")):
            a, b = dims[0], dims[1]
            if len(a) == 2 and len(b) == 2:
                return a[0], b[1], a[1]
        if name.endswith("bmm"):
            a, b = dims[0], dims[1]
            return a[0] * a[1], b[2], a[2]
    except (IndexError, TypeError):
        return None
    return None


def _dtype_name(t: str) -> str:
    return {"float": "fp32", "c10::Half": "fp16", "c10::BFloat16": "bf16", "float32": "fp32",
            "float16": "fp16", "bfloat16": "bf16"}.get(t, t)


def collect(files: list) -> dict:
    """Measurements from every input file, grouped by kind, each point tagged with its file."""
    errs = Collector("simtrain calibrate")
    got = {"gemm": [], "attention": [], "memory": [], "collectives": [], "provenance": []}
    for f in map(Path, files):
        if not f.is_file():
            errs.add(str(f), "no such file", "give calibration files, nccl-tests logs or profiler traces")
            continue
        head = f.read_bytes()[:4096]
        if head[:2] == b"\x1f\x8b" or b'"traceEvents"' in head:
            for o in kineto.operator_times(f):
                if o.seconds <= 0:
                    continue          # an op that launched no device work (CPU-side): nothing measured
                if o.operator == "gemm":
                    mnk = _gemm_from_dims(o.aten, o.shapes)
                    if mnk:
                        got["gemm"].append({"m": mnk[0], "n": mnk[1], "k": mnk[2], "dtype": _dtype_name(o.dtype),
                                            "median_s": o.seconds, "file": str(f)})
                elif o.operator == "attention" and o.shapes and len(o.shapes[0]) == 4:
                    b, h, s, d = o.shapes[0]
                    got["attention"].append({"batch": b, "heads": h, "seq": s, "head_dim": d, "causal": True, "pass": "fwd",
                                             "dtype": _dtype_name(o.dtype), "median_s": o.seconds, "file": str(f)})
            got["provenance"].append({"file": str(f), "kind": "torch.profiler trace"})
            continue
        text = head.decode(errors="replace")
        if "simtrain-calibration/" in text:
            doc = yaml.safe_load(f.read_text())
            for kind in ("gemm", "attention", "memory", "collectives"):
                for r in doc.get(kind) or []:
                    got[kind].append(dict(r, file=str(f)))
            got["provenance"].append({"file": str(f), "kind": "simtrain bench", **(doc.get("provenance") or {})})
            continue
        for sw in nccl_tests.read(f):
            if sw.ranks < 2:
                errs.add(str(f), f"a {sw.collective} sweep over {sw.ranks} rank moves no data between devices",
                         "give a log of two or more ranks")
                continue
            for r in sw.rows:
                got["collectives"].append({"collective": sw.collective, "ranks": sw.ranks, "nodes": sw.nodes,
                                           "bytes": r.bytes, "median_s": r.time_s, "busbw": r.busbw, "file": str(f)})
            got["provenance"].append({"file": str(f), "kind": "nccl-tests", **{k: v for k, v in sw.provenance.items()}})
    errs.raise_if_any()
    return got


def fit_alpha_beta(points: list) -> tuple:
    """(alpha seconds, peak busbw bytes/s) of t = alpha + x / busbw_peak, x = bytes x bus factor,
    by least squares on the points from 1 MiB up (all points if fewer than two are that large)."""
    pts = [(x, t) for x, t in points if x >= 2 ** 20] or list(points)
    if len(pts) < 2:
        x, t = pts[0]
        return 0.0, x / t
    pts = [(x, t) for x, t in pts if x > 0 and t > 0]
    if not pts:
        return 0.0, float("inf")
    if len(pts) < 2:
        return 0.0, pts[0][0] / pts[0][1]
    mx = statistics.fmean(x for x, _ in pts)
    mt = statistics.fmean(t for _, t in pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    slope = sum((x - mx) * (t - mt) for x, t in pts) / sxx if sxx > 0 else mt / mx
    alpha = max(0.0, mt - slope * mx)
    return alpha, 1.0 / slope if slope > 0 else float("inf")


def build_profile(files: list, device: str, base: str, command: str) -> dict:
    errs = Collector("simtrain calibrate")
    if base not in preset_names():
        errs.add("--base", f"unknown preset {base!r}", f"use one of: {', '.join(preset_names())}")
    errs.raise_if_any()
    got = collect(files)
    prof = {"schema": PROFILE_SCHEMA, "device": device, "base": base,
            "provenance": {"inputs": got["provenance"], "command": command,
                           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}}
    gemm: dict = {}
    for r in got["gemm"]:
        flops = 2.0 * r["m"] * r["n"] * r["k"]
        key = (r["m"], r["n"], r["k"])
        gemm.setdefault(r["dtype"], {}).setdefault(key, []).append(flops / r["median_s"] / 1e12)
    if gemm:
        prof["gemm"] = [{"dtype": dt, "source": _sources(got["gemm"], dt),
                         "points": [{"m": m, "n": n, "k": k, "tflops": _sig(statistics.median(v))}
                                    for (m, n, k), v in sorted(pts.items())]}
                        for dt, pts in sorted(gemm.items())]
    mem: dict = {}
    for r in got["memory"]:
        mem.setdefault(r["bytes"], []).append(r["bytes"] / r["median_s"])
    if mem:
        prof["memory_bound"] = {"source": _sources(got["memory"]),
                                "points": [{"bytes": b, "bandwidth_GBps": _sig(statistics.median(v) / 1e9)}
                                           for b, v in sorted(mem.items())]}
    att: dict = {}
    for r in got["attention"]:
        f = attention_flops(r["batch"], r["heads"], r["seq"], r["head_dim"], r.get("causal", True), r.get("pass", "fwd+bwd"))
        att.setdefault(r["seq"], []).append(f / r["median_s"] / 1e12)
    if att:
        prof["flash_attention"] = {"source": _sources(got["attention"]),
                                   "points": [{"seq": s, "tflops": _sig(statistics.median(v))} for s, v in sorted(att.items())]}
    coll: dict = {}
    for r in got["collectives"]:
        coll.setdefault((r["collective"], r["ranks"], r["nodes"]), {}).setdefault(r["bytes"], []).append(r["median_s"])
    if coll:
        prof["collectives"] = []
        for (c, n, nodes), by_size in sorted(coll.items()):
            f = bus_factor(c, n)
            pts = sorted((b, statistics.median(v)) for b, v in by_size.items())
            alpha, peak = fit_alpha_beta([(b * f, t) for b, t in pts])
            prof["collectives"].append({
                "collective": c, "ranks": n, "nodes": nodes,
                "source": _sources([r for r in got["collectives"] if r["collective"] == c and r["ranks"] == n]),
                "alpha_us": round(alpha * 1e6, 4), "peak_busbw_GBps": round(peak / 1e9, 4) if peak != float("inf") else None,
                "points": [{"bytes": b, "time_us": round(t * 1e6, 4), "busbw_GBps": round(b * f / t / 1e9, 4)} for b, t in pts]})
    if len(prof) == 4:
        errs.add("FILES", "no measurements found in the inputs", "give files written by simtrain bench, nccl-tests logs or profiler traces")
        errs.raise_if_any()
    return prof


def _sources(rows: list, dtype: str | None = None) -> str:
    files = sorted({r["file"] for r in rows if dtype is None or r.get("dtype") == dtype})
    return "measured: " + ", ".join(Path(f).name for f in files)


def main(args: argparse.Namespace) -> int:

    check_out_file(args.out, "-o")          # before reading the inputs
    prof = build_profile(args.files, args.device, args.base, getattr(args, "command_line", "simtrain calibrate"))
    write_atomic(args.out, yaml.safe_dump(prof, sort_keys=False).encode())
    kinds = [k for k in ("gemm", "memory_bound", "flash_attention", "collectives") if k in prof]
    print(f"wrote {args.out}: {', '.join(kinds)} (base preset {args.base})", file=sys.stderr)
    return 0


def _sig(x: float, digits: int = 5) -> float:
    """Rounds to significant digits, not decimals: a slow CPU GEMM of 0.00004 TFLOP/s must not
    be written as 0 (the profile loader refuses a zero throughput)."""
    return float(f"{x:.{digits}g}")
