"""Where the package's own data lives; the one place that says so.

- DATA: device presets, profiles, model and encoder presets, failure statistics (`simtrain/data`).
- TOPOLOGIES: the shipped fabric files. In a checkout they are the top-level `topologies/`
  folder; a wheel installs the same files as `simtrain/_topologies` (setup.py maps the folder).
- VALIDATION: the measured data the validation reports are computed on (vTrain iteration times,
  nccl-tests sweeps): `validation/data/` in a checkout, `simtrain/_validation` when installed.

Installed folders are found with importlib.resources, so an install anywhere (site-packages, a
user or prefix install) works the same as the editable checkout.
"""
from __future__ import annotations

import os
from importlib import resources as _resources
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parent                    # the checkout's root (site-packages when installed)


def _located(installed: str, checkout: str) -> Path:
    """The folder `installed` inside the installed package where there is one, else the checkout's
    folder `checkout` (which may not exist: callers then report the file they miss)."""
    inside = _resources.files(__package__) / installed
    if isinstance(inside, os.PathLike) and inside.is_dir():
        return Path(os.fspath(inside))
    return ROOT / checkout


DATA = PACKAGE / "data"
TOPOLOGIES = _located("_topologies", "topologies")
VALIDATION = _located("_validation", os.path.join("validation", "data"))
