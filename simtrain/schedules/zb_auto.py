"""Automatically searched zero-bubble schedules ZB-1p and ZB-2p: a greedy list scheduler over
profiled action times under an activation-memory limit.

Source: Qi, Wan, Huang, Lin, "Zero Bubble Pipeline Parallelism" (ICLR 2024, arXiv:2401.10241)
§3.2, the heuristic (written here from its description, not from the reference code):
  warm-up   within the memory limit, as many F as possible before the rank's first B; an F that
            would delay the first B is taken or not by a binary choice
  steady    one F and one B alternately; a W fills a wait for the next F / B when the wait is at
            least T_W (a second binary choice also lets a W fill a shorter wait), and a W runs
            when the memory limit blocks the next F
  cool-down the remaining B's as their gradients arrive, W's in the waits, then the last W's
Every combination of the two choices is built and the one with the shortest step is kept (the
paper's grid search). Times: T_F, T_B, T_W per microbatch and stage, T_comm per transfer between
neighbouring ranks. Memory: a microbatch's activations are alive from its F to its W, and a
rank holds at most `limit` microbatches at once (ZB-1p: pp, the 1F1B peak; ZB-2p: 2·pp).

The step of a built schedule is measured with the schedule-level model (`timed_execution`) as
the longest span of one rank from its first action to its last: under optimizer post-validation
(§4) ranks do not start together, so that span is the steady-state step. With T_F = T_B = T_W
and free communication the searched schedules reach the handcrafted bounds of §3.1: ZB-1p's
bubble is (p-1)(T_F + T_B - T_W) per rank, ZB-2p's 0 for m >= 2p-1
(tests/test_zero_bubble_auto.py).
"""
from __future__ import annotations

from collections.abc import Sequence
from itertools import product

from simtrain.cost.roofline import ComputeCostModel, sequence_time
from simtrain.schedules.registry import Action, Schedule, make, register
from simtrain.schedules.validate import timed_execution
from simtrain.workload.ir import Comm, Ring, StageWork

_EPS = 1e-12


def _per_rank(pp: int, t: float | Sequence[float]) -> tuple:
    return tuple(float(x) for x in t) if isinstance(t, (list, tuple)) else (float(t),) * pp


def _greedy(pp: int, m: int, limit: int, t_f: float | Sequence[float], t_b: float | Sequence[float],
            t_w: float | Sequence[float], t_comm: float, extra_f: bool, fill_small: bool, stair: bool = False) -> list:
    """One heuristic run: per rank, its ordered actions (kind, microbatch). Times are one value
    for every rank or one per rank."""
    dur = {"F": _per_rank(pp, t_f), "B": _per_rank(pp, t_b), "W": _per_rank(pp, t_w)}
    tw = dur["W"]
    free = [0.0] * pp                        # when each rank is next free
    end_f = [[None] * m for _ in range(pp)]  # end time of F / B of (rank, microbatch), once scheduled
    end_b = [[None] * m for _ in range(pp)]
    nf, nb, nw = [0] * pp, [0] * pp, [0] * pp
    want_f = [False] * pp                    # in the steady phase: whether an F is due next
    out: list = [[] for _ in range(pp)]

    def ready_f(r: int) -> float | None:
        """When rank r's next F may start (None: not known yet, its input is not scheduled)."""
        i = nf[r]
        if i >= m:
            return None
        if r == 0:
            return 0.0
        e = end_f[r - 1][i]
        return None if e is None else e + t_comm

    def ready_b(r: int) -> float | None:
        i = nb[r]
        if i >= nf[r]:
            return None
        if r == pp - 1:
            return end_f[r][i]
        e = end_b[r + 1][i]
        return None if e is None else e + t_comm

    def lower_bound(r: int, kind: str) -> float:
        """Earliest time the input of rank r's next `kind` can arrive (known or bounded)."""
        t = ready_f(r) if kind == "F" else ready_b(r)
        if t is not None:
            return t
        src = r - 1 if kind == "F" else r + 1
        return free[src] + dur[kind][src] + t_comm

    def run(r: int, kind: str, at: float) -> None:
        i = {"F": nf, "B": nb, "W": nw}[kind][r]
        e = at + dur[kind][r]
        if kind == "F":
            end_f[r][i] = e
            nf[r] += 1
        elif kind == "B":
            end_b[r][i] = e
            nb[r] += 1
        else:
            nw[r] += 1
        out[r].append((kind, i))
        free[r] = e

    def decide(r: int, t: float) -> str | None:
        """The action rank r starts at t, or None to wait."""
        f_left, b_left, w_left = nf[r] < m, nb[r] < nf[r], nw[r] < nb[r]
        mem_ok = nf[r] - nw[r] < limit
        if stair and nb[r] == 0:
            # staircase warm-up: each rank one step (limit/pp microbatches) shallower than the one before
            mem_ok = nf[r] < max(1, limit - r * (limit // pp))
        rf, rb = ready_f(r), ready_b(r)
        f_now = f_left and mem_ok and rf is not None and rf <= t + _EPS
        b_now = b_left and rb is not None and rb <= t + _EPS
        if nb[r] == 0:                                   # warm-up
            if b_now:
                return "B"
            if f_now:
                if not extra_f and b_left and rb is not None and t + dur["F"][r] > rb + _EPS:
                    return None                          # this F would delay the first B
                return "F"
            return None
        if f_left:                                       # steady: F and B alternately
            first, second = ("F", "B") if want_f[r] else ("B", "F")
            now = {"F": f_now, "B": b_now}
            if now[first]:
                return first
            if w_left and first == "F" and f_left and not mem_ok:
                return "W"                               # the memory limit blocks F: recycle
            if w_left:
                gap = lower_bound(r, first) - t
                if gap >= tw[r] - _EPS or fill_small:
                    return "W"
            if now[second] and not w_left:
                return second
            return None
        if b_now:                                        # cool-down
            return "B"
        if w_left:
            if b_left and not fill_small and lower_bound(r, "B") - t < tw[r] - _EPS:
                return None
            return "W"
        return None

    total = 3 * m
    while any(len(out[r]) < total for r in range(pp)):
        live = [r for r in range(pp) if len(out[r]) < total]
        tmin = min(free[r] for r in live)
        acted = False
        for r in live:
            if free[r] <= tmin + _EPS:
                k = decide(r, free[r])
                if k is not None:
                    if k in ("F", "B") and nb[r] > 0 and nf[r] < m:
                        want_f[r] = k == "B"
                    if k == "B" and nb[r] == 0:
                        want_f[r] = True
                    run(r, k, free[r])
                    acted = True
        if not acted:
            # nobody can start at tmin: move the waiting ranks to the next time something changes
            later = [free[r] for r in live if free[r] > tmin + _EPS]
            later += [x for r in live for x in (ready_f(r), ready_b(r)) if x is not None and x > tmin + _EPS]
            nxt = min(later) if later else None
            if nxt is None:
                raise AssertionError("zero-bubble heuristic stalled")   # every rank waits on nothing
            for r in live:
                if free[r] <= tmin + _EPS:
                    free[r] = nxt
    return out


def rank_span(s: Schedule, t_f: float | Sequence[float], t_b: float | Sequence[float], t_w: float | Sequence[float],
              t_comm: float = 0.0) -> float:
    """The longest span of one rank, first action's start to last action's end, under the
    schedule-level model with these action times (`timed_execution`; one value or one per rank)."""
    f, b, w = _per_rank(s.pp, t_f), _per_rank(s.pp, t_b), _per_rank(s.pp, t_w)
    d = {"F": f, "B": b, "W": w, "BW": tuple(x + y for x, y in zip(b, w))}
    start, end = timed_execution(s, lambda r, a: d[a.kind][r], t_comm)
    span = 0.0
    for r in range(s.pp):
        keys = [(r, a) for a in s.actions[r]]
        span = max(span, max(end[k] for k in keys) - min(start[k] for k in keys))
    return span


def zb_auto(pp: int, m: int, limit: int, t_f: float | Sequence[float] = 1.0, t_b: float | Sequence[float] = 1.0,
            t_w: float | Sequence[float] = 1.0, t_comm: float = 0.0, name: str = "zb_auto") -> Schedule:
    """The searched schedule for these times and a limit of `limit` microbatches' activations per
    rank: every combination of the heuristic's two choices, the shortest rank span kept (ties: the
    first, so the result is deterministic)."""
    best, best_key = None, None
    for extra_f, fill_small, stair in product((True, False), (False, True), (False, True)):
        rows = _greedy(pp, m, limit, t_f, t_b, t_w, t_comm, extra_f, fill_small, stair)
        s = make(name, pp, m, [[Action(k, i) for k, i in row] for row in rows])
        key = rank_span(s, t_f, t_b, t_w, t_comm)
        if best_key is None or key < best_key - _EPS:
            best, best_key = s, key
    return best


def _build(pp: int, m: int, limit: int, times: tuple | None, name: str) -> Schedule:
    if times is None:
        return zb_auto(pp, m, limit, name=name)
    t_f, t_b, t_w = times
    return zb_auto(pp, m, limit, t_f, t_b, t_w, name=name)


def stage_times(work: Sequence[StageWork], costs: ComputeCostModel) -> tuple:
    """Per model stage, the compute seconds of one microbatch's F, B (with its recompute) and W:
    the sum of the stage's compute segments under the cost model (a ring-attention segment once
    per round). Communication inside a stage is left out (it overlaps or is short next to
    compute), and so is the pipeline transfer: what the heuristic schedules by."""
    def secs(items: tuple) -> float:
        t = 0.0
        for it in items:
            if isinstance(it, Ring):
                t += it.steps * sequence_time(costs, it.segment) / it.share
            elif not isinstance(it, Comm):
                t += sequence_time(costs, it)
        return t

    f, b, w = [], [], []
    for st in work:
        lps = [lp for lp in (st.pre, *st.layers, st.post) if lp is not None]
        f.append(sum(secs(lp.forward) for lp in lps))
        b.append(sum(secs(lp.recompute) + secs(lp.backward_input) for lp in lps))
        w.append(sum(secs(lp.backward_weight) for lp in lps))
    return tuple(f), tuple(b), tuple(w)


@register("zb_1p", "Qi et al., 'Zero Bubble Pipeline Parallelism' (ICLR'24) §3.2: heuristic search under pp microbatches' "
          "activations (1F1B's memory) over the stages' F / B / W times (T_F = T_B = T_W where none are given)",
          post_validation=True, timed=True)
def zb_1p(pp: int, m: int, vpp: int = 1, times: tuple | None = None) -> Schedule:
    return _build(pp, m, pp, times, "zb_1p")


@register("zb_2p", "Qi et al., 'Zero Bubble Pipeline Parallelism' (ICLR'24) §3.2: heuristic search under 2·pp microbatches' "
          "activations over the stages' F / B / W times (T_F = T_B = T_W where none are given)",
          post_validation=True, timed=True)
def zb_2p(pp: int, m: int, vpp: int = 1, times: tuple | None = None) -> Schedule:
    return _build(pp, m, 2 * pp, times, "zb_2p")
