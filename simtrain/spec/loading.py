"""Loading (spec stage): scenario YAML (+ presets, HF config.json, --set overrides) -> frozen Scenario.

Every problem of a file is collected and reported together as `<file>: <key.path>: <problem>; <fix>`.
Plan checks that need no simulation (divisibility, world size against the topology, device
precision support) run here too, so nothing reaches the engine that cannot run.
"""
from __future__ import annotations

import copy
import difflib
import json
import math
import re
import warnings
from collections.abc import Callable, Iterable
from functools import lru_cache
from pathlib import Path

from simtrain import resources
from simtrain.errors import Collector, ConfigError, Problem
from simtrain.hardware import devices
from simtrain.hardware.topology import Topology, find_topology_file, load_topology
from simtrain.plan.grid import POLICIES
from simtrain.plan.heterogeneity import Jitter, Straggler
from simtrain.schedules import SCHEDULES
from simtrain.schedules.csvio import read_csv
from simtrain.spec import reliability
from simtrain.spec.fields import parse_value, section_of, validate_map
from simtrain.spec.files import TreeError, check_tree, json_problem, load_json, load_yaml, parse_yaml, read_text, short
from simtrain.spec.overrides import expand_single
from simtrain.spec.scenario import (
    COST,
    JITTER,
    MIXED,
    RECOMPUTE_MODULES,
    STRAGGLER,
    UB_GEMMS,
    ClusterSpec,
    EncoderSpec,
    MLASpec,
    ModelSpec,
    MoESpec,
    NetworkSpec,
    ParallelSpec,
    RoutingSpec,
    Scenario,
    TrainingSpec,
)
from simtrain.units import plural

DATA = resources.DATA

# The key tables the loader checks, derived from the field declarations of simtrain.spec.scenario
SCENARIO = section_of(Scenario)
MODEL = section_of(ModelSpec)
MOE = section_of(MoESpec)
ROUTING = section_of(RoutingSpec)
MLA = section_of(MLASpec)
ENCODER = section_of(EncoderSpec)
TRAINING = section_of(TrainingSpec)
PARALLEL = section_of(ParallelSpec)
CLUSTER = section_of(ClusterSpec)
NETWORK = section_of(NetworkSpec)
TOP = tuple(SCENARIO)
# microbatches of one step the schedules are built for (each is simulated op by op)
MAX_MICROBATCHES = 16_384
REQUIRED_SECTIONS = tuple(k for k, key in SCENARIO.items() if key.required)

def _resolve_memory(cluster: dict, capacities: list, errs: Collector) -> None:
    """cluster.memory_reserve -> one float (a fraction of the capacity below 1, else bytes; see
    ClusterSpec.reserve_of), checked against the capacities of the devices in use: what is left
    for the run, capacity - reserve, must be more than nothing on every device."""
    raw = cluster.get("memory_reserve")
    fix = 'write a size such as "6 GiB", or a fraction of the capacity such as 0.05 (or "5%")'
    if isinstance(raw, str) and raw.strip().endswith("%"):
        # a percentage of the capacity, as the docs speak of the default ("5 %")
        try:
            pct = float(raw.strip()[:-1])
        except ValueError:
            errs.add("cluster.memory_reserve", f"cannot read {short(raw, 40)} as a percentage", fix)
            cluster["memory_reserve"] = None
            return
        if not (math.isfinite(pct) and 0 <= pct < 100):
            errs.add("cluster.memory_reserve", f"a percentage of the capacity must be >= 0 and < 100, got {short(raw, 40)}", fix)
            cluster["memory_reserve"] = None
            return
        cluster["memory_reserve"] = pct / 100
    elif isinstance(raw, str):
        own = Collector(errs.file)
        size = parse_value(raw, "bytes", "cluster.memory_reserve", own)
        if size is None:
            # the size parser's problem, with the reserve's own fix (its example is a device's capacity)
            errs.problems.extend(Problem(p.file, p.path, p.problem, fix) for p in own.problems)
            cluster["memory_reserve"] = None
            return
        if 0 < size < 1:
            errs.add("cluster.memory_reserve", f"{short(raw, 40)} is less than one byte", f"{fix}, or 0")
            cluster["memory_reserve"] = None
            return
        cluster["memory_reserve"] = size
    elif isinstance(raw, bool) or not isinstance(raw, (int, float)):
        errs.add("cluster.memory_reserve", f"expected a size or a fraction, got {short(raw, 40)}", fix)
        cluster["memory_reserve"] = None
        return
    elif not (math.isfinite(raw) and 0 <= raw < 1):
        errs.add("cluster.memory_reserve", f"a fraction of the capacity must be >= 0 and < 1, got {short(raw, 40)}",
                 f"{fix} (a number is a fraction; give a size with its unit)")
        cluster["memory_reserve"] = None
        return
    else:
        cluster["memory_reserve"] = float(raw)
    r = cluster["memory_reserve"]
    for name, cap in capacities:
        held = r * cap if r < 1 else r
        if held >= cap:
            errs.add("cluster.memory_reserve", f"{short(raw, 40)} leaves nothing of the {cap / 2**30:.4g} GiB of {name}",
                     "give a reserve smaller than the device memory (e.g. \"6 GiB\" or 0.05)")
            cluster["memory_reserve"] = None
            return


def _resolve_heterogeneity(cluster: dict, errs: Collector) -> None:
    """cluster.stragglers / jitter / mixed -> the spec's tuples (see simtrain.plan.heterogeneity)."""
    nodes = cluster.get("nodes")
    raw = cluster.pop("stragglers", None)
    out = []
    if raw is not None:
        if not isinstance(raw, list):
            errs.add("cluster.stragglers", "expected a list of entries", "write e.g. `[{fraction: 0.01, compute: 1.2}]`")
            raw = []
        for i, e in enumerate(raw):
            path = f"cluster.stragglers[{i}]"
            before = len(errs.problems)
            v = validate_map(e, STRAGGLER, path, errs)
            if len(errs.problems) > before:
                continue
            devs, frac = v["devices"], v["fraction"]
            if (devs is None) == (frac is None):
                errs.add(path, "give exactly one of `devices` (a list of device indices) and `fraction`",
                         "write e.g. `{devices: [3, 17], compute: 1.3}` or `{fraction: 0.01, compute: 1.3}`")
                continue
            if devs is not None and not (isinstance(devs, list) and devs and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in devs)):
                errs.add(f"{path}.devices", "expected a non-empty list of device indices >= 0", "write e.g. `[3, 17]`")
                continue
            if frac is not None and not 0 < frac <= 1:
                errs.add(f"{path}.fraction", f"must be in (0, 1], got {frac}", "write e.g. `0.01` for 1 % of the devices")
                continue
            for k in ("compute", "memory", "link"):
                if v[k] <= 0:
                    errs.add(f"{path}.{k}", f"a time factor must be > 0, got {v[k]}", "write e.g. `1.3` (30 % slower)")
            out.append(Straggler(devices=tuple(devs or ()), fraction=frac or 0.0, compute=v["compute"], memory=v["memory"], link=v["link"]))
    cluster["stragglers"] = tuple(out)
    j = cluster.pop("jitter", None)
    cluster["jitter"] = None
    if j is not None:
        before = len(errs.problems)
        v = validate_map(j, JITTER, "cluster.jitter", errs)
        if len(errs.problems) == before:
            if v["sigma"] < 0:
                errs.add("cluster.jitter.sigma", f"must be >= 0, got {v['sigma']}", "write e.g. `0.02` (2 %)")
            else:
                cluster["jitter"] = Jitter(**v)
    var = cluster.get("variability", "auto")
    if var is None:
        cluster["variability"] = "none"
    elif isinstance(var, bool) or not (var in ("auto", "measured", "none") or (isinstance(var, (int, float)) and 0 <= var <= 1)):
        errs.add("cluster.variability", f"expected auto, measured, none or a sigma in [0, 1], got {var!r}",
                 "write e.g. `measured` (the measured per-device spread) or `0.015` (1.5 %)")
        cluster["variability"] = "auto"
    elif isinstance(var, (int, float)):
        cluster["variability"] = float(var)
    m = cluster.pop("mixed", None)
    blocks = []
    if m is not None:
        if not isinstance(m, list):
            errs.add("cluster.mixed", "expected a list of node blocks", "write e.g. `[{nodes: 16, device: a100-sxm4-80gb}]`")
            m = []
        for i, e in enumerate(m):
            path = f"cluster.mixed[{i}]"
            v = validate_map(e, MIXED, path, errs)
            if v.get("device") is not None and v["device"] not in devices.preset_names():
                errs.add(f"{path}.device", f"unknown device {v['device']!r}", f"use one of: {', '.join(devices.preset_names())}")
            elif v.get("nodes"):
                blocks.append((v["nodes"], v["device"]))
        if nodes and sum(n for n, _ in blocks) > nodes:
            errs.add("cluster.mixed", f"the blocks hold {sum(n for n, _ in blocks)} nodes, the cluster {nodes}",
                     "make the blocks add up to at most cluster.nodes (the rest runs cluster.device)")
        if blocks and cluster.get("device_profile"):
            errs.add("cluster.mixed", "mixed device types cannot be combined with one device_profile", "remove device_profile or mixed")
    cluster["mixed"] = tuple(blocks)


@lru_cache(maxsize=None)
def model_presets() -> dict:
    return load_yaml(DATA / "models.yaml", Collector(str(DATA / "models.yaml")), "fix the shipped presets")


@lru_cache(maxsize=None)
def encoder_presets() -> dict:
    return load_yaml(DATA / "encoders.yaml", Collector(str(DATA / "encoders.yaml")), "fix the shipped presets")


# keys whose value names a file: a relative path given on the command line is taken from the
# current directory (made absolute here); one written in a scenario file, from the file's directory
PATH_KEYS = ("model.hf_config", "parallel.schedule_csv", "cluster.device_profile", "cluster.topology", "cluster.topology.file")
# names the loader also looks up among the shipped files (a bare name stays a name)
SHIPPED_NAME_KEYS = ("cluster.device_profile", "cluster.topology", "cluster.topology.file")


def _command_line_path(key: str, value: object) -> object:
    """A relative path given with --set for a file key, made absolute against the current
    directory; a bare shipped name (`dgx-h100`) that is no file here stays a name."""
    if key not in PATH_KEYS or not isinstance(value, str) or not value or Path(value).is_absolute():
        return value
    p = Path(value)
    here = Path.cwd() / p
    if key in SHIPPED_NAME_KEYS and not here.exists() and len(p.parts) == 1:
        return value
    return str(here)


def apply_overrides(raw: dict, overrides: Iterable[str] | None, errs: Collector) -> dict:
    """`--set a.b.c=value`: value parsed as YAML, so `8`, `true`, `"300 GB/s"` and `[7, 8]` all work;
    `a+b=1+2` sets both keys (simtrain.spec.overrides). A file key's relative path is taken from the
    current directory. `cluster.topology.<key>` overrides that key of the topology file (the
    scenario's `cluster.topology` becomes the mapping `{file: ..., <key>: ...}`)."""
    raw = copy.deepcopy(raw)
    for ov in expand_single(overrides, errs):
        if "=" not in ov:
            errs.add(f"--set {ov}", "expected key.path=value", "write e.g. `--set parallel.tp=4`")
            continue
        key, val = ov.split("=", 1)
        key = key.strip()
        parts = key.split(".")
        if not all(parts):
            errs.add(f"--set {key[:100]}", "empty part in the key path", "write e.g. `--set parallel.tp=4`")
            continue
        try:
            value = parse_yaml(val)
        except TreeError as e:
            if "not valid YAML" not in str(e) or "duplicate key" in str(e):
                errs.add(f"--set {key[:100]}", str(e), "give a plain value, e.g. `--set parallel.tp=4`")
                continue
            value = val
        value = _command_line_path(key, value)
        node = raw
        for depth, p in enumerate(parts[:-1]):
            if parts[:depth + 1] == ["cluster", "topology"] and isinstance(node.get(p), str):
                node[p] = {"file": node[p]}      # a key of the named topology file
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        node[parts[-1]] = value
    try:
        check_tree(raw)
    except TreeError as e:
        errs.add("--set", f"the scenario with the overrides {e}", "give fewer or smaller overrides")
    return raw


def _model_from_hf(path: Path, errs: Collector) -> tuple[dict, int | None]:
    """The model fields of a Hugging Face config.json, and its max_position_embeddings (GPT-2:
    n_positions): the longest sequence the model accepts, which is not the training length."""
    herr = Collector(str(path))
    try:
        cfg = load_json(path)
    except TreeError as e:
        fix = "point it at a Hugging Face config.json"
        try:
            problem, fix = json_problem(read_text(path), e, fix)
        except (OSError, ValueError, TreeError):
            problem = str(e)
        errs.add("model.hf_config", f"cannot read {short(str(path), 100)} as JSON: {problem}", fix)
        return {}, None
    if not isinstance(cfg, dict):
        errs.add("model.hf_config", f"{short(str(path), 100)} holds a {type(cfg).__name__}, not a mapping",
                 "point it at a Hugging Face config.json (one JSON object)")
        return {}, None
    for a, b in _HF_ALIASES:
        if a in cfg and b in cfg and cfg[a] != cfg[b]:
            herr.add(b, f"{short(cfg[b], 40)} disagrees with {a} = {short(cfg[a], 40)} (two names of one field)",
                     f"remove one of `{a}` and `{b}`, or make them equal")
    if herr.problems:
        errs.extend(herr)
        return {}, None
    mt = cfg.get("model_type", "")
    if mt in ("gpt2", "gpt_bigcode", "openai-gpt"):
        h = cfg.get("n_embd", cfg.get("hidden_size"))
        out = {"architecture": "gpt", "num_layers": cfg.get("n_layer", cfg.get("num_hidden_layers")), "hidden_size": h,
               "num_attention_heads": cfg.get("n_head", cfg.get("num_attention_heads")),
               "ffn_hidden_size": cfg.get("n_inner") or (4 * h if isinstance(h, int) else None),
               "vocab_size": cfg.get("vocab_size"),
               "tie_embeddings": bool(cfg.get("tie_word_embeddings", True))}
    else:
        out = {"architecture": "llama", "num_layers": cfg.get("num_hidden_layers"), "hidden_size": cfg.get("hidden_size"),
               "num_attention_heads": cfg.get("num_attention_heads"),
               "num_key_value_heads": cfg.get("num_key_value_heads", cfg.get("num_attention_heads")),
               "ffn_hidden_size": cfg.get("intermediate_size"), "vocab_size": cfg.get("vocab_size"),
               "tie_embeddings": bool(cfg.get("tie_word_embeddings", False))}
        if cfg.get("head_dim") is not None and "kv_lora_rank" not in cfg:
            # Qwen3, Gemma, Mistral-Nemo: heads wider or narrower than hidden_size / heads (MLA
            # models give their head widths in their own fields)
            out["head_dim"] = cfg["head_dim"]
        if mt in ("qwen3", "qwen3_moe"):
            out["qk_norm"] = True          # Qwen3Attention's q_norm and k_norm (transformers)
    moe = _moe_from_hf(cfg)
    if moe:
        out["moe"] = moe
        if "n_routed_experts" in cfg and cfg.get("intermediate_size") is not None:
            out["ffn_hidden_size"] = cfg["intermediate_size"]      # DeepSeek: width of the dense first layers
    if "kv_lora_rank" in cfg:
        out["mla"] = {k: cfg.get(k) for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "q_lora_rank")}
        if out["mla"]["q_lora_rank"] is None:
            out["mla"].pop("q_lora_rank")
    for k, v in list(out.items()):
        if v is None:
            herr.add(k, "field missing from config.json", "add it to the config or give it under `model:` in the scenario")
            del out[k]
    errs.extend(herr)
    limit = cfg.get("max_position_embeddings", cfg.get("n_positions"))
    return out, (limit if isinstance(limit, int) and not isinstance(limit, bool) else None)


# GPT-2 style names and their Llama style equivalents: a config giving both must agree
_HF_ALIASES = (("n_embd", "hidden_size"), ("n_layer", "num_hidden_layers"), ("n_head", "num_attention_heads"),
               ("n_positions", "max_position_embeddings"), ("n_inner", "intermediate_size"))


def _moe_from_hf(cfg: dict) -> dict:
    """The MoE fields of a Hugging Face config: Mixtral (num_local_experts, num_experts_per_tok,
    intermediate_size), Qwen2-MoE (num_experts, moe_intermediate_size, shared_expert_intermediate_size,
    decoder_sparse_step) and DeepSeek-V2/V3 (n_routed_experts, n_shared_experts, moe_intermediate_size,
    first_k_dense_replace, moe_layer_freq)."""
    if "num_local_experts" in cfg:                                    # Mixtral
        return {"num_experts": cfg["num_local_experts"], "top_k": cfg.get("num_experts_per_tok", 2),
                "expert_ffn_hidden_size": cfg.get("intermediate_size")}
    if "n_routed_experts" in cfg:                                     # DeepSeek-V2 / V3
        shared = cfg.get("n_shared_experts") or 0
        return {"num_experts": cfg["n_routed_experts"], "top_k": cfg.get("num_experts_per_tok"),
                "expert_ffn_hidden_size": cfg.get("moe_intermediate_size"),
                "num_shared_experts": shared,
                "shared_expert_ffn_hidden_size": shared * (cfg.get("moe_intermediate_size") or 0),
                "first_dense_layers": cfg.get("first_k_dense_replace", 0) or 0,
                "layer_freq": cfg.get("moe_layer_freq", 1)}
    if "num_experts" in cfg and "moe_intermediate_size" in cfg:        # Qwen-MoE
        width = cfg.get("shared_expert_intermediate_size") or 0
        return {"num_experts": cfg["num_experts"], "top_k": cfg.get("num_experts_per_tok"),
                "expert_ffn_hidden_size": cfg["moe_intermediate_size"],
                "num_shared_experts": 1 if width else 0, "shared_expert_ffn_hidden_size": width,
                "shared_expert_gate": bool(width), "layer_freq": cfg.get("decoder_sparse_step", 1)}
    return {}


def _resolve_model(raw, base_dir: Path, errs: Collector) -> dict | None:
    if not isinstance(raw, dict):
        errs.add("model", "expected a mapping", "give `preset:`, `hf_config:` or the model fields")
        return None
    raw = dict(raw)
    merged = {}
    name = None
    if "preset" in raw:
        preset = raw.pop("preset")
        presets = model_presets()
        if not isinstance(preset, str) or preset not in presets:
            errs.add("model.preset", f"unknown preset {short(preset, 60)}", f"use one of: {', '.join(presets)}")
            return None
        merged.update({k: v for k, v in presets[preset].items() if k != "source"})
        name = preset
    if "hf_config" in raw:
        ref = raw.pop("hf_config")
        if not isinstance(ref, str):
            errs.add("model.hf_config", f"expected a path, got {short(ref, 60)}", "give the path of a config.json")
            return None
        p = Path(str(ref))
        cand = [base_dir / p, Path.cwd() / p]
        found = next((c for c in cand if c.is_file()), None)
        if found is None:
            errs.add("model.hf_config", f"file {ref!r} not found (looked beside the scenario and in the current directory)",
                     "give a path to a config.json")
            return None
        n0 = len(errs.problems)
        fields, limit = _model_from_hf(found, errs)
        if not fields and len(errs.problems) > n0:
            return None
        merged.update(fields)
        name = name or found.parent.name or "hf-model"
        if "seq_length" not in raw and "seq_length" not in merged:
            # max_position_embeddings (n_positions) is the longest sequence the model accepts, often
            # 16x the length it is trained on (Llama-3.1: 131,072); taking it silently would
            # simulate a different job
            errs.add("model.seq_length", "not given; a Hugging Face config.json has no training sequence length"
                     + (f" (its max_position_embeddings = {limit:,} is the longest the model accepts)" if limit else ""),
                     "add `seq_length:` under `model:` (e.g. `seq_length: 8192`) or --set model.seq_length=8192")
    for k in ("moe", "mla", "encoder"):
        # inline sub-keys refine the preset's section (e.g. `moe: {capacity_factor: 1.25}`)
        if isinstance(raw.get(k), dict) and isinstance(merged.get(k), dict):
            raw[k] = {**merged[k], **raw[k]}
    merged.update(raw)                      # inline keys override preset / config values
    if "name" in merged:
        name = merged.pop("name")
    if "num_key_value_heads" not in merged and "num_attention_heads" in merged:
        merged["num_key_value_heads"] = merged["num_attention_heads"]
    if "ffn_hidden_size" not in merged and merged.get("architecture") == "gpt" and isinstance(merged.get("hidden_size"), int):
        merged["ffn_hidden_size"] = 4 * merged["hidden_size"]
    v = validate_map(merged, MODEL, "model", errs)
    if merged.get("architecture") == "llama" and "ffn_hidden_size" not in merged:
        errs.add("model.ffn_hidden_size", "missing (llama models have no default FFN size)", "add `ffn_hidden_size:`")
    v["name"] = name or "custom"
    v["moe"] = _resolve_moe(v.get("moe"), errs)
    v["mla"] = _resolve_section(v.get("mla"), MLA, "model.mla", errs, MLASpec)
    v["encoder"] = _resolve_encoder(v.get("encoder"), errs)
    return v


def _resolve_section(raw, keys, path, errs, cls):
    if raw is None:
        return None
    before = len(errs.problems)
    vals = validate_map(raw, keys, path, errs)
    return cls(**vals) if len(errs.problems) == before else None


def _resolve_moe(raw, errs: Collector):
    if raw is None:
        return None
    if not isinstance(raw, dict):
        errs.add("model.moe", f"expected a mapping, got {type(raw).__name__}", "write e.g. `moe: {num_experts: 8, top_k: 2, expert_ffn_hidden_size: 14336}`")
        return None
    before = len(errs.problems)
    v = validate_map(raw, MOE, "model.moe", errs)
    routing = validate_map(v.pop("routing", None) or {}, ROUTING, "model.moe.routing", errs)
    if len(errs.problems) > before:
        return None
    E, k = v["num_experts"], v["top_k"]
    if k > E:
        errs.add("model.moe.top_k", f"{k} exceeds num_experts {E}", "route each token to at most num_experts experts")
    for key in ("num_shared_experts", "first_dense_layers"):
        if v[key] < 0:
            errs.add(f"model.moe.{key}", f"expected a whole number >= 0, got {v[key]}", "write e.g. `1`")
    if v["shared_expert_ffn_hidden_size"] is None:
        v["shared_expert_ffn_hidden_size"] = v["num_shared_experts"] * v["expert_ffn_hidden_size"]
    if v["capacity_factor"] is not None and v["capacity_factor"] <= 0:
        errs.add("model.moe.capacity_factor", f"must be > 0, got {v['capacity_factor']}", "write e.g. `1.25`, or remove it for dropless routing")
    loads = routing.pop("loads")
    if routing["distribution"] == "explicit":
        if not (isinstance(loads, list) and len(loads) == E and all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < math.inf for x in loads)
                and sum(loads) > 0):
            errs.add("model.moe.routing.loads", f"expected {E} finite non-negative numbers (one share per expert)",
                     f"write e.g. `[{', '.join(['1'] * min(E, 4))}{', ...' if E > 4 else ''}]`")
        else:
            tot = float(sum(loads))
            loads = tuple(float(x) / tot for x in loads)
            worst = max(loads)
            if worst > 1.0 / k + 1e-9:
                errs.add("model.moe.routing.loads", f"one expert gets {worst:.3f} of the assignments, but with top_k={k} a token picks "
                         f"{k} different experts, so no expert can take more than 1/{k}",
                         f"keep every share <= 1/{k} of the total, or set top_k: 1")
    elif loads is not None:
        errs.add("model.moe.routing.loads", f"given with distribution {routing['distribution']!r}", "set `distribution: explicit` or remove loads")
    if routing["skew"] < 0:
        errs.add("model.moe.routing.skew", f"must be >= 0, got {routing['skew']}", "write e.g. `1.2` (0 is uniform)")
    if len(errs.problems) > before:
        return None
    return MoESpec(**v, routing=RoutingSpec(loads=loads if routing["distribution"] == "explicit" else None, **routing))


def _resolve_encoder(raw, errs: Collector):
    if raw is None:
        return None
    if not isinstance(raw, dict):
        errs.add("model.encoder", "expected a mapping", "give `preset:` (simtrain list encoders) or the encoder fields")
        return None
    raw = dict(raw)
    name = "encoder"
    if "preset" in raw:
        pre = raw.pop("preset")
        presets = encoder_presets()
        if not isinstance(pre, str) or pre not in presets:
            errs.add("model.encoder.preset", f"unknown encoder preset {short(pre, 60)}", f"use one of: {', '.join(presets)}")
            return None
        raw = {**{k: v for k, v in presets[pre].items() if k != "source"}, **raw}
        name = pre
    name = raw.pop("name", name)
    before = len(errs.problems)
    v = validate_map(raw, ENCODER, "model.encoder", errs)
    if len(errs.problems) > before:
        return None
    if v["hidden_size"] % v["num_attention_heads"]:
        errs.add("model.encoder.hidden_size", f"{v['hidden_size']} is not divisible by num_attention_heads {v['num_attention_heads']}",
                 "pick a head count that divides the hidden size")
    if v["pipeline_stages"] < 0:
        errs.add("model.encoder.pipeline_stages", f"expected 0 or more, got {v['pipeline_stages']}", "0 puts it on the first stage")
    elif v["pipeline_stages"] and v["num_layers"] % v["pipeline_stages"]:
        errs.add("model.encoder.pipeline_stages", f"{v['num_layers']} encoder layers do not split into {v['pipeline_stages']} stages",
                 "use a stage count dividing the encoder's layers")
    return EncoderSpec(name=name, **v)


def load_scenario(path: str | Path, overrides: Iterable[str] = ()) -> tuple[Scenario, Topology]:
    path = Path(path)
    errs = Collector(str(path))
    raw = load_yaml(path, errs, "check the path: give an existing YAML scenario file")
    if not isinstance(raw, dict):
        errs.add("", "a scenario must be a mapping", "start with `name:`, `model:`, `training:`, `parallel:`, `cluster:`")
        errs.raise_if_any()
    raw = apply_overrides(raw, overrides, errs)
    try:
        return build_scenario(raw, path, errs)
    except ConfigError as e:
        raise attribute_overrides(e, str(path), overrides) from None


def attribute_overrides(err: ConfigError, file: str, overrides: Iterable[str] | None) -> ConfigError:
    """`err` with each problem of `file` whose key a `--set` wrote (that key or one below it) named
    after the file and the command-line argument (`s.yaml (--set parallel.tp=3): parallel.tp: ...`):
    the value that is wrong came from the command line, not from the file. A problem whose text
    names an overridden key (its last part, as a word) is named after that `--set` too, so a
    rule between two overridden keys names both."""
    given: dict[str, str] = {}
    for ov in expand_single(overrides, Collector(file)):
        key, eq, _ = ov.partition("=")
        if eq and key.strip():
            given[key.strip()] = ov.strip()
    if not given:
        return err
    out = []
    for p in err.problems:
        hits = [ov for key, ov in given.items() if p.path == key or p.path.startswith(key + ".")
                or (p.problem == "unknown key" and key.startswith(p.path + "."))][:1]
        # a rule that names an overridden key (parallel.pp: "num_layers=79 does not divide ..."
        # after --set model.num_layers=79), its own key's --set or not: every --set it names
        hits += [ov for key, ov in given.items() if ov not in hits
                 and re.search(rf"\b{re.escape(key.rsplit('.', 1)[-1])}\b", p.problem)]
        named = ", ".join(f"--set {ov[:120]}" for ov in hits)
        out.append(Problem(f"{file} ({named})", p.path, p.problem, p.fix) if p.file == file and hits else p)
    return ConfigError(out)


def build_scenario(raw: dict, path: Path, errs: Collector,
                   topology_loader: Callable[[Path, int], Topology] = load_topology) -> tuple[Scenario, Topology]:
    for k in raw:
        if k not in TOP:
            close = difflib.get_close_matches(str(k), sorted(TOP), n=1)
            errs.add(str(k), "unknown key", f"did you mean `{close[0]}`?" if close else f"allowed: {', '.join(sorted(TOP))}")
    for k in REQUIRED_SECTIONS:
        if k not in raw:
            errs.add(k, "missing required section", f"add `{k}:`")
    base = path.parent
    model = _resolve_model(raw.get("model"), base, errs) if "model" in raw else None
    training = validate_map(raw.get("training", {}), TRAINING, "training", errs) if "training" in raw else None
    parallel = validate_map(raw.get("parallel", {}), PARALLEL, "parallel", errs)
    raw, topo_over = _topology_mapping(raw, errs)
    cluster = validate_map(raw.get("cluster", {}), CLUSTER, "cluster", errs) if "cluster" in raw else None
    network = validate_map(raw.get("network", {}) or {}, NETWORK, "network", errs)
    seed = parse_value(raw.get("seed", 0), "int", "seed", errs)
    name = raw.get("name")
    if name is not None and not isinstance(name, str):
        errs.add("name", "expected text", "write e.g. `name: my-run`")

    topo = None
    if cluster is not None:
        _resolve_heterogeneity(cluster, errs)
    if cluster and cluster.get("device") is not None and cluster["device"] not in devices.preset_names():
        errs.add("cluster.device", f"unknown device {cluster['device']!r}", f"use one of: {', '.join(devices.preset_names())}")
    if cluster and cluster.get("device_profile"):
        pfile = devices.find_profile(cluster["device_profile"], base)
        if pfile is None:
            errs.add("cluster.device_profile", f"profile {cluster['device_profile']!r} not found (looked beside the scenario, in the current directory and in the shipped profiles)",
                     "give the path of a file written by simtrain calibrate")
        else:
            try:
                dev = devices.load_profile(str(pfile.resolve()))
                cluster["device_profile"] = str(pfile.resolve())
                if cluster.get("device") in devices.preset_names() and cluster["device"] != dev.base:
                    errs.add("cluster.device_profile", f"the profile refines {dev.base}, not cluster.device {cluster['device']}",
                             f"set cluster.device: {dev.base} or use a profile of {cluster['device']}")
            except ConfigError as e:
                errs.problems.extend(e.problems)
    if cluster and parallel and parallel.get("tp_comm_overlap") == "userbuffers" and (parallel.get("tp") or 1) > 1:
        kinds = [cluster.get("device")] + [d for _, d in cluster.get("mixed") or ()]
        for k in dict.fromkeys(k for k in kinds if k in devices.preset_names()):
            sms = devices.get_device(k).sms
            if not sms:
                errs.add("parallel.tp_comm_overlap", f"device {k} has no published SM count, and the overlapped GEMMs "
                         "are timed on the SMs the communication kernels leave them",
                         "set tp_comm_overlap: async_tp (copy-engine transfers, no SMs held) or none for this device")
                continue
            for te, g in (parallel.get("tp_comm_overlap_cfg") or {}).items():
                if isinstance(g, dict) and isinstance(g.get("num_sm"), int) and g["num_sm"] >= sms:
                    errs.add(f"parallel.tp_comm_overlap_cfg.{te}.num_sm", f"{g['num_sm']} SMs for the communication "
                             f"kernels leave {te}'s GEMM none of {k}'s {sms}", f"use fewer than {sms}")
    if cluster is not None:
        _resolve_memory(cluster, _capacities(cluster), errs)
    if cluster and cluster.get("topology"):
        tfile = find_topology_file(cluster["topology"], base)
        if tfile is None:
            errs.add("cluster.topology", f"topology file {cluster['topology']!r} not found (looked beside the scenario, in the current directory and in the shipped topologies/)",
                     "give a path to a topology YAML or a shipped name (simtrain list topologies)")
        elif cluster.get("nodes"):
            try:
                topo = (topology_loader(tfile, cluster["nodes"], overrides=topo_over) if topo_over
                        else topology_loader(tfile, cluster["nodes"]))
            except ConfigError as e:
                errs.problems.extend(_overridden_problems(e.problems, topo_over, str(path)))
            cluster["topology"] = str(tfile)
    if parallel.get("schedule_csv"):
        f = Path(parallel["schedule_csv"])
        f = f if f.is_absolute() else (base / f)
        try:
            parallel["_csv_schedule"] = read_csv(f, pp=parallel.get("pp"), microbatches=_microbatches(training, parallel))
            parallel["schedule_csv"] = str(f.resolve())
            parallel["schedule"] = parallel["_csv_schedule"].name
        except ConfigError as e:
            errs.problems.extend(e.problems)
    _check_plan(model, training, parallel, cluster, topo, errs)
    if "cost" in raw:
        c = raw.get("cost")
        if not isinstance(c, dict):
            errs.add("cost", "expected a mapping", "write e.g. `cost: {price_per_device_hour: 2.0}` (US$)")
        else:
            v = validate_map(c, COST, "cost", errs)
            pr = v.get("price_per_device_hour")
            if isinstance(pr, (int, float)) and pr <= 0:
                errs.add("cost.price_per_device_hour", f"must be > 0, got {pr}", "give the US$ price of one device-hour, e.g. 2.0")
    if "reliability" in raw:
        reliability.check_section(raw, errs)     # every problem of the file reported together
    errs.raise_if_any()
    _warn_unused(raw, training, parallel, path)
    parallel.pop("_csv_schedule", None)
    if parallel.get("vpp") is None:
        d = SCHEDULES.get(parallel.get("schedule"))
        parallel["vpp"] = (d.default_vpp if d else 0) or 1

    lps = parallel.pop("layers_per_stage")
    dor = parallel.pop("device_of_rank")
    sc = Scenario(
        name=name, model=ModelSpec(**model), training=TrainingSpec(**training),
        parallel=ParallelSpec(**parallel, layers_per_stage=(lps if lps == "balanced" else tuple(lps)) if lps is not None else None,
                              device_of_rank=tuple(dor) if dor is not None else None),
        cluster=ClusterSpec(device=cluster["device"], topology_file=cluster["topology"], nodes=cluster["nodes"],
                            device_profile=cluster.get("device_profile") or "", stragglers=cluster["stragglers"],
                            jitter=cluster["jitter"], mixed=cluster["mixed"], straggler_model=cluster["straggler_model"],
                            variability=cluster.get("variability", "auto"),
                            topology_overrides=json.dumps(topo_over, sort_keys=True) if topo_over else "",
                            memory_capacity=cluster.get("memory_capacity"), memory_reserve=cluster["memory_reserve"]),
        network=NetworkSpec(**network), seed=seed, source_file=str(path),
    )
    return sc, topo


def _topology_mapping(raw: dict, errs: Collector) -> tuple[dict, dict]:
    """`cluster.topology: {file: NAME, <key>: value, ...}` -> (a copy of `raw` with the file name in
    its place, the other keys: the overrides laid onto the topology file)."""
    c = raw.get("cluster")
    if not isinstance(c, dict) or not isinstance(c.get("topology"), dict):
        return raw, {}
    t = dict(c["topology"])
    ref = t.pop("file", None)
    if not isinstance(ref, str) or not ref:
        errs.add("cluster.topology.file", "missing: a topology mapping names the file its keys override" if ref is None
                 else f"expected a file path or shipped name, got {short(ref, 60)}",
                 "write e.g. `topology: {file: dgx-h100, scale_out: {oversubscription: 2}}` (simtrain list topologies)")
        ref = ""
    return {**raw, "cluster": {**c, "topology": ref}}, t


def _leaf_paths(d: dict, prefix: str = "") -> list:
    """Dotted key paths of the leaves of a nested mapping: {"a": {"b": 1}} -> ["a.b"]."""
    out = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        out += _leaf_paths(v, key + ".") if isinstance(v, dict) and v else [key]
    return out


def _overridden_problems(problems: Iterable[Problem], overrides: dict, scenario: str) -> list:
    """Problems of a topology file: those at (or under) a key the scenario overrides are the
    scenario's, at `cluster.topology.<key>`; the others stay the file's."""
    leaves = _leaf_paths(overrides)
    out = []
    for p in problems:
        # at, under or above (an unknown section) a key the scenario set
        ours = any(p.path == k or p.path.startswith((k + ".", k + "[")) or (p.path and k.startswith(p.path + ".")) for k in leaves)
        out.append(Problem(scenario, f"cluster.topology.{p.path}", p.problem, p.fix) if ours else p)
    return out


def _microbatches(training: dict | None, parallel: dict) -> int | None:
    """The plan's microbatches per step, when the keys it comes from are valid whole numbers."""
    t = training or {}
    gb, mb, dp = t.get("global_batch_size"), t.get("micro_batch_size"), parallel.get("dp")
    if not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (gb, mb, dp)) or gb % (mb * dp):
        return None
    return gb // (mb * dp)


def _capacities(cluster: dict) -> list:
    """(device, bytes) of every device type the cluster runs, as far as the file names them well
    enough to know: cluster.memory_capacity in place of `device`'s own, mixed blocks their presets'."""
    out = []
    cap = cluster.get("memory_capacity")
    dev = cluster.get("device")
    if cap is not None:
        out.append((dev or "cluster.device", cap))
    elif cluster.get("device_profile") and Path(cluster["device_profile"]).is_file():
        try:
            out.append((dev, devices.load_profile(cluster["device_profile"]).memory_bytes))
        except ConfigError:
            pass
    elif dev in devices.preset_names():
        out.append((dev, devices.get_device(dev).memory_bytes))
    for _, d in cluster.get("mixed") or ():
        if d in devices.preset_names():
            out.append((d, devices.get_device(d).memory_bytes))
    return out


class _CsvDef:
    """A schedule read from a CSV file, seen through the same checks as a registered one."""

    def __init__(self, s):
        self.s = s
        self.name = s.name

    def num_stages(self, pp, vpp):
        return self.s.num_stages

    def check(self, pp, m, vpp):
        out = []
        if pp != self.s.pp:
            out.append(("parallel.schedule_csv", f"the schedule has {self.s.pp} rows, the plan pp={pp}", f"set pp to {self.s.pp} or add rows"))
        if m != self.s.microbatches:
            out.append(("parallel.schedule_csv", f"the schedule runs {self.s.microbatches} microbatches, the plan {m}",
                        f"set global_batch_size so that global_batch_size / (micro_batch_size x dp) = {self.s.microbatches}"))
        return out


def _check_stages(p, L, training, errs: Collector, encoder_stages: int = 0) -> None:
    """Layer split over the schedule's model stages, and the schedule's own rules (microbatch
    count, vpp), all before anything is simulated."""
    d = SCHEDULES.get(p.get("schedule"))
    pp, vpp = p.get("pp"), p.get("vpp")
    if vpp is None and d is not None:
        # a schedule that takes vpp (interleaving) has its own default; everything else one chunk
        vpp = p["vpp"] = d.default_vpp or 1
    csv_sched = p.get("_csv_schedule")
    if p.get("schedule_csv") and csv_sched is None:
        return      # the CSV itself did not load; its errors are already reported
    if csv_sched is not None:
        d = _CsvDef(csv_sched)
        vpp = vpp or 1
    if d is None or not pp or not vpp:
        return
    if vpp > 1 and not getattr(d, "default_vpp", 0):
        takes = ", ".join(k for k, v in SCHEDULES.items() if v.default_vpp)
        errs.add("parallel.vpp", f"vpp={vpp} applies only to {takes}, not {d.name}",
                 f"remove vpp, or use one of: {takes}")
        return
    S = d.num_stages(pp, vpp)
    what = f"{S} model stages ({d.name} on pp={pp}" + (f", vpp={vpp}" if vpp > 1 else "") + ")"
    if encoder_stages:
        if S != pp:
            errs.add("model.encoder.pipeline_stages", f"an encoder on its own stages needs a schedule with one model stage per rank, not {what}",
                     "use 1f1b, gpipe, zb_h1 or zb_h2, or set pipeline_stages: 0 to put the encoder on the first stage")
            return
        if pp <= encoder_stages:
            errs.add("model.encoder.pipeline_stages", f"{encoder_stages} encoder stages leave no stage of pp={pp} for the language model",
                     f"use pp > {encoder_stages}")
            return
        S -= encoder_stages
        what = f"{S} language-model stages (pp={pp} minus {encoder_stages} encoder stage{'s' if encoder_stages > 1 else ''})"
    lps, first, last = p.get("layers_per_stage"), p.get("first_stage_layers"), p.get("last_stage_layers")
    acc = [k for k in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split") if p.get(k)]
    n = L + len(acc)
    bad_flag = any(q.path.startswith("parallel.account_for_") for q in errs.problems)
    what_acc = {"account_for_embedding_in_pipeline_split": "the embedding",
                "account_for_loss_in_pipeline_split": "the loss"}
    if bad_flag:
        pass                  # a flag that is not true / false is reported already
    elif acc:
        # Megatron-core: the embedding / loss count as a layer each in the even split
        if lps is not None or first is not None or last is not None:
            other = "layers_per_stage" if lps is not None else "first_stage_layers" if first is not None else "last_stage_layers"
            errs.add(f"parallel.{acc[0]}", f"given together with parallel.{other} (Megatron-core refuses the two together)",
                     "keep one of them")
        elif n % S:
            counted = " and ".join(what_acc[k] for k in acc)
            other = next(k for k in what_acc if k not in acc) if len(acc) == 1 else None
            fix = (f"set parallel.{other}: true as well ({L + 2} = {(L + 2) // S} x {S}), or remove the flag and give "
                   "parallel.layers_per_stage" if other and (L + 2) % S == 0 and (L + 2) // S >= 2 else
                   f"choose pp/vpp so that {n} divides evenly, or remove the flag and give parallel.layers_per_stage")
            errs.add(f"parallel.{acc[0]}", f"{L} layers plus 1{' each' if len(acc) == 2 else ''} for {counted} make {n}, "
                     f"which does not divide into {what}", fix)
        elif n // S < 2 and S > 1:
            errs.add(f"parallel.{acc[0]}", f"{n} counted layers over {what} leave a stage with no transformer layer "
                     "(simtrain's stages hold at least one)", "use fewer stages")
    elif lps == "balanced":
        # layers in proportion to each stage's device speed (workload.balanced_layers)
        if first is not None or last is not None:
            errs.add("parallel.layers_per_stage", "balanced is given together with first_stage_layers / last_stage_layers",
                     "keep one of them")
        elif S != pp:
            errs.add("parallel.layers_per_stage", f"balanced needs one model stage per pipeline rank, not {what}",
                     "use 1f1b, gpipe, zb_h1 or zb_h2, or give the counts")
        elif L < S:
            errs.add("parallel.layers_per_stage", f"{L} layers cannot give each of {S} stages one", "use fewer stages")
    elif lps is not None:
        if first is not None or last is not None:
            errs.add("parallel.layers_per_stage", "given together with first_stage_layers / last_stage_layers",
                     "give either the full list or the first/last counts")
        elif not (isinstance(lps, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in lps)):
            errs.add("parallel.layers_per_stage", "expected a list of whole numbers >= 1", "write e.g. `[7, 8, 8, 7]`")
        elif len(lps) != S:
            errs.add("parallel.layers_per_stage", f"has {len(lps)} entries; the plan has {what}", f"give exactly {S} layer counts")
        elif sum(lps) != L:
            errs.add("parallel.layers_per_stage", f"sums to {sum(lps)}, the model has {L} layers", f"make the counts add up to {L}")
    elif first is not None or last is not None:
        fixed = [x for x in (first, last) if x is not None]
        rest = S - len(fixed)
        left = L - sum(fixed)
        if (rest == 0 and left != 0) or (rest > 0 and (left < rest or left % rest)):
            key = "parallel.first_stage_layers" if first is not None else "parallel.last_stage_layers"
            errs.add(key, f"leaves {left} layers for the other {rest} of {what}, which does not split evenly into stages of >= 1 layer",
                     "adjust the first/last counts so the remaining layers divide evenly, or give parallel.layers_per_stage")
    elif L % S:
        errs.add("parallel.pp", f"num_layers={L} does not divide into {what}",
                 f"choose pp/vpp so that {L} layers split evenly, or give parallel.layers_per_stage / first_stage_layers")
    if training and None not in (training.get("global_batch_size"), training.get("micro_batch_size"), p.get("dp")):
        gb, mb, dp = training["global_batch_size"], training["micro_batch_size"], p["dp"]
        if gb % (mb * dp) == 0:
            for key, problem, fix in d.check(pp, gb // (mb * dp), vpp):
                errs.add(key, problem, fix)


def _check_cp_ep(model, training, p, errs: Collector) -> None:
    """Context- and expert-parallel rules (Megatron-core's): what each cp_kind needs from the
    sequence and the heads, and how ep / etp divide the experts and the ranks of a stage."""
    cp, ep, etp, tp, dp = p.get("cp"), p.get("ep"), p.get("etp"), p.get("tp"), p.get("dp")
    if None in (cp, ep, etp, tp, dp) or model is None:
        return
    if cp > 1:
        if training and training.get("flash_attention") is False:
            errs.add("parallel.cp", "context parallelism needs flash attention (its ring / gather kernels are fused attention)",
                     "set training.flash_attention: true or cp: 1")
        s, a = model.get("seq_length"), model.get("num_attention_heads")
        kind = p.get("cp_kind")
        if kind in ("ring", "allgather") and s and s % (2 * cp):
            errs.add("model.seq_length", f"{s} is not divisible by 2 x cp = {2 * cp} (causal load balancing splits the sequence into 2·cp chunks)",
                     f"use a sequence length that is a multiple of {2 * cp}")
        if kind == "ulysses":
            if s and s % cp:
                errs.add("model.seq_length", f"{s} is not divisible by cp = {cp}", f"use a multiple of {cp}")
            if a and tp and a % tp == 0 and (a // tp) % cp:
                errs.add("parallel.cp", f"Ulysses splits the {a // tp} heads of a tensor-parallel rank over cp = {cp} ranks, which does not divide them",
                         "use a cp dividing num_attention_heads / tp, or cp_kind: ring")
    moe = model.get("moe")
    if moe is None:
        if ep > 1 or etp > 1:
            errs.add("parallel.ep" if ep > 1 else "parallel.etp", "expert parallelism needs a mixture-of-experts model",
                     "add `model.moe:` (or a MoE preset) or set ep: 1, etp: 1")
        return
    if moe.num_experts % ep:
        errs.add("parallel.ep", f"ep={ep} does not divide num_experts={moe.num_experts}", "use an ep dividing the expert count")
    if (tp * cp * dp) % (ep * etp):
        errs.add("parallel.ep", f"etp x ep = {etp} x {ep} does not divide the {tp * cp * dp} ranks of a pipeline stage (tp x cp x dp)",
                 "choose ep and etp whose product divides tp x cp x dp (Megatron's expert grid etp-ep-edp)")
    if moe.expert_ffn_hidden_size % etp:
        errs.add("parallel.etp", f"etp={etp} does not divide expert_ffn_hidden_size={moe.expert_ffn_hidden_size}", "use an etp dividing it")
    if tp > 1 and not p.get("sequence_parallel"):
        errs.add("parallel.sequence_parallel", "MoE layers with tp > 1 need sequence parallelism (Megatron-core requires it: the token dispatcher works on sequence-sharded tokens)",
                 "set sequence_parallel: true")
    if p.get("zero_stage") == 3:
        errs.add("parallel.zero_stage", "ZeRO-3 / FSDP sharding of expert weights is not simulated", "use zero_stage 0, 1 or 2 with MoE models")
    L = model.get("num_layers")
    if L is not None and moe.first_dense_layers >= L:
        errs.add("model.moe.first_dense_layers", f"{moe.first_dense_layers} leaves no MoE layer of {L}", "use fewer dense first layers")


def _check_placement(p, errs: Collector) -> None:
    pol, dor = p.get("placement"), p.get("device_of_rank")
    if isinstance(pol, str) and pol not in POLICIES:
        dims = pol.split("-")
        if sorted(dims) != ["cp", "dp", "pp", "tp"]:
            errs.add("parallel.placement", f"{pol!r} is not a placement policy",
                     "use megatron, scattered, random, topology_aware, or an order of tp, cp, dp, pp such as `dp-tp-cp-pp` (first varies fastest over devices)")
    if dor is not None and pol not in (None, "megatron"):
        errs.add("parallel.device_of_rank", f"given together with placement {pol!r}",
                 "keep one: an explicit device_of_rank list or a placement policy")
    if dor is not None:
        world = None if None in (p.get("tp"), p.get("cp"), p.get("dp"), p.get("pp")) else p["tp"] * p["cp"] * p["dp"] * p["pp"]
        if not (isinstance(dor, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in dor)):
            errs.add("parallel.device_of_rank", "expected a list of device indices", "write e.g. `[0, 1, 4, 5, 2, 3, 6, 7]`")
        elif world is not None and sorted(dor) != list(range(world)):
            errs.add("parallel.device_of_rank", f"must list each device 0..{world - 1} exactly once (got {len(dor)} entries)",
                     f"give a permutation of 0..{world - 1}: entry r is rank r's device")


def _world_fix(p: dict, model: dict | None, training: dict | None, cluster: dict, topo, world: int) -> str:
    """Concrete ways to make tp x pp x dp x cp equal the cluster's device count: the node count the
    plan needs, a dp that fills the cluster, or tp+dp pairs (tp dividing the heads and at most one
    node), each as a `--set` the user can paste."""
    n, per = topo.num_devices, topo.devices_per_node
    tp, pp, cp = p["tp"], p["pp"], p["cp"]
    ways = []
    if world % per == 0:
        ways.append(f"set cluster.nodes to {world // per}")
    heads = (model or {}).get("num_attention_heads") or 0
    kv = (model or {}).get("num_key_value_heads") or heads
    gb, mb = (training or {}).get("global_batch_size"), (training or {}).get("micro_batch_size")

    def batch_ok(dp: int) -> bool:
        return not (gb and mb) or gb % (mb * dp) == 0

    rest = n // (pp * cp) if n % (pp * cp) == 0 else 0
    if rest and rest % tp == 0 and batch_ok(rest // tp):
        ways.append(f"--set parallel.dp={rest // tp}")
    pairs = [(t, rest // t) for t in range(1, min(per, rest) + 1) if rest and rest % t == 0 and t != tp
             and heads and heads % t == 0 and (kv % t == 0 or t % kv == 0) and batch_ok(rest // t)]
    pairs = sorted(pairs, key=lambda q: abs(q[0] - tp))[:3]
    if pairs:
        ways.append(f"--set parallel.tp+parallel.dp={pairs[0][0]}+{pairs[0][1]}"
                    + (f" (compare them: simtrain compare SCENARIO --set parallel.tp+parallel.dp="
                       f"{','.join(f'{a}+{b}' for a, b in sorted(pairs))})" if len(pairs) > 1 else ""))
    return "; or ".join(ways) if ways else f"change the plan so that tp x pp x dp x cp = {n}"


def _check_recompute(training: dict | None, errs: Collector) -> None:
    """recompute_method / recompute_num_layers choose layers of a full recompute (Megatron-LM's
    --recompute-method and --recompute-num-layers need --recompute-granularity full)."""
    if not training:
        return
    mods = training.get("recompute_modules", ("core_attn",))
    if isinstance(mods, str):
        mods = [mods]
    if not isinstance(mods, (list, tuple)) or not mods or any(m not in RECOMPUTE_MODULES for m in mods):
        bad = [m for m in mods if m not in RECOMPUTE_MODULES] if isinstance(mods, (list, tuple)) else []
        which = f" ({', '.join(map(repr, bad))} is not one)" if len(bad) == 1 else (
            f" ({', '.join(map(repr, bad))} are not)" if bad else "")
        errs.add("training.recompute_modules", f"expected a list of {', '.join(RECOMPUTE_MODULES)}, got {mods!r}{which}",
                 "write e.g. [core_attn] or [layernorm, mla_up_proj, moe_act]")
        mods = ("core_attn",)
    # another mode's keys are unused, as Megatron-LM ignores them (`_warn_unused` says so): the
    # run keeps their defaults, so its resolved file does not carry them
    selective = training.get("recompute") == "selective"
    training["recompute_modules"] = tuple(sorted(set(mods), key=RECOMPUTE_MODULES.index)) if selective else ("core_attn",)
    if training.get("recompute") != "full":
        training.pop("recompute_method", None)
        training.pop("recompute_num_layers", None)


def _check_fp8_param_gather(training, p, errs: Collector) -> None:
    """training.fp8_param_gather: Megatron-LM refuses --fp8-param-gather without the distributed
    optimizer or FSDP (its arguments.py); torchtitan all-gathers FP8 weights for tensorwise scaling
    only (enable_fsdp_float8_all_gather)."""
    if not training or training.get("fp8_param_gather") is not True or training.get("precision") != "fp8":
        return
    if p is not None and (p.get("zero_stage") or 0) < 1:
        errs.add("training.fp8_param_gather", "FP8 weights are gathered by the distributed optimizer (or FSDP) from "
                 "their shards, and this plan has zero_stage 0", "set parallel.zero_stage: 1 (Megatron's distributed "
                 "optimizer) or 3 (FSDP), or remove training.fp8_param_gather")
    recipe = training.get("fp8_recipe", "delayed")
    if recipe == "torchao_rowwise":
        errs.add("training.fp8_param_gather", "torchao all-gathers FP8 weights for tensorwise scaling only; rowwise "
                 "scales are per row of each GEMM's operand", "set fp8_recipe: torchao_tensorwise, or remove "
                 "training.fp8_param_gather")
    elif recipe in ("blockwise", "mxfp8"):
        errs.add("training.fp8_param_gather", f"is modelled for the per-tensor recipes (one scale per weight, gathered "
                 f"with its FP8 data); {recipe}'s block scales are not", "use fp8_recipe: delayed or current, or remove "
                 "training.fp8_param_gather")


def _check_op_recompute(model, training, p, errs: Collector) -> None:
    """recompute: op is torchtitan's op-level policy on its dense Llama-style layer
    (`LayerBuilder.op_recompute`); what it would save elsewhere is not modelled."""
    if not training or training.get("recompute") != "op":
        return
    fix = "use training.recompute: selective or full"
    if model is not None and (model.get("moe") is not None or model.get("mla") is not None):
        what = "MoE" if model.get("moe") is not None else "MLA"
        how = "grouped expert GEMMs" if what == "MoE" else "latent (MLA) projections"
        errs.add("training.recompute", f"op (torchtitan's op-level checkpointing) is modelled for dense attention + MLP "
                 f"layers; this model's {what} layers run {how}, which the policy counts differently", fix)
    elif model is not None and model.get("architecture") == "gpt":
        errs.add("training.recompute", "op (torchtitan's op-level checkpointing) is modelled for torchtitan's Llama "
                 "layers (RMSNorm, SwiGLU, rotary); a GPT layer's biases, GeLU and dropout keep tensors it does not count",
                 fix)
    if training.get("flash_attention") is False:
        errs.add("training.recompute", "op keeps the output of torchtitan's fused attention kernel (SDPA), so it needs "
                 "training.flash_attention: true", "set training.flash_attention: true, or " + fix[4:])
    if p.get("tp_comm_overlap") not in (None, "none") and (p.get("tp") or 1) > 1:
        errs.add("training.recompute", f"op with parallel.tp_comm_overlap {p['tp_comm_overlap']}: the fused "
                 "all-gather-matmul kernels are not matmuls the policy counts; not modelled",
                 "set parallel.tp_comm_overlap: none, or " + fix[4:])


def ub_cfg_problems(cfg: dict) -> list[tuple[str, str, str]]:
    """(key below the GEMM, problem, fix) for each entry of a tp_comm_overlap_cfg mapping that
    Transformer Engine would not run: each GEMM takes the methods TE offers it (initialize_ub: the
    all-gathers run as ring exchange, the forward reduce-scatters pipelined or as ring exchange,
    QKV's and fc1's dgrad and wgrad in bulk); num_splits is a pipeline's."""
    allowed = {"proj_fprop": ("pipeline", "ring_exchange"), "fc2_fprop": ("pipeline", "ring_exchange")}
    out = []
    for te in UB_GEMMS:
        g = cfg.get(te) or {}
        if not isinstance(g, dict):
            continue
        ok = allowed.get(te, ("bulk",) if te in ("qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad") else ("ring_exchange",))
        method = g.get("method") or "default"
        if method not in ("default", *ok):
            out.append((f"{te}.method", f"{te} does not run as {method} (Transformer Engine offers it {' or '.join(ok)})",
                        f"use {' or '.join(ok)}, or default"))
        runs = method if method != "default" else ok[0]
        if g.get("num_splits") is not None and runs != "pipeline":
            out.append((f"{te}.num_splits", f"applies to a pipelined overlap; {te} runs as {runs}",
                        "remove num_splits" + (", or set method: pipeline" if "pipeline" in ok else "")))
    return out


def _check_ub_cfg(p: dict, errs: Collector) -> None:
    """parallel.tp_comm_overlap_cfg: the rules of `ub_cfg_problems`."""
    for key, problem, fix in ub_cfg_problems(p.get("tp_comm_overlap_cfg") or {}):
        errs.add(f"parallel.tp_comm_overlap_cfg.{key}", problem, fix)


def _warn_unused(raw: dict, training: dict | None, parallel: dict | None, path: Path) -> None:
    """Warns of keys the file sets that the run it describes does not use, as Megatron-LM switches
    them off: an FP8 recipe on a 16-bit run, another recompute mode's settings, sequence parallelism and tensor-parallel overlap
    without tensor parallelism, Megatron-core's pipeline-split flags without a pipeline. Only keys the file (or an override) gives are named."""
    given_t = raw.get("training") if isinstance(raw.get("training"), dict) else {}
    given_p = raw.get("parallel") if isinstance(raw.get("parallel"), dict) else {}
    if training and "fp8_recipe" in given_t and training.get("precision") != "fp8":
        warnings.warn(f"{path}: training.fp8_recipe {training['fp8_recipe']} is used only with training.precision: fp8; "
                      f"this run is {training.get('precision')}, so no FP8 recipe applies (set training.precision: fp8 to use it, "
                      "or remove the recipe)", stacklevel=3)
    if training and given_t.get("grad_reduce_in_bf16") is True and training.get("precision") == "fp16":
        warnings.warn(f"{path}: training.grad_reduce_in_bf16 has no effect in fp16 training, whose gradients are "
                      "16-bit already (remove it, or set training.precision: bf16)", stacklevel=3)
    if training and given_t.get("fp8_param_gather") is True and training.get("precision") != "fp8":
        warnings.warn(f"{path}: training.fp8_param_gather is used only with training.precision: fp8; this run is "
                      f"{training.get('precision')}, so its weights are gathered in 16 bits (set training.precision: "
                      "fp8 to use it, or remove it)", stacklevel=3)
    mode = training.get("recompute", "none") if training else "none"
    for key, uses in (("recompute_modules", "selective"), ("recompute_method", "full"), ("recompute_num_layers", "full")):
        if key in given_t and mode != uses:
            warnings.warn(f"{path}: training.{key} applies only with training.recompute: {uses}; this run has "
                          f"recompute: {mode}, so it is not used (set training.recompute: {uses} to use it, or remove it)",
                          stacklevel=3)
    if parallel and given_p.get("tp_comm_overlap_cfg") and parallel.get("tp_comm_overlap") != "userbuffers":
        warnings.warn(f"{path}: parallel.tp_comm_overlap_cfg applies only with parallel.tp_comm_overlap: userbuffers; "
                      f"this run has {parallel.get('tp_comm_overlap')} (set tp_comm_overlap: userbuffers to use it, or "
                      "remove it)", stacklevel=3)
    if parallel and (parallel.get("pp") or 1) == 1:
        for k in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
            if given_p.get(k) is True:
                warnings.warn(f"{path}: parallel.{k} has no effect with pp 1: there is no pipeline split; "
                              "set parallel.pp > 1 to use it, or remove it", stacklevel=3)
    if parallel and (parallel.get("tp") or 1) == 1:
        if given_p.get("sequence_parallel"):
            warnings.warn(f"{path}: parallel.sequence_parallel has no effect with tp 1 (Megatron-LM switches it off); "
                          "set parallel.tp > 1 to use it, or remove it",
                          stacklevel=3)
        if given_p.get("tp_comm_overlap") not in (None, "none"):
            warnings.warn(f"{path}: parallel.tp_comm_overlap {given_p['tp_comm_overlap']} has no effect with tp 1: "
                          "there is no tensor-parallel communication to overlap; set parallel.tp > 1 to use it, or remove it",
                          stacklevel=3)


def _check_plan(model, training, parallel, cluster, topo, errs: Collector) -> None:
    p = parallel
    _check_recompute(training, errs)
    _check_fp8_param_gather(training, p, errs)
    _check_op_recompute(model, training, p, errs)
    _check_ub_cfg(p, errs)
    if p.get("schedule") is not None and p["schedule"] not in SCHEDULES and not p.get("schedule_csv"):
        errs.add("parallel.schedule", f"unknown schedule {p['schedule']!r}", f"use one of: {', '.join(SCHEDULES)}")
    _check_placement(p, errs)
    _check_cp_ep(model, training, p, errs)
    if model and all(model.get(k) is not None for k in ("num_attention_heads", "hidden_size", "num_layers", "num_key_value_heads")):
        a, h, L, g = model["num_attention_heads"], model["hidden_size"], model["num_layers"], model["num_key_value_heads"]
        if h % a and model.get("head_dim") is None:
            errs.add("model.hidden_size", f"{h} is not divisible by num_attention_heads {a}",
                     "pick a head count that divides the hidden size, or give `head_dim:` (each head's width)")
        if a % g:
            errs.add("model.num_key_value_heads", f"{g} does not divide num_attention_heads {a}", "use a divisor of the head count")
        tp = p.get("tp")
        if tp and a % tp:
            errs.add("parallel.tp", f"tp={tp} does not divide num_attention_heads={a}", f"use a tp that divides {a}")
        elif tp and g % tp and tp % g:
            errs.add("parallel.tp", f"tp={tp} and num_key_value_heads={g}: one must divide the other", "pick tp dividing the KV heads")
        enc = model.get("encoder")
        _check_stages(p, L, training, errs, enc.pipeline_stages if enc else 0)
        if p.get("tp_comm_overlap") not in (None, "none") and (tp or 1) > 1 and not p.get("sequence_parallel"):
            errs.add("parallel.tp_comm_overlap", "overlapping tensor-parallel communication with the GEMMs needs sequence "
                     "parallelism (Megatron-LM refuses --tp-comm-overlap without --sequence-parallel; PyTorch's async TP "
                     "works on sequence-sharded activations)",
                     "set sequence_parallel: true, or tp_comm_overlap: none")
        if p.get("sequence_parallel") and tp and model.get("seq_length") and model["seq_length"] % tp:
            errs.add("parallel.sequence_parallel", f"seq_length {model['seq_length']} is not divisible by tp={tp}", "use a tp dividing the sequence length or turn sequence_parallel off")
    if training and None not in (training.get("global_batch_size"), training.get("micro_batch_size"), p.get("dp")):
        gb, mb, dp = training["global_batch_size"], training["micro_batch_size"], p["dp"]
        if gb // (mb * dp) > MAX_MICROBATCHES:
            errs.add("training.global_batch_size", f"{gb:,} / (micro_batch_size x dp = {mb * dp:,}) = {gb // (mb * dp):,} microbatches per step; "
                     f"at most {MAX_MICROBATCHES:,} are simulated", f"use a global_batch_size of at most {MAX_MICROBATCHES * mb * dp:,}, or a larger micro_batch_size")
        elif gb % (mb * dp):
            errs.add("training.global_batch_size", f"{gb} is not divisible by micro_batch_size x dp = {mb} x {dp} = {mb * dp}",
                     f"use a multiple of {mb * dp}, e.g. {max(1, gb // (mb * dp)) * mb * dp}")
    if topo is not None and None not in (p.get("tp"), p.get("pp"), p.get("dp"), p.get("cp")):
        world = p["tp"] * p["pp"] * p["dp"] * p["cp"]
        if world != topo.num_devices:
            errs.add("parallel", f"tp x pp x dp x cp = {p['tp']} x {p['pp']} x {p['dp']} x {p['cp']} = {world}, but the cluster has "
                     f"{plural(cluster['nodes'], 'node')} x {topo.devices_per_node} = {topo.num_devices} devices",
                     _world_fix(p, model, training, cluster, topo, world))
    if topo is not None and cluster:
        for i, st in enumerate(cluster.get("stragglers") or ()):
            bad = [d for d in st.devices if d >= topo.num_devices]
            if bad:
                errs.add(f"cluster.stragglers[{i}].devices", f"device {bad[0]} does not exist: the cluster has {topo.num_devices} devices (0..{topo.num_devices - 1})",
                         "use device indices below the device count (node n, local device k is n x devices_per_node + k)")
    if cluster and training and cluster.get("device") in devices.preset_names():
        dev = devices.get_device(cluster["device"])
        prec = training.get("precision")
        if prec and prec not in dev.peak_flop_per_s:
            errs.add("training.precision", f"{cluster['device']} has no {prec} peak in its preset", f"use one of: {', '.join(k for k in dev.peak_flop_per_s if k in ('fp16', 'bf16', 'fp8'))}")
        recipe = training.get("fp8_recipe")
        if recipe == "mxfp8" and prec == "fp8" and dev.arch != "blackwell":
            errs.add("training.fp8_recipe", f"MXFP8 needs Blackwell's block-scaled Tensor Cores; {cluster['device']} is {dev.arch}",
                     "use fp8_recipe: delayed, current or blockwise, or a Blackwell device (b200-sxm-180gb, gb200-186gb)")
        if training.get("optimizer_offload") == "cpu" and not dev.host_bandwidth:
            errs.add("training.optimizer_offload", f"{cluster['device']} has no host-link bandwidth in its preset",
                     "give the preset a host_link, or set training.optimizer_offload: none")
