"""Topology (spec stage): cluster fabric YAML -> networkx graph with per-direction link bandwidth and latency.

`kind: two_tier` (the only builder so far; later builders register in `BUILDERS`): nodes of
`devices_per_node` devices on one scale-up switch (NVSwitch, MLU-Link); each device reaches the
scale-out fabric through a NIC (several devices may share one); NICs attach to leaf switches
(`nodes_per_leaf` nodes per leaf), leaves to spines with an oversubscription ratio.

Edge attributes (values per device, per direction):
  bw        capacity of the link (bytes/s)
  flow_bw   bandwidth one flow gets when every device drives the fabric at once (bytes/s):
            a NIC shared by k devices gives each nic_bw/k; a leaf uplink gives nic_bw/oversubscription
  latency   seconds; device->switch->device adds up to the scale-up latency, NIC->leaf->NIC to the
            scale-out latency, a spine crossing adds `spine_latency` each way.

Worked example (dgx-a100, nodes 128): device node3.gpu5 -> node3.gpu6: scale_up, 300 GB/s, 3 us;
node3.gpu5 -> node40.gpu5 (another leaf): min(25 GB/s NIC, 25/1 uplink) = 25 GB/s, 5 us.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import networkx as nx
import yaml

from simtrain.errors import Collector
from simtrain.units import PARSERS, UnitError, EXAMPLES

REPO_TOPOLOGIES = Path(__file__).resolve().parent.parent / "topologies"


@dataclass(frozen=True)
class LinkClass:
    """What a transfer between two devices sees: per-flow bandwidth, efficiency and latency."""
    name: str            # self | scale_up | leaf | spine
    bw: float            # per-flow bandwidth under full load, bytes/s
    latency: float       # seconds
    efficiency: float    # achievable fraction of bw (from nccl-tests, see topology file)


@dataclass(frozen=True)
class Topology:
    name: str
    kind: str
    file: str
    nodes: int
    devices_per_node: int
    device_label: str
    scale_up_bw: float
    scale_up_latency: float
    scale_up_efficiency: float
    nics_per_node: int
    nic_bw: float
    scale_out_latency: float
    scale_out_efficiency: float
    oversubscription: float
    nodes_per_leaf: int
    spine_latency: float
    source: str = ""
    efficiency_sources: tuple = ()
    rail_optimized: bool = False   # NIC k of every node on rail leaf k of its scalable unit (DGX SuperPOD)
    collectives: tuple = ()        # the `collectives:` section as sorted (key, value) pairs (see COLLECTIVES)

    @property
    def num_devices(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def devices_per_nic(self) -> int:
        return self.devices_per_node // self.nics_per_node

    @property
    def nic_bw_per_device(self) -> float:
        return self.nic_bw / self.devices_per_nic

    def node_of(self, device: int) -> int:
        return device // self.devices_per_node

    def leaf_of(self, device: int) -> int:
        """Leaf switch of the device's NIC. Plain fat-tree: all NICs of a node on one leaf, leaves
        of `nodes_per_leaf` nodes. Rail-optimized: a scalable unit of `nodes_per_leaf` nodes has
        one leaf per rail, NIC k of each node on rail k, so leaf = unit x nics_per_node + rail."""
        unit = self.node_of(device) // self.nodes_per_leaf
        if not self.rail_optimized:
            return unit
        return unit * self.nics_per_node + self.nic_of(device)

    def nic_of(self, device: int) -> int:
        return (device % self.devices_per_node) // self.devices_per_nic

    def device_id(self, device: int) -> str:
        return f"node{self.node_of(device)}.{self.device_label}{device % self.devices_per_node}"

    def link_class_name(self, a: int, b: int) -> str:
        if a == b:
            return "self"
        if self.node_of(a) == self.node_of(b):
            return "scale_up"
        if self.leaf_of(a) == self.leaf_of(b):
            return "leaf"
        return "spine"

    def link(self, a: int, b: int) -> LinkClass:
        return self._link_by_class(self.link_class_name(a, b))

    @lru_cache(maxsize=None)
    def _link_by_class(self, cls: str) -> LinkClass:
        """Walks a representative shortest path of the graph for the class (cached per class)."""
        if cls == "self":
            return LinkClass("self", math.inf, 0.0, 1.0)
        a = 0
        if cls == "scale_up":
            b = 1
        elif cls == "leaf":
            b = self.devices_per_node
        else:
            # a pair whose route crosses the spine: the first device of the next leaf's unit (same
            # rail); on a rail-optimized fabric inside one unit, a device on another rail
            b = self.nodes_per_leaf * self.devices_per_node
            if self.rail_optimized and b >= self.num_devices and self.nics_per_node > 1:
                b = self.devices_per_node + self.devices_per_nic
        g = self.graph()
        from simtrain.flows import access_path
        path = access_path(self, a, b)
        bw = min(g.edges[u, v]["flow_bw"] for u, v in zip(path, path[1:]))
        lat = sum(g.edges[u, v]["latency"] for u, v in zip(path, path[1:]))
        eff = self.scale_up_efficiency if cls == "scale_up" else self.scale_out_efficiency
        return LinkClass(cls, bw, lat, eff)

    @lru_cache(maxsize=None)
    def graph(self) -> nx.Graph:
        return build_two_tier_graph(self)


def build_two_tier_graph(t: Topology) -> nx.Graph:
    g = nx.Graph(name=t.name)
    units = math.ceil(t.nodes / t.nodes_per_leaf)
    leaves = units * (t.nics_per_node if t.rail_optimized else 1)
    multi_leaf = leaves > 1
    # every leaf's uplinks carry 1/oversubscription of its downlinks, spread over nics_per_node spines
    down = t.nic_bw * t.nodes_per_leaf * (1 if t.rail_optimized else t.nics_per_node)
    for s in range(t.nics_per_node if multi_leaf else 0):
        g.add_node(f"spine{s}", kind="spine")
    for leaf in range(leaves):
        g.add_node(f"leaf{leaf}", kind="leaf")
        for s in range(t.nics_per_node if multi_leaf else 0):
            g.add_edge(f"leaf{leaf}", f"spine{s}", bw=max(down / t.nics_per_node, t.nic_bw) / t.oversubscription,
                       flow_bw=t.nic_bw / t.oversubscription, latency=t.spine_latency)
    half_up, half_out = t.scale_up_latency / 2, t.scale_out_latency / 2
    for node in range(t.nodes):
        sw = f"node{node}.switch"
        g.add_node(sw, kind="scale_up_switch")
        for n in range(t.nics_per_node):
            nic = f"node{node}.nic{n}"
            g.add_node(nic, kind="nic")
            g.add_edge(nic, f"leaf{t.leaf_of(node * t.devices_per_node + n * t.devices_per_nic)}",
                       bw=t.nic_bw, flow_bw=t.nic_bw, latency=half_out)
        for d in range(t.devices_per_node):
            dev = f"node{node}.{t.device_label}{d}"
            g.add_node(dev, kind="device")
            g.add_edge(dev, sw, bw=t.scale_up_bw, flow_bw=t.scale_up_bw, latency=half_up)
            nic = f"node{node}.nic{d // t.devices_per_nic}"
            g.add_edge(dev, nic, bw=t.nic_bw, flow_bw=t.nic_bw_per_device, latency=0.0)
    return g


# ---------------------------------------------------------------------------------------------
# Loading

_TWO_TIER = {
    "name": ("str", True, None),
    "kind": ("str", True, None),
    "source": ("str", False, ""),
    "devices_per_node": ("int", True, None),
    "device_label": ("str", False, "gpu"),
    "scale_up": ("map", True, {
        "bandwidth": ("bandwidth", True, None),
        "latency": ("time", True, None),
        "efficiency": ("float", False, 1.0),
        "efficiency_source": ("str", False, ""),
    }),
    "scale_out": ("map", True, {
        "nics_per_node": ("int", True, None),
        "nic_bandwidth": ("bandwidth", True, None),
        "latency": ("time", True, None),
        "oversubscription": ("float", False, 1.0),
        "nodes_per_leaf": ("int", False, 32),
        "spine_latency": ("time", False, "0 us"),
        "rail_optimized": ("bool", False, False),
        "efficiency": ("float", False, 1.0),
        "efficiency_source": ("str", False, ""),
    }),
}

# How collectives behave on this fabric (read by simtrain.collectives; every kind accepts it)
COLLECTIVES = {
    "overhead": ("time", False, "0 us"),          # fixed cost per collective (launch + sync)
    "overhead_source": ("str", False, ""),
    "nvls_efficiency": ("float?", False, None),   # NVLink SHARP in-switch reduction, if the switch has it
    "nvls_source": ("str", False, ""),
    "latency_model": (("nccl", "none"), False, "nccl"),   # none: an ideal fabric without protocol latencies
}
_TWO_TIER["collectives"] = ("map", False, COLLECTIVES)

BUILDERS = {"two_tier": _TWO_TIER}


def validate_map(raw, schema: dict, path: str, errs: Collector) -> dict:
    """Checks a YAML mapping against a (kind, required, default) schema; returns parsed values.

    Unknown keys, missing required keys, wrong types and bare numbers where a unit is needed are
    all collected into `errs` rather than raised one at a time.
    """
    import difflib
    out = {}
    if not isinstance(raw, dict):
        errs.add(path or "<top>", f"expected a mapping, got {type(raw).__name__}", "write it as `key: value` lines")
        return out
    for key in raw:
        if key not in schema:
            close = difflib.get_close_matches(str(key), list(schema), n=1)
            hint = f"did you mean `{close[0]}`?" if close else f"allowed keys: {', '.join(schema)}"
            errs.add(_join(path, key), "unknown key", hint)
    for key, (kind, required, default) in schema.items():
        p = _join(path, key)
        if key not in raw:
            if required:
                errs.add(p, "missing required key", f"add `{key}:`" + (f" (a {kind}, e.g. {EXAMPLES[kind]})" if kind in EXAMPLES else ""))
                continue
            if kind == "map":
                out[key] = validate_map({}, default, p, errs)
                continue
            value = default
        else:
            value = raw[key]
        if kind == "map":
            out[key] = validate_map(value, default, p, errs)
        else:
            out[key] = parse_value(value, kind, p, errs)
    return out


def _join(path, key):
    return f"{path}.{key}" if path else str(key)


def parse_value(value, kind, path, errs):
    if isinstance(kind, str) and kind.endswith("?"):
        # optional value: absent (None) stays None
        return None if value is None else parse_value(value, kind[:-1], path, errs)
    if kind in PARSERS:
        try:
            return PARSERS[kind](value)
        except UnitError as e:
            errs.add(path, str(e), f"write e.g. {EXAMPLES[kind]}")
            return None
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            errs.add(path, f"expected a whole number, got {value!r}", "write e.g. `8`")
            return None
        return value
    if kind == "posint":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            errs.add(path, f"expected a whole number >= 1, got {value!r}", "write e.g. `8`")
            return None
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            errs.add(path, f"expected a number, got {value!r}", "write e.g. `0.8`")
            return None
        return float(value)
    if kind == "bool":
        if not isinstance(value, bool):
            errs.add(path, f"expected true or false, got {value!r}", "write `true` or `false`")
            return None
        return value
    if kind == "str":
        if not isinstance(value, str):
            errs.add(path, f"expected text, got {value!r}", "write it as a string")
            return None
        return value
    if isinstance(kind, tuple):  # choices
        if value not in kind:
            errs.add(path, f"{value!r} is not one of {', '.join(map(str, kind))}", f"use one of {', '.join(map(str, kind))}")
            return None
        return value
    if kind == "any":
        return value
    raise ValueError(f"schema kind {kind!r}")


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


def load_topology(file: Path, nodes: int) -> Topology:
    errs = Collector(str(file))
    try:
        with open(file) as f:
            raw = yaml.safe_load(f)
    except yaml.YAMLError as e:
        errs.add("", f"not valid YAML ({e})", "fix the YAML syntax")
        errs.raise_if_any()
    except UnicodeDecodeError:
        errs.add("", "is not a UTF-8 text file", "give the path of a topology YAML")
        errs.raise_if_any()
    if not isinstance(raw, dict):
        errs.add("", "a topology file must be a mapping", "start with `name:` and `kind:`")
        errs.raise_if_any()
    kind = raw.get("kind")
    if kind not in BUILDERS:
        errs.add("kind", f"unknown topology kind {kind!r}", f"use one of: {', '.join(BUILDERS)}")
        errs.raise_if_any()
    v = validate_map(raw, BUILDERS[kind], "", errs)
    errs.raise_if_any()
    up, out = v["scale_up"], v["scale_out"]
    if v["devices_per_node"] < 1:
        errs.add("devices_per_node", "must be >= 1", "write e.g. `8`")
    if out["nics_per_node"] < 1 or v["devices_per_node"] % out["nics_per_node"]:
        errs.add("scale_out.nics_per_node", f"{out['nics_per_node']} NICs cannot be shared evenly by {v['devices_per_node']} devices",
                 "use a divisor of devices_per_node")
    if out["oversubscription"] is not None and out["oversubscription"] < 1:
        errs.add("scale_out.oversubscription", "must be >= 1 (1 = non-blocking)", "write e.g. `1` or `2`")
    for sect, d in (("scale_up", up), ("scale_out", out)):
        if d["efficiency"] is not None and not 0 < d["efficiency"] <= 1:
            errs.add(f"{sect}.efficiency", "must be in (0, 1]", "give the measured busbw / link bandwidth ratio")
    if out["nodes_per_leaf"] is not None and out["nodes_per_leaf"] < 1:
        errs.add("scale_out.nodes_per_leaf", "must be >= 1", "write e.g. `32`")
    errs.raise_if_any()
    return Topology(
        name=v["name"], kind=kind, file=str(file), nodes=nodes, devices_per_node=v["devices_per_node"],
        device_label=v["device_label"], scale_up_bw=up["bandwidth"], scale_up_latency=up["latency"],
        scale_up_efficiency=up["efficiency"], nics_per_node=out["nics_per_node"], nic_bw=out["nic_bandwidth"],
        scale_out_latency=out["latency"], scale_out_efficiency=out["efficiency"],
        oversubscription=out["oversubscription"], nodes_per_leaf=out["nodes_per_leaf"],
        spine_latency=out["spine_latency"], source=v["source"],
        efficiency_sources=(up["efficiency_source"], out["efficiency_source"]),
        rail_optimized=out["rail_optimized"], collectives=_collectives_section(v, errs),
    )


def _collectives_section(v: dict, errs: Collector) -> tuple:
    c = dict(v.get("collectives") or {})
    eff = c.get("nvls_efficiency")
    if eff is not None and not 0 < eff <= 1:
        errs.add("collectives.nvls_efficiency", "must be in (0, 1]", "give the measured NVLS algbw / link bandwidth ratio")
    if c.get("overhead") is not None and c["overhead"] < 0:
        errs.add("collectives.overhead", "must be >= 0", "write e.g. `18 us`")
    errs.raise_if_any()
    return tuple(sorted(c.items()))


def shipped_topologies() -> list[Path]:
    return sorted(REPO_TOPOLOGIES.glob("*.yaml"))
