"""Schedule data model and registry: `Action`, `Schedule`, `ScheduleDef`, `register`, `make`.

Takes nothing from the rest of simtrain; the builders (basic, zero_bubble, dualpipe) import it and
register into `SCHEDULES`, `validate` and `csvio` read the `Schedule` it defines.

A schedule is a `Schedule`: for each pipeline rank the ordered actions it executes, which model
stage each of its chunks holds, and the route every microbatch takes through the model stages.

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
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable


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
    post_validation: bool = False   # training.optimizer_post_validation when the scenario leaves it out
    timed: bool = False     # the builder takes times=(T_F, T_B, T_W per stage) from the workload


SCHEDULES: dict = {}


def register(name: str, source: str, num_stages: Callable | None = None, check: Callable | None = None,
             default_vpp: int = 0, post_validation: bool = False, timed: bool = False) -> Callable:
    def deco(fn):
        SCHEDULES[name] = ScheduleDef(name, source, fn, num_stages or (lambda pp, vpp: pp),
                                      check or (lambda pp, m, vpp: []), default_vpp, post_validation, timed)
        return fn
    return deco


def forward_pass(s: Schedule) -> Schedule:
    """The schedule's forward actions alone, in the order each rank runs them: a forward-only pass
    over the batch (no B, W or BW; overlapped pairs lose their partner, so none is marked). The
    forwards keep their routes, so activations still move down the pipeline. Dropping actions
    from a deadlock-free schedule only removes waits, so the result is deadlock-free too."""
    acts = tuple(tuple(Action("F", a.microbatch, a.chunk) for a in row if a.kind == "F") for row in s.actions)
    return replace(s, actions=acts)


def simple_route(pp: int) -> tuple:
    return (tuple((r, 0) for r in range(pp)),)


def make(name: str, pp: int, m: int, actions: list, stage_of: tuple | None = None, routes: tuple | None = None,
         route_of: tuple | None = None) -> Schedule:
    """Builds a Schedule; defaults describe one chunk per rank and one straight route."""
    routes = routes or simple_route(pp)
    return Schedule(name=name, pp=pp, microbatches=m,
                    actions=tuple(tuple(a) for a in actions),
                    stage_of=stage_of or tuple((r,) for r in range(pp)),
                    routes=tuple(tuple(x) for x in routes),
                    route_of=tuple(route_of) if route_of is not None else (0,) * m)
