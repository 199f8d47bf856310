"""A torchtitan TOML job config (the format of torchtitan's train_configs/*.toml) -> a scenario tree.

[parallelism]: dp = data_parallel_replicate_degree x data_parallel_shard_degree, a shard degree
of -1 filling the world (world / (replicate x tp x pp x cp)); a shard degree above 1 is FSDP (ZeRO
stage 3), replication alone is DDP (stage 0). [training] local_batch_size (older files: batch_size)
is the batch of one data-parallel rank; the global batch is global_batch_size, or local x dp
when absent or -1. With pipeline parallelism the micro batch is pipeline_parallel_microbatch_size
(default 1); without, one local batch (more only with gradient accumulation). fp8 comes from
[float8] or `converters = ["float8"]`; otherwise training.mixed_precision_param (default bfloat16).
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

from simtrain.errors import Collector
from simtrain.imports.common import Fields, Options, cluster_section, drop_none, model_section
from simtrain.imports.deepspeed import flatten
from simtrain.spec.loading import model_presets

if sys.version_info >= (3, 11):
    import tomllib
else:                               # Python 3.10 has no tomllib; tomli is its origin
    import tomli as tomllib

# torchtitan's schedule names (torch.distributed.pipelining) -> simtrain's
SCHEDULES = {"1f1b": "1f1b", "gpipe": "gpipe", "interleaved1f1b": "interleaved_1f1b", "zbvzerobubble": "zb_v",
             "dualpipev": "dualpipev"}
# torchtitan model names and flavors -> simtrain presets
PRESETS = {("llama3", "8b"): "llama3-8b", ("llama3", "70b"): "llama3-70b", ("llama3", "405b"): "llama3-405b"}


def parse(text: str, file: str, errs: Collector) -> dict[str, Any] | None:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        errs.add("", f"not valid TOML: {e}", "fix the TOML syntax")
        return None


def _int(f: Fields, name: str, default: int | None, lo: int = 1) -> int | None:
    v = f.take(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        f.errs.add(name, f"expected a whole number >= {lo}, got {v!r}", f"give a whole number >= {lo}")
        return default
    return v


def _fusions(f: Fields) -> dict[str, bool]:
    """The kernels torchtitan's Llama runs without torch.compile: SwiGLU as silu and mul, the
    rotary as complex-number eager ops, the norm as `model.norm_type` says (older files:
    rmsnorm is torchtitan's eager RMSNorm, fused_rmsnorm its Triton kernel; newer files have no
    norm_type and build torch.nn.RMSNorm, which PyTorch runs as one fused kernel,
    aten::_fused_rms_norm)."""
    norm = f.take("model.norm_type")
    if norm not in (None, "rmsnorm", "fused_rmsnorm"):
        f.refuse("model.norm_type", f"{norm!r} is not modelled: the Llama presets normalise with RMSNorm",
                 'use norm_type = "rmsnorm" or "fused_rmsnorm"')
    return {"norm": norm != "rmsnorm", "bias_swiglu": False, "rope": False}


def to_tree(file: str, cfg: dict[str, Any], opts: Options, errs: Collector, out_dir: Path) -> dict[str, Any]:
    f = Fields(file, flatten(cfg), errs)
    P = "parallelism."
    tp = _int(f, P + "tensor_parallel_degree", 1)
    pp = _int(f, P + "pipeline_parallel_degree", 1)
    cp = _int(f, P + "context_parallel_degree", 1)
    ep = _int(f, P + "expert_parallel_degree", 1)
    etp = _int(f, P + "expert_tensor_parallel_degree", 1)
    rep = _int(f, P + "data_parallel_replicate_degree", 1)
    shard = f.take(P + "data_parallel_shard_degree", -1)
    world = opts.world_size
    dp = None
    if not isinstance(shard, int) or isinstance(shard, bool) or (shard < 1 and shard != -1):
        errs.add(P + "data_parallel_shard_degree", f"expected -1 or a whole number >= 1, got {shard!r}", "give -1 (fill) or a degree")
        shard = None
    if shard == -1:
        if world is None:
            errs.add("--world-size", "data_parallel_shard_degree = -1 fills the world, whose size the file does not give",
                     "pass --world-size N")
        elif tp and pp and cp and rep and world % (rep * tp * pp * cp) == 0:
            shard = world // (rep * tp * pp * cp)
        else:
            errs.add(P + "data_parallel_shard_degree", f"-1: the world {world} is not divisible by replicate x tp x pp x cp",
                     "pass a --world-size that is a multiple of their product")
            shard = None
    if shard is not None and rep:
        dp = rep * shard
        if world is None and tp and pp and cp:
            world = dp * tp * pp * cp
        elif world is not None and dp * tp * pp * cp != world:
            errs.add("parallelism", f"replicate x shard x tp x pp x cp = {dp * tp * pp * cp}, but --world-size is {world}",
                     "make the degrees multiply to the world size (or use data_parallel_shard_degree = -1)")
        if rep > 1 and shard > 1:
            f.refuse(P + "data_parallel_replicate_degree", "HSDP (sharding within groups, replicating across them) is not "
                     "modelled: simtrain shards over the whole data-parallel group", "use replicate 1 (FSDP) or shard 1 (DDP)")
    par: dict[str, Any] = {"tp": tp, "pp": pp, "cp": cp, "dp": dp, "zero_stage": 3 if shard and shard > 1 else 0,
                           "sequence_parallel": bool(tp and tp > 1)}   # torchtitan's TP plan shards the sequence
    if ep and ep > 1:
        par["ep"] = ep
        par["etp"] = etp
    sched = f.take(P + "pipeline_parallel_schedule", "1F1B")
    csv = f.take(P + "pipeline_parallel_schedule_csv")
    if csv:
        par["schedule_csv"] = str(csv)
    elif pp and pp > 1:
        key = str(sched).lower().replace("_", "")
        if key in SCHEDULES:
            par["schedule"] = SCHEDULES[key]
        else:
            f.refuse(P + "pipeline_parallel_schedule", f"schedule {sched!r} is not modelled",
                     f"use one of {', '.join(sorted(SCHEDULES))} (simtrain list schedules)")
    lps = _int(f, P + "pipeline_parallel_layers_per_stage", None)
    pmb = _int(f, P + "pipeline_parallel_microbatch_size", 1)

    T = "training."
    local = _int(f, T + "local_batch_size", None) or _int(f, T + "batch_size", None)
    gbs = f.take(T + "global_batch_size", -1)
    seq = opts.seq_length or _int(f, T + "seq_len", None)
    if local is None:
        errs.add(T + "local_batch_size", "missing", "add local_batch_size to [training]")
    gb = gbs if isinstance(gbs, int) and gbs > 0 else (local * dp if local and dp else None)
    mb = (pmb if pp and pp > 1 else local)
    if gb and mb and dp and gb % (mb * dp):
        errs.add(T + "global_batch_size", f"{gb} is not divisible by micro batch x dp = {mb} x {dp}", f"use a multiple of {mb * dp}")
    if pp and pp > 1 and local and pmb and local % pmb:
        errs.add(P + "pipeline_parallel_microbatch_size", f"{pmb} does not divide local_batch_size {local}", "use a divisor")
    prec = opts.precision
    conv = f.take("model.converters", [])
    # the [float8] table of older torchtitan turns float8 on by being there; the newer
    # [quantize.linear.float8] only configures the `float8` converter
    old = f.take("float8.enable_fsdp_float8_all_gather")
    fp8 = old is not None or "float8" in (conv or [])
    fp8_gather = f.take("quantize.linear.float8.enable_fsdp_float8_all_gather", old)
    # torchao's float8 recipes (tensorwise, its default, and rowwise) as training.fp8_recipe
    key = "quantize.linear.float8.recipe_name" if f.has("quantize.linear.float8.recipe_name") else "float8.recipe_name"
    rname = f.take(key)
    fp8_recipe = None
    if fp8 or rname:
        if rname in (None, "tensorwise", "rowwise"):
            fp8_recipe = f"torchao_{rname or 'tensorwise'}"
        else:
            f.refuse(key, f"torchao recipe {rname!r} is not modelled (rowwise_with_gw_hp keeps the weight-gradient "
                     "GEMMs in bf16)", "use tensorwise or rowwise")
    f.use(*[k for k in f.values if k.startswith(("float8.", "quantize.linear.float8."))])
    mp = f.take(T + "mixed_precision_param", "bfloat16")
    if prec is None:
        if fp8:
            prec = "fp8"
        elif mp == "bfloat16":
            prec = "bf16"
        elif mp == "float16":
            prec = "fp16"
        else:
            f.refuse(T + "mixed_precision_param", f"{mp!r} training is not modelled", "use bfloat16 (or pass --precision)")
    f.use(T + "mixed_precision_reduce")
    # torchtitan's defaults without an [activation_checkpoint] table: selective, every 2nd layer
    default = not f.has("activation_checkpoint.mode") and not f.has("activation_checkpoint.selective_ac_option")
    mode = f.take("activation_checkpoint.mode", "selective")
    opt = f.take("activation_checkpoint.selective_ac_option", "2")
    recompute = {"none": "none", "full": "full"}.get(str(mode))
    if mode == "selective":
        if str(opt) == "op":
            recompute = "op"        # the op-level policy (every second matmul and the non-matmul kernels re-run)
        elif str(opt) == "1":
            recompute = "full"      # every layer checkpointed whole
        else:
            f.refuse("activation_checkpoint.selective_ac_option", f"checkpointing every {opt}-th layer is not modelled"
                     + (" (torchtitan's default without an [activation_checkpoint] table)" if default else ""),
                     'set [activation_checkpoint] mode = "none", "full", or "selective" with selective_ac_option = "op"')
    elif recompute is None:
        f.refuse("activation_checkpoint.mode", f"unknown mode {mode!r}", "use none, selective or full")
    if f.take("compile.enable"):
        warnings.warn(f"{file}: compile.enable: torch.compile's kernel fusion is not modelled; the step is simulated "
                      "with eager kernels", stacklevel=2)
    f.use("compile.components")
    if f.take(P + "enable_async_tensor_parallel") and tp and tp > 1:
        par["tp_comm_overlap"] = "async_tp"
    model = model_section(opts, seq, errs, out_dir)
    name, flavor = f.take("model.name"), f.take("model.flavor")
    if model is None:
        preset = PRESETS.get((str(name).lower(), str(flavor).lower()))
        if preset is None:
            errs.add("model.flavor", f"model {name!r} flavor {flavor!r} names no simtrain preset",
                     "pass --model PRESET or --hf-config config.json")
        else:
            model = {"preset": preset, "seq_length": seq}
    training = {"micro_batch_size": mb, "global_batch_size": gb, "precision": prec, "recompute": recompute,
                "fusions": _fusions(f), "loss_kernel": "torch"}      # its loss: F.cross_entropy on fp32 logits
    if prec == "fp8" and fp8_recipe:
        training["fp8_recipe"] = fp8_recipe
        # FSDP2 all-gathers the Float8Linear weights in FP8 (tensorwise scaling only; FSDP only)
        if fp8_gather is True and fp8_recipe == "torchao_tensorwise" and par.get("zero_stage", 0) >= 1:
            training["fp8_param_gather"] = True
    if lps and pp and pp > 1:
        L = model_presets().get(model.get("preset"), {}).get("num_layers") if model else None
        if L and L % (lps * pp) == 0:
            par["vpp"] = L // (lps * pp)          # stages of lps layers, pp of them per round
        else:
            f.refuse(P + "pipeline_parallel_layers_per_stage", f"{lps} layers per stage do not split the model's "
                     f"{L or 'unknown'} layers into a multiple of pp {pp} stages", "give a layer count that does")
    cluster = cluster_section(opts, world, errs, "--world-size")
    f.warn_ignored("fields")
    return drop_none({"name": opts.name or Path(file).stem, "model": model, "training": training, "parallel": par,
                      "cluster": cluster})
