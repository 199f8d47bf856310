"""Which importer reads a file, and the two ways in: `simtrain import KIND FILE...` (a scenario
file written for review) and `simtrain run FILE` on a foreign config directly (`load_foreign`).
"""
from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

from simtrain.errors import Collector, ConfigError, Problem
from simtrain.hardware.topology import Topology
from simtrain.imports import deepspeed, megatron, torchtitan, verl
from simtrain.imports.common import Options, devices_per_node
from simtrain.spec.files import TreeError, json_problem, parse_json, read_text
from simtrain.spec.loading import apply_overrides, attribute_overrides, build_scenario
from simtrain.spec.scenario import Scenario

KINDS = ("megatron", "deepspeed", "torchtitan", "verl")


def _read(path: str, errs: Collector) -> str | None:
    try:
        return read_text(path)
    except (OSError, ValueError, TreeError) as e:
        errs.add("", f"cannot read the file: {e}", "give the path of a readable text file")
        return None


def _is_hf_config(d: Any) -> bool:
    return isinstance(d, dict) and ("model_type" in d or "num_hidden_layers" in d or "architectures" in d)


def import_files(kind: str, files: list[str], opts: Options, out: Path, args: str | None = None) -> dict[str, Any]:
    """The scenario tree (or `job: rl` tree for verl) of `files`; raises ConfigError naming the
    file and field of every problem."""
    out_dir = out.parent
    if kind == "megatron":
        if args is not None and not files:
            errs = Collector("--args")
            tree = megatron.to_tree("--args", args, opts, errs, out_dir)
            errs.raise_if_any()
            return tree
        texts = []
        errs = Collector(files[0] if files else "megatron")
        for f in files:
            t = _read(f, errs)
            if t is not None:
                texts.append(t)
        errs.raise_if_any()
        text = "\n".join(texts) + (("\n" + args) if args else "")
        tree = megatron.to_tree(files[-1], text, opts, errs, out_dir)
        errs.raise_if_any()
        return tree
    if len(files) != 1 and kind != "deepspeed":
        errs = Collector(kind)
        errs.add("FILE", f"{kind} takes one file, got {len(files)}", "give one file")
        errs.raise_if_any()
    if kind == "deepspeed":
        ds, ds_file = None, None
        for f in files:
            errs = Collector(f)
            t = _read(f, errs)
            errs.raise_if_any()
            try:
                d = parse_json(t or "")
            except TreeError as e:
                errs.add("", *json_problem(t or "", e, "give a DeepSpeed config (JSON)"))
                errs.raise_if_any()
            if _is_hf_config(d) and opts.hf_config is None:
                opts.hf_config = f
            elif isinstance(d, dict) and ds is None:
                ds, ds_file = d, f
            else:
                errs.add("", "neither a DeepSpeed config nor a Hugging Face config.json (or a second one)",
                         "give one DeepSpeed config and at most one config.json")
                errs.raise_if_any()
        errs = Collector(ds_file or files[0])
        if ds is None:
            errs.add("", "no DeepSpeed config among the files", "give the ds_config.json")
            errs.raise_if_any()
        tree = deepspeed.to_tree(ds_file, ds, opts, errs, out_dir)
        errs.raise_if_any()
        return tree
    file = files[0]
    errs = Collector(file)
    text = _read(file, errs)
    errs.raise_if_any()
    if kind == "torchtitan":
        cfg = torchtitan.parse(text or "", file, errs)
        errs.raise_if_any()
        tree = torchtitan.to_tree(file, cfg or {}, opts, errs, out_dir)
    else:
        tree = verl.to_tree(file, text or "", opts, errs)
    errs.raise_if_any()
    return tree


def detect(path: str) -> str | None:
    """The importer for a file handed to `simtrain run` (None: a scenario YAML)."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix in (".yaml", ".yml") or not p.is_file():
        return None
    if suffix == ".toml":
        return "torchtitan"
    if suffix == ".json":
        return "deepspeed"
    try:
        head = p.read_text(encoding="utf-8", errors="replace")[:200_000]
    except OSError:
        return None
    if re.search(r"verl\.trainer\.main_|main_ppo", head):
        return "verl"
    if suffix in (".sh", ".bash", ".txt", ".args") or re.search(r"(^|\s)--(tensor-model-parallel-size|num-layers)\b", head):
        return "megatron"
    return None


# scenario key -> the keys of each source format that set it one to one, for `simtrain run FILE`'s
# errors: a problem the scenario checks find in an imported value is named after the file's own
# key (with the scenario key beside it), where the file gave that key
SOURCE_KEYS: dict[str, dict[str, tuple[str, ...]]] = {
    "megatron": {
        "model.num_layers": ("--num-layers",), "model.hidden_size": ("--hidden-size",),
        "model.num_attention_heads": ("--num-attention-heads",), "model.num_key_value_heads": ("--num-query-groups",),
        "model.ffn_hidden_size": ("--ffn-hidden-size",), "model.seq_length": ("--seq-length",),
        "model.vocab_size": ("--vocab-size",), "parallel.tp": ("--tensor-model-parallel-size",),
        "parallel.pp": ("--pipeline-model-parallel-size",), "parallel.cp": ("--context-parallel-size",),
        "parallel.ep": ("--expert-model-parallel-size",), "parallel.etp": ("--expert-tensor-parallel-size",),
        "parallel.vpp": ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank"),
        "parallel.sequence_parallel": ("--sequence-parallel",), "parallel.tp_comm_overlap": ("--tp-comm-overlap",),
        "parallel.first_stage_layers": ("--decoder-first-pipeline-num-layers",),
        "parallel.last_stage_layers": ("--decoder-last-pipeline-num-layers",),
        "training.micro_batch_size": ("--micro-batch-size",), "training.global_batch_size": ("--global-batch-size",),
        "training.recompute_method": ("--recompute-method",), "training.recompute_num_layers": ("--recompute-num-layers",),
    },
    "torchtitan": {
        "parallel.tp": ("tensor_parallel_degree",), "parallel.pp": ("pipeline_parallel_degree",),
        "parallel.cp": ("context_parallel_degree",), "parallel.ep": ("expert_parallel_degree",),
        "model.seq_length": ("seq_len",), "training.global_batch_size": ("global_batch_size",),
    },
    "deepspeed": {
        "training.micro_batch_size": ("train_micro_batch_size_per_gpu",),
        "training.global_batch_size": ("train_batch_size",), "parallel.zero_stage": ("stage",),
    },
}


def source_named(err: ConfigError, path: str, kind: str, text: str) -> ConfigError:
    """`err` with each problem of the imported file `path` whose scenario key the file set one to
    one named after the file's key, the scenario key in brackets (`--num-attention-heads
    (model.num_attention_heads): ...`). A key the file does not contain (its value came from a
    preset, a config.json or a default) keeps the scenario key."""
    keys = SOURCE_KEYS.get(kind, {})
    out = []
    for p in err.problems:
        src = next((k for k in keys.get(p.path, ()) if re.search(rf"(?<![\w-]){re.escape(k)}(?![\w-])", text)), None)
        out.append(Problem(p.file, f"{src} ({p.path})", p.problem, p.fix) if p.file == path and src else p)
    return ConfigError(out)


def _override(overrides: list[str], key: str) -> str | None:
    for ov in overrides:
        k, eq, v = ov.partition("=")
        if eq and k.strip() == key:
            return v.strip()
    return None


def load_foreign(path: str, overrides: list[str]) -> tuple[Scenario, Topology] | None:
    """`simtrain run FILE` on a Megatron script or argument file, a DeepSpeed JSON or a torchtitan
    TOML: imported in memory, what the file lacks taken from `--set` (cluster.topology,
    cluster.device, cluster.nodes, model.hf_config, model.preset, model.seq_length, model.vocab_size),
    then loaded as
    a scenario. None for a file of another kind (a scenario YAML; verl configs go to the RL runner)."""
    kind = detect(path)
    if kind is None:
        return None
    if kind == "verl":
        errs = Collector(path)
        errs.add("", "a verl launch script is an RL job", f"write a job file first: simtrain import verl {path} "
                 "--topology T --device D -o job.yaml, then simtrain run job.yaml")
        errs.raise_if_any()
    opts = Options(topology=_override(overrides, "cluster.topology"), device=_override(overrides, "cluster.device"),
                   hf_config=_override(overrides, "model.hf_config"), model=_override(overrides, "model.preset"))
    seq = _override(overrides, "model.seq_length")
    opts.seq_length = int(seq) if seq and seq.isdigit() else None
    vocab = _override(overrides, "model.vocab_size")
    opts.vocab_size = int(vocab) if vocab and vocab.isdigit() else None
    nodes = _override(overrides, "cluster.nodes")
    if nodes and nodes.isdigit() and opts.topology:
        per = devices_per_node(opts.topology, path, Collector(path))
        if per:
            opts.world_size = int(nodes) * per
    if not opts.topology or not opts.device:
        errs = Collector(path)
        errs.add("cluster", f"a {kind} config does not say which devices and fabric the job runs on",
                 "add --set cluster.topology=NAME --set cluster.device=NAME (or write a scenario with simtrain import)")
        errs.raise_if_any()
    tree = import_files(kind, [path], opts, Path(path))
    errs = Collector(path)
    raw = apply_overrides(copy.deepcopy(tree), overrides, errs)
    errs.raise_if_any()
    try:
        return build_scenario(raw, Path(path), errs)
    except ConfigError as e:
        e = attribute_overrides(e, path, overrides)
        try:
            text = read_text(path)
        except (OSError, ValueError, TreeError):
            text = ""
        raise source_named(e, path, kind, text) from None
