"""A compute cost model slowed per rank class (stragglers, jitter): the compute seam's wrapper for heterogeneous devices."""
from __future__ import annotations

from collections.abc import Sequence

from simtrain.cost.roofline import ComputeCostModel, host_queue
from simtrain.workload.ir import Op


class ScaledCosts:
    """A compute cost model slowed by per-class factors: GEMM and attention time x compute,
    memory-bound time x memory. The host's issue cost per operator (a profile's op_overhead)
    is not scaled: a slow device does not slow the host."""

    def __init__(self, base: ComputeCostModel, compute: float, memory: float):
        self.base, self.compute, self.memory = base, compute, memory
        self.dev = getattr(base, "dev", None)

    @property
    def coverage(self) -> set:
        return self.base.coverage

    @property
    def outside(self) -> set:
        return getattr(self.base, "outside", set())

    def device_time(self, op: Op) -> float:
        """The base's device time slowed by the class's factor (a base without a host cost, such as
        a test's cost model, gives its duration as device time)."""
        dt = getattr(self.base, "device_time", self.base.duration)
        return dt(op) * (self.memory if op.kind == "memory" else self.compute)

    @property
    def _host(self) -> float:
        return getattr(self.dev, "op_overhead", 0.0) if hasattr(self.base, "device_time") else 0.0

    def duration(self, op: Op) -> float:
        # a slow device runs its kernels slower; the host issues them as fast as ever
        return self.device_time(op) + self._host

    def sequence_time(self, ops: Sequence[Op]) -> float:
        return host_queue([self.device_time(o) for o in ops], self._host)

    def memory_time(self, nbytes: float) -> float:
        return self.base.memory_time(nbytes) * self.memory
