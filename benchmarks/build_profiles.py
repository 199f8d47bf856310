"""Builds the shipped device profiles (simtrain/data/profiles/) from public collective-level data.

    python benchmarks/build_profiles.py        # rewrites the profiles from validation/data

Each profile refines a device preset (whose GEMM, memory-bound and attention curves already come
from operator-level measurements, see simtrain/data/devices.yaml) with the nccl-tests sweeps of
validation/data/nccl-tests/nccl_busbw.yaml measured on that GPU, turned into collective tables by
the same code as `simtrain calibrate` (fit_alpha_beta). The A100 profile also carries the
per-operator overhead of the Megatron-DeepSpeed stack, set from the vTrain single-node runs
(benchmarks/fit_op_overhead.py; the data README allows the single-node set for setting compute
efficiency, the multi-node set only reports error). The MLU profiles are specifications only,
marked uncalibrated until the suite has been run on an MLU.
"""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simtrain.calibration.fit import PROFILE_SCHEMA, fit_alpha_beta  # noqa: E402
from simtrain.calibration.nccl_tests import bus_factor  # noqa: E402

DATA = ROOT / "validation" / "data" / "nccl-tests" / "nccl_busbw.yaml"
OUT = ROOT / "simtrain" / "data" / "profiles"
A100_OP_OVERHEAD_US = 69.5   # benchmarks/fit_op_overhead.py: the single-node MAPE minimum (8.79 %) under the host-queue model

PROFILES = {
    "a100-megatron-deepspeed": ("a100-sxm4-80gb", ["nccl_azure_nda100v4_allreduce"]),
    "h100-public": ("h100-sxm5-80gb", ["nccl_vp_h100_1node_allreduce", "nccl_vp_h100_4node_allreduce",
                                        "nccl_vp_h100_4node_allgather"]),
    "h200-public": ("h200-sxm-141gb", ["nccl_azure_ndh200v5_allreduce"]),
    "gb200-public": ("gb200-186gb", ["nccl_azure_ndgb200v6_allreduce"]),
}
# Compute slowdown while a collective runs on the same GPU (devices.PROFILE `interference`):
# s = 1 - (time alone / time overlapped), from published kernel timings, never from step times.
_LEE = ("Lee et al., 'Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning', "
        "arXiv 2507.03114 (2025): compute kernels of GPT and LLaMA training on 4 A100 / H100 / MI250 / MI210 slow by "
        "18.9 % on average (max 40 %) while overlapped with communication; s = 1 - 1/1.189 = 0.159")
_NCCL_A100_AG = ("an Nsight Systems profile posted on the NVIDIA/nccl tracker (github.com/NVIDIA/nccl/issues/1428, 2024-09) of GPT training on A100-SXM4-80GB, kernels "
             "overlapped with an NCCL AllGather vs not: ")
_A100_AG = [("gemm", 1.18, 2.08, "GEMM 1.18 ms alone, 2.08 ms overlapped"),
            ("attention", 0.18, 0.33, "attention 0.18 ms alone, 0.33 ms overlapped"),
            ("memory", 0.02, 0.05, "elementwise 0.02 ms alone, 0.05 ms overlapped")]


def interference(device: str) -> list:
    """The shipped table: the all-kernel average of Lee et al. for every op class and collective
    (`any`); on A100 also the one public per-class measurement, under AllGather."""
    rows = []
    if device == "a100":
        rows += [{"op": op, "collective": "all_gather", "s": round(1 - alone / over, 3),
                  "source": f"measured: {_NCCL_A100_AG}{what}; s = 1 - {alone}/{over} (a single profile, no repeat count given)"}
                 for op, alone, over, what in _A100_AG]
    how = {"a100": "measured (cross-device average, A100 among the devices)", "h100": "measured (cross-device average, "
           "H100 among the devices)", "h200": "borrowed from H100 (same compute die, more HBM bandwidth): cross-device average"}
    if device not in how:       # no published overlap measurement on this device (GB200): no table, no slowdown
        return rows
    rows += [{"op": op, "collective": "any", "s": 0.159, "source": f"{how[device]}: {_LEE}"
              + ("" if op == "gemm" else f"; applied to {op} ops as well (the average covers all kernels)")}
             for op in ("gemm", "attention", "memory")]
    return rows


UNCALIBRATED = {"mlu370-x8-spec": "mlu370-x8", "mlu590-spec": "mlu590"}


def table(e: dict) -> dict:
    n, coll = e["n_gpus"], e["collective"]
    f = bus_factor(coll, n)
    pts = []
    for r in e["data"]:
        t = r.get("time_us")
        if t is None and r.get("busbw_GBps"):
            t = r["bytes"] * f / (r["busbw_GBps"] * 1e3)      # tables that print busbw only
        if t:
            pts.append((r["bytes"], t * 1e-6))
    alpha, peak = fit_alpha_beta([(b * f, t) for b, t in pts])
    src = e["source"]
    where = src.get("repo", "") + (f" {src['path']}" if src.get("path") else "")
    return {"collective": coll, "ranks": n, "nodes": e["n_nodes"],
            "source": f"nccl-tests sweep {e['id']} in validation/data/nccl-tests/nccl_busbw.yaml ({where}; {e.get('confidence', '')})",
            "alpha_us": round(alpha * 1e6, 3), "peak_busbw_GBps": round(peak / 1e9, 3),
            "points": [{"bytes": b, "time_us": round(t * 1e6, 3), "busbw_GBps": round(b * f / t / 1e9, 3)} for b, t in pts if t > 0]}


def main() -> int:
    if not DATA.exists():
        print(f"{DATA} is absent; the collective profiles stay as they are")
        write_uncalibrated()
        return 0
    sweeps = {e["id"]: e for e in yaml.safe_load(DATA.read_text()) if e.get("kind") == "sweep"}
    for name, (base, ids) in PROFILES.items():
        doc = {"schema": PROFILE_SCHEMA, "device": name, "base": base,
               "provenance": {"built_by": "benchmarks/build_profiles.py", "inputs": ids},
               "collectives": [table(sweeps[i]) for i in ids]}
        if base == "a100-sxm4-80gb":
            doc["op_overhead"] = {
                "per_operator": f"{A100_OP_OVERHEAD_US:g} us",
                "source": "host issue cost per operator of eager Megatron-DeepSpeed (fp16) on A100 (the device runs each "
                          "operator once the host has issued it, so the cost hides behind longer kernels: simtrain.cost.roofline."
                          "host_queue), set to the value that minimises the MAPE over the 1,440 vTrain single-node runs "
                          "(benchmarks/fit_op_overhead.py); the multi-node runs are not used"}
        rows = interference(base.split("-")[0])
        if rows:
            doc["interference"] = rows
        (OUT / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        print(f"wrote {OUT / (name + '.yaml')}")
    write_uncalibrated()
    return 0


def spec_values(base: str) -> list:
    """Every number an uncalibrated profile prices with, each with the source the preset gives it:
    the peaks, memory and host link of the preset itself, and the efficiency curves, which are the
    preset's own or borrowed (then the preset's `borrows_notes` says from what and what was searched)."""
    from simtrain.hardware.devices import _raw, get_device
    d, dev = _raw()[base], get_device(base)
    peak_src = d["source"] + (f" ({d['peak_notes']})" if d.get("peak_notes") else "")
    rows = [{"key": f"peak.{k}", "value": v, "source": peak_src, "confidence": d["confidence"]} for k, v in d["peak"].items()]
    rows += [{"key": "memory.capacity", "value": d["memory"]["capacity"], "source": d["capacity_source"], "confidence": d["confidence"]},
             {"key": "memory.bandwidth", "value": d["memory"]["bandwidth"], "source": d["source"], "confidence": d["confidence"]},
             {"key": "host_link.bandwidth", "value": d["host_link"]["bandwidth"], "source": d["host_link"]["source"],
              "confidence": "low" if d["host_link"]["source"].startswith("assumed") else d["confidence"]}]
    borrowed = d.get("borrows_notes", "")
    curves = [("gemm.16bit", dev.gemm["16bit"].origin, dev.gemm["16bit"].source),
              ("memory_bound.efficiency", dev.mem_origin, f"{dev.mem_efficiency:.4f} of the datasheet bandwidth"),
              ("flash_attention", dev.flash.origin, dev.flash.source)]
    for key, origin, src in curves:
        own = origin == base
        rows.append({"key": key, "value": f"curve of {origin}", "source": src if own else f"{borrowed} [{origin}: {src}]",
                     "confidence": d["confidence"] if own else "low (borrowed)"})
    return rows


def write_uncalibrated() -> None:
    for name, base in UNCALIBRATED.items():
        doc = {"schema": PROFILE_SCHEMA, "device": name, "base": base, "status": "uncalibrated",
               "provenance": {"built_by": "benchmarks/build_profiles.py",
                              "note": "specifications only (the preset); no public Cambricon microbenchmark exists "
                                      "(docs/modelling/mlu.md). Run simtrain bench on an MLU and simtrain calibrate to replace it.",
                              "values": spec_values(base)}}
        (OUT / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=4096))
        print(f"wrote {OUT / (name + '.yaml')}")


if __name__ == "__main__":
    sys.exit(main())
