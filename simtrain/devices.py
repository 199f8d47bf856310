"""Device presets (spec stage): peak throughput, memory, and measured efficiency curves.

Presets live in `simtrain/data/devices.yaml`, each number with its source. Efficiency curves are
built from operator-level microbenchmarks only (GEMM sweeps, STREAM copy, FlashAttention), never
from end-to-end training throughput. A device without its own measurement borrows another's curve
and the borrowed origin travels with it, so a result can say which costs rest on what.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from simtrain.units import parse_bandwidth, parse_bytes, parse_flops

DATA = Path(__file__).parent / "data"


def gemm_class(dtype: str) -> str:
    """GEMM curves are kept per precision class: 16-bit (fp16/bf16 share tensor-core rates) or fp8."""
    return "fp8" if dtype == "fp8" else "16bit"


@dataclass(frozen=True)
class Curve:
    """Efficiency (measured / peak) against a size, interpolated linearly in log2(size).

    GEMM curves are swept over square shapes; the cost model places an (m, n, k) GEMM on them by
    the cube root of m·n·k (the side of the square GEMM with the same work). Example (A100, fp16):
    2048³ -> 221.8/312 = 0.711; 2048 x 4608 x 12288 has side 4878, between 4096 (0.731) and 8192
    (0.813) -> 0.731 + (0.813 - 0.731) · log2(4878/4096) = 0.751.
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

    def peak(self, dtype: str) -> float:
        return self.peak_flop_per_s[dtype]


def _raw() -> dict:
    with open(DATA / "devices.yaml") as f:
        return yaml.safe_load(f)


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


@lru_cache(maxsize=None)
def get_device(key: str) -> Device:
    raw = _raw()
    d = raw[key]
    gemm, mem, flash = _own(key, d)
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
        lender = raw[lender].get("borrows")
    if "16bit" not in gemm or mem is None:
        raise ValueError(f"devices.yaml: {key} has no 16-bit GEMM or memory curve, even borrowed")
    return Device(
        key=key, name=d["name"], vendor=d["vendor"], arch=d["arch"], confidence=d["confidence"],
        source=d["source"], peak_flop_per_s={k: parse_flops(v) for k, v in d["peak"].items()},
        memory_bytes=parse_bytes(d["memory"]["capacity"]), memory_bw=parse_bandwidth(d["memory"]["bandwidth"]),
        gemm=gemm, mem_efficiency=mem, mem_origin=mem_origin, flash=flash,
    )


def describe(key: str) -> str:
    d = _raw()[key]
    return f"{key:16s} {d['name']} — {d['source']}"
