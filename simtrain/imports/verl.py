"""A verl trainer config (ppo_trainer.yaml-shaped YAML or a launch script) -> a `job: rl` tree.

The reading and mapping of verl's parallel and batch fields is simtrain.rl.verl's (the same code
that reads a job file's `verl_config:`); this adds what verl does not say: the cluster's device
and topology from the command line (the node count is verl's trainer.nnodes).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from simtrain.errors import Collector
from simtrain.imports.common import Options
from simtrain.rl import verl
from simtrain.spec.files import parse_yaml

_SCRIPT_SUFFIXES = (".sh", ".bash")


def to_tree(file: str, text: str, opts: Options, errs: Collector) -> dict[str, Any]:
    if Path(file).suffix in _SCRIPT_SUFFIXES:
        cfg = verl.verl_from_script(text, file, errs)
    else:
        try:
            cfg = parse_yaml(text)
        except ValueError as e:
            errs.add("", str(e), "give a verl trainer config (YAML) or a launch script")
            return {}
        if not isinstance(cfg, dict):
            errs.add("", "a verl trainer config must be a mapping", "give a ppo_trainer.yaml-shaped file")
            return {}
    if not cfg:
        return {}
    model_cfg = cfg.get("actor_rollout_ref", {}).get("model") if isinstance(cfg.get("actor_rollout_ref"), dict) else None
    if opts.model and isinstance(model_cfg, dict):
        model_cfg.pop("path", None)            # --model names the preset in place of the model path
    tree = verl.tree_from_verl(cfg, file, errs)
    if opts.model:
        tree["model"] = {"preset": opts.model}
    if opts.response_length is not None:
        rl = opts.response_length
        tree.setdefault("data", {})["response_length"] = {"kind": "fixed", "tokens": rl} if isinstance(rl, int) else rl
    elif "response_length" not in tree.get("data", {}):
        errs.add("data.response_length", "verl samples response lengths at run time; simtrain needs their distribution",
                 'pass --response-length "{kind: lognormal, mean: 3000, sigma: 0.8}" (or a fixed token count)')
    if not opts.topology or not opts.device:
        errs.add("cluster", "a verl config does not say which devices and fabric the job runs on",
                 "pass --topology NAME (simtrain list topologies) and --device NAME (simtrain list devices)")
    cluster = dict(tree.get("cluster", {}))
    cluster.update({"device": opts.device, "topology": opts.topology})
    if opts.world_size and "nodes" not in cluster:
        errs.add("--world-size", "a verl job's size is trainer.nnodes x the topology's devices per node",
                 "set trainer.nnodes in the config")
    if "nodes" not in cluster:
        errs.add("trainer.nnodes", "missing", "set trainer.nnodes (nodes of the job)")
    tree["cluster"] = cluster
    name = opts.name or Path(file).stem
    return {"job": "rl", "name": name, **{k: v for k, v in tree.items() if k != "job"}}
