"""`simtrain calibrate`: measurements -> a device profile.

Inputs (any mix): calibration files written by `simtrain bench`, nccl-tests logs or `-J` JSON
files, PyTorch profiler traces, and Nsight Systems SQLite exports (told by SQLite's magic bytes).
Output: a profile YAML (`schema: simtrain-profile/1`) that a scenario uses with
`cluster.device_profile: FILE`:

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
  interference          per (op class, collective): s = 1 - alone / overlapped, the median over
                        the bench's `interference` rows (`simtrain bench --interference`); a
                        single-GPU copy proxy gives the `any` entry

Only operator- and collective-level measurements go in; nothing is fitted to end-to-end step
times.
"""
from __future__ import annotations

import argparse
import datetime
import os
import stat
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from simtrain.calibration import kineto, nccl_tests, nsys
from simtrain.calibration.checks import (
    COLLECTIVES,
    MAX_BYTES,
    MAX_DIM,
    MIN_TIME_S,
    Checker,
    device_mismatch,
    read_input,
    text_of,
    tree_of,
)
from simtrain.calibration.nccl_tests import bus_factor
from simtrain.errors import Collector, ConfigError, Problem
from simtrain.hardware.devices import (
    INTERFERENCE_COLLECTIVES,
    INTERFERENCE_OPS,
    Device,
    get_device,
    load_profile,
    preset_names,
)
from simtrain.results.io import check_out_file, write_atomic
from simtrain.spec.files import short

SCHEMA = "simtrain-calibration/1"      # the files simtrain bench writes

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


BENCH_FIX = "give the file simtrain bench wrote (fix the value named)"
# per kind of bench record: key -> (check, low, high); ranges in simtrain.calibration.checks
RECORD = {
    "gemm": {"m": ("whole", 1, MAX_DIM), "n": ("whole", 1, MAX_DIM), "k": ("whole", 1, MAX_DIM), "dtype": ("text",)},
    "attention": {"batch": ("whole", 1, 2**20), "heads": ("whole", 1, 2**16), "seq": ("whole", 1, 2**24),
                  "head_dim": ("whole", 1, 2**16), "causal": ("flag",), "dtype": ("text",)},
    "memory": {"op": ("text",), "elements": ("whole", 1, MAX_BYTES), "bytes": ("whole", 1, MAX_BYTES), "dtype": ("text",)},
    "collectives": {"collective": ("text",), "ranks": ("whole", 2, 2**20), "nodes": ("whole", 1, 2**20),
                    "bytes": ("whole", 1, MAX_BYTES)},
    # median_s: the op's time with the collective (or the copy proxy) running on another stream
    "interference": {"op": ("text",), "collective": ("text",), "bytes": ("whole", 1, MAX_BYTES)},
}
INTERFERENCE_PROXY = "copy"     # bench's single-GPU stand-in: a memory-bound copy on a second stream
OPTIONAL = {"causal", "dtype", "op", "elements", "nodes"}


def _bench_records(doc: Any, c: Checker, base: Device) -> dict:
    """The measurements of a bench file, every value checked at its key path."""
    got: dict = {k: [] for k in RECORD}
    if not isinstance(doc, dict):
        c.add("", f"a calibration file must be a mapping, got a {type(doc).__name__}")
        return got
    if doc.get("schema") != SCHEMA:
        c.add("schema", f"expected {SCHEMA}, got {short(doc.get('schema'), 60)}")
    if doc.get("provenance") is not None:
        c.mapping(doc["provenance"], "provenance")
    for kind, spec in RECORD.items():
        for i, r in c.records(doc.get(kind), kind):
            p = f"{kind}[{i}]"
            rec, ok = {}, True
            for key, (check, *rng) in spec.items():
                if key not in r:
                    if key not in OPTIONAL:
                        c.add(f"{p}.{key}", "missing")
                        ok = False
                    continue
                v = {"whole": lambda v, q: c.whole(v, q, *rng), "text": c.text, "flag": c.flag}[check](r[key], f"{p}.{key}")
                ok &= v is not None
                rec[key] = v
            if "median_s" not in r:
                c.add(f"{p}.median_s", "missing")
                ok = False
            else:
                ok &= c.seconds(r["median_s"], f"{p}.median_s") is not None
            for key in ("p10_s", "p90_s"):
                if key in r:
                    ok &= c.seconds(r[key], f"{p}.{key}") is not None
            if "reps" in r:
                ok &= c.whole(r["reps"], f"{p}.reps", 1, 2**31) is not None
            if kind == "gemm" and isinstance(rec.get("dtype"), str) and rec["dtype"] not in base.peak_flop_per_s:
                c.add(f"{p}.dtype", f"{base.key} has no {rec['dtype']} peak to compare the measurement with",
                      f"measure a dtype the base preset has ({', '.join(sorted(base.peak_flop_per_s))}), or pick another --base")
                ok = False
            if kind == "collectives" and isinstance(rec.get("collective"), str) and rec["collective"] not in COLLECTIVES:
                c.add(f"{p}.collective", f"unknown collective {short(rec['collective'], 40)}", f"use one of: {', '.join(COLLECTIVES)}")
                ok = False
            if kind == "collectives" and ok and rec.get("nodes", 1) > rec["ranks"]:
                c.add(f"{p}.nodes", f"{rec['nodes']} nodes for {rec['ranks']} ranks", "give at most one node per rank")
                ok = False
            if kind == "interference" and ok:
                ok = _interference_record(r, rec, p, c)
            if ok:
                got[kind].append(dict(r, **rec))
    return got


def _interference_record(r: dict, rec: dict, p: str, c: Checker) -> bool:
    """An interference row: a known op class and collective (or the copy proxy), and the op's
    time alone (`alone_s`) next to its time overlapped (`median_s`)."""
    ok = True
    if rec.get("op") not in INTERFERENCE_OPS:
        c.add(f"{p}.op", f"unknown op class {short(rec.get('op'), 40)}", f"use one of: {', '.join(INTERFERENCE_OPS)}")
        ok = False
    kinds = [k for k in INTERFERENCE_COLLECTIVES if k != "any"] + [INTERFERENCE_PROXY]
    if rec.get("collective") not in kinds:
        c.add(f"{p}.collective", f"unknown collective {short(rec.get('collective'), 40)}", f"use one of: {', '.join(kinds)}")
        ok = False
    if "alone_s" not in r:
        c.add(f"{p}.alone_s", "missing")
        return False
    return c.seconds(r["alone_s"], f"{p}.alone_s") is not None and ok


def interference_table(rows: list) -> list:
    """Profile `interference` entries from bench rows: per (op class, collective) the median of
    s = 1 - alone / overlapped, kept in [0, 0.95] (a faster overlapped run is noise: 0). Rows of
    the copy proxy give the op's `any` entry. Example: alone 10 ms, overlapped 12.5 ms: s 0.2."""
    by: dict = {}
    for r in rows:
        coll = "any" if r["collective"] == INTERFERENCE_PROXY else r["collective"]
        by.setdefault((r["op"], coll), []).append(r)
    out = []
    for (op, coll), rs in sorted(by.items()):
        s = statistics.median(1.0 - x["alone_s"] / x["median_s"] for x in rs)
        what = ("a memory-bound copy on a second stream (single-GPU proxy for a collective)" if coll == "any"
                else f"{coll} on another stream")
        out.append({"op": op, "collective": coll, "s": round(min(max(s, 0.0), 0.95), 4),
                    "source": f"{_sources(rs)} (simtrain bench --interference: {op} alone vs with {what}, "
                              f"median of {len(rs)} row(s))"})
    return out


def collect(files: list, base: str | None = None) -> dict:
    """Measurements from every input file, grouped by kind, each point tagged with its file and
    checked (types, ranges, finite times); `warnings` lists inputs measured on another kind of
    device than the base preset."""
    errs = Collector("simtrain calibrate")
    dev = get_device(base) if base else None
    got: dict = {"gemm": [], "attention": [], "memory": [], "collectives": [], "interference": [], "provenance": [], "warnings": []}

    def mismatch(f: Path, backend: str, names: list) -> None:
        why = device_mismatch(backend, names, dev) if dev is not None else None
        if why:
            got["warnings"].append(f"warning: {f}: measured on {why}, calibrated onto base preset {dev.key} ({dev.name}); "
                                   f"the profile will take those speeds for {dev.key}'s: pass the --base of the device measured")

    for f in map(Path, files):
        ferrs = Collector(str(f))
        try:
            if nsys.is_sqlite(_head(f)) or f.suffix.lower() in (".sqlite", ".sqlite3"):
                _nsys(f, got, ferrs, dev, mismatch)
                continue
            raw = read_input(f, ferrs, "give calibration files, nccl-tests logs or profiler traces")
            head = raw[:4096]
            if head[:2] == b"\x1f\x8b" or b'"traceEvents"' in head:
                _trace(f, raw, got, ferrs, dev, mismatch)
                continue
            text = text_of(raw, ferrs, "give a calibration file simtrain bench wrote, an nccl-tests log, a PyTorch "
                           "profiler trace (.json / .json.gz) or an Nsight Systems export (.sqlite)")
            if "simtrain-calibration/" in text[:4096]:
                c = Checker(ferrs, BENCH_FIX)
                doc = tree_of(text, "yaml", ferrs, BENCH_FIX)
                recs = _bench_records(doc, c, dev or get_device("h100-sxm5-80gb"))
                c.finish()
                for kind, rows in recs.items():
                    got[kind].extend(dict(r, file=str(f)) for r in rows)
                prov = doc.get("provenance") or {}
                got["provenance"].append({"file": str(f), "kind": "simtrain bench", **prov})
                mismatch(f, str(prov.get("backend", "")), [prov.get("device")] if prov.get("device") else [])
                continue
            for sw in nccl_tests.read(f, raw=raw):
                if sw.ranks < 2:
                    ferrs.add("devices", f"a {sw.collective} sweep over {sw.ranks} rank moves no data between devices",
                              "give a log of two or more ranks")
                    continue
                for r in sw.rows:
                    got["collectives"].append({"collective": sw.collective, "ranks": sw.ranks, "nodes": sw.nodes,
                                               "bytes": r.bytes, "median_s": r.time_s, "busbw": r.busbw, "file": str(f)})
                got["provenance"].append({"file": str(f), "kind": "nccl-tests", **{k: v for k, v in sw.provenance.items()}})
                mismatch(f, "", list(sw.provenance.get("devices") or []))
            ferrs.raise_if_any()
        except ConfigError as e:
            errs.problems.extend(e.problems)
    errs.raise_if_any()
    return got


def _head(f: Path) -> bytes:
    """The first 16 bytes of a regular file (b"" otherwise: the guarded reader reports it), so an
    SQLite report, which may be larger than any other input, is told before it is read."""
    try:
        if not stat.S_ISREG(os.stat(f).st_mode):
            return b""
        with open(f, "rb") as fh:
            return fh.read(16)
    except OSError:
        return b""


def _trace(f: Path, raw: bytes, got: dict, errs: Collector, dev: Device | None, mismatch: Callable) -> None:
    """The GEMM and attention measurements of a profiler trace; zero or absurd shapes are
    problems at the CPU op's event."""
    doc = kineto.load(f, raw)
    ops = kineto.operator_times(f, doc=doc)
    c = Checker(errs, kineto.FIX)
    on_device = _add_ops(ops, f, got, c, dev, lambda o: f"traceEvents[{o.event}]")
    c.finish()
    got["provenance"].append({"file": str(f), "kind": "torch.profiler trace"})
    if ops:
        names = kineto.device_names(doc)
        mismatch(f, "" if on_device else "cpu", names or (["CPU-only trace"] if not on_device else []))


def _add_ops(ops: list, f: Path, got: dict, c: Checker, dev: Device | None, where: Callable) -> bool:
    """GEMM and attention points of operator times (a trace's or a report's) into `got`; `where`
    names an op's record for a problem. True when any was measured on a device."""
    on_device = False
    for o in ops:
        if o.seconds <= 0:
            continue          # an op that launched no device work (CPU-side): nothing measured
        on_device |= o.on_device
        p = f"{where(o)}.args.Input Dims" if where(o).startswith("traceEvents") else f"{where(o)}.text"
        if o.operator == "gemm":
            mnk = _gemm_from_dims(o.aten, o.shapes)
            if mnk:
                if any(x < 1 for x in mnk) or any(x > MAX_DIM for x in mnk):
                    c.add(p, f"{o.aten} of (m, n, k) = {mnk}: each must be > 0 and <= {MAX_DIM:,}")
                    continue
                if dev is not None and _dtype_name(o.dtype) not in dev.peak_flop_per_s:
                    c.add(f"{where(o)}.args.Input type" if p.endswith("Dims") else p,
                          f"{o.aten} in {short(o.dtype, 40)}: {dev.key} has no peak for it "
                          "to compare the measurement with", "record the trace with record_shapes=True, in a dtype the base preset has"
                          if p.endswith("Dims") else "pass the --base of the device measured, or profile in a dtype it has")
                    continue
                got["gemm"].append({"m": mnk[0], "n": mnk[1], "k": mnk[2], "dtype": _dtype_name(o.dtype),
                                    "median_s": o.seconds, "file": str(f), "event": o.event, "where": where(o)})
        elif o.operator == "attention" and o.shapes and len(o.shapes[0]) == 4:
            b, h, s, d = o.shapes[0]
            if min(b, h, s, d) < 1:
                c.add(p, f"{o.aten} of (batch, heads, seq, head_dim) = {(b, h, s, d)}: each must be > 0")
                continue
            got["attention"].append({"batch": b, "heads": h, "seq": s, "head_dim": d, "causal": True, "pass": "fwd",
                                     "dtype": _dtype_name(o.dtype), "median_s": o.seconds, "file": str(f), "event": o.event, "where": where(o)})
    return on_device


def _nsys(f: Path, got: dict, errs: Collector, dev: Device | None, mismatch: Callable) -> None:
    """An Nsight Systems SQLite export: its op times go the way a trace's do (a GEMM whose
    kernels name no dtype is left out, with a warning); NCCL kernels with a message size and
    two or more devices become collective points; host statistics go into the provenance."""
    prof = nsys.read(f)
    c = Checker(errs, nsys.FIX)
    known = [o for o in prof.ops if not (o.operator == "gemm" and o.dtype == "?")]
    if len(known) < len(prof.ops):
        n = len(prof.ops) - len(known)
        got["warnings"].append(f"warning: {f}: {n} GEMM op{'s' if n > 1 else ''} left out: the kernel names say no dtype")
    _add_ops(known, f, got, c, dev, lambda o: f"NVTX_EVENTS[rowid={o.event}]")
    rows, warn = nsys.collective_rows(prof)
    for r in rows:
        if r["median_s"] < MIN_TIME_S or r["bytes"] > MAX_BYTES:
            c.add(f"CUPTI_ACTIVITY_KIND_KERNEL[rowid={r['row']}]", f"{r['collective']} of {r['bytes']} bytes in {r['median_s']:g} s "
                  "is beyond any real measurement")
            continue
        got["collectives"].append({k: r[k] for k in ("collective", "ranks", "nodes", "bytes", "median_s")} | {"file": str(f)})
    c.finish()
    got["warnings"].extend(f"warning: {f}: {w}" for w in warn)
    got["provenance"].append({"file": str(f), "kind": "nsys sqlite export", "kernels": len(prof.kernels),
                              "devices": list(prof.devices), "host": prof.host.summary()})
    mismatch(f, "cuda", list(prof.devices))


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


def build_profile(files: list, device: str, base: str, command: str, warnings: list | None = None) -> dict:
    """The profile of the measurements in `files`; `warnings` (if given) receives one line per
    input measured on another kind of device than `base`."""
    errs = Collector("simtrain calibrate")
    if base not in preset_names():
        errs.add("--base", f"unknown preset {base!r}", f"use one of: {', '.join(preset_names())}")
    errs.raise_if_any()
    got = collect(files, base)
    if warnings is not None:
        warnings.extend(got["warnings"])
    _check_peaks(got, get_device(base))
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
    if got["interference"]:
        prof["interference"] = interference_table(got["interference"])
    if len(prof) == 4:
        errs.add("FILES", "no measurements found in the inputs", "give files written by simtrain bench, nccl-tests logs or profiler traces")
        errs.raise_if_any()
    return prof


def _check_peaks(got: dict, base: Device) -> None:
    """A GEMM or attention measurement faster than the base preset's datasheet peak (10 %
    allowance for clock boost) is a wrong time, a wrong shape or a wrong --base: refused."""
    errs = Collector("simtrain calibrate")
    peak16 = base.peak_flop_per_s.get("bf16", base.peak_flop_per_s.get("fp16"))
    for kind in ("gemm", "attention"):
        for i, r in enumerate(got[kind]):
            if kind == "gemm":
                flops, peak = 2.0 * r["m"] * r["n"] * r["k"], base.peak_flop_per_s.get(r["dtype"])
            else:
                flops = attention_flops(r["batch"], r["heads"], r["seq"], r["head_dim"], r.get("causal", True), r.get("pass", "fwd+bwd"))
                peak = peak16
            if peak and flops / r["median_s"] > 1.1 * peak:
                where = r.get("where") or (f"traceEvents[{r['event']}]" if "event" in r else f"{kind}[{i}]")
                errs.problems.append(Problem(r["file"], where, f"{flops / r['median_s'] / 1e12:.4g} TFLOP/s is faster than {base.key}'s "
                                             f"peak of {peak / 1e12:g} TFLOP/s", "check the time and shape, or pass the --base of the device measured"))
    errs.raise_if_any()


def _sources(rows: list, dtype: str | None = None) -> str:
    files = sorted({r["file"] for r in rows if dtype is None or r.get("dtype") == dtype})
    return "measured: " + ", ".join(Path(f).name for f in files)


def check_loads(prof: dict, text: bytes, out: Path) -> None:
    """Loads the profile's bytes through the loader `simtrain run` uses; what it refuses is an
    error here, at the output file, and nothing is written."""
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d) / out.name
        tmp.write_bytes(text)
        try:
            load_profile.__wrapped__(str(tmp))
        except ConfigError as e:
            raise ConfigError([Problem(str(out), p.path, f"the profile made from these inputs would be refused: {p.problem}",
                                       "check the measurements named; nothing was written") for p in e.problems]) from None


def main(args: argparse.Namespace) -> int:
    """The `simtrain calibrate` command (see cli)."""
    check_out_file(args.out, "-o")          # before reading the inputs
    warnings: list = []
    try:
        prof = build_profile(args.files, args.device, args.base, getattr(args, "command_line", "simtrain calibrate"), warnings)
    except ConfigError:
        for w in warnings:            # why an input gave nothing (a report's GEMMs of unknown dtype, ...)
            print(w, file=sys.stderr)
        raise
    text = yaml.safe_dump(prof, sort_keys=False).encode()
    check_loads(prof, text, Path(args.out))
    for w in warnings:
        print(w, file=sys.stderr)
    write_atomic(args.out, text)
    kinds = [k for k in ("gemm", "memory_bound", "flash_attention", "collectives", "interference") if k in prof]
    print(f"wrote {args.out}: {', '.join(kinds)} (base preset {args.base})", file=sys.stderr)
    return 0


def _sig(x: float, digits: int = 5) -> float:
    """Rounds to significant digits, not decimals: a slow CPU GEMM of 0.00004 TFLOP/s must not
    be written as 0 (the profile loader refuses a zero throughput)."""
    return float(f"{x:.{digits}g}")
