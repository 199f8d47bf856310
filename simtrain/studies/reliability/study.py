"""`simtrain reliability`: the whole job-level study of one scenario (build -> run -> collect).

    scenario + reliability section ─▶ step simulation (step time, memory) ─▶ JobParams
    ─▶ Monte-Carlo of the chosen interval (+ interval sweep, + what-if variants), one process pool
    ─▶ result.json, sweep.csv, whatif.csv, goodput_vs_interval.png, timeline.png, timeline.json

Everything written to result.json is a function of the inputs and the seed (no wall times; those
go to run_info.json), so the same input and seed give byte-identical files.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import math
import platform
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from simtrain import __version__
from simtrain.errors import ConfigError, Problem
from simtrain.hardware.devices import get_device
from simtrain.results.io import check_out_dir, staged_dir, to_json, write_atomic
from simtrain.studies.reliability import model as M
from simtrain.studies.reliability.config import METHODS, defaults, load_spec, parse_duration
from simtrain.studies.reliability.instep import inject, trace
from simtrain.studies.reliability.job import run_trial
from simtrain.studies.reliability.montecarlo import run_many, stats, summarize
from simtrain.studies.reliability.optimize import daly, daly_goodput, exact_optimum, grid, refine, young
from simtrain.studies.reliability.plots import sweep_png, timeline_png
from simtrain.studies.runner import load_point, simulate_point
from simtrain.units import UnitError, plural

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

OUT_FILES = ("result.json", "scenario.resolved.yaml", "timeline.json", "timeline.png", "sweep.csv", "goodput_vs_interval.png",
             "whatif.csv", "step_fault_trace.json", "run_info.json")


def auto_interval_steps(p: M.JobParams) -> int:
    """The configured interval, or Daly's higher-order optimum for this method's overhead, in whole steps."""
    tau = p.interval_s if p.interval_s is not None else daly(p.effective_overhead_s, p.mtbf_s)
    if tau == float("inf"):
        tau = 3600.0 * 24
    return max(1, int(round(tau / p.step_time_s)))


def describe(p: M.JobParams, n: int) -> dict:
    day = 86400.0
    return {
        "method": p.method, "checkpoint_bytes": p.checkpoint_bytes, "checkpoint_size_source": p.checkpoint_size_source, "stall_s": p.stall_s, "write_s": p.write_s,
        "background_slowdown": p.background_slowdown, "effective_overhead_s": p.effective_overhead_s,
        "storage_write_s": p.storage_write_s, "interval_steps": n, "interval_s": n * p.step_time_s,
        "levels": [{"name": lv.name, "every": lv.every, "write_s": lv.write_s} for lv in M.levels(p, n)],
        "job_mtbf_h": p.mtbf_s / 3600.0, "unexpected_per_day": p.job_rate * day,
        "planned_per_day": sum(c[1] for c in p.categories if c[5]) * day,
        "mean_restart_s": p.mean_restart_s, "restart_s": p.restart_s, "load_storage_s": p.load_storage_s,
        "load_memory_s": p.load_memory_s, "warmup_s": p.warmup_s,
        "detection_s": {k: v for k, v in p.detect_s.items() if k != "none"},
        "hot_spares": p.hot_spares, "elastic": p.elastic,
    }


def closed_form(p: M.JobParams, n: int) -> dict:
    d, R, mt = p.effective_overhead_s, p.mean_restart_s, p.mtbf_s
    tau = n * p.step_time_s
    g = daly_goodput(tau, d, R, mt) if mt < float("inf") else tau / (tau + d)
    # planned stops (saved first, no detection or load) take restart + warm-up of wall time each
    planned = sum(c[1] for c in p.categories if c[5])
    return {
        "model": "Daly 2006: exponential failures, fixed checkpoint cost delta and restart R, no spare waits",
        "delta_s": d, "restart_s": R, "mtbf_s": mt,
        "goodput": g,
        "goodput_with_planned_stops": g * (1.0 - planned * (p.restart_s + p.warmup_s)),
        "young_interval_s": young(d, mt), "daly_interval_s": daly(d, mt), "exact_interval_s": exact_optimum(d, mt),
    }


# The only published per-component breakdown of training-fleet interruptions is Llama 3's, measured
# on H100-80GB (arXiv:2407.21783 Table 5, the shipped categories). Other devices have no public
# breakdown we could find, so they run on those rates and the result says so.
MEASURED_ON = "h100-sxm5-80gb"


def failure_rate_source(device: str, from_scenario: bool) -> dict:
    """Where the failure rates of a run on `device` come from, and whether they are an assumption."""
    if from_scenario:
        return {"device": device, "assumed": False, "source": "the scenario's reliability.failures section"}
    if device == MEASURED_ON:
        return {"device": device, "assumed": False,
                "source": "Llama 3 interruptions on 16,384 H100-80GB over 54 days (arXiv:2407.21783, Table 5)"}
    d = get_device(device)
    why = ("another Hopper part; the same rates are assumed" if d.arch == "hopper"
           else f"no public per-component failure statistics for {d.vendor} {d.arch} devices were found")
    return {"device": device, "assumed": True,
            "source": f"assumed: the H100 rates of Llama 3 (arXiv:2407.21783, Table 5) for {d.name}: {why}; "
                      "set reliability.failures.rate_scale or categories from your fleet's records"}


def cross_check(p: M.JobParams) -> dict:
    """This job's failure rate next to Meta's independent RSC figures (failures per 1,000 node-days)."""
    cc = defaults()["failures"]["cross_check"]
    per_node_day = p.job_rate * 86400.0 / p.hosts * 1000.0
    return {"source": cc["source"], "this_job_failures_per_1000_node_days": per_node_day,
            "rsc1_failures_per_1000_node_days": cc["rsc1_failures_per_1000_node_days"],
            "rsc2_failures_per_1000_node_days": cc["rsc2_failures_per_1000_node_days"],
            "meta_mttf_model_h": 1.0 / (p.hosts * cc["rsc1_failures_per_1000_node_days"] / 1000.0) * 24.0,
            "restart_overhead_min": (p.mean_restart_s) / 60.0,
            "meta_typical_restart_overhead_min": cc["restart_overhead_u0_min"]}


def _sweep_block(p, ns, res, trials, with_cf=True):
    rows = [stats([r["goodput"] for r in res[f"sweep-{n}"]]) for n in ns]
    taus = [n * p.step_time_s for n in ns]
    means = [r["mean"] for r in rows]
    d, R, mt = p.effective_overhead_s, p.mean_restart_s, p.mtbf_s
    best = int(max(range(len(ns)), key=lambda i: means[i]))
    out = {
        "trials": trials, "intervals_s": taus, "interval_steps": list(ns),
        "goodput_mean": means, "goodput_ci95": [r["ci95"] for r in rows],
        "goodput_p5": [r["p5"] for r in rows], "goodput_p95": [r["p95"] for r in rows],
        "best_interval_s": taus[best], "best_goodput": means[best], "refined_optimum_s": refine(taus, means),
        "young_s": young(d, mt), "daly_s": daly(d, mt), "exact_daly_model_s": exact_optimum(d, mt),
    }
    if with_cf:
        out["closed_form"] = [daly_goodput(t, d, R, mt) for t in taus]
    return out


def study(path: str | Path, overrides: Sequence[str] = (), days: float | None = None, tokens: float | None = None,
          trials: int | None = None, seed: int | None = None, jobs: int = 1, interval: float | None = None, sweep: bool = False,
          sweep_points: int = 13, spares: Sequence[int] | None = None, methods: Sequence[str] | None = None,
          out: str | Path | None = None, log: Callable[[str], None] | None = None, timeline_days: float | None = None,
          step_fault: tuple[int, float] | None = None) -> dict:
    """step_fault = (rank, seconds into the step): also inject a failure inside one step (instep.py)."""
    t0 = time.perf_counter()
    if out:
        check_out_dir(out, "--out", OUT_FILES)       # before simulating: a bad path fails in seconds
    point = load_point(path, list(overrides)).check()
    sc, topo = point.scenario, point.topology
    spec = load_spec(path, overrides)
    if days is not None:
        spec = replace(spec, horizon_s=float(days) * 86400.0, tokens=None)
    if tokens is not None:
        spec = replace(spec, horizon_s=None, tokens=float(tokens))
    if trials is not None:
        spec = replace(spec, trials=int(trials))
    if seed is not None:
        spec = replace(spec, seed=int(seed))
    if interval is not None:
        spec = replace(spec, checkpoint=replace(spec.checkpoint, interval_s=float(interval)))
    step = None
    step_wall = 0.0
    run = None
    if spec.step_time_s is None or spec.checkpoint.size_bytes is None or step_fault is not None:
        run = simulate_point(point).check().run
        step, step_wall = run.result, run.wall_s
    p = M.build(spec, sc, topo, step, str(path))
    n = auto_interval_steps(p)
    tasks = [("main", p, n)]
    sweep_ns = []
    if sweep:
        center = daly(p.effective_overhead_s, p.mtbf_s) if p.mtbf_s < float("inf") else n * p.step_time_s
        sweep_ns = grid(center, p.step_time_s, sweep_points)
        tasks += [(f"sweep-{k}", p, k) for k in sweep_ns]
    variants = []
    for s in spares or ():
        q = p.with_(hot_spares=int(s))
        variants.append((f"spares={s}", q, n))
    for m in methods or ():
        sp = replace(spec, checkpoint=replace(spec.checkpoint, method=m, interval_s=None))
        q = M.build(sp, sc, topo, step, str(path))
        variants.append((f"method={m}", q, auto_interval_steps(q)))
    tasks += variants
    store = Path(out) / "trials" if out else None
    t1 = time.perf_counter()
    res = run_many(tasks, spec.trials, spec.seed, jobs=jobs, store=store, log=log)
    mc_wall = time.perf_counter() - t1
    result = {
        "scenario": sc.name, "simtrain_version": __version__, "device": sc.cluster.device, "devices": p.gpus,
        "gpus": p.gpus, "hosts": p.hosts, "dp": p.dp,
        "step_time_s": p.step_time_s, "step_time_source": "reliability.step_time" if spec.step_time_s is not None else "step simulation",
        "tokens_per_step": p.tokens_per_step,
        "horizon_s": spec.horizon_s, "target_tokens": spec.tokens, "trials": spec.trials, "seed": spec.seed,
        "job": describe(p, n),
        "failure_rates": failure_rate_source(sc.cluster.device, spec.failures.from_scenario),
        "failure_categories": [{"name": c[0], "job_rate_per_day": c[1] * 86400.0, "action": c[2], "detection": c[3],
                                "group": c[4], "planned": c[5]} for c in p.categories],
        **summarize(res["main"]),
        "closed_form": closed_form(p, n),
        "cross_check": cross_check(p),
        "reliability_spec": asdict(spec),       # the section as resolved (defaults filled in, SI units)
    }
    if sweep:
        result["sweep"] = _sweep_block(p, sweep_ns, res, spec.trials)
    if variants:
        wi = []
        for tag, q, k in variants:
            s = summarize(res[tag])
            wi.append({"variant": tag, "method": q.method, "hot_spares": q.hot_spares, "interval_s": k * q.step_time_s,
                       "effective_overhead_s": q.effective_overhead_s,
                       "goodput": s["goodput"], "time_s": s["time_s"], "lost_s": {b: v["mean"] for b, v in s["lost_s"].items()},
                       "spare_waits_mean": s["spare_waits_mean"], "storage_fallbacks_mean": s["storage_fallbacks_mean"]})
        result["what_if"] = wi
    fault = None
    if step_fault is not None:
        fault = inject(run, int(step_fault[0]), float(step_fault[1]), spec.recovery.detect_hang_s)
        fs = fault.summary()
        fs["blocked"] = [b for b in fs["blocked"] if b["on_peer"]]
        fs["blocked_on_peers"] = len(fs["blocked"])
        fs["blocked"] = fs["blocked"][:20]
        result["step_fault"] = fs
    rec, events, marks = run_trial(p, n, spec.seed, 0, record=True)
    result["timeline_trial"] = {"trial": 0, "goodput": rec["goodput"], "interruptions": rec["interruptions"]}
    if out:
        # written beside --out and moved in together (trials/ stays: it is the resume store)
        with staged_dir(out) as o:
            write_atomic(o / "result.json", to_json(result).encode())
            write_atomic(o / "scenario.resolved.yaml", yaml.safe_dump(sc.resolved(), sort_keys=False).encode())
            write_atomic(o / "timeline.json", json.dumps({"events": [list(e) for e in events], "failures": [list(m) for m in marks]}).encode())
            end = rec["time_s"]
            timeline_png(events, marks, end, o / "timeline.png",
                         f"{sc.name}: trial 0" + (f", first {timeline_days:g} of {end / 86400:g} days" if timeline_days else "")
                         + f" ({rec['interruptions']} failures in all, goodput {100 * rec['goodput']:.1f} %)", timeline_days)
            if sweep:
                write_atomic(o / "sweep.csv", sweep_csv(result["sweep"]).encode())
                sweep_png(result["sweep"], o / "goodput_vs_interval.png",
                          f"{sc.name}: goodput vs checkpoint interval ({p.method}, {_span(spec)})")
            if variants:
                write_atomic(o / "whatif.csv", whatif_csv(result["what_if"]).encode())
            if fault is not None:
                write_atomic(o / "step_fault_trace.json", json.dumps(trace(run, fault)).encode())
            write_atomic(o / "run_info.json", to_json({"simtrain_version": __version__, "python": platform.python_version(),
                                                       "scenario_file": str(path), "overrides": list(overrides), "jobs": jobs,
                                                       "step_sim_wall_s": step_wall, "monte_carlo_wall_s": mc_wall,
                                                       "total_wall_s": time.perf_counter() - t0}).encode())
    result["_wall"] = {"step_sim_s": step_wall, "monte_carlo_s": mc_wall}
    return result


def _span(spec) -> str:
    return f"{spec.horizon_s / 86400:g} days" if spec.horizon_s else f"{spec.tokens:.3g} tokens"


def sweep_csv(s: dict) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["interval_s", "interval_steps", "goodput_mean", "goodput_ci95", "goodput_p5", "goodput_p95", "closed_form"])
    for i, t in enumerate(s["intervals_s"]):
        w.writerow([repr(t), s["interval_steps"][i], repr(s["goodput_mean"][i]), repr(s["goodput_ci95"][i]),
                    repr(s["goodput_p5"][i]), repr(s["goodput_p95"][i]), repr(s["closed_form"][i]) if "closed_form" in s else ""])
    return buf.getvalue()


def whatif_csv(rows: list) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["variant", "method", "hot_spares", "interval_s", "goodput_mean", "goodput_ci95", "goodput_p5", "goodput_p95",
                "lost_work_s", "checkpoint_s", "spare_wait_s", "restart_s"])
    for r in rows:
        g = r["goodput"]
        w.writerow([r["variant"], r["method"], r["hot_spares"], repr(r["interval_s"]), repr(g["mean"]), repr(g["ci95"]), repr(g["p5"]),
                    repr(g["p95"]), repr(r["lost_s"]["lost_work"]), repr(r["lost_s"]["checkpoint"]), repr(r["lost_s"]["spare_wait"]),
                    repr(r["lost_s"]["restart"])])
    return buf.getvalue()


def summary(r: dict) -> str:
    j = r["job"]
    g = r["goodput"]
    h = 3600.0
    span = plural(r['horizon_s'] / 86400, "day") if r["horizon_s"] else f"{r['target_tokens']:.3g} tokens"
    n = r["trials"]

    def ci(x: dict, digits: int = 2) -> str:
        # one trial has no spread to estimate: printing "± 0.00" would claim a certainty it lacks
        return f"± {100 * x['ci95']:.{digits}f} (95 % CI)" if n > 1 else "(one trial: no confidence interval)"

    lines = [
        f"simtrain {r['simtrain_version']} — reliability of {r['scenario']}: {r['devices']:,} x {r['device']} on "
        f"{plural(r['hosts'], 'host')}, {span}, {plural(n, 'trial')}",
        "",
        f"  step time          {r['step_time_s']:.3f} s ({r['step_time_source']})",
        f"  failure rates      {r['failure_rates']['source']}",
        f"  job MTBF           {j['job_mtbf_h']:.2f} h ({j['unexpected_per_day']:.2f} unexpected + {j['planned_per_day']:.2f} planned interruptions/day)",
        f"  checkpoint         {j['method']}, {j['checkpoint_bytes'] / 1e12:.2f} TB, stall {j['stall_s']:.2f} s"
        + (f", background write {j['write_s']:.1f} s" if j["write_s"] else "")
        + f", every {j['interval_s'] / 60:.1f} min ({j['interval_steps']} steps)",
        f"  recovery           {j['mean_restart_s'] / 60:.1f} min per failure (detection, restart {j['restart_s']:.0f} s, load {j['load_storage_s']:.1f} s, warm-up {j['warmup_s']:.0f} s)",
        "",
        f"  goodput            {100 * g['mean']:.2f} % {ci(g)}   p5 {100 * g['p5']:.2f} %  p50 {100 * g['p50']:.2f} %  p95 {100 * g['p95']:.2f} %",
        f"  closed form        {100 * r['closed_form']['goodput']:.2f} % (Daly's model, unexpected failures only; "
        f"{100 * r['closed_form']['goodput_with_planned_stops']:.2f} % with the planned stops' restarts)",
    ]
    lines.append(f"  tokens trained     {r['tokens']['mean']:.4g} (mean over {plural(n, 'trial')})")
    if r["target_tokens"]:
        t = r["time_s"]
        lines.append(f"  time to train      {t['mean'] / 86400:.2f} days (p5 {t['p5'] / 86400:.2f}, p95 {t['p95'] / 86400:.2f})")
    it = r["interruptions"]
    lines.append(f"  interruptions      {it['mean']:.1f} unexpected (p5 {it['p5']:.0f}, p95 {it['p95']:.0f}), {r['planned_interruptions']['mean']:.1f} planned")
    lines.append("    by group         " + ", ".join(f"{k} {v['mean']:.1f}" for k, v in r["interruptions_by_group"].items()))
    total = r["time_s"]["mean"]
    lines.append("  time lost per cause (mean hours, % of wall time, p95 hours):")
    for k, v in r["lost_s"].items():
        if v["mean"] > 0 or k in ("lost_work", "checkpoint", "restart"):
            lines.append(f"    {k:15s}  {v['mean'] / h:9.1f} h  {100 * v['mean'] / total:5.2f} %   p95 {v['p95'] / h:.1f} h")
    if "sweep" in r:
        s = r["sweep"]
        lines += ["", "  checkpoint interval sweep (same failures for every interval):",
                  "    interval     goodput        95 % CI    closed form"]
        for i, t in enumerate(s["intervals_s"]):
            mark = "  <- best" if t == s["best_interval_s"] else ""
            lines.append(f"    {t / 60:7.1f} min  {100 * s['goodput_mean'][i]:7.3f} %  ± {100 * s['goodput_ci95'][i]:.3f}  {100 * s['closed_form'][i]:7.3f} %{mark}")
        lines.append(f"    optimum: simulated {s['refined_optimum_s'] / 60:.1f} min (grid {s['best_interval_s'] / 60:.1f}), "
                     f"Young {s['young_s'] / 60:.1f} min, Daly {s['daly_s'] / 60:.1f} min")
    if "what_if" in r:
        lines += ["", "  what-if                 interval   goodput (95 % CI)      spare wait   lost work"]
        for w in r["what_if"]:
            g = w["goodput"]
            lines.append(f"    {w['variant']:20s} {w['interval_s'] / 60:6.1f} min  {100 * g['mean']:6.2f} % "
                         f"{'± %.2f' % (100 * g['ci95']) if n > 1 else '(1 trial)'}   "
                         f"{w['lost_s']['spare_wait'] / h:8.1f} h  {w['lost_s']['lost_work'] / h:8.1f} h")
    if "step_fault" in r:
        f = r["step_fault"]
        lines += ["", f"  failure inside a step: rank {f['failed_rank']} at {f['fault_s']:.3f} s of a {f['step_time_s']:.3f} s step; "
                      f"{f['ops_cut']} op(s) cut, {f['ops_never_run']:,} of {f['ops']:,} ops never run",
                  ("    every rank is in the failed rank's equivalence class here, so no simulated peer is left to block; "
                   "the others would wait at their next exchange with it" if f["other_classes"] == 0 else
                   "    the others block on it" + (" at the next step's first exchange" if f["blocked_in_next_step"] else
                                                     f" from {min(b['since_s'] for b in f['blocked']):.3f} s ({f['blocked_on_peers']} streams)")) +
                  f"; the watchdog ({f['timeout_s']:g} s) aborts the job at {f['abort_s']:.1f} s, {f['detection_s']:.1f} s after the failure; the step is lost"]
    cc = r["cross_check"]
    lines += ["", f"  cross-check: {cc['this_job_failures_per_1000_node_days']:.2f} failures per 1,000 node-days "
                  f"(Meta RSC-1 {cc['rsc1_failures_per_1000_node_days']}, RSC-2 {cc['rsc2_failures_per_1000_node_days']}); "
                  f"restart overhead {cc['restart_overhead_min']:.1f} min (Meta: {cc['meta_typical_restart_overhead_min'][0]}-{cc['meta_typical_restart_overhead_min'][1]} min)"]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    interval = None
    probs = []
    if args.interval is not None:
        try:
            interval = parse_duration(args.interval)
        except UnitError as e:
            probs.append(Problem("--interval", "", str(e), 'write e.g. "10 min"'))
    spares = methods = None
    if args.what_if_spares:
        try:
            spares = [int(x) for x in args.what_if_spares.split(",")]
            if any(x < 0 for x in spares):
                raise ValueError
        except ValueError:
            probs.append(Problem("--what-if-spares", "", f"{args.what_if_spares!r} is not a list of whole numbers >= 0", "write e.g. 0,8,32"))
    if args.what_if_methods:
        methods = args.what_if_methods.split(",")
        bad = [m for m in methods if m not in METHODS]
        if bad:
            probs.append(Problem("--what-if-methods", "", f"unknown method {', '.join(bad)}", f"use {', '.join(METHODS)}"))
    for name, v in (("--days", args.days), ("--tokens", args.tokens)):
        if v is not None and not 0 < v < math.inf:
            probs.append(Problem(name, "", f"{v} is not a finite number > 0", "give a positive number"))
    for name, v, hi in (("--trials", args.trials, 10**6), ("--sweep-points", args.sweep_points, 1000), ("--jobs", args.jobs, 4096)):
        if v is not None and not 1 <= v <= hi:
            probs.append(Problem(name, "", f"{v} is outside 1..{hi:,}", f"give a whole number from 1 to {hi:,}"))
    fault = None
    if args.step_fault_rank is not None or args.step_fault_at is not None:
        try:
            fault = (int(args.step_fault_rank or 0), parse_duration(args.step_fault_at or "0 s"))
        except UnitError as e:
            probs.append(Problem("--step-fault-at", "", str(e), 'write e.g. "2.5 s"'))
    if probs:
        raise ConfigError(probs)
    log = (lambda m: print(m, file=sys.stderr)) if not args.json else None
    r = study(args.scenario, args.set or (), days=args.days, tokens=args.tokens, trials=args.trials, seed=args.seed,
              jobs=args.jobs, interval=interval, sweep=args.sweep, sweep_points=args.sweep_points, spares=spares,
              methods=methods, out=args.out, log=log, timeline_days=args.timeline_days, step_fault=fault)
    wall = r.pop("_wall")
    if args.json:
        sys.stdout.write(json.dumps(r) + "\n")
    else:
        print(summary(r))
        print(f"\n  step simulation {wall['step_sim_s']:.2f} s, Monte-Carlo {wall['monte_carlo_s']:.2f} s wall ({plural(args.jobs, 'process', 'processes')})")
        if args.out:
            files = ["result.json", "timeline.png", "timeline.json", "scenario.resolved.yaml", "run_info.json", "trials/"]
            files += ["sweep.csv", "goodput_vs_interval.png"] if args.sweep else []
            files += ["whatif.csv"] if "what_if" in r else []
            files += ["step_fault_trace.json"] if "step_fault" in r else []
            print(f"  wrote {args.out}/: {' '.join(files)}")
    return 0
