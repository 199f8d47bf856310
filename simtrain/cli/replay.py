"""`simtrain run SCENARIO --workload chakra:DIR`: replay a Chakra execution trace on the scenario's
cluster (simtrain.replay); a summary, `--json`, or the files of `--out`."""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from simtrain import __version__
from simtrain.errors import ConfigError, Problem
from simtrain.hardware.topology import Topology
from simtrain.program.chakra import Trace, rank_files
from simtrain.replay import ReplayRun, replay_chakra
from simtrain.results.io import check_out_dir, staged_dir, to_json, write_atomic
from simtrain.results.report import write_report
from simtrain.results.trace import replay_trace
from simtrain.spec.scenario import Scenario
from simtrain.units import fmt_size, fmt_time

OUT_FILES = ("result.json", "trace.json", "run_info.json", "report.html")
WORKLOADS = ("chakra",)


def workload_source(spec: str) -> tuple[str, str]:
    """('chakra', path) of `--workload chakra:PATH`; a ConfigError for anything else."""
    kind, sep, path = spec.partition(":")
    if not sep or kind not in WORKLOADS or not path:
        raise ConfigError([Problem("--workload", "", f"{spec!r} is not a workload source",
                                   "give chakra:DIR (a directory of <prefix>.<rank>.et Chakra traces) or chakra:DIR/PREFIX")])
    return kind, path


def ranks_line(t: Trace) -> str:
    """How many ranks were read, from which files; where nothing in the trace (no comm_group.json,
    no send or receive) names a rank, a missing last file cannot be told from a smaller job, and
    the line says so."""
    line = f"replayed {t.world} ranks from {rank_files(t)}"
    if not t.groups and not any(x.type in ("send", "recv") for nodes in t.ranks for x in nodes):
        line += f" (nothing in the trace names a rank: check the job had {t.world})"
    return line


def summary(run: ReplayRun) -> str:
    r = run.result
    step = r.step_time_s
    cf = r.compute_from
    lines = [
        f"simtrain {__version__} — Chakra trace {r.trace} ({r.prefix}.<rank>.et, {r.ranks} ranks) on {r.topology}, "
        f"{r.device}, {r.network_backend} network",
        "  nodes              " + ", ".join(f"{v:,} {k}" for k, v in r.nodes.items()),
        "  ranks              " + ranks_line(run.trace),
        f"  compute nodes      {cf['trace_duration']:,} at their recorded duration, {cf['cost_model']:,} by the cost model",
        "",
        f"  step time          {fmt_time(step)}",
        "",
        f"  where the step goes (rank {r.busiest_rank}, the most compute):",
    ]
    for k, v in (("compute", r.compute_s), ("exposed comm", r.exposed_comm_s), ("idle", r.idle_s)):
        lines.append(f"    {k:<16} {fmt_time(v):>10}  {100 * v / step if step > 0 else 0.0:5.1f} %")
    if r.collectives:
        lines += ["", "  collectives (each distinct one):"]
        for c in r.collectives[:12]:
            lines.append(f"    {c.collective:<15} {fmt_size(c.nbytes):>10} over {c.group_size:>5} ranks  "
                         f"{c.algorithm}/{c.protocol}  {fmt_time(c.seconds)}")
        if len(r.collectives) > 12:
            lines.append(f"    ... {len(r.collectives) - 12} more in --json / result.json")
    if r.coverage:
        lines += ["", "  coverage notes (costs not backed by a direct measurement):"]
        lines += [f"    - {c}" for c in r.coverage]
    lines += ["", f"  simulated {r.ranks} ranks, {r.simulated_ops:,} ops in {run.wall_s:.2f} s wall"]
    return "\n".join(lines)


def cmd_run_chakra(args: argparse.Namespace, sc: Scenario, topo: Topology) -> int:
    _, path = workload_source(args.workload)
    if args.out:
        check_out_dir(args.out, "--out", OUT_FILES)
    run = replay_chakra(path, sc, topo, trace_durations=args.trace_durations)
    r = run.result
    if args.out:
        with staged_dir(args.out) as out:
            write_atomic(out / "result.json", to_json(r).encode())
            write_atomic(out / "trace.json", json.dumps(replay_trace(run.ops, run.timeline, run.trace.world, run.topology, run.result.trace)).encode())
            write_atomic(out / "run_info.json", to_json({
                "simtrain_version": __version__, "python": platform.python_version(), "sim_wall_s": run.wall_s,
                "scenario_file": str(args.scenario), "workload": args.workload, "overrides": list(args.set or ()),
                "trace_durations": bool(args.trace_durations)}).encode())
            write_report(out, "replay", f"{Path(path).name}: replayed step {fmt_time(r.step_time_s)}",
                         [("trace", str(path)), ("cluster from", str(args.scenario)),
                          ("overrides", " ".join(args.set or ()) or "none")])
    if args.json:
        d = r.to_dict()
        d["sim_wall_s"] = run.wall_s
        sys.stdout.write(json.dumps(d) + "\n")
    else:
        print(summary(run))
        if args.out:
            print(f"\n  wrote {Path(args.out)}/: {' '.join(OUT_FILES)}")
    return 0
