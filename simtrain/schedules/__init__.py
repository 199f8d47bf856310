"""Pipeline schedules (fourth pipeline stage): per-rank ordered lists of actions, as data.

A schedule is a `Schedule`: for each pipeline rank the ordered actions it executes, which model
stage each of its chunks holds, and the route every microbatch takes through the model stages.
The lowering and the engine execute that data and never branch on a schedule's name; adding a
schedule is one builder function and one `@register` decorator.

Vocabulary (Megatron / zero-bubble / torchtitan):
  action     F (forward), B (input-gradient backward), W (weight-gradient backward) or BW (both,
             fused), of one microbatch on one model chunk of a rank
  chunk      a model chunk held by a rank (interleaved schedules hold v chunks, V-shapes 2)
  stage      a model stage: a contiguous run of layers; stage 0 has the embedding, the last the
             LM head. `stage_of[rank][chunk]` says which stage a chunk holds.
  route      the (rank, chunk) positions a microbatch visits in forward order, one per model
             stage. 1F1B: ((0,0),(1,0),...); V-shape: down the ranks on chunk 0 and back up on
             chunk 1; DualPipe: two routes in opposite directions.
  overlap    `Action.overlap_next` marks an action that runs overlapped with the next action in the
             list (DualPipe's forward/backward pair: one's communication under the other's compute)

Dependencies implied by the data (position k of a microbatch's route, S stages):
  F(k)      needs F(k-1)                                      (activation from the previous stage)
  B(k), BW  needs F(k) and B/BW(k+1)                          (gradient from the next stage)
  W(k)      needs B(k)                                        (the output gradient B computed)

`validate` checks that every microbatch has, at every position of its route, exactly one F and
either one BW or one B and one W, on the rank and chunk the route names, and that executing the
per-rank lists in order with those dependencies finishes (an overlapped pair starts when both
actions may start). Rules that need no simulation (e.g. interleaving's microbatch count) are
`ScheduleDef.check`, run when the scenario is loaded.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from simtrain.errors import ScheduleError


@dataclass(frozen=True)
class Action:
    kind: str              # F | B | W | BW
    microbatch: int
    chunk: int = 0
    overlap_next: bool = field(default=False, compare=False)   # identity is (kind, microbatch, chunk)

    def __str__(self) -> str:
        return f"{self.chunk}{self.kind}{self.microbatch}" + ("&" if self.overlap_next else "")


@dataclass(frozen=True)
class Schedule:
    name: str
    pp: int
    microbatches: int
    actions: tuple          # per rank: tuple[Action, ...]
    stage_of: tuple         # per rank: tuple of model-stage indices, one per chunk
    routes: tuple           # tuple of routes; a route is a tuple of (rank, chunk), one per stage
    route_of: tuple         # per microbatch: index into routes

    @property
    def num_stages(self) -> int:
        return len(self.routes[0])

    @property
    def chunks(self) -> int:
        return len(self.stage_of[0])

    @property
    def duplicated_stages(self) -> bool:
        """True when two chunks of different ranks hold the same model stage (DualPipe: rank r
        and rank pp-1-r hold the same pair of stages)."""
        held = [st for row in self.stage_of for st in row]
        return len(held) != len(set(held))

    @property
    def split_backward(self) -> bool:
        return any(a.kind == "W" for acts in self.actions for a in acts)

    def route(self, mb: int) -> tuple:
        return self.routes[self.route_of[mb]]

    def position(self, rank: int, chunk: int, mb: int) -> int:
        """Index of (rank, chunk) on microbatch mb's route."""
        return self.route(mb).index((rank, chunk))

    def deps(self, rank: int, a: Action) -> tuple:
        """(rank, Action) pairs that must finish before `a` may start on `rank`."""
        r = self.route(a.microbatch)
        k = r.index((rank, a.chunk))
        mb = a.microbatch
        if a.kind == "F":
            if k == 0:
                return ()
            pr, pc = r[k - 1]
            return ((pr, Action("F", mb, pc)),)
        if a.kind == "W":
            return ((rank, Action("B", mb, a.chunk)),)
        out = [(rank, Action("F", mb, a.chunk))]
        if k < len(r) - 1:
            nr, nc = r[k + 1]
            out.append((nr, Action(self.backward_kind(nr, nc, mb), mb, nc)))
        return tuple(out)

    def backward_kind(self, rank: int, chunk: int, mb: int) -> str:
        """'B' if that position's backward is split (a W follows), else 'BW'."""
        return "B" if (rank, chunk, mb) in self._split_positions() else "BW"

    def _split_positions(self) -> frozenset:
        cache = self.__dict__.get("_split_cache")
        if cache is None:
            cache = frozenset((r, a.chunk, a.microbatch) for r, acts in enumerate(self.actions) for a in acts if a.kind == "W")
            object.__setattr__(self, "_split_cache", cache)
        return cache

    def table(self) -> str:
        """One line per rank, actions separated by spaces (for error messages and the CLI)."""
        return "\n".join(f"rank {r}: " + " ".join(str(a) for a in acts) for r, acts in enumerate(self.actions))


@dataclass(frozen=True)
class ScheduleDef:
    name: str
    source: str
    build: Callable         # (pp, m, vpp) -> Schedule
    num_stages: Callable    # (pp, vpp) -> number of model stages
    check: Callable         # (pp, m, vpp) -> list of (key path, problem, fix); empty when fine
    default_vpp: int = 0    # 0: the schedule takes no vpp; else the chunks per rank when vpp is not given


SCHEDULES: dict = {}


def register(name: str, source: str, num_stages=None, check=None, default_vpp: int = 0):
    def deco(fn):
        SCHEDULES[name] = ScheduleDef(name, source, fn, num_stages or (lambda pp, vpp: pp),
                                      check or (lambda pp, m, vpp: []), default_vpp)
        return fn
    return deco


def simple_route(pp: int) -> tuple:
    return (tuple((r, 0) for r in range(pp)),)


def make(name: str, pp: int, m: int, actions, stage_of=None, routes=None, route_of=None) -> Schedule:
    """Builds a Schedule; defaults describe one chunk per rank and one straight route."""
    routes = routes or simple_route(pp)
    return Schedule(name=name, pp=pp, microbatches=m,
                    actions=tuple(tuple(a) for a in actions),
                    stage_of=stage_of or tuple((r,) for r in range(pp)),
                    routes=tuple(tuple(x) for x in routes),
                    route_of=tuple(route_of) if route_of is not None else (0,) * m)


def build_schedule(name: str, pp: int, m: int, vpp: int = 1) -> Schedule:
    d = SCHEDULES[name]
    problems = d.check(pp, m, vpp)
    if problems:
        raise ScheduleError("; ".join(f"{k}: {p}; {f}" for k, p, f in problems))
    sched = d.build(pp, m, vpp)
    validate(sched)
    return sched


def schedule_for(parallel, m: int) -> Schedule:
    """The scenario's schedule: a registered builder, or the CSV file it names."""
    if parallel.schedule_csv:
        from simtrain.schedules.csvio import read_csv
        return read_csv(parallel.schedule_csv)
    return build_schedule(parallel.schedule, parallel.pp, m, parallel.vpp)


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


# the shipped schedules register themselves on import
from simtrain.schedules import basic, dualpipe, zero_bubble  # noqa: E402,F401
