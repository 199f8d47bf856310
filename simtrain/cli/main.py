"""Command line: `simtrain run | compare | check | schedule | reliability | sweep | search | list`.

Errors from any pipeline stage are printed as `<file>: <key.path>: <problem>; <fix>` lines without
a traceback, and the process exits with code 2. Output files are written atomically (temporary
file + rename), so an interrupted run leaves no half-written file behind.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import yaml

from simtrain import __version__
from simtrain.cli import schema as schema_cli
from simtrain.errors import SimtrainError
from simtrain.units import fmt_bytes, fmt_time


def _load(args):
    from simtrain.spec.loading import load_scenario
    return load_scenario(args.scenario, args.set or ())


def _summary(r: dict, wall: float) -> str:
    b = r["breakdown"]
    lines = [
        f"simtrain {__version__} — {r['scenario']}: {r['num_devices']} x {r['device']} ({r['precision']}), "
        f"{r['num_microbatches']} microbatches per step",
        "",
        f"  step time          {fmt_time(r['step_time_s'])}",
        f"  tokens/s           {r['tokens_per_s']:,.0f}",
        f"  MFU                {100 * r['mfu']:.1f} %   (HFU {100 * r['hfu']:.1f} %, incl. recompute)",
        f"  model FLOPs/step   {r['model_flops_per_step']:.3e}",
        f"  pipeline bubble    {100 * r['bubble_fraction']:.1f} % of device time",
        f"  peak memory        {fmt_bytes(r['peak_memory_bytes'])} of {fmt_bytes(r['memory_capacity_bytes'])}"
        + ("" if r["fits_in_memory"] else f"  DOES NOT FIT: {fmt_bytes(r['memory_shortfall_bytes'])} short"),
        "",
        f"  where the step goes (rank {b['rank']}, stage {b['stage']}, the busiest):",
        f"    compute          {fmt_time(b['compute_s']):>10}  {100 * b['compute_s'] / r['step_time_s']:5.1f} %",
        f"    bubble           {fmt_time(b['bubble_s']):>10}  {100 * b['bubble_s'] / r['step_time_s']:5.1f} %",
    ]
    for k, v in b["exposed_comm_s"].items():
        if v > 0 or k in ("tp", "pp", "dp"):         # cp / ep only where the plan has them
            lines.append(f"    exposed {k} comm  {fmt_time(v):>10}  {100 * v / r['step_time_s']:5.1f} %")
    if "moe" in r:
        m = r["moe"]
        lines += ["", f"  experts: {m['num_experts']} (top-{m['top_k']}) over ep {m['ep']}, routing {m['routing']}; busiest ep rank "
                      f"{m['imbalance_max']:.2f} x the mean, {100 * m['dropped_fraction_mean']:.1f} % of assignments dropped"]
    if "context_parallel" in r:
        c = r["context_parallel"]
        lines += ["", f"  context parallel: cp {c['cp']} ({c['cp_kind']}), {c['tokens_per_rank']:,.0f} tokens per rank"]
    if "stragglers" in r:
        st = r["stragglers"]
        lines += ["", f"  stragglers: {st['count']} devices; without them the step takes {fmt_time(st['step_time_without_s'])} "
                      f"(x{st['slowdown']:.3f} with them)"]
        for x in st["critical_path"][:3]:
            lines.append(f"    on the critical path: rank {x['representative_rank']} (stage {x['stage']}, {x['device']}"
                         f"{', with a straggler' if x['straggler'] else ''}) for {fmt_time(x['seconds'])}")
    lines += ["", "  memory per stage (GiB):  weights  grads  optim  activ  buffers  total  in-flight"]
    for m in r["memory"]:
        g = 2.0**30
        lines.append(f"    stage {m['stage']:<3}             {m['weights'] / g:7.2f} {m['gradients'] / g:6.2f} {m['optimizer'] / g:6.2f} "
                     f"{m['activations'] / g:6.2f} {m['communication_buffers'] / g:8.2f} {m['total'] / g:6.2f}  {m['inflight_microbatches_peak']:>5}")
    if r["coverage"]:
        lines += ["", "  coverage notes (costs not backed by a direct measurement):"]
        lines += [f"    - {c}" for c in r["coverage"]]
    lines += ["", f"  simulated {r['simulated_classes']} rank classes, {r['simulated_ops']:,} ops in {wall:.2f} s wall"]
    return "\n".join(lines)


def cmd_run(args) -> int:
    from simtrain.results.figures import timeline_png
    from simtrain.results.io import to_json, write_atomic
    from simtrain.results.trace import chrome_trace
    from simtrain.simulate import simulate
    sc, topo = _load(args)
    run = simulate(sc, topo)
    r = run.result
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / "result.json", to_json(r).encode())
        write_atomic(out / "scenario.resolved.yaml", yaml.safe_dump(sc.resolved(), sort_keys=False).encode())
        write_atomic(out / "trace.json", json.dumps(chrome_trace(run.ops, run.timeline, run.classes, topo, run.link_series)).encode())
        timeline_png(run.ops, run.timeline, run.classes, out / "timeline.png", f"{sc.name}: step {fmt_time(r['step_time_s'])}")
        write_atomic(out / "run_info.json", to_json({
            "simtrain_version": __version__, "python": platform.python_version(),
            "sim_wall_s": run.wall_s, "scenario_file": str(args.scenario), "overrides": list(args.set or ()),
        }).encode())
    if args.json:
        d = dict(r)
        d["sim_wall_s"] = run.wall_s
        sys.stdout.write(json.dumps(d) + "\n")
    else:
        print(_summary(r, run.wall_s))
        if args.out:
            print(f"\n  wrote {args.out}/: result.json scenario.resolved.yaml trace.json timeline.png run_info.json")
    return 0


def cmd_check(args) -> int:
    from simtrain.hardware.devices import device_of
    from simtrain.schedules import schedule_for
    from simtrain.simulate import comm_buffers, static_memory
    from simtrain.workload.build import build_workload
    sc, topo = _load(args)
    p = sc.parallel
    sched = schedule_for(p, sc.num_microbatches)
    work = build_workload(sc, sched.num_stages)
    dev = device_of(sc.cluster)
    lp = work[0].layer_params
    print(f"{args.scenario}: ok")
    print(f"  model {sc.model.name} ({sc.model.architecture}), {sc.world_size} ranks = tp {p.tp} x cp {p.cp} x dp {p.dp} x pp {p.pp}, "
          f"{sc.num_microbatches} microbatches, schedule {p.schedule}")
    print(f"  topology {topo.name}: {topo.describe()}")
    print("  static memory per rank (weights + gradients + optimizer + buffers, before activations):")
    worst = 0.0
    for r, held in enumerate(sched.stage_of):
        st = static_memory(sc, sum(work[k].params for k in held), sum(work[k].expert_params for k in held))
        tot = sum(st.values()) + comm_buffers(sc, lp)
        worst = max(worst, tot)
        layers = " + ".join(str(work[k].num_layers) for k in held)
        chunks = f" (model stages {', '.join(map(str, held))})" if len(held) > 1 else ""
        print(f"    pipeline rank {r}: {layers} layers{chunks}, {fmt_bytes(tot)}")
    if worst > dev.memory_bytes:
        print(f"  warning: static memory alone exceeds the {fmt_bytes(dev.memory_bytes)} of {dev.key}")
    from simtrain.plan.grid import RankGrid, placement_of
    grid = RankGrid(p.tp, p.cp, p.dp, p.pp)
    place = placement_of(sc, grid, topo)
    crossing = [g for g in grid.groups("tp") if len({topo.node_of(place[r]) for r in g}) > 1]
    print(f"  placement {p.placement if p.device_of_rank is None else 'explicit (device_of_rank)'}")
    if crossing:
        # a "node" is a scale-up domain: one server, or e.g. a GB200 NVL72 rack of 18 trays
        g = crossing[0]
        nodes = sorted({topo.node_of(place[r]) for r in g})
        one_host = topo.devices_per_host == topo.devices_per_node
        where, short = (("node", "node") if one_host else
                        (topo.domain_name, f"scale-up domain ({topo.node_label})"))
        units = "nodes" if one_host else f"{topo.node_label}s"
        print(f"  warning: {len(crossing)} of {len(grid.groups('tp'))} tensor-parallel groups cross a {where} boundary "
              f"(e.g. ranks {g[0]}..{g[-1]} on {units} {', '.join(map(str, nodes[:4]))}{'...' if len(nodes) > 4 else ''}); "
              f"their collectives go over the scale-out network; "
              + (f"keep tp <= {topo.devices_per_node}, the {topo.device_label}s of one {short}" if p.tp > topo.devices_per_node
                 else f"use placement megatron, scattered or topology_aware, which keep tp groups inside a {short}"))
    return 0


def cmd_list(args) -> int:
    what = args.what
    if what == "devices":
        from simtrain.hardware.devices import describe, preset_names
        for k in preset_names():
            print(describe(k))
    elif what == "topologies":
        from simtrain.hardware.topology import load_topology, shipped_topologies
        for f in shipped_topologies():
            t = load_topology(f, 1)
            print(f"{f.stem:26s} {t.kind}: {t.describe(count=False)} — {t.source}")
    elif what == "schedules":
        from simtrain.schedules import SCHEDULES
        for k, d in SCHEDULES.items():
            print(f"{k:17s} {d.source}")
    elif what == "collectives":
        from simtrain.network.collectives import ALGORITHMS, PROTOCOLS
        from simtrain.network.flows import FLOW_ALGORITHMS
        for k, a in ALGORITHMS.items():
            flow = "flow too" if any(k in v for v in FLOW_ALGORITHMS.values()) else "analytical only"
            print(f"{k:17s} {', '.join(a.collectives)}; {'auto' if a.tuned else 'when named'}; {flow} — {a.source}")
        print(f"protocols: {', '.join(PROTOCOLS)} (network.protocol; auto picks the fastest)")
    elif what == "profiles":
        from simtrain.hardware.devices import REPO_PROFILES
        for f in sorted(REPO_PROFILES.glob("*.yaml")):
            d = yaml.safe_load(f.read_text())
            measured = [k for k in ("gemm", "memory_bound", "flash_attention", "collectives", "op_overhead") if d.get(k)]
            print(f"{f.stem:26s} base {d.get('base')}; " + (f"measured: {', '.join(measured)}" if measured else d.get("status", "no measurements")))
    elif what == "models":
        from simtrain.spec.loading import model_presets
        for k, v in model_presets().items():
            print(f"{k:14s} {v['source']}")
    return 0


def cmd_compare(args) -> int:
    from simtrain.results.io import write_atomic
    from simtrain.studies.compare import figure, run_variants, table, to_csv
    rows = run_variants(args.scenario, args.set)
    print(f"simtrain {__version__} — compare {args.scenario}")
    print(table(rows))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / "compare.csv", to_csv(rows).encode())
        if any(r.result for r in rows):
            figure(rows, out / "compare.png", f"{Path(args.scenario).name}: pipeline timelines (one representative rank per pipeline stage)")
        print(f"\n  wrote {args.out}/: compare.csv" + (" compare.png" if any(r.result for r in rows) else ""))
    bad = [r for r in rows if r.error]
    if bad:
        print(f"\n  {len(bad)} of {len(rows)} variants are invalid (see their rows)", file=sys.stderr)
        return 2
    return 0


def cmd_schedule(args) -> int:
    from simtrain.errors import ConfigError, Problem, ScheduleError
    from simtrain.results.io import write_atomic
    from simtrain.schedules import schedule_for
    from simtrain.schedules.csvio import to_csv
    sc, _ = _load(args)
    s = schedule_for(sc.parallel, sc.num_microbatches)
    if args.csv:
        try:
            text = to_csv(s)
        except ScheduleError as e:
            raise ConfigError([Problem(str(args.scenario), "parallel.schedule", str(e).split("; ")[0], "; ".join(str(e).split("; ")[1:]))])
    print(f"{s.name}: pp {s.pp}, {s.microbatches} microbatches, {s.num_stages} model stages "
          f"({s.chunks} chunk{'s' if s.chunks > 1 else ''} per rank); action = <chunk><kind><microbatch>, '&' = overlapped with the next")
    print(s.table())
    if args.csv:
        write_atomic(Path(args.csv), text.encode())
        print(f"\n  wrote {args.csv} (torchtitan / torch.distributed.pipelining CSV)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="simtrain", description="Discrete-event simulator of large-model training clusters.")
    ap.add_argument("--version", action="version", version=f"simtrain {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="simulate one training step")
    r.add_argument("scenario")
    r.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a scenario value (repeatable)")
    r.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    r.add_argument("--out", metavar="DIR", help="write result.json, scenario.resolved.yaml, trace.json, timeline.png")
    r.set_defaults(fn=cmd_run)
    cp = sub.add_parser("compare", help="simulate variants of a scenario (sweep keys with comma-separated values) and compare them")
    cp.add_argument("scenario")
    cp.add_argument("--set", action="append", metavar="KEY.PATH=V1,V2,...", help="a value, or a comma-separated sweep (repeatable: cartesian product)")
    cp.add_argument("--out", metavar="DIR", help="write compare.csv and compare.png")
    cp.set_defaults(fn=cmd_compare)
    sh = sub.add_parser("schedule", help="print the scenario's pipeline schedule per rank; export it as torchtitan CSV")
    sh.add_argument("scenario")
    sh.add_argument("--set", action="append", metavar="KEY.PATH=VALUE")
    sh.add_argument("--csv", metavar="FILE", help="write the schedule in torchtitan's CSV action format")
    sh.set_defaults(fn=cmd_schedule)
    c = sub.add_parser("check", help="validate a scenario without simulating")
    c.add_argument("scenario")
    c.add_argument("--set", action="append", metavar="KEY.PATH=VALUE")
    c.set_defaults(fn=cmd_check)
    b = sub.add_parser("bench", help="measure GEMMs, attention, memory-bound ops or collectives on this machine (needs torch)")
    b.add_argument("-o", "--out", type=Path, required=True, metavar="FILE", help="calibration file to write (YAML)")
    b.add_argument("--for", dest="for_scenario", metavar="SCENARIO", help="measure exactly the operator shapes this scenario runs")
    b.add_argument("--device", choices=("auto", "cuda", "mlu", "cpu"), default="auto")
    b.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    b.add_argument("--collectives", action="store_true",
                   help="measure collectives instead; start one process per device: torchrun --nproc_per_node N -m simtrain bench --collectives -o F")
    b.add_argument("--min-bytes", type=int, default=2 ** 20)
    b.add_argument("--max-bytes", type=int, default=2 ** 30)
    b.add_argument("--warmup", type=int, default=5)
    b.add_argument("--reps", type=int, default=20)
    b.add_argument("--tiny", action="store_true", help="a grid of a few small shapes (seconds on a CPU; for testing the workflow)")
    b.add_argument("--quiet", action="store_true")
    b.set_defaults(fn=lambda a: __import__("simtrain.calibration.bench", fromlist=["main"]).main(a))
    cal = sub.add_parser("calibrate", help="turn bench files, nccl-tests logs and profiler traces into a device profile")
    cal.add_argument("files", nargs="+", metavar="FILE")
    cal.add_argument("--device", required=True, metavar="NAME", help="name of the profile (e.g. h100-mycluster)")
    cal.add_argument("--base", required=True, metavar="PRESET", help="the device preset it refines (simtrain list devices)")
    cal.add_argument("-o", "--out", type=Path, required=True, metavar="PROFILE.yaml")
    cal.set_defaults(fn=lambda a: __import__("simtrain.calibration.fit", fromlist=["main"]).main(a))
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
        rl.set_defaults(fn=lambda a: __import__("simtrain.studies.reliability.study", fromlist=["main"]).main(a))
    sw = sub.add_parser("sweep", help="simulate the cartesian product of overrides into a resumable SQLite store")
    sw.add_argument("scenario")
    sw.add_argument("--grid", action="append", metavar="KEY.PATH=V1,V2,...", help="an axis of the grid (repeatable: cartesian product)")
    sw.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="a fixed override in every point")
    sw.add_argument("--executor", choices=("serial", "process", "dask"), default="serial")
    sw.add_argument("--scheduler", metavar="tcp://HOST:PORT", help="the Dask scheduler (with --executor dask)")
    sw.add_argument("--workers", type=int, metavar="N", help="worker processes of --executor process (default: all cores)")
    sw.add_argument("--out", metavar="DIR", help="store directory (default ./<scenario>.sweep): sweep.sqlite, sweep.csv; a rerun resumes")
    sw.add_argument("--plot-x", metavar="KEY.PATH", help="also plot step time, MFU and US$/Mtok against this grid key (scaling.png)")
    sw.set_defaults(fn=lambda a: __import__("simtrain.studies.sweep", fromlist=["main"]).main(a))
    se = sub.add_parser("search", help="find the best parallel plan: enumerate, prune (memory, closed form), simulate the best")
    se.add_argument("scenario")
    se.add_argument("--objective", choices=("step_time", "tokens_per_s", "cost"), default="step_time",
                    help="cost: US$ per million tokens from the scenario's cost.price_per_device_hour")
    se.add_argument("--top", type=int, default=10, metavar="K", help="rows of the ranked table (default 10)")
    se.add_argument("--fix", action="append", metavar="KEY.PATH=VALUE", help="hold a plan axis (parallel.tp=8) or set any other key (repeatable)")
    se.add_argument("--max-candidates", type=int, default=20, metavar="N", help="plans simulated at event level after pruning (default 20)")
    se.add_argument("--nodes", metavar="N1,N2,...", help="also search over these cluster sizes (default: the scenario's)")
    se.add_argument("--schedules", metavar="S1,S2,...", help="pipeline schedules to try (default 1f1b,interleaved_1f1b)")
    se.add_argument("--max-mb", type=int, default=8, metavar="N", help="largest micro batch size tried (default 8)")
    se.add_argument("--zero", metavar="Z1,Z2,...", help="ZeRO stages to try (default 0,1)")
    se.add_argument("--out", metavar="DIR", help="write best.yaml (ready to run), search.csv, search.png")
    se.set_defaults(fn=lambda a: __import__("simtrain.studies.search", fromlist=["main"]).main(a))
    lst = sub.add_parser("list", help="list shipped devices, profiles, topologies, schedules, collectives, models")
    lst.add_argument("what", choices=("devices", "profiles", "topologies", "schedules", "collectives", "models"))
    lst.set_defaults(fn=cmd_list)
    schema_cli.add_parser(sub)
    return ap


def main(argv=None) -> int:
    import simtrain.studies.reliability.config  # noqa: F401  (registers the scenario's reliability: section check)
    args = build_parser().parse_args(argv)
    args.command_line = " ".join(["simtrain"] + list(sys.argv[1:] if argv is None else argv))
    try:
        return args.fn(args)
    except SimtrainError as e:
        print(str(e), file=sys.stderr)
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
