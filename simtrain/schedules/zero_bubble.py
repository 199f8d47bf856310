"""Zero-bubble schedules: the backward split into B (input gradient) and W (weight gradient), W
deferred into what would be bubbles.

Source: Qi, Wan, Huang, Lin, "Zero Bubble Pipeline Parallelism" (ICLR 2024, arXiv:2401.10241),
§3 (handcrafted ZB-H1 / ZB-H2, Table 2) and §6 (ZB-V); orders as in the zero-bubble reference
implementation and PyTorch's ScheduleZBVZeroBubble, written here from their description.
Paper claims with T_F = T_B = T_W (each rank counted from its own first to its own last op):
  ZB-H1  bubble (p-1)(T_F + T_B - T_W), peak activations p microbatches (as 1F1B)
  ZB-H2  bubble (p-1)(T_F + T_B - 2T_W), peak 2p-1 microbatches, zero only when m >= 2p-1
  ZB-V   bubble 0 with 2p chunks in a V, peak p microbatches (2p half-size chunks), m >= 2p-1
The orders are valid for any m; with fewer microbatches the warm-up cannot be filled and bubbles
remain (tests/test_schedules.py shows the bound is tight). B and W of a rank run in microbatch
(FIFO) order.
"""
from __future__ import annotations

from simtrain.schedules.registry import Action, Schedule, make, register


class _Row:
    """Emits F / B / W of one chunk in microbatch order, skipping microbatches >= m."""

    def __init__(self, m: int, out: list, chunk: int = 0):
        self.m, self.out, self.chunk = m, out, chunk
        self.n = {"F": 0, "B": 0, "W": 0}

    def __call__(self, *kinds):
        for k in kinds:
            i = self.n[k]
            self.n[k] += 1
            if i < self.m:
                self.out.append(Action(k, i, self.chunk))

    def left(self, k: str) -> int:
        return self.m - self.n[k]


def _zb_h(pp: int, m: int, r: int, warm: int, pairs: int, pair: tuple) -> list:
    """warm F's, then `pairs` groups `pair` (no W yet), then F B W groups while forwards remain,
    then B W pairs, then the remaining W's."""
    out: list = []
    row = _Row(m, out)
    row(*["F"] * min(warm, m))
    for _ in range(pairs):
        if row.left("F") > 0:
            row(*pair)
    while row.left("F") > 0:
        row("F", "B", "W") if pair == ("F", "B") else row("B", "W", "F")
    while row.left("B") > 0:
        row("B", "W")
    while row.left("W") > 0:
        row("W")
    return out


@register("zb_h1", "Qi et al., 'Zero Bubble Pipeline Parallelism' (ICLR'24) §3.1, ZB-H1: 1F1B's memory, W deferred by the rank's warm-up depth",
          post_validation=True)
def zb_h1(pp: int, m: int, vpp: int = 1) -> Schedule:
    """Rank r: p-1-r forwards, r (F, B) pairs, then (F, B, W) groups, (B, W) pairs and the last W's.
    Worked example (p 2, m 3), rank 0: F0 F1 B0 W0 F2 B1 W1 B2 W2; rank 1: F0 B0 F1 B1 W0 F2 B2 W1 W2."""
    return make("zb_h1", pp, m, [_zb_h(pp, m, r, pp - 1 - r, r, ("F", "B")) for r in range(pp)])


@register("zb_h2", "Qi et al., 'Zero Bubble Pipeline Parallelism' (ICLR'24) §3.1, ZB-H2: 2p-1-2r warm-up forwards fill the start, W's the end",
          post_validation=True)
def zb_h2(pp: int, m: int, vpp: int = 1) -> Schedule:
    """Rank r: 2p-1-2r forwards, 2r (B, F) pairs, then (B, W, F) groups, (B, W) pairs, last W's."""
    return make("zb_h2", pp, m, [_zb_h(pp, m, r, 2 * pp - 1 - 2 * r, 2 * r, ("B", "F")) for r in range(pp)])


@register("zb_v", "Qi et al., 'Zero Bubble Pipeline Parallelism' (ICLR'24) §6, ZB-V: two chunks per rank in a V (rank r holds stages r and 2p-1-r)",
          num_stages=lambda pp, vpp: 2 * pp, post_validation=True)
def zb_v(pp: int, m: int, vpp: int = 1) -> Schedule:
    """Rank r with n = max(2p-1, m) microbatch slots (slots >= m are left out):
    2(p-r)-1 F on chunk 0; r (F1, F0) pairs; p-r (F1, B1, W1) groups; while chunk 1 lags chunk 0
    or chunk 0 has forwards left: F0 (if left), B0, W0, F1, B1, W1; r (B0, B1) pairs; p-r (B0, W0)
    pairs; the remaining W1's, then W0's."""
    acts = []
    n = max(2 * pp - 1, m)
    for r in range(pp):
        out: list = []
        c0, c1 = _Row(m, out, 0), _Row(m, out, 1)
        for _ in range(2 * (pp - r) - 1):
            c0("F")
        for _ in range(r):
            c1("F")
            c0("F")
        for _ in range(pp - r):
            c1("F", "B", "W")
        while c1.n["F"] < c0.n["F"] or c0.n["F"] < n:
            if c0.n["F"] < n:
                c0("F")
            c0("B", "W")
            c1("F", "B", "W")
        for _ in range(r):
            c0("B")
            c1("B")
        for _ in range(pp - r):
            c0("B", "W")
        while c1.n["W"] < n:
            c1("W")
        while c0.n["W"] < n:
            c0("W")
        acts.append(out)
    stage_of = tuple((r, 2 * pp - 1 - r) for r in range(pp))
    route = tuple((r, 0) for r in range(pp)) + tuple((pp - 1 - k, 1) for k in range(pp))
    return make("zb_v", pp, m, acts, stage_of=stage_of, routes=(route,))
