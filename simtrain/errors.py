"""Error hierarchy shared by every pipeline stage.

Every user-facing error reads `<file>: <key.path>: <what is wrong>; <how to fix>`. Loaders collect
all problems of a file and raise them together; the CLI prints them without a traceback and exits 2.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    file: str
    path: str
    problem: str
    fix: str

    def __str__(self) -> str:
        where = f"{self.file}: {self.path}" if self.path else self.file
        return f"{where}: {self.problem}; {self.fix}"


class SimtrainError(Exception):
    """Base of all errors simtrain reports to a user."""


class ConfigError(SimtrainError):
    """One or more problems in an input file; `problems` lists every one of them."""

    def __init__(self, problems: list) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class ScheduleError(SimtrainError):
    """A pipeline schedule is invalid (missing/duplicate actions, broken dependencies, deadlock)."""


class SimulationError(SimtrainError):
    """The engine could not finish the step."""


class DeadlockError(SimulationError):
    """The event queue drained while rank programs still had ops waiting."""


class Collector:
    """Gathers problems of one file so they can all be reported together."""

    def __init__(self, file: str):
        self.file = file
        self.problems: list[Problem] = []

    def add(self, path: str, problem: str, fix: str) -> None:
        self.problems.append(Problem(self.file, path, problem, fix))

    def extend(self, other: "Collector") -> None:
        self.problems.extend(other.problems)

    def raise_if_any(self, cls: type[ConfigError] = ConfigError) -> None:
        if self.problems:
            raise cls(self.problems)
