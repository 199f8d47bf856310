"""Pipeline schedules (fourth pipeline stage): per-rank ordered lists of actions, as data.

Takes the parallel spec (pp, vpp, schedule name or CSV) and the microbatch count; returns a
validated `Schedule`. The lowering and the engine execute that data and never branch on a
schedule's name; adding a schedule is one builder function and one `@register` decorator.

  registry     Action, Schedule, ScheduleDef, the SCHEDULES registry, `register`, `make`,
               `forward_pass` (a schedule's forwards alone)
  validate     `validate` (complete, consistent, deadlock-free), `order_execution`, `timed_execution`
  basic        GPipe, 1F1B, interleaved 1F1B
  zero_bubble  ZB-H1, ZB-H2, ZB-V
  zb_auto      ZB-1p, ZB-2p: the heuristic search over profiled times under a memory limit
  dualpipe     DualPipe, DualPipeV
  csvio        torch.distributed.pipelining / torchtitan CSV import and export

This package imports its modules; none of them imports the package back.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from simtrain.errors import ScheduleError
from simtrain.schedules import basic, dualpipe, zb_auto, zero_bubble  # noqa: F401  (the shipped schedules register on import)
from simtrain.schedules.csvio import read_csv
from simtrain.schedules.registry import SCHEDULES, Action, Schedule, ScheduleDef, forward_pass, make, register, simple_route
from simtrain.schedules.validate import order_execution, timed_execution, validate

if TYPE_CHECKING:
    from simtrain.spec.scenario import ParallelSpec

__all__ = ["SCHEDULES", "Action", "Schedule", "ScheduleDef", "build_schedule", "forward_pass", "make", "order_execution", "register",
           "schedule_for", "simple_route", "timed_execution", "validate"]


def build_schedule(name: str, pp: int, m: int, vpp: int = 1, times: tuple | None = None) -> Schedule:
    """The registered schedule `name` for pp ranks and m microbatches, checked and validated.
    `times`: per model stage (T_F, T_B, T_W) seconds, for the builders that search over them
    (`ScheduleDef.timed`); the others ignore it."""
    d = SCHEDULES[name]
    problems = d.check(pp, m, vpp)
    if problems:
        raise ScheduleError("; ".join(f"{k}: {p}; {f}" for k, p, f in problems))
    sched = d.build(pp, m, vpp, times=times) if d.timed and times is not None else d.build(pp, m, vpp)
    validate(sched)
    return sched


def schedule_for(parallel: ParallelSpec, m: int, times: tuple | None = None) -> Schedule:
    """The scenario's schedule: a registered builder (given the stages' action times where it
    searches over them), or the CSV file it names."""
    if parallel.schedule_csv:
        return read_csv(parallel.schedule_csv)
    return build_schedule(parallel.schedule, parallel.pp, m, parallel.vpp, times)
