"""DeepSeek-V3's bidirectional DualPipe and its V-shaped 'cut-in-half' DualPipeV.

Source: DeepSeek-AI, "DeepSeek-V3 Technical Report" (arXiv:2412.19437) §3.2.1 and Table 2, and
the phase structure of the reference implementation (github.com/deepseek-ai/DualPipe,
dualpipe/dualpipe.py and dualpipev.py); the builder below is written from that description.

Both run eight phases per rank. In the DualPipeV form (n ranks, m microbatches, rank r; phase 0
is chunk 0 going down the ranks, phase 1 chunk 1 coming back up; "B~" is an input-gradient-only
backward whose weight gradient is deferred to a FIFO and run by a later "W"):
  1. 2(n-r-1) x F0
  2. (r+1) x (F0, F1)
  3. (n-r-1) x (B~1, W, F1)
  4. (m-2n+r+1) x (F0&B1, F1&B0)           '&': overlapped forward/backward pair; on the last rank
                                            the first pair runs as F0 then B1
  5. (n-r-1) x (B1, F1&B0)
  6. (r+1) x (B1, B0)                       the first r+1 of these backwards full, the rest B~
  7. (n-r-1) x (W, B~0)
  8. (r+1) x W
DualPipe on pp ranks is this with n = pp/2, m = M/2 and r = min(rank, pp-1-rank), where phase 0
is the direction that enters at the rank's nearer end: rank r holds stage r (direction 0, fed
at rank 0) and stage pp-1-r (direction 1, fed at rank pp-1), so the model is held twice.
Microbatches 0..M/2-1 go in direction 0, M/2..M-1 in direction 1.
"""
from __future__ import annotations

from simtrain.schedules.registry import Action, Schedule, make, register


def _phases(n: int, m: int, r: int) -> list:
    """Phase-relative action list: items (kind, phase, overlap_next) with kind F | B | Bz | W."""
    out = []
    add = out.append
    for _ in range(2 * (n - r - 1)):
        add(("F", 0, False))
    for _ in range(r + 1):
        add(("F", 0, False))
        add(("F", 1, False))
    for _ in range(n - r - 1):
        add(("Bz", 1, False))
        add(("W", None, False))
        add(("F", 1, False))
    for i in range(m - 2 * n + r + 1):
        if i == 0 and r == n - 1:
            add(("F", 0, False))
            add(("B", 1, False))
        else:
            add(("F", 0, True))
            add(("B", 1, False))
        add(("F", 1, True))
        add(("B", 0, False))
    for _ in range(n - r - 1):
        add(("B", 1, False))
        add(("F", 1, True))
        add(("B", 0, False))
    full = r + 1
    k = 0
    for _ in range(r + 1):
        for ph in (1, 0):
            add(("B" if k < full else "Bz", ph, False))
            k += 1
    for _ in range(n - r - 1):
        add(("W", None, False))
        add(("Bz", 0, False))
    for _ in range(r + 1):
        add(("W", None, False))
    return out


def _realise(items, mb_of_phase, chunk_of_phase) -> list:
    """Phase-relative items -> Actions: F and B count microbatches in order per phase; a W runs
    the oldest deferred B~."""
    nf = {0: 0, 1: 0}
    nb = {0: 0, 1: 0}
    deferred = []
    acts = []
    for kind, ph, ov in items:
        if kind == "F":
            acts.append(Action("F", mb_of_phase(ph, nf[ph]), chunk_of_phase[ph], ov))
            nf[ph] += 1
        elif kind in ("B", "Bz"):
            mb = mb_of_phase(ph, nb[ph])
            nb[ph] += 1
            if kind == "Bz":
                acts.append(Action("B", mb, chunk_of_phase[ph], ov))
                deferred.append((mb, chunk_of_phase[ph]))
            else:
                acts.append(Action("BW", mb, chunk_of_phase[ph], ov))
        else:
            mb, c = deferred.pop(0)
            acts.append(Action("W", mb, c, ov))
    return acts


def _check_dualpipe(pp: int, m: int, vpp: int) -> list:
    out = []
    if pp < 2 or pp % 2:
        out.append(("parallel.pp", f"dualpipe needs an even pp >= 2, got {pp}", "use an even pipeline size, or dualpipev"))
    if m % 2 or m < 2 * pp:
        out.append(("training.global_batch_size",
                    f"dualpipe needs an even number of microbatches >= 2·pp = {2 * pp}, got {m}",
                    f"make global_batch_size / (micro_batch_size x dp) even and at least {2 * pp}"))
    return out


@register("dualpipe", "DeepSeek-V3 Technical Report (arXiv:2412.19437) §3.2.1, Table 2; deepseek-ai/DualPipe phase structure",
          num_stages=lambda pp, vpp: pp, check=_check_dualpipe)
def dualpipe(pp: int, m: int, vpp: int = 1) -> Schedule:
    n, half = pp // 2, m // 2
    acts = []
    for rank in range(pp):
        lower = rank < n
        h = rank if lower else pp - 1 - rank
        # phase 0 is the direction entering at this rank's nearer end
        direction = {0: 0, 1: 1} if lower else {0: 1, 1: 0}
        chunk_of_phase = {ph: direction[ph] for ph in (0, 1)}
        acts.append(_realise(_phases(n, half, h), lambda ph, i, d=direction: i + half * d[ph], chunk_of_phase))
    stage_of = tuple((r, pp - 1 - r) for r in range(pp))
    route0 = tuple((r, 0) for r in range(pp))
    route1 = tuple((pp - 1 - k, 1) for k in range(pp))
    return make("dualpipe", pp, m, acts, stage_of=stage_of, routes=(route0, route1),
                route_of=[0] * half + [1] * half)


def _check_dualpipev(pp: int, m: int, vpp: int) -> list:
    if m < 2 * pp:
        return [("training.global_batch_size", f"dualpipev needs at least 2·pp = {2 * pp} microbatches, got {m}",
                 f"make global_batch_size / (micro_batch_size x dp) at least {2 * pp}")]
    return []


@register("dualpipev", "deepseek-ai/DualPipe, DualPipeV ('cut-in-half' V-shape); DeepSeek-V3 report §3.2.1",
          num_stages=lambda pp, vpp: 2 * pp, check=_check_dualpipev)
def dualpipev(pp: int, m: int, vpp: int = 1) -> Schedule:
    acts = [_realise(_phases(pp, m, r), lambda ph, i: i, {0: 0, 1: 1}) for r in range(pp)]
    stage_of = tuple((r, 2 * pp - 1 - r) for r in range(pp))
    route = tuple((r, 0) for r in range(pp)) + tuple((pp - 1 - k, 1) for k in range(pp))
    return make("dualpipev", pp, m, acts, stage_of=stage_of, routes=(route,))
