"""The factor runner shared by the studies: one base scenario file, a list of override sets, each
loaded and simulated on its own.

    for o in run_factors("S.yaml", [["parallel.tp=4"], ["parallel.tp=8"]]):
        o.result.step_time_s if o.ok else o.error

A set whose scenario does not load (a ConfigError from a bad combination) or does not simulate
(any SimtrainError) yields an outcome with its error and the next set goes on; anything else is a
bug and raises. `compare` tabulates the outcomes, `sweep` stores them (in worker processes too:
`run_point` is one set), `search` simulates its chosen plans through it (plans it built itself,
`Point.scenario`), the reliability study loads and simulates its one scenario with it.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from simtrain.errors import SimtrainError
from simtrain.hardware.topology import Topology
from simtrain.results.step import StepResult
from simtrain.simulate import StepRun, simulate
from simtrain.spec.loading import load_scenario
from simtrain.spec.scenario import Scenario


@dataclass
class Point:
    """One override set; `scenario` and `topology` when the caller already built them."""
    overrides: list = field(default_factory=list)
    scenario: Scenario | None = None
    topology: Topology | None = None


@dataclass
class Outcome:
    overrides: list
    scenario: Scenario | None = None
    topology: Topology | None = None
    run: StepRun | None = None
    exception: SimtrainError | None = None

    @property
    def ok(self) -> bool:
        return self.exception is None

    @property
    def error(self) -> str | None:
        """The error's whole text (None when the point ran)."""
        return None if self.exception is None else str(self.exception)

    @property
    def result(self) -> StepResult | None:
        return self.run.result if self.run is not None else None

    def check(self) -> Outcome:
        """Raises the point's error, for callers that stop at the first one."""
        if self.exception is not None:
            raise self.exception
        return self


def load_point(path: str | Path, point: Point | Sequence[str]) -> Outcome:
    """The point's scenario and topology, loaded (or as given), without simulating."""
    if not isinstance(point, Point):
        point = Point(list(point))
    o = Outcome(list(point.overrides), point.scenario, point.topology)
    if o.scenario is None:
        try:
            o.scenario, o.topology = load_scenario(path, o.overrides)
        except SimtrainError as e:
            o.exception = e
    return o


def simulate_point(o: Outcome) -> Outcome:
    """Simulates a loaded point (nothing when it failed to load)."""
    if o.exception is None and o.run is None:
        try:
            o.run = simulate(o.scenario, o.topology)
        except SimtrainError as e:
            o.exception = e
    return o


def run_factors(path: str | Path, points: Iterable[Point | Sequence[str]]) -> Iterator[Outcome]:
    """Loads and simulates each override set (or Point) in turn; yields one Outcome per set, in order."""
    for point in points:
        yield simulate_point(load_point(path, point))
