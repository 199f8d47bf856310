"""`simtrain export chakra | megatron SCENARIO`.

    chakra     the simulated step as MLCommons Chakra execution traces (`-o DIR`), one
               `<prefix>.<rank>.et` per rank plus ASTRA-sim's `comm_group.json`
               (simtrain.results.chakra; needs the optional `chakra` extra, mlc-chakra)
    megatron   the scenario as Megatron-LM training arguments on stdout (simtrain.imports.megatron),
               which `simtrain import megatron --args` reads back
"""
from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from simtrain.errors import ConfigError, Problem
from simtrain.imports.megatron import to_args
from simtrain.plan.grid import RankGrid
from simtrain.results.chakra import write_chakra
from simtrain.results.io import staged_dir
from simtrain.schedules import schedule_for
from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario


def add_parser(sub: argparse._SubParsersAction, set_help: str) -> None:
    """Adds the `export` subcommand to the CLI's subparsers."""
    p = sub.add_parser("export", help="write the simulated step as Chakra execution traces (ASTRA-sim input), "
                                      "or the scenario as Megatron-LM arguments")
    p.add_argument("format", choices=["chakra", "megatron"])
    p.add_argument("scenario")
    p.add_argument("-o", "--out", metavar="DIR", help="chakra: directory for <prefix>.<rank>.et and comm_group.json")
    p.add_argument("--prefix", default="simtrain", help="file prefix (ASTRA-sim's workload path is DIR/PREFIX)")
    p.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help=set_help)
    p.set_defaults(fn=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    sc, topo = load_scenario(args.scenario, args.set or ())
    if args.format == "megatron":
        print(shlex.join(to_args(sc.resolved())))
        return 0
    if not args.out:
        raise ConfigError([Problem("-o", "", "simtrain export chakra writes a directory of files",
                                   "give one: simtrain export chakra SCENARIO -o DIR")])
    run = simulate(sc, topo, fuse=False)          # every collective its own op, so its own node
    p = sc.parallel
    grid = RankGrid(p.tp, p.cp, p.dp, p.pp, p.ep, p.etp)
    mirror = schedule_for(p, sc.num_microbatches).duplicated_stages
    with staged_dir(args.out, "-o") as out:
        info = write_chakra(run.ops, run.timeline, run.classes, grid, out, args.prefix, mirror,
                            {"scenario": sc.name, "step_time_s": repr(run.result.step_time_s)})
    print(f"wrote {Path(args.out)}/: {info['files']} files {args.prefix}.<rank>.et ({len(info['nodes'])} distinct programs, "
          f"{min(info['nodes'].values())}-{max(info['nodes'].values())} nodes each), comm_group.json ({info['groups']} groups)")
    return 0
