"""`simtrain import megatron|deepspeed|torchtitan|verl FILE... -o scenario.yaml` and
`simtrain export megatron SCENARIO`: other frameworks' configurations in and out."""
from __future__ import annotations

import argparse
import copy
from pathlib import Path

from simtrain.errors import Collector
from simtrain.imports.common import Options, to_yaml
from simtrain.imports.dispatch import KINDS, import_files
from simtrain.results.io import write_atomic
from simtrain.rl.spec import build_rl_job
from simtrain.spec.files import TreeError, parse_yaml
from simtrain.spec.loading import build_scenario


def _env(items: list[str] | None) -> dict[str, str]:
    out = {}
    for it in items or ():
        k, eq, v = it.partition("=")
        if not eq or not k:
            errs = Collector("--env")
            errs.add(it, "expected NAME=VALUE", "write e.g. --env NUM_NODES=16")
            errs.raise_if_any()
        out[k] = v
    return out


def _length(text: str | None) -> object:
    if text is None:
        return None
    try:
        return parse_yaml(text)
    except TreeError as e:
        errs = Collector("--response-length")
        errs.add(text[:60], str(e), 'write a token count or e.g. "{kind: lognormal, mean: 3000, sigma: 0.8}"')
        errs.raise_if_any()
        return None


def register(sub: argparse._SubParsersAction) -> None:
    im = sub.add_parser("import", help="turn a Megatron-LM script, DeepSpeed JSON, torchtitan TOML or verl config into a scenario")
    im.add_argument("kind", choices=KINDS)
    im.add_argument("files", nargs="*", metavar="FILE",
                    help="megatron: launch script(s) or argument file; deepspeed: ds_config.json (and a config.json); "
                         "torchtitan: a TOML; verl: a trainer YAML or launch script")
    im.add_argument("-o", "--out", type=Path, required=True, metavar="SCENARIO.yaml", help="scenario (verl: job file) to write")
    im.add_argument("--topology", help="topology of the cluster (a file or shipped name: simtrain list topologies)")
    im.add_argument("--device", help="device preset (simtrain list devices)")
    im.add_argument("--world-size", type=int, metavar="N", help="devices of the job (replaces torchrun's nnodes x nproc-per-node)")
    im.add_argument("--seq-length", type=int, metavar="N", help="training sequence length (replaces the file's)")
    im.add_argument("--hf-config", metavar="config.json", help="the model as a Hugging Face config.json")
    im.add_argument("--model", metavar="PRESET", help="the model as a preset (simtrain list models)")
    im.add_argument("--vocab-size", type=int, metavar="N", help="vocabulary size (Megatron reads it from the tokenizer)")
    im.add_argument("--precision", choices=("bf16", "fp16", "fp8"), help="GEMM precision where the file says auto or nothing")
    im.add_argument("--recompute", choices=("none", "selective", "full", "op"), help="activation recomputation (DeepSpeed: set in code)")
    im.add_argument("--micro-batch-size", type=int, metavar="N", help='micro batch per device (resolves "auto")')
    im.add_argument("--global-batch-size", type=int, metavar="N", help='sequences per step (resolves "auto")')
    im.add_argument("--name", help="scenario name (default: the file's stem)")
    im.add_argument("--env", action="append", metavar="NAME=VALUE", help="a shell variable the launch script reads (repeatable)")
    im.add_argument("--response-length", metavar="SPEC", help='verl: response lengths, a token count or a YAML spec such as '
                    '"{kind: lognormal, mean: 3000, sigma: 0.8}" (simtrain.rl.lengths)')
    im.add_argument("--args", metavar="STRING", help="megatron: the training arguments as one string")
    im.set_defaults(fn=cmd_import)


def cmd_import(args: argparse.Namespace) -> int:
    opts = Options(topology=args.topology, device=args.device, world_size=args.world_size, seq_length=args.seq_length,
                   hf_config=args.hf_config, model=args.model, vocab_size=args.vocab_size, precision=args.precision,
                   recompute=args.recompute, micro_batch_size=args.micro_batch_size,
                   global_batch_size=args.global_batch_size, name=args.name, env=_env(args.env),
                   response_length=_length(args.response_length))
    if not args.files and not (args.kind == "megatron" and args.args):
        errs = Collector(f"simtrain import {args.kind}")
        errs.add("FILE", "no file given", "give the configuration file to import" + (" or --args" if args.kind == "megatron" else ""))
        errs.raise_if_any()
    out: Path = args.out
    tree = import_files(args.kind, list(args.files), opts, out, args.args)
    # the written file must load: checked before it is written, against its own directory
    errs = Collector(str(out))
    if tree.get("job") == "rl":
        build_rl_job(copy.deepcopy(tree), out, errs)
    else:
        build_scenario(copy.deepcopy(tree), out, errs)
    errs.raise_if_any()
    sources = list(args.files) or ["--args"]
    write_atomic(out, to_yaml(tree, sources, args.kind).encode())
    print(f"wrote {out} (check it: simtrain check {out}; run it: simtrain run {out})")
    return 0
