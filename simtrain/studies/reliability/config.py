"""The scenario's `reliability:` section, for the reliability study.

The section is part of the scenario file format: its keys are declared and checked in
`simtrain.spec.reliability` (every `load_scenario` checks it with the rest of the scenario);
this module gives the study its spec, with `--set reliability.x=...` overrides applied.
"""
from __future__ import annotations

from pathlib import Path

from simtrain.errors import Collector, ConfigError
from simtrain.spec.files import load_yaml
from simtrain.spec.loading import apply_overrides, attribute_overrides
from simtrain.spec.reliability import (
    ACTIONS,
    DETECTIONS,
    DISTRIBUTIONS,
    METHODS,
    PER,
    RELIABILITY,
    Category,
    CheckpointSpec,
    FailureSpec,
    RecoverySpec,
    ReliabilitySpec,
    SparesSpec,
    defaults,
    parse_section,
    scenario_seed,
)
from simtrain.units import parse_duration

__all__ = ["ACTIONS", "Category", "CheckpointSpec", "DETECTIONS", "DISTRIBUTIONS", "FailureSpec", "METHODS", "PER",
           "RELIABILITY", "RecoverySpec", "ReliabilitySpec", "SparesSpec", "defaults", "load_spec", "parse_duration",
           "parse_section"]


def load_spec(path: str | Path, overrides: tuple | list = ()) -> ReliabilitySpec:
    """The reliability section of a scenario file (with `--set reliability.x=...` overrides applied)."""
    path = Path(path)
    errs = Collector(str(path))
    raw = load_yaml(path, errs, "give a scenario file")
    raw = apply_overrides(raw, overrides, errs)
    spec = parse_section(raw.get("reliability"), errs, scenario_seed(raw))
    try:
        errs.raise_if_any()
    except ConfigError as e:
        raise attribute_overrides(e, str(path), overrides) from None
    return spec
