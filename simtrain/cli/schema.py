"""`simtrain schema`: the JSON Schema files and the Markdown key reference of every input file.

    simtrain schema --write schemas/     writes scenario / topology / profile .schema.json
    simtrain schema --markdown           prints the key reference (pipe it into a docs page)
    simtrain schema --check schemas/     exits 1 when the committed files differ from the declarations
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from simtrain.spec import schemas


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Adds the `schema` subcommand to the CLI's subparsers."""
    p = sub.add_parser("schema", help="write the JSON Schema of scenario, topology and profile files, or the key reference")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", metavar="DIR", help="write <DIR>/{scenario,topology,profile}.schema.json")
    g.add_argument("--check", metavar="DIR", help="fail when the files in DIR differ from what --write would write")
    g.add_argument("--markdown", action="store_true", help="print the Markdown table of every key")
    p.set_defaults(fn=main)


def main(args: argparse.Namespace) -> int:
    if args.markdown:
        sys.stdout.write(schemas.markdown())
        return 0
    if args.write:
        for p in schemas.write(Path(args.write)):
            print(f"wrote {p}")
        return 0
    stale = [n for n, s in schemas.schemas().items()
             if not (Path(args.check) / f"{n}.schema.json").is_file()
             or (Path(args.check) / f"{n}.schema.json").read_text(encoding="utf-8") != schemas.render(s)]
    for n in stale:
        print(f"{Path(args.check) / (n + '.schema.json')}: out of date; run `simtrain schema --write {args.check}`", file=sys.stderr)
    if not stale:
        print(f"{args.check}: {len(schemas.schemas())} schemas up to date")
    return 1 if stale else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m simtrain.cli.schema")
    add_parser(ap.add_subparsers(dest="cmd", required=True))
    ns = ap.parse_args(["schema"] + sys.argv[1:])
    sys.exit(ns.fn(ns))
