"""`simtrain validate vtrain | h100 | busbw`: the subcommand's arguments (the work: simtrain.studies.validate)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from simtrain.studies.validate import main

if TYPE_CHECKING:
    import argparse


def register(sub: argparse._SubParsersAction) -> None:
    """Adds `validate` to the subparsers `sub` of the simtrain command line."""
    v = sub.add_parser("validate", help="the simulator against the measurements kept in the project (vTrain iteration times, H100 throughput, nccl-tests busbw)")
    what = v.add_subparsers(dest="what", required=True, metavar="vtrain|h100|busbw")
    vt = what.add_parser("vtrain", help="MAPE on vTrain's measured Megatron-DeepSpeed iteration times (A100)")
    vt.add_argument("--runs", choices=("multi", "single", "both"), default="multi",
                    help="multi: 109 runs on 64-512 GPUs (default); single: 1,440 runs on one node")
    vt.add_argument("--set", action="append", metavar="KEY.PATH=VALUE",
                    help="override a key of every run's scenario, as in `run` (e.g. network.protocol=Simple; repeatable)")
    vt.add_argument("--table", action="store_true", help="also print every run: measured, predicted, error")
    vt.add_argument("--profile", default="a100-megatron-deepspeed", metavar="NAME|FILE",
                    help="device profile (a shipped name or a file; none: the bare preset)")
    vt.add_argument("--limit", type=int, metavar="N", help="only the first N runs of each set")
    vt.add_argument("--csv", metavar="FILE", help="also write every run to a CSV file")
    vt.set_defaults(fn=main)
    h = what.add_parser("h100", help="error on published H100 pre-training throughput (torchtitan, Megatron-Bridge; a development set)")
    h.add_argument("--set", action="append", metavar="KEY.PATH=VALUE",
                   help="override a key of every run's scenario, as in `run` (repeatable)")
    h.add_argument("--table", action="store_true", help="also print every run: GPUs, measured, predicted, signed error")
    h.add_argument("--profile", default="h100-public", metavar="NAME|FILE",
                   help="device profile (a shipped name or a file; none: the bare preset)")
    h.add_argument("--csv", metavar="FILE", help="also write every run to a CSV file")
    h.set_defaults(fn=main)
    bb = what.add_parser("busbw", help="predicted against measured nccl-tests bus bandwidth, per size and sweep")
    bb.add_argument("--fit", nargs=2, metavar=("KEY[,KEY]", "SWEEP"),
                    help="the values of one or two topology `collectives` keys (network_step_latency, nvls_chunk_cost) "
                         "that fit one sweep best, and the errors they give on the others")
    bb.set_defaults(fn=main)
