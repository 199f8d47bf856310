"""What every importer shares: the options a file does not carry (cluster, world size, model
source), the record of which fields of the foreign file were used, and writing the scenario.

An importer turns one foreign configuration into a scenario *tree* (the dict a scenario YAML
holds). Every field of the file is accounted for: mapped onto a scenario key, ignored (one
warning naming them all: the count plus the names) or refused with a ConfigError
`<file>: <field>: <problem>; <fix>` where ignoring it would change the simulated answer.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from simtrain.errors import Collector, ConfigError, Problem
from simtrain.hardware import devices
from simtrain.hardware.topology import find_topology_file, load_topology
from simtrain.spec.files import TreeError, json_problem, parse_json, read_text
from simtrain.spec.loading import model_presets

# names shown in an "ignored" warning before "and N more"
SHOWN_NAMES = 12


@dataclass
class Options:
    """What the command line adds to a foreign file (None: not given)."""
    topology: str | None = None
    device: str | None = None
    world_size: int | None = None
    seq_length: int | None = None
    hf_config: str | None = None
    model: str | None = None              # a model preset name
    vocab_size: int | None = None
    precision: str | None = None
    recompute: str | None = None
    micro_batch_size: int | None = None
    global_batch_size: int | None = None
    name: str | None = None
    response_length: Any = None          # verl: a length spec (simtrain.rl.lengths)
    env: dict[str, str] = field(default_factory=dict)


class Fields:
    """The fields of one foreign file (flat names such as `--hidden-size` or
    `zero_optimization.stage`), which of them were used, and the problems found."""

    def __init__(self, file: str, values: dict[str, Any], errs: Collector):
        self.file = file
        self.values = values
        self.errs = errs
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.values

    def take(self, name: str, default: Any = None) -> Any:
        if name in self.values:
            self.used.add(name)
            return self.values[name]
        return default

    def use(self, *names: str) -> None:
        """Marks fields as read (their meaning is folded into another key)."""
        self.used.update(n for n in names if n in self.values)

    def refuse(self, name: str, problem: str, fix: str) -> None:
        """A field whose effect simtrain cannot express: ignoring it would change the answer."""
        self.used.add(name)
        self.errs.add(name, problem, fix)

    def integer(self, name: str, default: int | None = None, lo: int = 1) -> int | None:
        v = self.take(name)
        if v is None or v is True:
            if v is True:
                self.errs.add(name, "expected a whole number, got no value", f"write e.g. `{name} 8`")
            return default
        try:
            n = int(str(v).strip())
        except ValueError:
            self.errs.add(name, f"expected a whole number, got {str(v)[:60]!r}", f"write e.g. `{name} 8`")
            return default
        if n < lo:
            self.errs.add(name, f"must be >= {lo}, got {n}", f"give a value >= {lo}")
            return default
        return n

    def warn_ignored(self, what: str = "fields") -> list[str]:
        """One warning naming every field that was not used; returns their names."""
        left = sorted(k for k in self.values if k not in self.used)
        if left:
            warnings.warn(ignored_message(self.file, left, what), stacklevel=2)
        return left


def ignored_message(file: str, names: list[str], what: str = "fields") -> str:
    shown = ", ".join(names[:SHOWN_NAMES]) + (f" and {len(names) - SHOWN_NAMES} more" if len(names) > SHOWN_NAMES else "")
    what = what[:-1] if len(names) == 1 and what.endswith("s") else what
    return f"{file}: ignored {len(names)} {what} that simtrain does not read: {shown}"


def hf_config_problems(path: Path) -> list[Problem]:
    """Problems of a Hugging Face config.json given with --hf-config, naming that file: unreadable,
    not JSON, or not one JSON object."""
    fix = "give the model's Hugging Face config.json (one complete JSON object)"
    try:
        text = read_text(path)
    except (OSError, ValueError, TreeError) as e:
        return [Problem(str(path), "", f"cannot read the file: {e}", fix)]
    try:
        cfg = parse_json(text)
    except TreeError as e:
        return [Problem(str(path), "", *json_problem(text, e, fix))]
    if not isinstance(cfg, dict):
        return [Problem(str(path), "", f"holds a JSON {type(cfg).__name__}, not an object", fix)]
    return []


def devices_per_node(ref: str, file: str, errs: Collector) -> int | None:
    """Devices of one node of the topology `ref` (a path or a shipped name)."""
    tfile = find_topology_file(ref, Path.cwd())
    if tfile is None:
        errs.add("--topology", f"topology {ref!r} not found (looked in the current directory and the shipped topologies/)",
                 "give a path to a topology YAML or a shipped name (simtrain list topologies)")
        return None
    try:
        return load_topology(tfile, 1).devices_per_node
    except ConfigError as e:
        errs.problems.extend(e.problems)
        return None


def cluster_section(opts: Options, world: int | None, errs: Collector, world_from: str) -> dict[str, Any]:
    """`cluster:` from --topology / --device and the world size (nodes = world / devices per node)."""
    if not opts.topology or not opts.device:
        missing = " and ".join(f for f, v in (("--topology", opts.topology), ("--device", opts.device)) if not v)
        errs.add("cluster", f"the file does not say which devices and fabric the job runs on ({missing} not given)",
                 "pass --topology NAME (simtrain list topologies) and --device NAME (simtrain list devices)")
        return {}
    if opts.device not in devices.preset_names():
        errs.add("--device", f"unknown device {opts.device!r}", f"use one of: {', '.join(devices.preset_names())}")
    cluster: dict[str, Any] = {"device": opts.device, "topology": opts.topology}
    per = devices_per_node(opts.topology, errs.file, errs)
    if world is None:
        errs.add(world_from, "the world size (devices of the job) is not given",
                 "pass --world-size N (all devices of the job)")
        return cluster
    if per:
        if world % per:
            errs.add(world_from, f"world size {world} is not a whole number of {opts.topology} nodes of {per} devices",
                     f"pass --world-size as a multiple of {per}")
        else:
            cluster["nodes"] = world // per
    return cluster


def model_section(opts: Options, seq_length: int | None, errs: Collector, out_dir: Path) -> dict[str, Any] | None:
    """`model:` from --model PRESET or --hf-config FILE (None when neither is given)."""
    if opts.model and opts.hf_config:
        errs.add("--model", "both --model and --hf-config given", "give one of them")
        return None
    if opts.model:
        if opts.model not in model_presets():
            errs.add("--model", f"unknown model preset {opts.model!r}", f"use one of: {', '.join(model_presets())}")
            return None
        m: dict[str, Any] = {"preset": opts.model}
    elif opts.hf_config:
        p = Path(opts.hf_config)
        if not p.is_file():
            errs.add("--hf-config", f"file {opts.hf_config!r} not found", "give the path of a Hugging Face config.json")
            return None
        bad = hf_config_problems(p)
        if bad:
            errs.problems.extend(bad)
            return None
        m = {"hf_config": os.path.relpath(p.resolve(), out_dir.resolve())}
    else:
        return None
    if seq_length is not None:
        m["seq_length"] = seq_length
    return m


def drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (drop_none(v) if isinstance(v, dict) else v) for k, v in d.items() if v is not None and v != {}}


def to_yaml(tree: dict[str, Any], sources: list[str], kind: str) -> str:
    """The scenario as YAML, headed by the files and the command it came from."""
    head = f"# imported by `simtrain import {kind}` from " + ", ".join(sources) + "\n"
    return head + yaml.safe_dump(tree, sort_keys=False, default_flow_style=None, width=120)
