"""Compute cost models (the engine's compute seam): operator -> duration on a device.

`ComputeCostModel` is the protocol; `CalibratedRoofline` is the default implementation:
  gemm       max(flops / (peak[dtype] x gemm_eff(m,n,k)), bytes / (hbm_bw x mem_eff)), dtype the
             op's own (an FP8 run's TE linears fp8, the rest bf16) or else the run's precision
  attention  flops / (peak x flash_eff(seq))        (FlashAttention-2 measured fwd+bwd curve)
  memory     bytes / (hbm_bw x mem_eff)             (STREAM copy / datasheet bandwidth)
  non-GEMM   bytes / (hbm_bw x class_eff(bytes))    (a norm, softmax, fused or eager elementwise
             kernel, `Op.shape` = (class,): the class's measured achieved-bandwidth curve by the
             bytes one kernel moves, `simtrain.workload.nongemm`)
plus, from a device profile, the host's issue time per operator (the Python, dispatch and launch
cost of the software stack, e.g. eager Megatron-DeepSpeed; 0 for the presets). The host issues a
sequence's operators one every c seconds and the device runs them in order, each once it is
issued and the one before it is done (`host_queue`): the cost is hidden behind kernels longer
than c and paid in full by shorter ones.
Efficiencies come from the device preset's measured curves (simtrain/data/devices.yaml). Every
lookup that falls outside measured coverage, or rests on a curve borrowed from another device or
another precision, is recorded in `coverage` and reported with the result.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from simtrain.hardware.devices import Device, gemm_class
from simtrain.workload.ir import Op


class ComputeCostModel(Protocol):
    coverage: set      # notes on costs not backed by a direct measurement

    def duration(self, op: Op) -> float: ...

    def memory_time(self, nbytes: float) -> float: ...


def host_queue(device: list, c: float) -> float:
    """Time from a synchronisation point until the last of a sequence of operators is done, when
    the host issues operator k at (k+1)·c and the device runs each in order once it is issued:
    max over k of ((k+1)·c + the device time of operators k..n-1). Kernels longer than c let the
    host run ahead (only the first issue shows); shorter ones leave the device waiting on the
    host. Worked example (c = 10 us; 50, 5, 5 us): max(10 + 60, 20 + 10, 30 + 5) = 70 us, where
    adding c per operator would give 90 us."""
    if not c:
        return sum(device)
    tail = best = 0.0
    for k in range(len(device) - 1, -1, -1):
        tail += device[k]
        best = max(best, (k + 1) * c + tail)
    return best


def sequence_time(costs: ComputeCostModel, ops: Sequence[Op]) -> float:
    """Time of operators run back to back from a synchronisation point: the cost model's
    `sequence_time` where it has one (host issue overhead), else the sum of the durations."""
    f = getattr(costs, "sequence_time", None)
    return f(ops) if f is not None else sum(costs.duration(o) for o in ops)


class CalibratedRoofline:
    def __init__(self, device: Device, precision: str):
        self.dev = device
        self.precision = precision
        self.matmul_dtype = precision
        self.vector_dtype = "bf16" if "bf16" in device.peak_flop_per_s else "fp16"
        self.notes: set = set()
        self._outside: dict = {}      # (what, lo, hi) -> [min size, max size, count]
        self._cache: dict = {}
        cls = gemm_class(precision)
        if cls not in device.gemm and cls not in dict(device.gemm_shapes):
            # e.g. fp8 requested on a device whose fp8 GEMMs were never measured
            self.notes.add(f"{device.key}: no {precision} GEMM measurement; using the 16-bit curve relative to the {precision} peak")
        measured = dict(device.gemm_shapes)
        if device.profile:
            self.notes.add(f"{device.key}: costs from the measured profile {Path(device.profile).name}; "
                           "what it does not measure comes from its base preset")
        if device.profile_status == "uncalibrated":
            self.notes.add(f"{device.key}: the profile is uncalibrated (specifications only); run simtrain bench and simtrain calibrate on the device")
        for cls_, c in device.gemm.items():
            if cls_ in measured:
                continue
            if c.origin != device.key:
                self.notes.add(f"{device.key}: {('fp8' if c is device.gemm.get('fp8') else '16-bit')} GEMM efficiency borrowed from {c.origin} measurements")
        if device.mem_origin != device.key:
            self.notes.add(f"{device.key}: memory-bound efficiency borrowed from {device.mem_origin} measurements")
        if device.flash is not None and device.flash.origin != device.key:
            self.notes.add(f"{device.key}: FlashAttention efficiency borrowed from {device.flash.origin} measurements")
        if device.confidence == "low":
            self.notes.add(f"{device.key}: preset peak numbers are low-confidence third-party estimates")

    def device_time(self, op: Op) -> float:
        """The operator's time on the device alone (no host issue cost)."""
        d = self._cache.get(op)
        if d is None:
            d = self._cache[op] = self._duration(op)
        return d

    def duration(self, op: Op) -> float:
        """The operator issued on its own after a synchronisation point: issue, then run."""
        return self.device_time(op) + self.dev.op_overhead

    def sequence_time(self, ops: Sequence[Op]) -> float:
        return host_queue([self.device_time(o) for o in ops], self.dev.op_overhead)

    def _note_outside(self, what: str, span, size: float) -> None:
        """Counts a lookup outside a measured range; `span` is a Curve or a (lo, hi) pair."""
        lo, hi = span if isinstance(span, tuple) else (span.points[0][0], span.points[-1][0])
        key = (what, lo, hi)
        rec = self._outside.setdefault(key, [size, size, 0])
        rec[0], rec[1], rec[2] = min(rec[0], size), max(rec[1], size), rec[2] + 1

    @property
    def outside(self) -> set:
        """One note per measured curve that lookups fell outside of (the result's calibration_warnings)."""
        return {f"{self.dev.key}: {what} {lo:.0f}..{hi:.0f}: {n} operator shapes with sizes {mn:.0f}..{mx:.0f}; "
                "the nearest measured efficiency was used"
                for (what, lo, hi), (mn, mx, n) in self._outside.items()}

    @property
    def coverage(self) -> set:
        """Notes on every cost not backed by a direct measurement (for the result)."""
        return set(self.notes) | self.outside

    def memory_time(self, nbytes: float) -> float:
        curve = self.dev.mem_curve
        if curve is None:
            return nbytes / (self.dev.memory_bw * self.dev.mem_efficiency)
        eff, inside = curve.at(max(nbytes, 1.0))
        if not inside:
            self._note_outside("memory-bound op size (bytes) outside the measured", curve, nbytes)
        return nbytes / (self.dev.memory_bw * eff)

    def nongemm_time(self, cls: str, nbytes: float) -> float:
        """One non-GEMM kernel of class `cls` moving `nbytes`: at the class's measured achieved
        bandwidth for that size. Fused softmax without its own curve takes the fused norm's
        (the same one-read, one-write row kernel); a class with no curve at all, the STREAM
        efficiency. Each fallback is noted in `coverage`."""
        dev = self.dev
        curve = dev.nongemm_curve(cls)
        if curve is None and cls == "softmax" and dev.nongemm_curve("norm") is not None:
            curve = dev.nongemm_curve("norm")
            self.notes.add(f"{dev.key}: fused softmax kernels priced at the fused norm kernel's measured bandwidth "
                           "(assumed: the same one-read, one-write row kernel)")
        if curve is None:
            self.notes.add(f"{dev.key}: no measured {cls} kernel bandwidth; those kernels run at the memory-bound (STREAM) efficiency")
            return self.memory_time(nbytes)
        if curve.origin != dev.key:
            self.notes.add(f"{dev.key}: {cls} kernel bandwidth borrowed from {curve.origin} measurements")
        eff, inside = curve.at(max(nbytes, 1.0))
        if not inside:
            self._note_outside(f"{cls} kernel size (bytes) outside the measured", curve, nbytes)
        return nbytes / (dev.memory_bw * eff)

    def _duration(self, op: Op) -> float:
        dev = self.dev
        if op.kind == "memory":
            if op.shape:
                return self.nongemm_time(op.shape[0], op.bytes)
            return self.memory_time(op.bytes)
        if op.kind == "gemm":
            m, n, k = op.shape
            dt = op.dtype or self.matmul_dtype        # an FP8 run tags each GEMM with its own precision
            shaped = dict(dev.gemm_shapes).get(gemm_class(dt))
            if shaped is not None:
                eff, inside = shaped.at_shape(m, n, k)
                if not inside:
                    self._note_outside("GEMM shape (cube root of m·n·k) outside the measured", shaped.side_range(), (m * n * k) ** (1 / 3))
                peak = dev.peak(dt if dt in dev.peak_flop_per_s else self.vector_dtype)
                return max(op.flops / (peak * eff), self.memory_time(op.bytes))
            curve = dev.gemm.get(gemm_class(dt), dev.gemm["16bit"])
            size = (max(m, 1.0) * max(n, 1.0) * max(k, 1.0)) ** (1.0 / 3.0)
            eff, inside = curve.at(size)
            if not inside:
                self._note_outside(f"GEMM size (cube root of m·n·k) outside the measured {curve.origin} sweep", curve, size)
            peak = dev.peak(dt if dt in dev.peak_flop_per_s else self.vector_dtype)
            return max(op.flops / (peak * eff), self.memory_time(op.bytes))
        if op.kind == "attention":
            seq = op.shape[0]
            if dev.flash is None:
                raise ValueError(f"{dev.key} has no FlashAttention curve")
            eff, inside = dev.flash.at(seq)
            if not inside:
                self._note_outside(f"FlashAttention sequence length outside the measured {dev.flash.origin} sweep", dev.flash, seq)
            return op.flops / (dev.peak(self.vector_dtype) * eff)
        raise ValueError(f"unknown op kind {op.kind}")

