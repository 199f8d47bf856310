"""`simtrain run`: simulate one training step; a summary, `--json`, or the files of `--out`."""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import yaml

from simtrain import __version__
from simtrain.cli.replay import cmd_run_chakra, workload_source
from simtrain.cli.rl import cmd_run_rl, is_rl_path
from simtrain.errors import ConfigError, Problem
from simtrain.hardware.topology import Topology
from simtrain.imports.dispatch import load_foreign
from simtrain.results.figures import timeline_png
from simtrain.results.io import check_out_dir, staged_dir, to_json, write_atomic
from simtrain.results.kinds import LABELS
from simtrain.results.report import write_report
from simtrain.results.step import StepResult
from simtrain.results.trace import chrome_trace
from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario
from simtrain.spec.scenario import Scenario
from simtrain.units import fmt_bytes, fmt_time, plural


def load(args: argparse.Namespace) -> tuple[Scenario, Topology]:
    """The command's scenario with its `--set` overrides; a Megatron script, DeepSpeed JSON or
    torchtitan TOML is imported on the way (simtrain.imports)."""
    return load_foreign(args.scenario, list(args.set or ())) or load_scenario(args.scenario, args.set or ())


def summary(r: StepResult, wall: float, sc: Scenario) -> str:
    b = r.breakdown
    step = r.step_time_s
    t = sc.training
    lines = [
        f"simtrain {__version__} — {r.scenario}: {r.num_devices} x {r.device} "
        f"({r.precision}{', ' + r.fp8_recipe + ' scaling' if r.fp8_recipe else ''}"
        f"{', FP8 weights gathered' if r.fp8_recipe and t.fp8_param_gather else ''}), "
        f"{plural(r.num_microbatches, 'microbatch', 'microbatches')} per step" + (", forward only" if r.forward_only else ""),
    ]
    if r.forward_only:
        lines.append("  forward only: one forward pass over the batch; no backward, gradient reduction or optimizer step")
    lines += [
        f"  sequences of {sc.model.seq_length:,} tokens, global batch {t.global_batch_size:,}, micro batch {t.micro_batch_size}"
        + (f", tp overlap {sc.parallel.tp_overlap}" if sc.parallel.tp_overlap else "")
        + (" (per-GEMM settings)" if sc.parallel.tp_overlap == "userbuffers" and sc.parallel.tp_comm_overlap_cfg
           != type(sc.parallel.tp_comm_overlap_cfg)() else ""),
        "",
        f"  step time          {fmt_time(step)}",
        f"  tokens/s           {r.tokens_per_s:,.0f}",
        f"  MFU                {100 * r.mfu:.1f} %" + (" of the FP8 peak" if r.precision == "fp8" else "")
        + f"   (HFU {100 * r.hfu:.1f} %, incl. recompute)",
        f"  model FLOPs/step   {r.model_flops_per_step:.3e}",
        f"  pipeline bubble    {100 * r.bubble_fraction:.1f} % of device time",
        f"  peak memory        {fmt_bytes(r.peak_memory_bytes)} of {fmt_bytes(r.usable_memory_bytes)} usable"
        + ("" if r.fits_in_memory else f"  DOES NOT FIT: {fmt_bytes(r.memory_shortfall_bytes)} short"),
        f"                     (capacity {fmt_bytes(r.memory_capacity_bytes)} - reserve {fmt_bytes(r.memory_reserve_bytes)}, "
        "cluster.memory_reserve)",
        "",
        f"  where the step goes (rank {b.rank}, stage {b.stage}, the busiest):",
        f"    compute          {fmt_time(b.compute_s):>10}  {100 * b.compute_s / step:5.1f} %",
    ]
    # the compute line split by operator kind (results.kinds), largest first, four to a line
    parts = [f"{LABELS[k]} {fmt_time(v)}" for k, v in sorted(b.compute_by_kind_s.items(), key=lambda kv: -kv[1]) if v > 0]
    lines += ["      " + ", ".join(parts[i:i + 4]) + ("," if i + 4 < len(parts) else "") for i in range(0, len(parts), 4)]
    lines += [
        f"    bubble           {fmt_time(b.bubble_s):>10}  {100 * b.bubble_s / step:5.1f} %",
    ]
    for k, v in b.exposed_comm_s.items():
        if v > 0 or k in ("tp", "pp", "dp"):         # cp / ep only where the plan has them
            lines.append(f"    exposed {k} comm  {fmt_time(v):>10}  {100 * v / step:5.1f} %")
    if r.moe is not None:
        m = r.moe
        lines += ["", f"  experts: {m.num_experts} (top-{m.top_k}) over ep {m.ep}, routing {m.routing}; busiest ep rank "
                      f"{m.imbalance_max:.2f} x the mean, {100 * m.dropped_fraction_mean:.1f} % of assignments dropped"]
    if r.context_parallel is not None:
        c = r.context_parallel
        lines += ["", f"  context parallel: cp {c.cp} ({c.cp_kind}), {c.tokens_per_rank:,.0f} tokens per rank"]
    if r.stragglers is not None:
        st = r.stragglers
        lines += ["", f"  stragglers: {st.count} devices; without them the step takes {fmt_time(st.step_time_without_s)} "
                      f"(x{st.slowdown:.3f} with them)"]
        for x in st.critical_path[:3]:
            lines.append(f"    on the critical path: rank {x.representative_rank} (stage {x.stage}, {x.device}"
                         f"{', with a straggler' if x.straggler else ''}) for {fmt_time(x.seconds)}")
    lines += ["", "  memory per stage (GiB):  weights  grads  optim  activ  buffers  total  in-flight"]
    if r.forward_only:
        lines.append("    (forward only: weights alone, no gradients or optimizer state; activations are one "
                     "microbatch's forward working set, nothing stored for a backward)")
    g = 2.0**30
    for m in r.memory:
        lines.append(f"    stage {m.stage:<3}             {m.weights / g:7.2f} {m.gradients / g:6.2f} {m.optimizer / g:6.2f} "
                     f"{m.activations / g:6.2f} {m.communication_buffers / g:8.2f} {m.total / g:6.2f}  {round(m.inflight_microbatches_peak, 3):>5g}")
    if r.coverage:
        lines += ["", "  coverage notes (costs not backed by a direct measurement):"]
        lines += [f"    - {c}" for c in r.coverage]
    lines += ["", f"  simulated {r.simulated_classes} rank classes, {r.simulated_ops:,} ops in {wall:.2f} s wall"]
    return "\n".join(lines)


OUT_FILES = ("result.json", "scenario.resolved.yaml", "trace.json", "timeline.png", "run_info.json", "report.html")


def _write_out(out: Path, args: argparse.Namespace, sc: Scenario, topo: Topology, run) -> None:
    r = run.result
    write_atomic(out / "result.json", to_json(r).encode())
    write_atomic(out / "scenario.resolved.yaml", yaml.safe_dump(sc.resolved(), sort_keys=False).encode())
    write_atomic(out / "trace.json", json.dumps(chrome_trace(run.ops, run.timeline, run.classes, topo, run.link_series,
                                                             forward_only=bool(r.forward_only))).encode())
    what = "forward-only pass" if r.forward_only else "step"
    timeline_png(run.ops, run.timeline, run.classes, out / "timeline.png", f"{sc.name}: {what} {fmt_time(r.step_time_s)}")
    write_atomic(out / "run_info.json", to_json({
        "simtrain_version": __version__, "python": platform.python_version(),
        "sim_wall_s": run.wall_s, "scenario_file": str(args.scenario), "overrides": list(args.set or ()),
    }).encode())
    write_report(out, "run", f"{sc.name}: {what} {fmt_time(r.step_time_s)}",
                 [("scenario file", str(args.scenario)), ("overrides", " ".join(args.set or ()) or "none")])


def cmd_run(args: argparse.Namespace) -> int:
    if getattr(args, "workload", None):
        workload_source(args.workload)          # a bad source fails before the scenario loads
        return cmd_run_chakra(args, *load(args))
    if getattr(args, "trace_durations", False):
        raise ConfigError([Problem("--trace-durations", "", "only applies to a replayed trace", "add --workload chakra:DIR, or drop the flag")])
    if is_rl_path(args.scenario):
        return cmd_run_rl(args)
    if args.out:
        check_out_dir(args.out, "--out", OUT_FILES)      # before simulating: a bad path fails in seconds
    sc, topo = load(args)
    run = simulate(sc, topo)
    r = run.result
    replaced = bool(args.out) and (Path(args.out) / "run_info.json").is_file()    # an earlier run's files
    if args.out:
        # written beside --out and moved in together: concurrent runs never mix their files
        with staged_dir(args.out) as out:
            _write_out(out, args, sc, topo, run)
    if args.json:
        d = r.to_dict()
        d["sim_wall_s"] = run.wall_s
        sys.stdout.write(json.dumps(d) + "\n")
    else:
        print(summary(r, run.wall_s, sc))
        if args.out:
            print(f"\n  wrote {args.out}/: {' '.join(OUT_FILES)}" + (" (replacing an earlier run's)" if replaced else ""))
    return 0
