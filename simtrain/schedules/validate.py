"""Schedule checks and the schedule-level timing model, on a `Schedule` (see `registry`).

`validate` checks that every microbatch has, at every position of its route, exactly one F and
either one BW or one B and one W, on the rank and chunk the route names, and that executing the
per-rank lists in order with those dependencies finishes (an overlapped pair starts when both
actions may start). Rules that need no simulation (e.g. interleaving's microbatch count) are
`ScheduleDef.check`, run when the scenario is loaded.

`order_execution` returns the rounds in which the per-rank lists run under those dependencies;
`timed_execution` returns every action's (start, end) for given action costs.
"""
from __future__ import annotations

from typing import Callable

from simtrain.errors import ScheduleError
from simtrain.schedules.registry import Action, Schedule


def validate(s: Schedule) -> None:
    """Raises ScheduleError unless the schedule is complete, consistent and deadlock-free."""
    pp, m = s.pp, s.microbatches
    if len(s.actions) != pp or len(s.stage_of) != pp:
        raise ScheduleError(f"schedule {s.name}: {len(s.actions)} action lists and {len(s.stage_of)} chunk maps for pp={pp}")
    S = s.num_stages
    for ri, route in enumerate(s.routes):
        if len(route) != S:
            raise ScheduleError(f"schedule {s.name}: route {ri} has {len(route)} positions, expected {S}")
        for k, (r, c) in enumerate(route):
            if not (0 <= r < pp and 0 <= c < len(s.stage_of[r])) or s.stage_of[r][c] != k:
                raise ScheduleError(f"schedule {s.name}: route {ri} position {k} is rank {r} chunk {c}, which does not hold stage {k}")
            if k and not (abs(r - route[k - 1][0]) <= 1 or {r, route[k - 1][0]} == {0, pp - 1}):
                raise ScheduleError(f"schedule {s.name}: route {ri} jumps from rank {route[k - 1][0]} to rank {r}; "
                                    f"activations only move to a neighbouring rank (or between the pipeline's two ends)")
    if len(s.route_of) != m:
        raise ScheduleError(f"schedule {s.name}: {len(s.route_of)} route assignments for {m} microbatches")
    seen: dict = {}
    for r, acts in enumerate(s.actions):
        for i, a in enumerate(acts):
            if a.kind not in ("F", "B", "W", "BW"):
                raise ScheduleError(f"schedule {s.name}: rank {r}: unknown action kind {a.kind!r}")
            if not 0 <= a.microbatch < m:
                raise ScheduleError(f"schedule {s.name}: rank {r}: action {a} names a microbatch outside 0..{m - 1}")
            if (r, a.chunk) not in s.route(a.microbatch):
                raise ScheduleError(f"schedule {s.name}: rank {r}: action {a}: microbatch {a.microbatch}'s route does not pass chunk {a.chunk} of rank {r}")
            if a.overlap_next and (i + 1 >= len(acts) or acts[i + 1].overlap_next):
                raise ScheduleError(f"schedule {s.name}: rank {r}: action {a} is marked to overlap with a next action that is missing or itself overlapped")
            if a.overlap_next and (acts[i + 1].microbatch == a.microbatch or _depends_locally(s, r, acts[i + 1], a)):
                raise ScheduleError(f"schedule {s.name}: rank {r}: the overlapped pair {a} and {acts[i + 1]} depend on each other; "
                                    f"a pair must be two independent actions (e.g. a forward of one microbatch and a backward of another)")
            key = (r, a.chunk, a.microbatch, a.kind)
            seen[key] = seen.get(key, 0) + 1
    for mb in range(m):
        for (r, c) in s.route(mb):
            n = {k: seen.get((r, c, mb, k), 0) for k in ("F", "B", "W", "BW")}
            ok = n["F"] == 1 and ((n["BW"] == 1 and n["B"] == n["W"] == 0) or (n["BW"] == 0 and n["B"] == n["W"] == 1))
            if not ok:
                have = ", ".join(f"{k}×{v}" for k, v in n.items() if v) or "nothing"
                raise ScheduleError(f"schedule {s.name}: rank {r} chunk {c} microbatch {mb} has {have}; "
                                    f"it needs exactly one F and either one BW or one B and one W")
    order_execution(s)


def _depends_locally(s: Schedule, r: int, b: Action, a: Action) -> bool:
    """Whether b needs a on rank r, directly or through b's other dependencies on that rank."""
    stack, seen = [b], set()
    while stack:
        x = stack.pop()
        for rr, d in s.deps(r, x) if (r, x.chunk) in s.route(x.microbatch) else ():
            if rr == r and d == a:
                return True
            if rr == r and d not in seen:
                seen.add(d)
                stack.append(d)
    return False


def order_execution(s: Schedule) -> list:
    """Executes the lists in order under the dependencies, in rounds; returns, per round, the
    (rank, index) pairs that ran. A round without progress is a deadlock (ScheduleError)."""
    pp = s.pp
    pos = [0] * pp
    done = set()
    rounds = []
    while any(pos[r] < len(s.actions[r]) for r in range(pp)):
        ran = []
        for r in range(pp):
            acts = s.actions[r]
            while pos[r] < len(acts):
                a = acts[pos[r]]
                group = [a] + ([acts[pos[r] + 1]] if a.overlap_next else [])
                if all(d in done for g in group for d in s.deps(r, g) if d[1] not in group or d[0] != r):
                    for g in group:
                        done.add((r, g))
                        ran.append((r, pos[r]))
                        pos[r] += 1
                else:
                    break
        if not ran:
            blocked = ", ".join(f"rank {r} at {s.actions[r][pos[r]]}" for r in range(pp) if pos[r] < len(s.actions[r]))
            raise ScheduleError(f"schedule {s.name} deadlocks: {blocked}")
        rounds.append(ran)
    return rounds


def timed_execution(s: Schedule, cost: Callable, comm: float = 0.0) -> tuple:
    """Start and end time of every action when each takes cost(rank, action) seconds and a
    transfer between ranks takes `comm`: the schedule-level model used by the greedy builders
    and by tests as an independent reference. Returns (start, end) dicts keyed (rank, Action)."""
    start, end = {}, {}
    pos = [0] * s.pp
    free_at = [0.0] * s.pp
    pending = sum(len(a) for a in s.actions)
    while pending:
        progressed = False
        for r in range(s.pp):
            acts = s.actions[r]
            while pos[r] < len(acts):
                a = acts[pos[r]]
                group = [a] + ([acts[pos[r] + 1]] if a.overlap_next else [])
                ready = free_at[r]
                ok = True
                for g in group:
                    for d in s.deps(r, g):
                        if d[0] == r and d[1] in group:
                            continue
                        if d not in end:
                            ok = False
                            break
                        ready = max(ready, end[d] + (comm if d[0] != r else 0.0))
                    if not ok:
                        break
                if not ok:
                    break
                t = ready
                for g in group:
                    start[(r, g)] = t
                dur = sum(cost(r, g) for g in group)
                for g in group:
                    end[(r, g)] = t + dur
                free_at[r] = t + dur
                pos[r] += len(group)
                pending -= len(group)
                progressed = True
        if not progressed:
            raise ScheduleError(f"schedule {s.name} deadlocks")
    return start, end
