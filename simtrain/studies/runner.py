"""The factor runner shared by the studies: one base scenario file, a list of override sets, each
loaded and simulated on its own.

    for o in run_factors("S.yaml", [["parallel.tp=4"], ["parallel.tp=8"]]):
        o.result.step_time_s if o.ok else o.error

A set whose scenario does not load (a ConfigError from a bad combination) or does not simulate
(any SimtrainError) yields an outcome with its error and the next set goes on. Any other exception
is a bug of simtrain at that point: it too becomes the outcome's error (`internal` is true, the
message says so and names the point), so one bad point never loses the others; `check()` raises
the original exception, traceback and all, for callers with a single point. `compare` tabulates the outcomes, `sweep` stores them (in worker processes too:
`run_point` is one set), `search` simulates its chosen plans through it (plans it built itself,
`Point.scenario`), the reliability study loads and simulates its one scenario with it.
"""
from __future__ import annotations

import warnings
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
    exception: Exception | None = None
    path: str = ""

    @property
    def ok(self) -> bool:
        return self.exception is None

    @property
    def internal(self) -> bool:
        """The point failed on a bug (an exception that is not a SimtrainError)."""
        return self.exception is not None and not isinstance(self.exception, SimtrainError)

    @property
    def error(self) -> str | None:
        """The error's whole text (None when the point ran)."""
        if self.exception is None:
            return None
        return str(self.exception) if not self.internal else internal_error(self.path, self.overrides, self.exception)

    @property
    def result(self) -> StepResult | None:
        return self.run.result if self.run is not None else None

    def check(self) -> Outcome:
        """Raises the point's error, for callers that stop at the first one."""
        if self.exception is not None:
            raise self.exception
        return self


def internal_error(path: str | Path, overrides: Sequence[str], e: BaseException) -> str:
    """The one-line message of a point that failed on a bug rather than on its inputs."""
    first = (str(e).splitlines() or [""])[0]
    at = f" with {' '.join(overrides)}" if overrides else ""
    return (f"{path}: internal error{at}: {type(e).__name__}: {first}; "
            "this is a bug of simtrain, not of the scenario: please report it with the scenario file and these overrides")


def load_point(path: str | Path, point: Point | Sequence[str]) -> Outcome:
    """The point's scenario and topology, loaded (or as given), without simulating."""
    if not isinstance(point, Point):
        point = Point(list(point))
    o = Outcome(list(point.overrides), point.scenario, point.topology, path=str(path))
    if o.scenario is None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                o.scenario, o.topology = load_scenario(path, o.overrides)
            except Exception as e:     # a bug at one point must not stop the others (see `internal`)
                o.exception = e
        for w in caught:
            warnings.warn_explicit(variant_message(str(w.message), str(path), o.overrides), w.category,
                                   w.filename, w.lineno)
    return o


def variant_message(msg: str, path: str, overrides: Sequence[str]) -> str:
    """A loader warning about `path`, named after the point's overrides as well (a sweep or a
    comparison loads the file once per point, and the warning may hold for some points only).

    >>> variant_message("s.yaml: training.fp8_recipe ...", "s.yaml", ["training.precision=bf16"])
    's.yaml (--set training.precision=bf16): training.fp8_recipe ...'
    """
    if overrides and msg.startswith(f"{path}: "):
        return f"{path} ({' '.join('--set ' + x for x in overrides)}): " + msg[len(path) + 2:]
    return msg


def simulate_point(o: Outcome) -> Outcome:
    """Simulates a loaded point (nothing when it failed to load)."""
    if o.exception is None and o.run is None:
        try:
            o.run = simulate(o.scenario, o.topology)
        except Exception as e:         # a bug at one point must not stop the others (see `internal`)
            o.exception = e
    return o


def run_factors(path: str | Path, points: Iterable[Point | Sequence[str]]) -> Iterator[Outcome]:
    """Loads and simulates each override set (or Point) in turn; yields one Outcome per set, in order."""
    for point in points:
        yield simulate_point(load_point(path, point))
