"""Validation of the generation model (`simtrain.rollout`) against published serving throughput.

Takes the cases of validation/data/serving/ (TensorRT-LLM's performance overview: model, GPU,
tp, fixed input/output lengths, request count, measured total output tokens/s; source and licence
in the README there); simulates each with `simulate_generation` and reports the per-case signed
error (simulated / measured - 1), the mean signed error and the MAPE.

The engine settings of each case are the benchmark's own, derived by the rules the benchmark
states, never fitted: trtllm-bench's max batch size and max tokens per iteration come from its
heuristic (tensorrt_llm/bench/build/tuning.py: calc_engine_setting / finetune_setting, re-derived
in `trtllm_bench_settings`), KV cache 0.90 of the memory left after the weights
(`kv_cache_free_gpu_mem_fraction` default), FP8 weights and GEMMs (the ModelOpt FP8 checkpoints
the page lists), CUDA graphs for batches up to 8,192 (the page's cuda_graph_config), and
TRT-LLM's overlap scheduler (CPU work hidden behind the GPU step). Declared assumptions: the KV
cache is FP8 (the checkpoints' kv_cache_quant_algo, not checked here), prompts are scheduled
with chunking at the token budget as vLLM V1 does (TRT-LLM without chunked prefill fits whole
prompts), and the engine's CPU overhead keeps the EngineConfig default.
"""
from __future__ import annotations

import csv
import math
import sys
from dataclasses import dataclass, replace
from typing import TextIO

from simtrain import resources
from simtrain.hardware.devices import Device, get_device
from simtrain.hardware.topology import Topology, find_topology_file, load_topology
from simtrain.rollout.engine import EngineConfig, Request, simulate_generation
from simtrain.spec.loading import model_presets
from simtrain.spec.scenario import MLASpec, ModelSpec, MoESpec, RoutingSpec
from simtrain.workload.generation import GenerationDims

SERVING = resources.VALIDATION / "serving"
CASES = SERVING / "trtllm_perf_overview.csv"

# the page's model names -> the architecture presets with the same dimensions (simtrain/data/models.yaml):
# Llama 3.1 8B / 3.3 70B / 3.1 405B share the Llama 3 8B / 70B / 405B architectures
MODELS = {"llama3.1-8b": "llama3-8b", "llama3.3-70b": "llama3-70b", "llama3.1-405b": "llama3-405b"}
TOPOLOGY = {"h100-sxm5-80gb": "dgx-h100", "h200-sxm-141gb": "hgx-h200"}
GiB = 2 ** 30


@dataclass(frozen=True)
class ServingCase:
    model: str
    device: str
    tp: int
    isl: int
    osl: int
    num_requests: int
    measured: float          # output tokens/s


@dataclass(frozen=True)
class ServingRun:
    case: ServingCase
    simulated: float
    engine: EngineConfig

    @property
    def error(self) -> float:
        return self.simulated / self.case.measured - 1.0


def cases(path: str | None = None) -> list[ServingCase]:
    with open(path or CASES, encoding="utf-8") as f:
        return [ServingCase(r["model"], r["device"], int(r["tp"]), int(r["isl"]), int(r["osl"]), int(r["num_requests"]),
                            float(r["output_tokens_per_s"])) for r in csv.DictReader(f)]


def model_spec(name: str) -> ModelSpec:
    preset = MODELS.get(name, name)
    fields = {k: v for k, v in model_presets()[preset].items() if k != "source"}
    fields.setdefault("num_key_value_heads", fields["num_attention_heads"])
    moe = fields.pop("moe", None)
    if isinstance(moe, dict):
        moe = dict(moe)
        routing = moe.pop("routing", None)
        moe.setdefault("shared_expert_ffn_hidden_size", moe.get("num_shared_experts", 0) * moe["expert_ffn_hidden_size"])
        moe = MoESpec(**moe, **({"routing": RoutingSpec(**routing)} if routing else {}))
    mla = fields.pop("mla", None)
    if isinstance(mla, dict):
        mla = MLASpec(**mla)
    fields.pop("encoder", None)
    return ModelSpec(name=name, moe=moe, mla=mla, **fields)


def trtllm_bench_settings(model: ModelSpec, device: Device, tp: int, isl: int, osl: int,
                          kv_fraction: float = 0.95, weight_bytes: float = 1.0, kv_bytes: float = 1.0) -> tuple[int, int]:
    """(max batch size, max tokens per iteration) as trtllm-bench derives them
    (tensorrt_llm/bench/build/tuning.py): KV bytes per token 2·layers·max(tp, kv heads)·head
    size·bytes, engine size = parameters x bytes, requests that fit = kv_fraction x (memory x tp -
    engine) / (bytes per token x (isl + osl)), batch capped at 4096 and rounded up (to 32 below
    256, 128 below 1024, else 256; at least 64); tokens = batch x (1 + isl/osl) capped at 32768,
    rounded up (to 256 below 4096 with at least 2048, 512 below 8192, else 1024).
    Worked example (Llama 3 8B, H100 80 GB, tp 1, 128/128): 32·2·8·128 B = 64 KiB per token,
    engine 8.03 GB; 0.95 x (74.5 - 7.48) GiB / (64 KiB x 256) = 4,074 requests -> batch 4,096,
    tokens 4,074 x 2 = 8,148 -> 8,192."""
    dims = GenerationDims(model, 1)
    per_token = 2 * model.num_layers * max(tp, model.num_key_value_heads) * model.head_dim * kv_bytes / GiB
    engine = dims.weight_params() * weight_bytes / GiB
    avail = device.memory_bytes / GiB * tp - engine
    reqs = kv_fraction * avail / (per_token * (isl + osl))
    raw_bs = min(reqs, 4096)
    raw_tok = min(raw_bs * (1 + isl / osl), 32768)
    if raw_bs < 256:
        bs = max(64, 32 * math.ceil(raw_bs / 32))
    elif raw_bs < 1024:
        bs = 128 * math.ceil(raw_bs / 128)
    else:
        bs = 256 * math.ceil(raw_bs / 256)
    if raw_tok < 4096:
        tok = max(2048, 256 * math.ceil(raw_tok / 256))
    elif raw_tok < 8192:
        tok = 512 * math.ceil(raw_tok / 512)
    else:
        tok = 1024 * math.ceil(raw_tok / 1024)
    return bs, tok


def engine_for(c: ServingCase, model: ModelSpec, device: Device) -> EngineConfig:
    bs, tok = trtllm_bench_settings(model, device, c.tp, c.isl, c.osl)
    base = EngineConfig(tp=c.tp, max_num_seqs=bs, max_num_batched_tokens=tok, chunked_prefill=True,
                        cuda_graphs=True, cuda_graph_max_batch=8192, overlap_cpu=True,
                        weight_dtype="fp8", kv_dtype="fp8")
    # kv_cache_free_gpu_mem_fraction 0.90 of what is left after weights and workspace, written as
    # the equivalent gpu_memory_utilization
    dims = GenerationDims(model, c.tp, 1, "fp8", "fp8")
    used = dims.weight_bytes() + dims.workspace_bytes(tok, bs) + base.reserved_bytes
    util = (0.90 * (device.memory_bytes - used) + used) / device.memory_bytes
    return replace(base, gpu_memory_utilization=min(util, 1.0))


def topology_for(device: str, tp: int) -> Topology | None:
    if tp == 1:
        return None
    return load_topology(find_topology_file(TOPOLOGY[device], None), 1)


def run_case(c: ServingCase) -> ServingRun:
    model = model_spec(c.model)
    dev = get_device(c.device)
    eng = engine_for(c, model, dev)
    reqs = [Request(c.isl, c.osl)] * c.num_requests
    res = simulate_generation(model, dev, topology_for(c.device, c.tp), eng, reqs)
    return ServingRun(c, res.output_tokens_per_s, eng)


def evaluate(limit: int | None = None) -> list[ServingRun]:
    return [run_case(c) for c in cases()[:limit]]


def summary(runs: list[ServingRun]) -> dict:
    errs = [r.error for r in runs]
    return {"cases": len(runs), "mean_signed_error": sum(errs) / len(errs) if errs else 0.0,
            "mape": sum(abs(e) for e in errs) / len(errs) if errs else 0.0}


def report(runs: list[ServingRun], out: TextIO) -> dict:
    """A markdown table of the runs and the summary line; returns the summary."""
    out.write("| model | GPU | tp | ISL/OSL | requests | measured tok/s | simulated tok/s | error |\n")
    out.write("|---|---|---|---|---|---|---|---|\n")
    for r in runs:
        c = r.case
        out.write(f"| {c.model} | {c.device} | {c.tp} | {c.isl}/{c.osl} | {c.num_requests} | {c.measured:,.0f} | "
                  f"{r.simulated:,.0f} | {r.error:+.1%} |\n")
    s = summary(runs)
    out.write(f"\n{s['cases']} cases: mean signed error {s['mean_signed_error']:+.1%}, MAPE {s['mape']:.1%}\n")
    return s


if __name__ == "__main__":
    report(evaluate(), sys.stdout)
