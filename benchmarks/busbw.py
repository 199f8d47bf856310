"""Predicted against measured nccl-tests bus bandwidth: the same as `simtrain validate busbw`
(simtrain/studies/validate.py; data in validation/data/nccl-tests).

    python benchmarks/busbw.py                      # every sweep with a shipped topology, both backends
    python benchmarks/busbw.py --fit network_step_latency nccl_vp_h100_4node_allreduce
    python benchmarks/busbw.py --fit nvls_chunk_cost nccl_vp_h100_1node_allreduce
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simtrain.cli.main import main as simtrain  # noqa: E402

if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "--fit-network-step":
        args = ["--fit", "network_step_latency", args[1]]
    sys.exit(simtrain(["validate", "busbw", *args]))
