"""Stragglers and heterogeneity (between the parallel plan and the lowering): per-device
slowdowns, seeded compute jitter and mixed device types, turned into per-rank factors.

    cluster:
      stragglers:                       # any number of entries
        - {devices: [17, 300], compute: 1.3}                   # device indices (node by node)
        - {fraction: 0.01, compute: 1.2, memory: 1.1, link: 2.0}   # drawn with the scenario seed
      jitter: {distribution: normal, sigma: 0.02}              # per-device compute factor 1 + N(0, sigma), seeded
      mixed:                            # node blocks in node order; the rest runs cluster.device
        - {nodes: 16, device: a100-sxm4-80gb}

      straggler_model: lockstep         # or exact (see below)
      variability: auto                 # measured per-device speed spread above 16,384 devices (Variability)

A factor multiplies a time: `compute` the GEMM and attention kernels, `memory` the memory-bound
operators and the optimizer step, `link` every transfer of a collective or pipeline send that the
device takes part in (a collective is as slow as its slowest member). Factors combine by
multiplication when entries overlap. Ranks with different factors or device types get different
integer keys, and the rank grouping (`parallel.equivalence_classes(rank_key=...)`) splits exactly
the classes that differ.

`straggler_model: exact` gives every rank its own device's factors. One straggler then splits its
tensor-parallel peers, their data-parallel groups and their pipeline neighbours into classes of
their own, and at 1 % stragglers on 16,384 ranks that is ~11,000 classes whose collectives all
rendezvous across classes. `lockstep` (the default) uses that tensor-parallel ranks meet at a
collective after every compute segment, so a tp group runs at the pace of its slowest member:
every member takes the group's slowest compute, memory and link factors, the group stays one
class, and its collectives fold into its compute (~1,000 classes in the same case). The step is
the same wherever a group's members start each segment together. It differs by up to one
segment's extra time where they start apart: after a pipeline receive (the late sender's partner
waits at the group's first collective either way) or after a dp rendezvous. The faster members'
waiting counts as their compute, not as bubble. A test bounds the difference against `exact`.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import erf
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from simtrain.spec.scenario import ClusterSpec


@dataclass(frozen=True)
class Straggler:
    devices: tuple = ()
    fraction: float = 0.0
    compute: float = 1.0
    memory: float = 1.0
    link: float = 1.0


@dataclass(frozen=True)
class Jitter:
    distribution: str = "normal"     # normal | lognormal
    sigma: float = 0.0


@dataclass(frozen=True)
class DeviceFactors:
    """Per device (index = device): compute, memory and link time factors and the device type."""
    compute: np.ndarray
    memory: np.ndarray
    link: np.ndarray
    device: tuple                    # device preset per device
    chosen: tuple                    # devices named or drawn as stragglers, sorted

    def per_rank(self, place: list[int] | np.ndarray, tp_members: np.ndarray | None = None) -> tuple:
        """(compute, memory, link, device-type index) per rank. With `tp_members` (the tp
        groups as rows of ranks, the lockstep model) every member takes its group's slowest
        factors: tensor-parallel ranks meet at a collective after every compute segment, so the
        group computes at the pace of its slowest member (module docstring)."""
        place = np.asarray(place)
        comp, mem, link = self.compute[place].copy(), self.memory[place].copy(), self.link[place].copy()
        if tp_members is not None and tp_members.shape[1] > 1:
            for a in (comp, mem, link):
                a[tp_members.ravel()] = np.repeat(a[tp_members].max(axis=1), tp_members.shape[1])
        kinds = {d: i for i, d in enumerate(sorted(set(self.device)))}
        dev = np.asarray([kinds[self.device[int(d)]] for d in place], dtype=np.int64)
        return comp, mem, link, dev

    @staticmethod
    def rank_key(comp: np.ndarray, mem: np.ndarray, link: np.ndarray, dev: np.ndarray) -> np.ndarray:
        """An integer per rank that is equal exactly when the ranks behave the same."""
        rows = np.stack([comp, mem, link, dev.astype(float)], axis=1)
        _, inv = np.unique(rows, axis=0, return_inverse=True)
        return inv.reshape(-1).astype(np.int64)


def device_factors(cluster: ClusterSpec, num_devices: int, devices_per_node: int, seed: int) -> DeviceFactors:
    """Draws and combines the cluster's stragglers, jitter and device blocks (seeded: the same
    scenario and seed give the same devices and factors)."""
    rng = np.random.default_rng([seed, 0x57A6])
    comp = np.ones(num_devices)
    mem = np.ones(num_devices)
    link = np.ones(num_devices)
    chosen: set = set()
    for s in cluster.stragglers:
        if s.devices:
            devs = np.asarray(s.devices, dtype=np.int64)
        else:
            n = max(1, int(round(s.fraction * num_devices)))
            devs = np.sort(rng.choice(num_devices, size=n, replace=False))
        comp[devs] *= s.compute
        mem[devs] *= s.memory
        link[devs] *= s.link
        chosen.update(int(d) for d in devs)
    j = cluster.jitter
    if j is not None and j.sigma > 0:
        draw = rng.standard_normal(num_devices) * j.sigma
        comp *= np.exp(draw) if j.distribution == "lognormal" else np.clip(1.0 + draw, 0.05, None)
    device = [cluster.device] * num_devices
    pos = 0
    for nodes, dev in cluster.mixed:
        for d in range(pos * devices_per_node, (pos + nodes) * devices_per_node):
            device[d] = dev
        pos += nodes
    return DeviceFactors(comp, mem, link, tuple(device), tuple(sorted(chosen)))


# --- per-device speed variability, modelled by order statistics -----------------------------

VARIABILITY_SIGMA = 0.08 / (2 * 2.698)
"""The measured per-device compute-speed spread, as a relative standard deviation (~1.48 %).

Source: Sinha et al., "Not All GPUs Are Created Equal: Characterizing Variability in Large-Scale,
Accelerator-Rich Systems", SC22 (arXiv 2208.11035): on identical-SKU GPUs of five large clusters
(Summit, Vortex, Frontera, Longhorn, Corona; over 90 % of each cluster's GPUs, compute-bound SGEMM
among the workloads) the performance varies by 8 % on average (at most 22 %), with outliers up to
1.5x slower than the median GPU. Reading the 8 % as the span of the box plot's whiskers (Tukey:
Q1 - 1.5 IQR to Q3 + 1.5 IQR, which is +-2.698 sigma for a normal) gives sigma = 0.08 / 5.396.
That reading is an interpretation (ASSUMED), not a figure the paper states; the outliers beyond
the whiskers are what `cluster.stragglers` is for."""

VARIABILITY_SOURCE = ("Sinha et al., SC22 (arXiv 2208.11035): 8 % average per-GPU performance variation "
                      "on identical GPUs, read as the +-2.698 sigma whisker span")

def expected_max_blom(g: int) -> float:
    """E[max of g standard normal draws] by Blom's approximation, Phi^-1((g - 0.375) / (g + 0.25)).

    >>> expected_max_blom(1)
    0.0
    """
    if g <= 1:
        return 0.0
    return float(_norm_ppf((g - 0.375) / (g + 0.25)))


def expected_max_exact(g: int, points: int = 20_001) -> float:
    """E[max of g standard normal draws] by numeric integration of x d/dx Phi(x)^g on [-10, 10]
    (trapezoid rule; the density g phi Phi^(g-1) is negligible outside)."""
    if g <= 1:
        return 0.0
    x = np.linspace(-10.0, 10.0, points)
    phi = np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi)
    cdf = _norm_cdf(x)
    dens = g * phi * np.exp((g - 1) * np.log(np.clip(cdf, 1e-300, None)))
    return float(np.trapezoid(x * dens, x) if hasattr(np, "trapezoid") else np.trapz(x * dens, x))


def _norm_cdf(x: np.ndarray) -> np.ndarray:
    """Phi(x) via math.erf (vectorised; no scipy)."""
    return 0.5 * (1.0 + np.vectorize(erf)(np.asarray(x) / np.sqrt(2.0)))


def _norm_ppf(p: float) -> float:
    """Phi^-1(p) by bisection on Phi (60 halvings: below 1e-15 in x)."""
    lo, hi = -40.0, 40.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if float(_norm_cdf(np.asarray(mid))) < p:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Variability:
    """The slowest-member effect of persistent per-device speed differences.

    Each device keeps its own speed across steps: compute time x (1 + sigma z), z ~ N(0, 1), one
    draw per device. A synchronous step cannot finish before its slowest device: tp groups meet
    at every collective, the pipeline passes work stage to stage, and the dp all-reduce joins every
    replica each step, so the whole job (g = every rank) proceeds at the expected maximum of g
    draws, 1 + sigma E[max_g z] (Blom's approximation). It is applied as one compute factor to
    every rank class, so it adds no classes. Approximations: the per-device draw is persistent
    (per-step noise would average part of it away in the pipeline); every stage takes the
    slowest device's factor, where in a pipeline only the slowest stage gates the steady state
    (the model overstates the fill and drain by up to that share of the step); memory-bound
    operators and links keep their speed."""
    sigma: float
    group: int
    source: str = VARIABILITY_SOURCE

    @property
    def z(self) -> float:
        return expected_max_blom(self.group)

    @property
    def factor(self) -> float:
        return 1.0 + self.sigma * self.z


def variability_of(setting: object, world: int) -> Variability | None:
    """The cluster.variability setting for a run of `world` ranks: "auto" (the default) and
    "measured" apply the measured spread at every size, "none" turns it off, a float is a sigma.

    There is no size below which the default leaves it out: the slowest-of-g factor grows
    continuously with g (x1.021 at 8 devices, x1.045 at 512, x1.059 at 16,384), and a threshold
    would make the predicted step jump where it was crossed."""
    if setting is None or setting == "none":
        return None
    if setting in ("auto", "measured"):
        sigma, src = VARIABILITY_SIGMA, VARIABILITY_SOURCE
    else:
        sigma, src = float(setting), "cluster.variability (given)"
    return Variability(sigma, world, src) if sigma > 0 else None
