"""Pipeline schedules (fourth pipeline stage): per-stage ordered lists of actions, as data.

A schedule builder is a plain function `(pp, microbatches) -> tuple[tuple[Action, ...], ...]`
(one tuple per pipeline stage) registered by name with `@register("name")`. The engine executes
that data and never branches on a schedule's name.

Dependencies implied by the actions (a single model chunk per stage):
  F(s, i)  needs F(s-1, i)                      (activation from the previous stage)
  BW(s, i) needs F(s, i) and BW(s+1, i)          (gradient from the next stage; the last stage
                                                  starts its backward from its own forward)
`validate` checks each (stage, microbatch) has exactly one F and one BW and that executing the
lists in order with those dependencies finishes (no deadlock).
"""
from __future__ import annotations

from dataclasses import dataclass

from simtrain.errors import ScheduleError

SCHEDULES: dict = {}
SOURCES: dict = {}


@dataclass(frozen=True)
class Action:
    kind: str          # F | BW
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}"


def register(name: str, source: str):
    def deco(fn):
        SCHEDULES[name] = fn
        SOURCES[name] = source
        return fn
    return deco


def build_schedule(name: str, pp: int, m: int) -> tuple:
    sched = SCHEDULES[name](pp, m)
    validate(sched, pp, m)
    return sched


def deps(stage: int, a: Action, pp: int) -> tuple:
    """(stage, Action) pairs that must finish before `a` may start on `stage`."""
    if a.kind == "F":
        return ((stage - 1, Action("F", a.microbatch)),) if stage > 0 else ()
    out = [(stage, Action("F", a.microbatch))]
    if stage < pp - 1:
        out.append((stage + 1, Action("BW", a.microbatch)))
    return tuple(out)


def validate(sched, pp: int, m: int) -> None:
    if len(sched) != pp:
        raise ScheduleError(f"schedule has {len(sched)} stage lists for pp={pp}")
    for s, acts in enumerate(sched):
        seen = {}
        for a in acts:
            if a.kind not in ("F", "BW"):
                raise ScheduleError(f"stage {s}: unknown action kind {a.kind!r}")
            if not 0 <= a.microbatch < m:
                raise ScheduleError(f"stage {s}: action {a} names a microbatch outside 0..{m - 1}")
            seen[(a.kind, a.microbatch)] = seen.get((a.kind, a.microbatch), 0) + 1
        for i in range(m):
            for k in ("F", "BW"):
                n = seen.get((k, i), 0)
                if n != 1:
                    raise ScheduleError(f"stage {s}: {k}{i} appears {n} times (must be exactly once)")
    # execute in order with the implied dependencies; a round with no progress is a deadlock
    pos = [0] * pp
    done = set()
    while any(pos[s] < len(sched[s]) for s in range(pp)):
        progressed = False
        for s in range(pp):
            while pos[s] < len(sched[s]):
                a = sched[s][pos[s]]
                if all(d in done for d in deps(s, a, pp)):
                    done.add((s, a))
                    pos[s] += 1
                    progressed = True
                else:
                    break
        if not progressed:
            blocked = ", ".join(f"stage {s} at {sched[s][pos[s]]}" for s in range(pp) if pos[s] < len(sched[s]))
            raise ScheduleError(f"schedule deadlocks: {blocked}")


@register("gpipe", "Huang et al., 'GPipe' (NeurIPS 2019): all forwards, then all backwards")
def gpipe(pp: int, m: int) -> tuple:
    return tuple(tuple([Action("F", i) for i in range(m)] + [Action("BW", i) for i in range(m)]) for _ in range(pp))


@register("1f1b", "Narayanan et al., PipeDream-Flush / Megatron-LM 1F1B (SC'21 §2.2.1): pp-s-1 warm-up forwards, then one forward one backward")
def one_f_one_b(pp: int, m: int) -> tuple:
    out = []
    for s in range(pp):
        warm = min(pp - s - 1, m)
        acts = [Action("F", i) for i in range(warm)]
        f, b = warm, 0
        while f < m:
            acts.append(Action("F", f))
            f += 1
            acts.append(Action("BW", b))
            b += 1
        while b < m:
            acts.append(Action("BW", b))
            b += 1
        out.append(tuple(acts))
    return tuple(out)
