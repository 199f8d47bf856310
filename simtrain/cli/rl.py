"""`simtrain run` / `simtrain check` of a `job: rl` file: RL iterations; a summary, `--json`, or `--out` files."""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from simtrain import __version__
from simtrain.errors import Collector
from simtrain.results.figures import plain, save_figure
from simtrain.results.io import check_out_dir, staged_dir, to_json, write_atomic
from simtrain.results.report import write_report
from simtrain.rl.iteration import RLRun, simulate_rl
from simtrain.rl.phases import VERL_ORDER
from simtrain.rl.spec import RLJob, is_rl_file, load_rl_job
from simtrain.spec.files import load_yaml
from simtrain.units import fmt_bytes, fmt_time, plural

if TYPE_CHECKING:
    from matplotlib.figure import Figure

OUT_FILES = ("result.json", "scenario.resolved.yaml", "trace.json", "timeline.png", "run_info.json", "report.html")
PHASE_COLORS = {"gen": "#4C78A8", "reward": "#EECA3B", "old_log_prob": "#72B7B2", "ref": "#9D755D", "values": "#FF9DA6",
                "adv": "#BAB0AC", "update_critic": "#E45756", "update_actor": "#54A24B", "update_weights": "#F58518"}


def is_rl_path(path: str | Path) -> bool:
    """True when the file at `path` is a `job: rl` file or a verl config (False when it cannot be read:
    the training-step loader then reports the problem)."""
    try:
        raw = load_yaml(Path(path), Collector(str(path)), "")
    except Exception:        # the step loader reports unreadable files with their fix
        return False
    return is_rl_file(raw)


def summary(run: RLRun, wall: float) -> str:
    r = run.result
    j = run.job
    step = r.timing["step"]
    lines = [
        f"simtrain {__version__} — {r.name}: RL ({j.estimator}, {r.placement}) on {r.devices} x {r.device}",
        f"  {j.train_batch_size} prompts x {j.n} responses per iteration; rollout {j.engine_name} tp {j.engine.tp} x "
        f"{j.engine.dp} replicas on {j.rollout_devices} devices; actor {j.roles['actor'].strategy} "
        f"tp {j.roles['actor'].scenario.parallel.tp} dp {j.roles['actor'].scenario.parallel.dp}",
        f"  {plural(len(r.iterations), 'iteration')} simulated; steady-state means"
        + (" (first iteration left out)" if len(r.iterations) > 1 else ""),
        "",
        f"  step time          {fmt_time(step)}",
        f"  throughput         {r.throughput:,.1f} tokens/s per device (prompt + response)",
        f"  response length    mean {r.response_length_mean:,.0f}, max {r.response_length_max:,.0f}, "
        f"clipped {100 * r.clip_ratio:.1f} %",
        f"  rollout preemptions {r.preemptions}",
        "",
        "  phases (verl order)        seconds   % of step",
    ]
    for p in VERL_ORDER:
        v = r.timing.get(p, 0.0)
        if v or p in ("gen", "update_actor", "update_weights"):
            lines.append(f"    {p:<18} {fmt_time(v):>14}  {100 * v / step if step else 0.0:6.1f} %")
    if r.placement not in ("colocated", "split"):
        lines.append("    (gen overlaps training in this placement: the phases do not add up to the step)")
    lines += ["", "  pools:"]
    for name, p in r.pools.items():
        lines.append(f"    {name:<14} {p['devices']:>5} devices, busy {fmt_time(p['busy_s'])}, idle {100 * p['idle_fraction']:.1f} %")
    lines += ["", f"  memory per device by phase ({r.device}):"]
    for ph, v in r.memory.items():
        d = r.memory_detail[ph]
        # the parts in brackets add up to the row's total; state moved to the host is shown apart
        parts = " + ".join(f"{k} {fmt_bytes(x)}" for k, x in d.items() if x and k != "offloaded_to_host")
        host = f"; on host, not counted: {fmt_bytes(d['offloaded_to_host'])}" if d.get("offloaded_to_host") else ""
        lines.append(f"    {ph:<16} {fmt_bytes(v):>10}   ({parts}{host})")
    if r.notes:
        lines += ["", "  notes:"] + [f"    - {n}" for n in r.notes]
    lines += ["", f"  simulated in {wall:.2f} s wall ({run.simulations} training-step simulations)"]
    return "\n".join(lines)


def chrome_trace(run: RLRun) -> dict:
    """One process per pool, one complete event per phase span (microseconds)."""
    pools = sorted({s[0] for s in run.spans})
    ev: list[dict] = []
    for pid, pool in enumerate(pools):
        ev.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": f"{pool} ({run.result.pools[pool]['devices']} devices)"}})
    for pool, phase, it, s, e in run.spans:
        ev.append({"name": phase, "cat": "rl", "ph": "X", "pid": pools.index(pool), "tid": 0, "ts": s * 1e6,
                   "dur": (e - s) * 1e6, "args": {"iteration": it}})
    return {"traceEvents": ev, "displayTimeUnit": "ms"}


def timeline_title(run: RLRun) -> str:
    """What timeline.png shows: every simulated iteration of the placement, on one time axis, and
    the steady-state step (a single iteration's bars are one step). Example: `job: 3 iterations,
    colocated on 32 x NVIDIA H20 (steady-state step 108.120 s, first iteration left out)`."""
    r = run.result
    n = len(r.iterations)
    steady = f"steady-state step {fmt_time(r.timing['step'])}" + (", first iteration left out" if n > 1 else "")
    return f"{r.name}: {plural(n, 'iteration')}, {r.placement} on {r.devices} x {r.device} ({steady})"


def timeline_figure(run: RLRun, title: str) -> Figure:
    """Pools (rows) x phases (coloured bars) over the simulated iterations."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    pools = sorted({s[0] for s in run.spans})
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.8 * len(pools)))
    for row, pool in enumerate(pools):
        for p, phase, it, s, e in run.spans:
            if p == pool and e > s:
                ax.broken_barh([(s, e - s)], (row - 0.4, 0.8), facecolors=PHASE_COLORS.get(phase, "#888888"), edgecolor="white", linewidth=0.3)
    ax.set_yticks(range(len(pools)), [plain(p) for p in pools])
    ax.set_xlabel("time (s)")
    ax.set_title(plain(title))
    used = [p for p in VERL_ORDER if any(s[1] == p for s in run.spans)]
    ax.legend(handles=[Patch(color=PHASE_COLORS[p], label=p) for p in used], loc="upper center",
              bbox_to_anchor=(0.5, -0.35), ncol=min(len(used), 9), fontsize=8, frameon=False)
    return fig


def _write_out(out: Path, args: argparse.Namespace, run: RLRun, wall: float) -> None:
    r = run.result
    write_atomic(out / "result.json", to_json(r.to_dict()).encode())
    write_atomic(out / "scenario.resolved.yaml", yaml.safe_dump(run.job.raw, sort_keys=False).encode())
    write_atomic(out / "trace.json", json.dumps(chrome_trace(run)).encode())
    save_figure(timeline_figure(run, timeline_title(run)), out / "timeline.png", bbox_inches="tight")
    write_atomic(out / "run_info.json", to_json({
        "simtrain_version": __version__, "python": platform.python_version(), "sim_wall_s": wall,
        "scenario_file": str(args.scenario), "overrides": list(args.set or ()),
    }).encode())
    write_report(out, "rl", f"{r.name}: RL step {fmt_time(r.timing['step'])}",
                 [("job file", str(args.scenario)), ("overrides", " ".join(args.set or ()) or "none")])


def load(args: argparse.Namespace) -> RLJob:
    return load_rl_job(args.scenario, args.set or ())


def cmd_run_rl(args: argparse.Namespace) -> int:
    if args.out:
        check_out_dir(args.out, "--out", OUT_FILES)
    job = load(args)
    t0 = time.perf_counter()
    run = simulate_rl(job)
    wall = time.perf_counter() - t0
    if args.out:
        with staged_dir(args.out) as out:
            _write_out(out, args, run, wall)
    if args.json:
        sys.stdout.write(json.dumps(run.result.to_dict()) + "\n")     # no wall time: same seed, same bytes
    else:
        print(summary(run, wall))
        if args.out:
            print(f"\n  wrote {args.out}/: {' '.join(OUT_FILES)}")
    return 0


def cmd_check_rl(args: argparse.Namespace) -> int:
    j = load(args)
    print(f"{args.scenario}: ok")
    print(f"  RL job {j.name}: {j.estimator}, placement {j.placement}, {j.total_devices} x {j.device_name}")
    print(f"  {j.train_batch_size} prompts x {j.n} responses; prompts {j.prompt_length.describe()}; "
          f"responses {j.response_length.describe()}")
    print(f"  rollout: {j.engine_name} tp {j.engine.tp} ep {j.engine.ep} x {j.engine.dp} replicas on {j.rollout_devices} devices")
    a_topo = j.roles["actor"].topology
    if j.placement != "colocated" and j.rollout_topology is not None and a_topo.devices_per_node < j.rollout_topology.devices_per_node:
        per = j.rollout_topology.devices_per_node
        print(f"  pools share every node: {per - a_topo.devices_per_node} rollout + {a_topo.devices_per_node} training "
              f"devices on each of {a_topo.nodes} nodes")
    for name, role in j.roles.items():
        if name == "reference" and not j.needs_ref:
            # verl builds no reference policy without a KL term, and the iteration runs no `ref` phase
            print("  reference: not run (no KL term: algorithm.use_kl_loss and kl_in_reward are false)")
            continue
        p = role.scenario.parallel
        print(f"  {name}: {role.strategy} tp {p.tp} pp {p.pp} cp {p.cp} dp {p.dp} (zero {p.zero_stage}) on {role.scenario.world_size} devices")
    return 0
