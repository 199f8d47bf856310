"""Prediction error against published H100 pre-training throughput (torchtitan, Megatron-Bridge):
the same as `simtrain validate h100` (simtrain/studies/validate.py; data in validation/data/h100).

    python benchmarks/h100_validation.py [--table] [--profile NAME|none] [--csv OUT.csv] [--set KEY.PATH=VALUE]
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simtrain.cli.main import main as simtrain  # noqa: E402

if __name__ == "__main__":
    sys.exit(simtrain(["validate", "h100", *sys.argv[1:]]))
