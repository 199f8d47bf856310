"""A DeepSpeed JSON config (plus the model and world size from the command line) -> a scenario tree.

DeepSpeed's batch rule (deepspeed/runtime/config.py): train_batch_size = micro batch per GPU x
gradient_accumulation_steps x dp; any two give the third. dp = world / tensor_parallel.autotp_size
(pipeline parallelism is set in code, not in the JSON: pp 1). Values of "auto" are filled by the
Hugging Face Trainer from its own arguments; here they come from --micro-batch-size,
--global-batch-size and --precision, else they are reported.

zero_optimization: stage -> parallel.zero_stage; reduce_bucket_size (elements) ->
parallel.bucket_size_params (DeepSpeed's default 5e8); overlap_comm -> parallel.overlap_grad_reduce
(and overlap_param_gather at stage 3; DeepSpeed's default: false, at stage 3 true). Offloading the
optimizer or parameters to the host is not modelled and refused.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from simtrain.errors import Collector
from simtrain.imports.common import Fields, Options, cluster_section, drop_none, model_section

# deepspeed/runtime/zero/config.py: reduce_bucket_size default 5e8 elements
DEFAULT_BUCKET = 500_000_000
_RESOLVED_AUTO = {"train_micro_batch_size_per_gpu", "train_batch_size", "gradient_accumulation_steps", "bf16.enabled",
                  "fp16.enabled"}


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _auto(f: Fields, name: str, flag: str, given: Any, why: str) -> Any:
    """A value that may be "auto": the flag's value, else an error naming both."""
    v = f.take(name)
    if v == "auto":
        if given is None:
            f.errs.add(name, f'"auto" ({why}) cannot be resolved here', f"pass {flag} to simtrain import")
        return given
    if v is not None and given is not None and v != given:
        warnings.warn(f"{f.file}: {name}: {flag} {given} replaces the file's {v}", stacklevel=3)
        return given
    return v if v is not None else given


def _whole(f: Fields, name: str, v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < 1:
        f.errs.add(name, f"expected a whole number >= 1, got {v!r}", "give a positive whole number")
        return None
    return int(v)


def to_tree(file: str, cfg: dict[str, Any], opts: Options, errs: Collector, out_dir: Path) -> dict[str, Any]:
    f = Fields(file, flatten(cfg), errs)
    # "auto" values the Trainer fills at run time beyond the batch sizes and precision resolved below
    autos = sorted(k for k, v in f.values.items() if v == "auto" and k not in _RESOLVED_AUTO)
    world = opts.world_size
    tp = _whole(f, "tensor_parallel.autotp_size", f.take("tensor_parallel.autotp_size", 1)) or 1
    dp = None
    if world is None:
        errs.add("--world-size", "a DeepSpeed config does not say how many devices run the job", "pass --world-size N")
    elif world % tp:
        errs.add("tensor_parallel.autotp_size", f"{tp} does not divide the world size {world}", "give a divisor of --world-size")
    else:
        dp = world // tp
    mb = _whole(f, "train_micro_batch_size_per_gpu", _auto(f, "train_micro_batch_size_per_gpu", "--micro-batch-size",
                                                           opts.micro_batch_size, "the Trainer's --per_device_train_batch_size"))
    gb = _whole(f, "train_batch_size", _auto(f, "train_batch_size", "--global-batch-size", opts.global_batch_size,
                                             "micro batch x gradient accumulation x dp"))
    gas_raw = f.take("gradient_accumulation_steps")
    gas = None if gas_raw in (None, "auto") else _whole(f, "gradient_accumulation_steps", gas_raw)
    if gas_raw == "auto" and not (mb and gb):
        errs.add("gradient_accumulation_steps", '"auto" (the Trainer\'s --gradient_accumulation_steps) cannot be resolved here',
                 "pass --micro-batch-size and --global-batch-size to simtrain import")
    if dp:
        if mb is None and gb and gas:
            if gb % (gas * dp):
                errs.add("train_batch_size", f"{gb} is not divisible by gradient_accumulation_steps x dp = {gas} x {dp}",
                         "give batch sizes with train_batch_size = micro x accumulation x dp")
            else:
                mb = gb // (gas * dp)
        if gb is None and mb:
            gb = mb * (gas or 1) * dp
        if mb and gb and gas and gb != mb * gas * dp:
            errs.add("train_batch_size", f"{gb} != micro batch x gradient_accumulation_steps x dp = {mb} x {gas} x {dp}",
                     "make the three agree (DeepSpeed refuses the config otherwise)")
        elif mb and gb and gb % (mb * dp):
            errs.add("train_batch_size", f"{gb} is not divisible by micro batch x dp = {mb} x {dp}", f"use a multiple of {mb * dp}")
        if mb is None and gb and not gas:
            mb = gb // dp if gb % dp == 0 else None       # gradient accumulation 1 (DeepSpeed's default)
            if mb is None:
                errs.add("train_batch_size", f"{gb} is not divisible by dp {dp}", f"use a multiple of {dp}")
    if mb is None and not errs.problems:
        errs.add("train_micro_batch_size_per_gpu", "no batch size given", "add train_micro_batch_size_per_gpu or pass --micro-batch-size")

    # precision
    prec = None
    for p in ("bf16", "fp16"):
        on = f.take(f"{p}.enabled")
        if on == "auto":
            on = opts.precision == p if opts.precision else None
            if on is None:
                errs.add(f"{p}.enabled", '"auto" (the Trainer\'s --bf16 / --fp16) cannot be resolved here', "pass --precision bf16 or fp16")
        if on is True:
            prec = p
    f.use("bf16", "fp16")
    if opts.precision and prec and opts.precision != prec:
        warnings.warn(f"{file}: --precision {opts.precision} replaces the file's {prec}", stacklevel=2)
    prec = opts.precision or prec
    if prec is None and not any(e.path.endswith(".enabled") for e in errs.problems):
        errs.add("bf16.enabled", "neither bf16 nor fp16 is enabled: DeepSpeed trains in fp32, which simtrain does not model",
                 'add "bf16": {"enabled": true} or pass --precision bf16')

    # ZeRO
    stage = f.take("zero_optimization.stage", 0)
    if stage not in (0, 1, 2, 3):
        errs.add("zero_optimization.stage", f"expected 0, 1, 2 or 3, got {stage!r}", "give a ZeRO stage")
        stage = 0
    par: dict[str, Any] = {"tp": tp, "pp": 1, "dp": dp, "zero_stage": stage}
    overlap = f.take("zero_optimization.overlap_comm")
    if overlap == "auto":
        overlap = None
    overlap = bool(overlap) if overlap is not None else stage == 3
    par["overlap_grad_reduce"] = overlap
    if stage == 3:
        par["overlap_param_gather"] = overlap
    bucket = f.take("zero_optimization.reduce_bucket_size")
    par["bucket_size_params"] = int(bucket) if isinstance(bucket, (int, float)) and bucket >= 1 else DEFAULT_BUCKET
    for part in ("offload_optimizer", "offload_param"):
        dev = f.take(f"zero_optimization.{part}.device")
        f.use(*[k for k in f.values if k.startswith(f"zero_optimization.{part}.")])
        if dev not in (None, "none"):
            f.refuse(f"zero_optimization.{part}.device", f"offloading to {dev} is not modelled",
                     f"remove zero_optimization.{part} (or set its device to none)")
    if tp > 1:
        par["sequence_parallel"] = False

    model = model_section(opts, opts.seq_length, errs, out_dir)
    if model is None:
        errs.add("--hf-config", "a DeepSpeed config does not describe the model",
                 "pass --hf-config config.json (the model's Hugging Face config) or --model PRESET")
    if opts.seq_length is None:
        errs.add("--seq-length", "a DeepSpeed config does not give the training sequence length", "pass --seq-length N")
    training = {"micro_batch_size": mb, "global_batch_size": gb, "precision": prec, "recompute": opts.recompute or "none"}
    cluster = cluster_section(opts, world, errs, "--world-size")
    if autos:
        warnings.warn(f"{file}: {len(autos)} \"auto\" values (filled by the Hugging Face Trainer at run time) were "
                      "taken as DeepSpeed's defaults: " + ", ".join(autos), stacklevel=2)
        f.use(*autos)                             # reported here, not again among the ignored
    f.warn_ignored("fields")
    return drop_none({"name": opts.name or Path(file).stem, "model": model, "training": training, "parallel": par,
                      "cluster": cluster})
