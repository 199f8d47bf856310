"""Prediction error against measured Megatron-DeepSpeed iteration times on A100 clusters (vTrain):
the same as `simtrain validate vtrain` (simtrain/studies/validate.py; data in validation/data/vtrain).

    python benchmarks/vtrain_validation.py [--set multi|single|both] [--profile NAME|none] [--table] [--limit N] [--csv OUT.csv]

`evaluate` and `DATA` stay importable for benchmarks/fit_op_overhead.py.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simtrain.cli.main import main as simtrain  # noqa: E402
from simtrain.studies.validate import VTRAIN as DATA  # noqa: E402,F401
from simtrain.studies.validate import evaluate_vtrain as evaluate  # noqa: E402,F401
from simtrain.studies.validate import vtrain_rows as rows  # noqa: E402,F401
from simtrain.studies.validate import vtrain_scenario as scenario  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(simtrain(["validate", "vtrain", *sys.argv[1:]]))
