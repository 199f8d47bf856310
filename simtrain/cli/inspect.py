"""`simtrain check | schedule | list`: validate a scenario, print its schedule, list what ships."""
from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from simtrain.cli.rl import cmd_check_rl, is_rl_path
from simtrain.cli.run import load
from simtrain.errors import ConfigError, Problem, ScheduleError
from simtrain.hardware.devices import REPO_PROFILES, describe, device_of, preset_names
from simtrain.hardware.topology import load_topology, shipped_topologies
from simtrain.network.collectives import ALGORITHMS, PROTOCOLS
from simtrain.network.flows import FLOW_ALGORITHMS
from simtrain.plan.grid import RankGrid, placement_of
from simtrain.results.io import check_out_file, write_atomic
from simtrain.results.memory import budget_of, memory_fit, rank_static
from simtrain.schedules import SCHEDULES, schedule_for
from simtrain.schedules.csvio import to_csv
from simtrain.spec.loading import model_presets
from simtrain.units import fmt_bytes
from simtrain.workload.build import build_workload


def cmd_check(args: argparse.Namespace) -> int:
    if is_rl_path(args.scenario):
        return cmd_check_rl(args)
    sc, topo = load(args)
    p = sc.parallel
    sched = schedule_for(p, sc.num_microbatches)
    work = build_workload(sc, sched.num_stages)
    dev = device_of(sc.cluster)
    print(f"{args.scenario}: ok")
    print(f"  model {sc.model.name} ({sc.model.architecture}), {sc.world_size} ranks = tp {p.tp} x cp {p.cp} x dp {p.dp} x pp {p.pp}, "
          f"{sc.num_microbatches} microbatches, schedule {p.schedule}")
    print(f"  sequences of {sc.model.seq_length:,} tokens, global batch {sc.training.global_batch_size:,}, "
          f"micro batch {sc.training.micro_batch_size}")
    print(f"  topology {topo.name}: {topo.describe()}")
    budget = budget_of(sc.cluster, dev.memory_bytes)
    print(f"  device memory {fmt_bytes(budget.capacity)} ({dev.key}{', cluster.memory_capacity' if sc.cluster.memory_capacity else ''})"
          f" - reserve {fmt_bytes(budget.reserve)} (cluster.memory_reserve) = {fmt_bytes(budget.usable)} usable")
    print("  static memory per rank (weights + gradients + optimizer + buffers, before activations):")
    need = []
    for r, held in enumerate(sched.stage_of):
        tot = rank_static(sc, work, held).total
        need.append((tot, budget.capacity))
        layers = " + ".join(str(work[k].num_layers) for k in held)
        chunks = f" (model stages {', '.join(map(str, held))})" if len(held) > 1 else ""
        print(f"    pipeline rank {r}: {layers} layer{'' if layers == '1' else 's'}{chunks}, {fmt_bytes(tot)}")
    if not memory_fit(need, sc.cluster.reserve_of).fits:
        print(f"  warning: static memory alone exceeds the {fmt_bytes(budget.usable)} usable of {dev.key}")
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


def cmd_list(args: argparse.Namespace) -> int:
    what = args.what
    if what == "devices":
        for k in preset_names():
            print(describe(k))
    elif what == "topologies":
        for f in shipped_topologies():
            t = load_topology(f, 1)
            print(f"{f.stem:26s} {t.kind}: {t.describe(count=False)} — {t.source}")
    elif what == "schedules":
        for k, d in SCHEDULES.items():
            print(f"{k:17s} {d.source}")
    elif what == "collectives":
        for k, a in ALGORITHMS.items():
            flow = "flow too" if any(k in v for v in FLOW_ALGORITHMS.values()) else "analytical only"
            print(f"{k:17s} {', '.join(a.collectives)}; {'auto' if a.tuned else 'when named'}; {flow} — {a.source}")
        print(f"protocols: {', '.join(PROTOCOLS)} (network.protocol; auto picks the fastest)")
    elif what == "profiles":
        for f in sorted(REPO_PROFILES.glob("*.yaml")):
            d = yaml.safe_load(f.read_text())
            measured = [k for k in ("gemm", "memory_bound", "flash_attention", "collectives", "op_overhead") if d.get(k)]
            print(f"{f.stem:26s} base {d.get('base')}; " + (f"measured: {', '.join(measured)}" if measured else d.get("status", "no measurements")))
    elif what == "models":
        for k, v in model_presets().items():
            print(f"{k:14s} {v['source']}")
    return 0


def cmd_schedule(args: argparse.Namespace) -> int:
    if args.csv:
        check_out_file(args.csv, "--csv")
    sc, _ = load(args)
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
