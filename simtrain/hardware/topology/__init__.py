"""Topology (spec stage): cluster fabric YAML -> networkx graph with per-direction link bandwidth and latency.

Builders, one module each, registered by `kind` with their schema (`base.register`):

  fat_tree / two_tier  scale-up domains (a switch or a full mesh; one host, or several hosts such as
                       the 18 trays of a GB200 NVL72 rack or the boxes of an MLU-Link POD) on a
                       plain or rail-optimized, single- or multi-plane, two- or three-level fat-tree
                       (`fattree`)
  torus                devices on routers of a 1-, 2- or 3-D torus (wrap-around) or mesh (`torus`)
  dragonfly            devices on routers in all-to-all groups joined by global links (`dragonfly`)
  explicit             devices, switches, NICs and links listed one by one (`explicit`)

A `Topology` is what the rest of simtrain sees; it delegates every fabric question to its
builder's `Fabric`, so the engine never branches on a topology's kind. `node_of(d)` is the index
of the device's scale-up domain (what collectives, group shapes and placement group by),
`devices_per_node` the devices of one domain, `host_of(d)` the physical server or tray
(`devices_per_host`), and `cluster.nodes` of a scenario counts scale-up domains.

Routing (`Topology.route`): every builder lays out shortest paths of its graph and lets the caller
choose among equal-cost ones (ECMP) with `pick(options, salt=None)`; the flow backend picks by a
CRC32 of (seed, flow id[, salt]). Devices are never transit nodes, except on the PXN hop of a
multi-plane fat-tree.

Link classes (analytical backend): `link_class_name(a, b)` names the kind of route between two
devices and `_link_by_class(cls)` gives its LinkClass: the smallest per-flow bandwidth under full
load (`flow_bw` of the edges) and the summed latency of a representative route, with the tier's
measured efficiency. Every builder provides `scale_up`, `leaf` and `spine`, the classes the
collectives use (`leaf`: a group under one leaf switch / router group; `spine`: the widest span
the builder knows, e.g. the longest shortest path of a torus), plus its own (`core`, `pxn_*`).
`span_class(devices)` is the class of the widest hop a group spans. Each builder's module
docstring says how its classes are chosen.

Values are per device, per direction. Worked example (dgx-a100, nodes 128): device node3.gpu5 ->
node3.gpu6: scale_up, 300 GB/s, 3 us; node3.gpu5 -> node40.gpu5 (another leaf): min(25 GB/s NIC,
25/1 uplink) = 25 GB/s, 5 us.

>>> t = load_topology(REPO_TOPOLOGIES / "dgx-a100.yaml", 128)
>>> a, b, c = 3 * 8 + 5, 3 * 8 + 6, 40 * 8 + 5
>>> t.device_id(a), t.device_id(c)
('node3.gpu5', 'node40.gpu5')
>>> t.link_class_name(a, b), t.link(a, b).bw / 1e9, round(t.link(a, b).latency * 1e6, 6)
('scale_up', 300.0, 3.0)
>>> t.link_class_name(a, c), t.link(a, c).bw / 1e9, round(t.link(a, c).latency * 1e6, 6)
('spine', 25.0, 5.0)
"""
from __future__ import annotations

from pathlib import Path

from simtrain import resources
from simtrain.errors import Collector
from simtrain.hardware.topology import dragonfly, explicit, fattree, torus  # noqa: F401  (register the builders)
from simtrain.hardware.topology.base import (
    BUILDERS,
    COLLECTIVES,
    COMMON,
    Builder,
    Fabric,
    LinkClass,
    Topology,
    collectives_section,
    path_class,
    register,
)
from simtrain.spec.fields import parse_value, validate_map
from simtrain.spec.files import load_yaml

REPO_TOPOLOGIES = resources.TOPOLOGIES

__all__ = ["BUILDERS", "Builder", "COLLECTIVES", "COMMON", "Fabric", "LinkClass", "Topology", "find_topology_file",
           "load_topology", "merge", "parse_value", "path_class", "register", "shipped_topologies", "validate_map"]


def find_topology_file(ref: str, scenario_dir: Path | None) -> Path | None:
    """A topology named by a path relative to the scenario, the current directory, or the shipped folder."""
    cands = []
    p = Path(ref)
    if scenario_dir is not None:
        cands.append(scenario_dir / p)
    cands.append(Path.cwd() / p)
    cands.append(REPO_TOPOLOGIES / p.name)
    if not p.suffix:
        cands.append(REPO_TOPOLOGIES / f"{ref}.yaml")
    for c in cands:
        if c.is_file():
            return c
    return None


def merge(base: dict, over: dict) -> dict:
    """`over` laid onto `base`: nested mappings merged key by key, anything else replaced.

    >>> merge({"a": {"x": 1, "y": 2}, "b": 3}, {"a": {"y": 5}, "c": 4})
    {'a': {'x': 1, 'y': 5}, 'b': 3, 'c': 4}"""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_topology(file: Path, nodes: int, overrides: dict | None = None) -> Topology:
    """Loads a topology file for `nodes` scale-up domains, with `overrides` (a mapping of the
    file's keys, e.g. {"scale_out": {"oversubscription": 2}}) laid onto it before it is checked;
    every problem is reported at once as `<file>: <key.path>: <problem>; <fix>`."""
    errs = Collector(str(file))
    raw = load_yaml(file, errs, "check the path: give an existing topology YAML file")
    if not isinstance(raw, dict):
        errs.add("", "a topology file must be a mapping", "start with `name:` and `kind:`")
        errs.raise_if_any()
    if overrides:
        raw = merge(raw, overrides)
    kind = raw.get("kind")
    if kind not in BUILDERS:
        errs.add("kind", f"unknown topology kind {kind!r}", f"use one of: {', '.join(sorted(BUILDERS))}")
        errs.raise_if_any()
    b = BUILDERS[kind]
    v = validate_map(raw, b.schema, "", errs)
    errs.raise_if_any()
    fields = b.fabric.load(v, nodes, errs)
    fields["collectives"] = collectives_section(v, errs)
    errs.raise_if_any()
    fields.setdefault("device_label", v.get("device_label", "gpu"))
    return Topology(name=v["name"], kind=kind, file=str(file), nodes=nodes, source=v["source"], **fields)


def shipped_topologies() -> list[Path]:
    return sorted(REPO_TOPOLOGIES.glob("*.yaml"))
