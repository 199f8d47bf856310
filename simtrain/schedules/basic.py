"""GPipe, 1F1B and Megatron's interleaved 1F1B (virtual pipeline stages)."""
from __future__ import annotations

from simtrain.schedules.registry import Action, Schedule, make, register


@register("gpipe", "Huang et al., 'GPipe' (NeurIPS 2019): all forwards, then all backwards")
def gpipe(pp: int, m: int, vpp: int = 1) -> Schedule:
    acts = [[Action("F", i) for i in range(m)] + [Action("BW", i) for i in range(m)] for _ in range(pp)]
    return make("gpipe", pp, m, acts)


def one_f_one_b_order(pp: int, m: int, r: int) -> list:
    """Rank r: min(pp-r-1, m) warm-up forwards, then one forward one backward, then the cool-down."""
    warm = min(pp - r - 1, m)
    acts = [Action("F", i) for i in range(warm)]
    f, b = warm, 0
    while f < m:
        acts.append(Action("F", f))
        f += 1
        acts.append(Action("BW", b))
        b += 1
    acts += [Action("BW", i) for i in range(b, m)]
    return acts


@register("1f1b", "Narayanan et al., PipeDream-Flush / Megatron-LM 1F1B (SC'21 §2.2.1): pp-s-1 warm-up forwards, then one forward one backward")
def one_f_one_b(pp: int, m: int, vpp: int = 1) -> Schedule:
    return make("1f1b", pp, m, [one_f_one_b_order(pp, m, r) for r in range(pp)])


def _interleaved_check(pp: int, m: int, vpp: int) -> list:
    out = []
    if vpp < 2:
        out.append(("parallel.vpp", f"interleaved_1f1b needs at least 2 model chunks per rank, got vpp={vpp}",
                    "set `vpp: 2` or more (num_layers must divide into pp x vpp stages)"))
    if pp < 2:
        out.append(("parallel.pp", "interleaved_1f1b needs pp >= 2", "use 1f1b for pp = 1"))
    elif m % pp:
        out.append(("training.global_batch_size",
                    f"interleaved_1f1b runs microbatches in groups of pp: {m} microbatches is not a multiple of pp={pp}",
                    f"make global_batch_size / (micro_batch_size x dp) a multiple of {pp}, e.g. {max(1, m // pp) * pp if m >= pp else pp}"))
    return out


@register("interleaved_1f1b",
          "Narayanan et al. SC'21 §2.2.2 and Megatron-LM's interleaved schedule: rank r holds chunks c·pp + r; "
          "forwards go in groups of pp microbatches per chunk; (pp-r-1)·2 + (vpp-1)·pp warm-up forwards",
          num_stages=lambda pp, vpp: pp * vpp, check=_interleaved_check, default_vpp=2)
def interleaved_1f1b(pp: int, m: int, vpp: int) -> Schedule:
    """The k-th forward of a rank runs chunk (k // pp) % v on microbatch (k // (pp·v))·pp + k % pp;
    the k-th backward runs chunk v-1-(k // pp) % v on the same microbatch formula.
    Worked example (pp 2, v 2, m 4), rank 0: warm-up (2-0-1)·2 + 1·2 = 4 forwards
    0F0 0F1 1F0 1F1, then 0F2&1B0 pairs as 1F1B: 0F2 1B0 0F3 1B1 1F2 0B0 1F3 0B1, then 1B2 1B3 0B2 0B3."""
    v = vpp
    total = m * v

    def fwd(k):
        return Action("F", (k // (pp * v)) * pp + k % pp, (k // pp) % v)

    def bwd(k):
        return Action("BW", (k // (pp * v)) * pp + k % pp, v - 1 - (k // pp) % v)

    acts = []
    for r in range(pp):
        warm = min((pp - r - 1) * 2 + (v - 1) * pp, total)
        seq = [fwd(k) for k in range(warm)]
        f, b = warm, 0
        while f < total:
            seq.append(fwd(f))
            f += 1
            seq.append(bwd(b))
            b += 1
        seq += [bwd(k) for k in range(b, total)]
        acts.append(seq)
    stage_of = tuple(tuple(c * pp + r for c in range(v)) for r in range(pp))
    route = tuple((k % pp, k // pp) for k in range(pp * v))
    return make("interleaved_1f1b", pp, m, acts, stage_of=stage_of, routes=(route,))
