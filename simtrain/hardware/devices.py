"""Device presets (spec stage): peak throughput, memory, and measured efficiency curves.

Presets live in `simtrain/data/devices.yaml`, each number with its source. Efficiency curves are
built from operator-level microbenchmarks only (GEMM sweeps, STREAM copy, FlashAttention), never
from end-to-end training throughput. A device without its own measurement borrows another's curve
and the borrowed origin travels with it, so a result can say which costs rest on what.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from simtrain import resources
from simtrain.errors import Collector
from simtrain.spec.fields import REQUIRED, Key, Section, validate_tree
from simtrain.spec.files import load_yaml
from simtrain.units import parse_bandwidth, parse_bytes, parse_flops, parse_time

DATA = resources.DATA


def gemm_class(dtype: str) -> str:
    """GEMM curves are kept per precision class: 16-bit (fp16/bf16 share tensor-core rates), fp8,
    or 32-bit (fp32/tf32, which a training step's matmuls do not use)."""
    return {"fp8": "fp8", "fp32": "32bit", "tf32": "32bit"}.get(dtype, "16bit")


@dataclass(frozen=True)
class Curve:
    """Efficiency (measured / peak) against a size, interpolated linearly in log2(size).

    GEMM curves are swept over square shapes; the cost model places an (m, n, k) GEMM on them by
    the cube root of m·n·k (the side of the square GEMM with the same work). Example (A100, fp16):
    2048³ -> 221.8/312 = 0.711; 2048 x 4608 x 12288 has side 4876, between 4096 (0.731) and 8192
    (0.813) -> 0.731 + (0.813 - 0.731) · log2(4876/4096) = 0.751.

    >>> c = get_device("a100-sxm4-80gb").gemm["16bit"]
    >>> round(c.at(2048)[0], 3)
    0.711
    >>> round((2048 * 4608 * 12288) ** (1 / 3))
    4876
    >>> e, inside = c.at((2048 * 4608 * 12288) ** (1 / 3))
    >>> round(e, 3), inside
    (0.751, True)
    """
    points: tuple        # ((size, efficiency), ...) sorted by size
    origin: str          # device key whose measurement this is
    source: str

    def at(self, size: float) -> tuple[float, bool]:
        """(efficiency, inside measured coverage). Outside the sweep the nearest end value is used."""
        pts = self.points
        if size <= pts[0][0]:
            return pts[0][1], size >= pts[0][0] * 0.999
        if size >= pts[-1][0]:
            return pts[-1][1], size <= pts[-1][0] * 1.001
        x = math.log2(size)
        for (s0, e0), (s1, e1) in zip(pts, pts[1:]):
            if s0 <= size <= s1:
                x0, x1 = math.log2(s0), math.log2(s1)
                return e0 + (e1 - e0) * (x - x0) / (x1 - x0), True
        raise AssertionError("unreachable")


@dataclass(frozen=True)
class ShapeCurve:
    """GEMM efficiency over measured (m, n, k) shapes, interpolated in x = log2 FLOPs and
    y = log2 arithmetic intensity (FLOPs per byte of A, B and C).

    Measured shapes are grouped into intensity levels (equal y); inside a level the efficiency is
    piecewise linear in x, between the two levels that bracket a query it is linear in y. So a
    measured shape gets exactly its measured efficiency (shapes with the same FLOPs and intensity,
    such as permutations of m, n, k, share the mean of theirs), and along a level the result is
    monotone wherever the measurements are. A sweep of square shapes makes one level per size,
    so shapes between them are interpolated across levels and reported as outside coverage. Outside the measured x range of a level, or the y
    range of all levels, the nearest measured value is used and the lookup is reported.
    Example: levels y = 6 {x 20: 0.4, x 30: 0.8} and y = 8 {x 20: 0.5, x 30: 0.9}; the query
    (x 25, y 7) is 0.6 on level 6 and 0.7 on level 8, so 0.65.

    >>> sc = ShapeCurve(((6.0, ((20.0, 0.4), (30.0, 0.8))), (8.0, ((20.0, 0.5), (30.0, 0.9)))), "x", "", 2.0)
    >>> levels = sc.levels[0][1], sc.levels[1][1]
    >>> round(ShapeCurve._along(levels[0], 25.0)[0], 3), round(ShapeCurve._along(levels[1], 25.0)[0], 3)
    (0.6, 0.7)
    """
    levels: tuple        # ((y, ((x, eff), ...)), ...) sorted by y, points sorted by x
    origin: str
    source: str
    esize: float         # bytes per element the intensities were computed with

    @staticmethod
    def from_points(points: Iterable[tuple], peak: float, esize: float, origin: str, source: str) -> "ShapeCurve":
        by_y: dict = {}
        for m, n, k, flops_per_s in points:
            x, y = ShapeCurve.coords(m, n, k, esize)
            by_y.setdefault(round(y, 6), {}).setdefault(round(x, 9), []).append(flops_per_s / peak)
        # shapes with the same FLOPs and intensity (permutations of m, n, k) share their mean
        levels = tuple((y, tuple((x, sum(v) / len(v)) for x, v in sorted(pts.items()))) for y, pts in sorted(by_y.items()))
        return ShapeCurve(levels, origin, source, esize)

    @staticmethod
    def coords(m: float, n: float, k: float, esize: float) -> tuple[float, float]:
        flops = 2.0 * m * n * k
        return math.log2(flops), math.log2(flops / (esize * (m * k + k * n + m * n)))

    @staticmethod
    def _along(pts, x) -> tuple:
        for px, e in pts:             # a measured point (stored rounded to 1e-9)
            if abs(x - px) < 1e-9:
                return e, True
        if x <= pts[0][0]:
            return pts[0][1], x >= pts[0][0] - 1e-9
        if x >= pts[-1][0]:
            return pts[-1][1], x <= pts[-1][0] + 1e-9
        for (x0, e0), (x1, e1) in zip(pts, pts[1:]):
            if x0 <= x <= x1:
                return e0 + (e1 - e0) * (x - x0) / (x1 - x0), True
        raise AssertionError("unreachable")

    def side_range(self) -> tuple:
        """The measured range as the cube root of m·n·k (for coverage notes)."""
        xs = [x for _, pts in self.levels for x, _ in pts]
        return ((2 ** min(xs) / 2) ** (1 / 3), (2 ** max(xs) / 2) ** (1 / 3))

    def at_shape(self, m: float, n: float, k: float) -> tuple[float, bool]:
        x, y = self.coords(max(m, 1.0), max(n, 1.0), max(k, 1.0), self.esize)
        lv = self.levels
        for ly, pts in lv:            # on a measured level (levels are stored rounded to 1e-6)
            if abs(y - ly) < 1e-6:
                return self._along(pts, x)
        if y <= lv[0][0] or len(lv) == 1:
            e, inside = self._along(lv[0][1], x)
            return e, inside and abs(y - lv[0][0]) < 1e-6
        if y >= lv[-1][0]:
            e, inside = self._along(lv[-1][1], x)
            return e, inside and abs(y - lv[-1][0]) < 1e-6
        for (y0, p0), (y1, p1) in zip(lv, lv[1:]):
            if y0 <= y <= y1:
                e0, i0 = self._along(p0, x)
                e1, i1 = self._along(p1, x)
                return e0 + (e1 - e0) * (y - y0) / (y1 - y0), i0 and i1
        raise AssertionError("unreachable")


@dataclass(frozen=True)
class Device:
    key: str
    name: str
    vendor: str
    arch: str
    confidence: str
    source: str
    peak_flop_per_s: dict          # dtype -> FLOP/s
    memory_bytes: float
    memory_bw: float               # bytes/s, datasheet
    gemm: dict                     # gemm_class -> Curve (size = cube root of m*n*k)
    mem_efficiency: float
    mem_origin: str
    flash: Curve | None            # size = sequence length
    gemm_shapes: tuple = ()        # ((gemm_class, ShapeCurve), ...) from a measured profile
    mem_curve: Curve | None = None # memory-bound efficiency by bytes moved, from a measured profile
    profile: str = ""              # the profile file this device comes from, if any
    base: str = ""                 # the preset a profile refines (empty for a preset itself)
    collectives: tuple = ()        # measured collective sweeps of the profile (dicts)
    op_overhead: float = 0.0       # host issue time per compute operator (seconds; see costs.host_queue)
    op_overhead_source: str = ""
    profile_status: str = ""       # "uncalibrated" for a profile that holds specifications only
    host_bandwidth: float = 0.0    # bytes/s per direction to host memory (PCIe / NVLink-C2C), for CPU offload
    host_bandwidth_source: str = ""  # "measured: ...", "nominal: ..." or "assumed: ..." with its source
    interference: tuple = ()       # ((op class, collective, s, source), ...): compute slowdown under a collective
    nongemm: tuple = ()            # ((kernel class, Curve), ...): achieved HBM bandwidth / datasheet by kernel bytes
    sms: int = 0                   # streaming multiprocessors (0: not given); TE's overlapped GEMMs give some up
    sms_source: str = ""

    def nongemm_curve(self, cls: str) -> Curve | None:
        """The achieved-bandwidth curve of a non-GEMM kernel class (`workload.nongemm`), if measured."""
        return dict(self.nongemm).get(cls)

    def slowdown_table(self) -> dict:
        """{(op class, collective): s} of the profile's `interference` table (see `slowdown`)."""
        return {(op, coll): s for op, coll, s, _ in self.interference}

    def peak(self, dtype: str) -> float:
        return self.peak_flop_per_s[dtype]


@lru_cache(maxsize=None)
def _raw() -> dict:
    """The shipped presets, read once, through the same guarded reader as every input file
    (read-only: callers index it, never change it)."""
    path = DATA / "devices.yaml"
    return load_yaml(path, Collector(str(path)), "restore the shipped simtrain/data/devices.yaml")


@lru_cache(maxsize=None)
def preset_names() -> tuple:
    return tuple(_raw().keys())


def _own(key: str, d: dict):
    peaks = {k: parse_flops(v) for k, v in d["peak"].items()}
    gemm = {}
    for g in d.get("gemm", ()):
        peak = peaks[g["dtype"]]
        pts = tuple(sorted((float(s), t * 1e12 / peak) for s, t in g["tflops_by_size"].items()))
        gemm[gemm_class(g["dtype"])] = Curve(pts, key, g["source"])
    mem = None
    if "memory_bound" in d:
        mem = parse_bandwidth(d["memory_bound"]["bandwidth"]) / parse_bandwidth(d["memory"]["bandwidth"])
    flash = None
    if "flash_attention" in d:
        fa = d["flash_attention"]
        peak16 = peaks.get("bf16", peaks.get("fp16"))
        pts = tuple(sorted((float(s), t * 1e12 / peak16) for s, t in fa["causal_tflops_by_seq"].items()))
        flash = Curve(pts, key, fa["source"])
    return gemm, mem, flash


def _own_nongemm(key: str, d: dict) -> dict:
    """{kernel class: Curve} of a preset's `nongemm` table: efficiency (achieved / datasheet
    bandwidth of the GPU measured) by the bytes one kernel moves."""
    return {cls: Curve(tuple(sorted((float(b), float(e)) for b, e in c["efficiency_by_bytes"].items())), key, c["source"])
            for cls, c in (d.get("nongemm") or {}).items()}


@lru_cache(maxsize=None)
def get_device(key: str) -> Device:
    raw = _raw()
    d = raw[key]
    gemm, mem, flash = _own(key, d)
    nongemm = _own_nongemm(key, d)
    mem_origin = key if mem is not None else ""
    lender, seen = d.get("borrows"), {key}
    while lender:
        if lender in seen:
            raise ValueError(f"devices.yaml: borrow cycle at {lender}")
        seen.add(lender)
        lg, lm, lf = _own(lender, raw[lender])
        for cls, c in lg.items():
            gemm.setdefault(cls, c)
        if mem is None and lm is not None:
            mem, mem_origin = lm, lender
        if flash is None and lf is not None:
            flash = lf
        for cls, c in _own_nongemm(lender, raw[lender]).items():
            nongemm.setdefault(cls, c)
        lender = raw[lender].get("borrows")
    if "16bit" not in gemm or mem is None:
        raise ValueError(f"devices.yaml: {key} has no 16-bit GEMM or memory curve, even borrowed")
    return Device(
        key=key, name=d["name"], vendor=d["vendor"], arch=d["arch"], confidence=d["confidence"],
        source=d["source"], peak_flop_per_s={k: parse_flops(v) for k, v in d["peak"].items()},
        memory_bytes=parse_bytes(d["memory"]["capacity"]), memory_bw=parse_bandwidth(d["memory"]["bandwidth"]),
        gemm=gemm, mem_efficiency=mem, mem_origin=mem_origin, flash=flash,
        host_bandwidth=parse_bandwidth(d["host_link"]["bandwidth"]), host_bandwidth_source=d["host_link"]["source"],
        nongemm=tuple(sorted(nongemm.items())),
        sms=int(d["sms"]["count"]) if "sms" in d else 0, sms_source=d["sms"]["source"] if "sms" in d else "",
    )


def describe(key: str) -> str:
    """One line per preset: its name, dense peak per precision, memory capacity and bandwidth, the
    host link per direction (measured or nominal, as its source says) and the source, e.g.
    `a100-sxm4-80gb    NVIDIA A100-SXM4-80GB: bf16 312, fp16 312, tf32 156, fp32 19.5 TFLOP/s;
    80 GiB at 2039 GB/s; host 26.28 GB/s (measured) — NVIDIA A100 datasheet, ...` (capacity in
    GiB, what the device exposes; bandwidths in decimal GB/s as datasheets print them)."""
    d = _raw()[key]
    dev = get_device(key)
    order = ("fp8", "bf16", "fp16", "tf32", "fp32")
    peaks = ", ".join(f"{k} {dev.peak_flop_per_s[k] / 1e12:g}" for k in sorted(dev.peak_flop_per_s, key=lambda k: (
        order.index(k) if k in order else len(order), k)))
    how = dev.host_bandwidth_source.split(":", 1)[0]
    return (f"{key:16s} {d['name']}: {peaks} TFLOP/s; {dev.memory_bytes / 2**30:.4g} GiB at {dev.memory_bw / 1e9:g} GB/s;"
            f" host {dev.host_bandwidth / 1e9:g} GB/s ({how}) — {d['source']}")


REPO_PROFILES = DATA / "profiles"
PROFILE_SCHEMA = "simtrain-profile/1"


def _points(doc: str, **keys: str) -> Key:
    """A `points:` list of measurements, each a mapping of numbers > 0."""
    return Key("any", REQUIRED, doc, many=True, section=Section({k: Key("positive", doc=d) for k, d in keys.items()}, open=True))


# A device profile (written by simtrain calibrate): the keys load_profile reads
PROFILE = Section({
    "schema": Key((PROFILE_SCHEMA,), doc="file format"),
    "device": Key("str", None, "the profile's device key (absent: the file name)", optional=True),
    "base": Key("str", doc="the device preset the profile refines", choices=lambda: preset_names()),
    "status": Key("str", "", "`uncalibrated` for a profile that holds specifications only"),
    "provenance": Key("any", None, "inputs, command and date of the calibration", json={"type": "object"}),
    "gemm": Key("any", None, "measured GEMM shapes, per dtype", many=True, section=Section({
        "dtype": Key("str", doc="precision (the base preset needs its peak)"),
        "source": Key("str", "", "where the measurements come from"),
        "points": _points("measured shapes", m="rows", n="columns", k="inner dimension", tflops="achieved TFLOP/s"),
    }, open=True)),
    "memory_bound": Key("any", None, "measured memory-bound copies", section=Section({
        "source": Key("str", "", "where the measurements come from"),
        "points": _points("measured sizes", bytes="bytes moved", bandwidth_GBps="achieved GB/s"),
    }, open=True)),
    "flash_attention": Key("any", None, "measured causal FlashAttention", section=Section({
        "source": Key("str", "", "where the measurements come from"),
        "points": _points("measured sequence lengths", seq="sequence length", tflops="achieved TFLOP/s"),
    }, open=True)),
    "nongemm": Key("any", None, "measured non-GEMM kernels, per kernel class (norm, softmax, elementwise, eager)",
                   many=True, section=Section({
        "class": Key("str", doc="kernel class (simtrain.workload.nongemm.KERNEL_CLASSES)"),
        "source": Key("str", "", "where the measurements come from"),
        "points": _points("measured kernel sizes", bytes="bytes one kernel moves", bandwidth_GBps="achieved GB/s"),
    }, open=True)),
    "collectives": Key("any", None, "measured collective sweeps (nccl-tests)", many=True, section=Section({
        "collective": Key("str", doc="all_reduce, all_gather, ..."),
        "ranks": Key("posint", doc="ranks of the sweep"),
        "nodes": Key("posint", doc="nodes of the sweep"),
        "source": Key("str", "", "where the measurements come from"),
        "points": _points("measured sizes", bytes="message bytes", time_us="time in us"),
    }, open=True)),
    "op_overhead": Key("any", None, "host issue time per compute operator", section=Section({
        "per_operator": Key("time", doc="e.g. \"45 us\""),
        "source": Key("str", doc="where it was measured (required with per_operator)"),
    })),
    "interference": Key("any", None, "compute slowdown while a collective runs on the same device", many=True, section=Section({
        "op": Key("str", doc="compute op class", choices=lambda: INTERFERENCE_OPS),
        "collective": Key("str", doc="collective kind, or `any` for the others", choices=lambda: INTERFERENCE_COLLECTIVES),
        "s": Key("float", doc="rate loss in [0, 1): the op runs at (1 - s) of its speed while the collective runs",
                 minimum=0.0, maximum=1.0),
        "source": Key("str", doc="where the number comes from (measured, or assumed/borrowed and from what)"),
    }, open=True)),
}, doc="a device profile written by simtrain calibrate", open=True)

INTERFERENCE_OPS = ("gemm", "attention", "memory")
NONGEMM_CLASSES = ("norm", "softmax", "elementwise", "eager")   # simtrain.workload.nongemm.KERNEL_CLASSES
INTERFERENCE_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "any")


def slowdown(table: dict, op: str, collective: str) -> float:
    """s for a compute op class under one collective kind: the (op, collective) entry, else the
    op's `any` entry, else 0 (no slowdown)."""
    s = table.get((op, collective))
    return table.get((op, "any"), 0.0) if s is None else s


def _interference(doc: dict, errs: Collector) -> tuple:
    """The profile's `interference` rows, each s checked to lie in [0, 1) with a source."""
    out, seen = [], set()
    for i, row in enumerate(doc.get("interference") or []):
        s = row.get("s")
        where = f"interference[{i}]"
        bad = [(k, v, ok) for k, ok in (("op", INTERFERENCE_OPS), ("collective", INTERFERENCE_COLLECTIVES))
               if (v := row.get(k)) not in ok]
        for k, v, ok in bad:
            errs.add(f"{where}.{k}", f"unknown {k} {v!r}", f"use one of: {', '.join(ok)}")
        if bad:
            continue
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0.0 <= float(s) < 1.0:
            errs.add(f"{where}.s", f"{s!r} is not a slowdown in [0, 1)",
                     "give the fraction of the op's rate lost while the collective runs, e.g. 0.15 (0: no slowdown)")
            continue
        if not str(row.get("source", "")).strip():
            errs.add(f"{where}.source", "empty", "say where the number comes from, or that it is assumed and from what")
            continue
        key = (row["op"], row["collective"])
        if key in seen:
            errs.add(where, f"a second entry for op {key[0]} under {key[1]}", "keep one entry per (op, collective)")
            continue
        seen.add(key)
        out.append((row["op"], row["collective"], float(s), str(row["source"])))
    return tuple(out)


ESIZE = {"fp32": 4.0, "tf32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0}


def find_profile(ref: str, scenario_dir: Path | None) -> Path | None:
    """A profile named by a path (relative to the scenario or the current directory) or by the
    name of a shipped one (simtrain/data/profiles/NAME.yaml)."""
    p = Path(ref)
    for c in ([scenario_dir / p] if scenario_dir is not None else []) + [Path.cwd() / p, REPO_PROFILES / p.name,
                                                                        REPO_PROFILES / f"{ref}.yaml"]:
        if c.is_file():
            return c
    return None


@lru_cache(maxsize=None)
def load_profile(path: str) -> Device:
    """A device from a profile written by `simtrain calibrate` (schema simtrain-profile/1): the
    base preset, with every measured curve of the profile in place of the preset's."""
    errs = Collector(path)
    doc = load_yaml(path, errs, "give a file written by simtrain calibrate")
    if not isinstance(doc, dict) or doc.get("schema") != PROFILE_SCHEMA:
        errs.add("schema", "not a simtrain device profile (schema simtrain-profile/1)", "give a file written by simtrain calibrate")
        errs.raise_if_any()
    if doc.get("base") not in preset_names():
        errs.add("base", f"unknown base preset {doc.get('base')!r}", f"use one of: {', '.join(preset_names())}")
        errs.raise_if_any()
    validate_tree(doc, PROFILE, "", errs)        # every key as PROFILE declares it, at its key path
    errs.raise_if_any()
    base = get_device(doc["base"])
    key = str(doc.get("device") or Path(path).stem)
    gemm, shapes = dict(base.gemm), []
    for i, g in enumerate(doc.get("gemm") or []):
        dt = g.get("dtype")
        peak = base.peak_flop_per_s.get(dt)
        pts = g["points"]
        if peak is None:
            errs.add(f"gemm[{i}].dtype", f"{base.key} has no {dt} peak to compare the measurement with", "measure a dtype the base preset has")
            continue
        sc = ShapeCurve.from_points([(p["m"], p["n"], p["k"], p["tflops"] * 1e12) for p in pts], peak, ESIZE.get(dt, 2.0),
                                    key, str(g.get("source", "")))
        shapes.append((gemm_class(dt), sc))
    mem_curve = base_mem = None
    mb = doc.get("memory_bound")
    if mb and mb.get("points"):
        mem_curve = Curve(tuple(sorted((float(p["bytes"]), p["bandwidth_GBps"] * 1e9 / base.memory_bw) for p in mb["points"])),
                          key, str(mb.get("source", "")))
        base_mem = max(e for _, e in mem_curve.points)
    flash = base.flash
    fa = doc.get("flash_attention")
    if fa and fa.get("points"):
        peak16 = base.peak_flop_per_s.get("bf16", base.peak_flop_per_s.get("fp16"))
        flash = Curve(tuple(sorted((float(p["seq"]), p["tflops"] * 1e12 / peak16) for p in fa["points"])), key, str(fa.get("source", "")))
    interference = _interference(doc, errs)
    nongemm = dict(base.nongemm)
    for i, row in enumerate(doc.get("nongemm") or []):
        cls = row.get("class")
        if cls not in NONGEMM_CLASSES:
            errs.add(f"nongemm[{i}].class", f"unknown kernel class {cls!r}", f"use one of: {', '.join(NONGEMM_CLASSES)}")
            continue
        nongemm[cls] = Curve(tuple(sorted((float(p["bytes"]), p["bandwidth_GBps"] * 1e9 / base.memory_bw) for p in row["points"])),
                             key, str(row.get("source", "")))
    ov = doc.get("op_overhead") or {}
    overhead = parse_time(ov["per_operator"]) if ov else 0.0
    if ov and not ov["source"].strip():
        errs.add("op_overhead.source", "empty", "say where the overhead was measured")
    errs.raise_if_any()
    return dataclasses.replace(
        base, key=key, base=base.key, op_overhead=overhead, profile_status=str(doc.get("status", "")), op_overhead_source=str(ov.get("source", "")), name=f"{base.name} (profile {Path(path).name})", gemm=gemm, gemm_shapes=tuple(shapes),
        mem_curve=mem_curve, mem_efficiency=base_mem if base_mem is not None else base.mem_efficiency,
        mem_origin=key if mem_curve is not None else base.mem_origin, flash=flash, profile=str(path),
        collectives=tuple(doc.get("collectives") or ()), interference=interference, nongemm=tuple(sorted(nongemm.items())))


def device_of(cluster: Any) -> Device:
    """The scenario's device: its profile when it names one, else the preset."""
    prof = getattr(cluster, "device_profile", "")
    return load_profile(prof) if prof else get_device(cluster.device)
