"""`simtrain compare`: variants of a scenario side by side (sweep, search and reliability have their
own `main` in simtrain.studies)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from simtrain import __version__
from simtrain.cli.rl import is_rl_path
from simtrain.results.io import check_out_dir, staged_dir, write_atomic
from simtrain.results.report import write_report
from simtrain.studies.compare import figure, run_variants, table, to_csv
from simtrain.studies.rl_compare import RLRow, rl_csv, rl_table, run_rl_variants
from simtrain.studies.textable import terminal_width


def cmd_compare(args: argparse.Namespace) -> int:
    if args.out:
        check_out_dir(args.out, "--out", ("compare.csv", "compare.png", "report.html"))    # before simulating
    if is_rl_path(args.scenario):
        return _compare_rl(args)
    rows = run_variants(args.scenario, args.set)
    print(f"simtrain {__version__} — compare {args.scenario}")
    print(table(rows, terminal_width()))
    if args.out:
        with staged_dir(args.out) as out:        # the files appear together
            write_atomic(out / "compare.csv", to_csv(rows).encode())
            if any(r.result for r in rows):
                figure(rows, out / "compare.png", f"{Path(args.scenario).name}: pipeline timelines (one representative rank per pipeline stage)")
            write_report(out, "compare", f"compare {Path(args.scenario).name}", _facts(args))
        print(f"\n  wrote {args.out}/: compare.csv" + (" compare.png" if any(r.result for r in rows) else "") + " report.html")
    bad = [r for r in rows if r.error]
    if bad:
        print(f"\n  {len(bad)} of {len(rows)} variants are invalid (see their rows)", file=sys.stderr)
        return 2
    return 0


def _compare_rl(args: argparse.Namespace) -> int:
    """compare on a `job: rl` file: one row per variant with verl's phases."""
    rows = run_rl_variants(args.scenario, args.set)
    print(f"simtrain {__version__} — compare {args.scenario} (RL iterations, steady state)")
    print(rl_table(rows, terminal_width()))
    if args.out:
        with staged_dir(args.out) as out:
            write_atomic(out / "compare.csv", rl_csv(rows).encode())
            write_report(out, "compare", f"compare {Path(args.scenario).name} (RL iterations, steady state)", _facts(args))
        print(f"\n  wrote {args.out}/: compare.csv report.html")
    bad = [r for r in rows if r.error]
    hint = rollout_devices_hint(rows)
    if hint:
        print(f"\n  hint: {hint}", file=sys.stderr)
    if bad:
        print(f"\n  {len(bad)} of {len(rows)} variants are invalid (see their rows)", file=sys.stderr)
        return 2
    return 0


def _facts(args: argparse.Namespace) -> list:
    """The lines report.html shows under its title: the scenario file and the --set arguments."""
    return [("scenario file", str(args.scenario)), ("--set", " ".join(args.set or ()) or "none")]


def rollout_devices_hint(rows: list[RLRow]) -> str | None:
    """What to write when a variant fails on placement.rollout_devices: the split placements need
    the rollout pool's size and colocated takes none, so `placement.kind=colocated,split` alone
    cannot load both."""
    if not any(r.error and "placement.rollout_devices" in r.error for r in rows):
        return None
    return ("split, one_step_off and fully_async need placement.rollout_devices (the rollout pool, whole nodes) and "
            "colocated takes none: vary the two keys together, e.g. `--set placement.kind+placement.rollout_devices="
            "colocated+null,split+16,fully_async+16`, or run "
            "`simtrain search FILE`, which tries every placement and pool split")
