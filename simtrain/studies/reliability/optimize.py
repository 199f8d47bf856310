"""Checkpoint-interval optimisation: closed forms and the Monte-Carlo sweep (analysis stage).

Closed forms (exponential failures of MTBF M, checkpoint cost delta, restart R, compute tau
between checkpoints; a failure loses the segment in progress, a failure during a restart starts
it again):
  Young 1974            tau* = sqrt(2 delta M)
  Daly 2006 (FGCS 22)   tau* = sqrt(2 delta M) (1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9) - delta
                        for delta < 2M, else tau* = M
  Daly's expected wall time of T_s of work:  T_w = M e^(R/M) (e^((tau + delta)/M) - 1) T_s / tau
  so the expected goodput is  G(tau) = tau / (M e^(R/M) (e^((tau + delta)/M) - 1)), and its exact
  maximiser does not depend on R (`exact_optimum`).
Worked example: delta = 10 s, M = 1 h: Young 268.3 s, Daly 261.70 s, exact 261.70 s.

The sweep runs the same trials (same failure times) at every interval, so differences between
intervals are not blurred by failure-count noise; the optimum is the best grid point refined by a
parabola through it and its neighbours in log(interval).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Sequence


def young(delta: float, mtbf: float) -> float:
    return math.sqrt(2.0 * delta * mtbf)


def daly(delta: float, mtbf: float) -> float:
    if delta >= 2.0 * mtbf:
        return mtbf
    x = delta / (2.0 * mtbf)
    return math.sqrt(2.0 * delta * mtbf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta


def daly_wall(tau: float, delta: float, restart: float, mtbf: float, work: float) -> float:
    """Daly's expected wall time to finish `work` seconds of computation."""
    return mtbf * math.exp(restart / mtbf) * math.expm1((tau + delta) / mtbf) * work / tau


def daly_goodput(tau: float, delta: float, restart: float, mtbf: float) -> float:
    return tau / (mtbf * math.exp(restart / mtbf) * math.expm1((tau + delta) / mtbf))


def exact_optimum(delta: float, mtbf: float) -> float:
    """argmax over tau of tau / (e^((tau + delta)/M) - 1), by golden-section search in log tau."""
    f = lambda lt: -math.exp(lt) / math.expm1((math.exp(lt) + delta) / mtbf)
    a, b = math.log(1e-6 * mtbf + 1e-9), math.log(20.0 * mtbf)
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    for _ in range(200):
        if f(c) < f(d):
            b, d = d, c
            c = b - g * (b - a)
        else:
            a, c = c, d
            d = a + g * (b - a)
    return math.exp((a + b) / 2)


def grid(center_s: float, step_s: float, points: int = 13, span: float = 4.0) -> list:
    """Checkpoint intervals in whole steps, geometric from center/span to center x span."""
    out = []
    for x in np.geomspace(1.0 / span, span, points):
        n = max(1, int(round(center_s * x / step_s)))
        if n not in out:
            out.append(n)
    return sorted(out)


def refine(intervals: Sequence[float], means: Sequence[float]) -> float:
    """Best grid point, refined by a parabola in log(interval) through it and its neighbours."""
    i = int(np.argmax(means))
    if i == 0 or i == len(means) - 1:
        return float(intervals[i])
    x = np.log(np.asarray(intervals[i - 1:i + 2], dtype=float))
    y = np.asarray(means[i - 1:i + 2], dtype=float)
    a, b, _ = np.polyfit(x, y, 2)
    if a >= 0:
        return float(intervals[i])
    xm = float(np.clip(-b / (2 * a), x[0], x[2]))
    return float(math.exp(xm))
