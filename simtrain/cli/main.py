"""Command line: `simtrain run | compare | check | schedule | reliability | sweep | search | list | validate`.

Errors from any pipeline stage are printed as `<file>: <key.path>: <problem>; <fix>` lines without
a traceback, and the process exits with code 2. Output files are written atomically (temporary
file + rename), so an interrupted run leaves no half-written file behind.

    run.py      simtrain run (the step summary, --json, --out files)
    inspect.py  simtrain check, schedule, list
    imports.py  simtrain import (Megatron-LM, DeepSpeed, torchtitan, verl configs), simtrain export megatron
    study.py    simtrain compare; sweep, search, reliability and bench/calibrate are the `main`
                of their modules
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

from simtrain import __version__, progress
from simtrain.calibration import bench, fit
from simtrain.cli import export as export_cli
from simtrain.cli import imports as imports_cli
from simtrain.cli import schema as schema_cli
from simtrain.cli import validate
from simtrain.cli.inspect import cmd_check, cmd_list, cmd_schedule
from simtrain.cli.run import cmd_run
from simtrain.cli.study import cmd_compare
from simtrain.errors import SimtrainError
from simtrain.studies import search, sweep
from simtrain.studies.reliability import study as reliability_study


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="simtrain", description="Discrete-event simulator of large-model training clusters.")
    ap.add_argument("--version", action="version", version=f"simtrain {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="simulate one training step")
    r.add_argument("scenario")
    r.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help=SET_HELP)
    r.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    r.add_argument("--out", metavar="DIR", help="write result.json, scenario.resolved.yaml, trace.json, timeline.png, report.html")
    r.add_argument("--workload", metavar="chakra:DIR",
                   help="replay a Chakra execution trace (DIR or DIR/PREFIX of <prefix>.<rank>.et, ASTRA-sim's input) "
                        "instead of the scenario's model: the scenario gives the cluster, network and device")
    r.add_argument("--trace-durations", action="store_true",
                   help="with --workload: every compute node at its recorded duration, even where it gives num_ops")
    r.set_defaults(fn=cmd_run)
    cp = sub.add_parser("compare", help="simulate variants of a scenario (sweep keys with comma-separated values) and compare them")
    cp.add_argument("scenario")
    cp.add_argument("--set", action="append", metavar="KEY.PATH=V1,V2,...",
                    help="a value, or a comma-separated axis; keys joined by + move together (a+b=1+2,3+4), as in sweep "
                         "(repeatable: cartesian product)")
    cp.add_argument("--out", metavar="DIR", help="write compare.csv and compare.png")
    cp.set_defaults(fn=cmd_compare)
    sh = sub.add_parser("schedule", help="print the scenario's pipeline schedule per rank; export it as torchtitan CSV")
    sh.add_argument("scenario")
    sh.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help=SET_HELP)
    sh.add_argument("--csv", metavar="FILE", help="write the schedule in torchtitan's CSV action format")
    sh.set_defaults(fn=cmd_schedule)
    c = sub.add_parser("check", help="validate a scenario without simulating")
    c.add_argument("scenario")
    c.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help=SET_HELP)
    c.set_defaults(fn=cmd_check)
    b = sub.add_parser("bench", help="measure GEMMs, attention, memory-bound ops or collectives on this machine (needs torch)")
    b.add_argument("-o", "--out", type=Path, required=True, metavar="FILE", help="calibration file to write (YAML)")
    b.add_argument("--for", dest="for_scenario", metavar="SCENARIO", help="measure exactly the operator shapes this scenario runs")
    b.add_argument("--device", choices=("auto", "cuda", "mlu", "cpu"), default="auto")
    b.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    b.add_argument("--collectives", action="store_true",
                   help="measure collectives instead; start one process per device: torchrun --nproc_per_node N -m simtrain bench --collectives -o F")
    b.add_argument("--interference", action="store_true",
                   help="time a GEMM and a memory-bound op alone and with communication on another stream (CUDA; torchrun for a real collective)")
    b.add_argument("--min-bytes", type=int, default=2 ** 20)
    b.add_argument("--max-bytes", type=int, default=2 ** 30)
    b.add_argument("--warmup", type=int, default=5)
    b.add_argument("--reps", type=int, default=20)
    b.add_argument("--tiny", action="store_true", help="a grid of a few small shapes (seconds on a CPU; for testing the workflow)")
    b.add_argument("--quiet", action="store_true")
    b.set_defaults(fn=bench.main)
    cal = sub.add_parser("calibrate", help="turn bench files, nccl-tests logs and profiler traces into a device profile")
    cal.add_argument("files", nargs="+", metavar="FILE")
    cal.add_argument("--device", required=True, metavar="NAME", help="name of the profile (e.g. h100-mycluster)")
    cal.add_argument("--base", required=True, metavar="PRESET", help="the device preset it refines (simtrain list devices)")
    cal.add_argument("-o", "--out", type=Path, required=True, metavar="PROFILE.yaml")
    cal.set_defaults(fn=fit.main)
    for name in ("reliability", "goodput"):
        rl = sub.add_parser(name, help="failures, checkpoints and restarts of a long run: goodput with percentiles (Monte-Carlo)"
                            if name == "reliability" else "the same as `simtrain reliability`")
        rl.add_argument("scenario")
        rl.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a scenario value, e.g. reliability.spares.hot_nodes=8")
        span = rl.add_mutually_exclusive_group()
        span.add_argument("--days", type=float, metavar="N", help="wall-clock horizon in days (default: reliability.horizon, 30 days)")
        span.add_argument("--tokens", type=float, metavar="N", help="token budget instead: report the time to train")
        rl.add_argument("--trials", "--seeds", type=int, metavar="N", dest="trials", help="Monte-Carlo trials (default: reliability.trials)")
        rl.add_argument("--seed", type=int, help="base seed (default: reliability.seed, else the scenario's seed)")
        rl.add_argument("--jobs", type=int, default=1, metavar="N", help="worker processes (results do not depend on it)")
        rl.add_argument("--interval", metavar="TIME", help='checkpoint interval, e.g. "10 min" (default: Daly\'s optimum)')
        rl.add_argument("--sweep", action="store_true", help="sweep the checkpoint interval around Daly's optimum")
        rl.add_argument("--sweep-points", type=int, default=13, metavar="N", help="intervals in the sweep (geometric, 1/4x to 4x)")
        rl.add_argument("--what-if-spares", metavar="N1,N2,...", help="also run these hot-spare pool sizes")
        rl.add_argument("--what-if-methods", metavar="M1,M2,...", help="also run these checkpoint methods (sync, async, in_memory), each at its own optimum")
        rl.add_argument("--timeline-days", type=float, metavar="N", help="show only the first N days in timeline.png")
        rl.add_argument("--step-fault-rank", type=int, metavar="R", help="also fail rank R inside one step (trace: step_fault_trace.json)")
        rl.add_argument("--step-fault-at", metavar="TIME", help='when, into the step, e.g. "2.5 s" (default 0 s)')
        rl.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
        rl.add_argument("--out", metavar="DIR", help="write result.json, CSVs, figures and per-chunk trial files (a rerun resumes from them)")
        rl.set_defaults(fn=reliability_study.main)
    sw = sub.add_parser("sweep", help="simulate the cartesian product of overrides into a resumable SQLite store")
    sw.add_argument("scenario")
    sw.add_argument("--grid", action="append", metavar="KEY.PATH=V1,V2,...",
                    help="an axis of the grid; keys joined by + move together (a+b=1+2,3+4) (repeatable: cartesian product)")
    sw.add_argument("--set", action="append", metavar="KEY.PATH=VALUE",
                    help="an override in every point; with comma-separated values an axis, as in compare")
    sw.add_argument("--executor", choices=("serial", "process", "dask"), default="serial")
    sw.add_argument("--scheduler", metavar="tcp://HOST:PORT", help="the Dask scheduler (with --executor dask)")
    sw.add_argument("--workers", type=int, metavar="N", help="worker processes of --executor process (default: all cores)")
    sw.add_argument("--out", metavar="DIR", help="store directory (default ./<scenario>.sweep): sweep.sqlite, sweep.csv; a rerun resumes")
    sw.add_argument("--plot-x", metavar="KEY.PATH", help="also plot step time, MFU and US$/Mtok against this grid key (scaling.png)")
    sw.set_defaults(fn=sweep.main)
    se = sub.add_parser("search", help="find the best parallel plan: enumerate, prune (memory, closed form), simulate the best; "
                        "on a `job: rl` file the best placement, pool split, rollout tp and staleness")
    se.add_argument("scenario")
    se.add_argument("--objective", choices=("step_time", "tokens_per_s", "cost"), default="step_time",
                    help="cost: US$ per million tokens from the scenario's cost.price_per_device_hour")
    se.add_argument("--top", type=int, default=10, metavar="K", help="rows of the ranked table (default 10)")
    se.add_argument("--fix", action="append", metavar="KEY.PATH=VALUE", help="hold a plan axis (parallel.tp=8) or set any other key (repeatable)")
    se.add_argument("--set", action="append", metavar="KEY.PATH=VALUE",
                    help="override a scenario value for every plan, as in `run`; on a plan axis it holds the axis like --fix (repeatable)")
    se.add_argument("--max-candidates", type=int, default=20, metavar="N", help="plans simulated at event level after pruning (default 20)")
    se.add_argument("--nodes", metavar="N1,N2,...", help="also search over these cluster sizes (default: the scenario's)")
    se.add_argument("--schedules", metavar="S1,S2,...", help="pipeline schedules to try (default 1f1b,interleaved_1f1b)")
    se.add_argument("--max-mb", type=int, default=8, metavar="N", help="largest micro batch size tried (default 8)")
    se.add_argument("--zero", metavar="Z1,Z2,...", help="ZeRO stages to try (default 0,1)")
    se.add_argument("--memory-margin", type=float, default=search.MEMORY_MARGIN, metavar="FRACTION",
                    help="plans whose peak is within this share of the usable memory rank after plans with headroom "
                         f"(default {search.MEMORY_MARGIN:g}; 0: by the objective alone)")
    se.add_argument("--out", metavar="DIR", help="write best.yaml (ready to run), search.csv, search.png")
    se.add_argument("--json", action="store_true", help="`job: rl` files: print the search as one JSON object")
    se.set_defaults(fn=search.main)
    lst = sub.add_parser("list", help="list shipped devices, profiles, topologies, schedules, collectives, models")
    lst.add_argument("what", choices=("devices", "profiles", "topologies", "schedules", "collectives", "models"))
    lst.set_defaults(fn=cmd_list)
    schema_cli.add_parser(sub)
    imports_cli.register(sub)
    export_cli.add_parser(sub, SET_HELP)
    validate.register(sub)
    # every command that reads a scenario takes --set with one meaning (simtrain.spec.overrides)
    add_set_option(b, "override a key of the --for scenario, as in `run` (repeatable)")
    return ap


SET_HELP = "override a scenario value, e.g. parallel.tp=4 or cluster.topology.scale_out.oversubscription=2 (repeatable)"


def add_set_option(p: argparse.ArgumentParser, help: str = SET_HELP) -> None:
    """`--set KEY.PATH=VALUE` on `p`, unless it has one already."""
    if "--set" not in p._option_string_actions:
        p.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help=help)


def _show_warning(message: Warning | str, category: type, filename: str, lineno: int, file: object = None,
                  line: str | None = None) -> None:
    """A warning as one `warning: ...` line on stderr, without the source line Python would print."""
    print(f"warning: {message}", file=sys.stderr)


def _earlier_output(out) -> str:
    """A note for a failed command whose output directory already holds files: nothing of this
    run was written there, so what it holds is an earlier run's (its run_info.json or report
    says which)."""
    try:
        p = Path(out) if isinstance(out, (str, Path)) and out else None
        if p is None or not p.is_dir() or not any(p.iterdir()):
            return ""
    except OSError:
        return ""
    named = next((f for f in ("run_info.json", "report.md", "report.html") if (p / f).is_file()), "")
    which = f" ({named} there names that run)" if named else ""
    return f"  nothing was written: {p}/ keeps the files of an earlier run{which}"


def main(argv: list[str] | None = None) -> int:
    warnings.showwarning = _show_warning
    args = build_parser().parse_args(argv)
    args.command_line = " ".join(["simtrain"] + list(sys.argv[1:] if argv is None else argv))
    # one JSON object on stdout and nothing else drawn: no progress bars under --json
    progress.set_enabled(not getattr(args, "json", False))
    try:
        return args.fn(args)
    except SimtrainError as e:
        print(str(e), file=sys.stderr)
        kept = _earlier_output(getattr(args, "out", None))
        if kept and str(args.out).rstrip("/") not in str(e):       # an error about the output path says it itself
            print(kept, file=sys.stderr)
        return 2
    except BrokenPipeError:
        # output piped into e.g. `head`, which closed early: not an error of the run
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except KeyboardInterrupt:
        print("interrupted; files already written are complete, nothing half-written was left", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
