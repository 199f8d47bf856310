"""The generic Topology, its link classes and the registry of topology builders.

A builder is one `Fabric` subclass registered under a `kind` with its schema (`@register`). It
turns the parsed YAML into a frozen spec, builds the networkx graph, and answers every question
the rest of simtrain asks about the fabric: routes, leaves, link classes, placement levels. The
engine and the comm code only talk to `Topology`, which delegates to its fabric; nothing outside a
builder module looks at a topology's kind.

Conventions every builder keeps:
  - devices are numbered scale-up domain by domain: device d is in domain d // devices_per_node
    (`node_of`: what every collective, GroupShape and placement groups by), and within a domain
    host by host (`host_of`: the physical server / tray, d // devices_per_host);
  - graph nodes carry `kind` (device, scale_up_switch, nic, leaf, spine, core, router, switch) and
    edges carry, per direction: `bw` (capacity, bytes/s), `flow_bw` (what one flow gets when every
    device drives the fabric at once), `latency` (s) and `tier` (scale_up | scale_out);
  - a route is a real path of the graph; devices are never transit nodes except where a builder
    says so (the PXN hop of a multi-plane fat-tree goes through a device of the source's domain).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import networkx as nx
import numpy as np

from simtrain.errors import Collector
from simtrain.spec.fields import REQUIRED, Key, Section

# chooses among equal-cost routes: pick(options, salt=None) -> one of options (ECMP)
Pick = Callable[..., Any]


@dataclass(frozen=True)
class LinkClass:
    """What a transfer between two devices sees: per-flow bandwidth, efficiency and latency."""
    name: str            # self | scale_up | leaf | spine | core | pxn_* (builder-defined)
    bw: float            # per-flow bandwidth under full load, bytes/s
    latency: float       # seconds
    efficiency: float    # achievable fraction of bw (from nccl-tests, see topology file)


@dataclass(frozen=True, eq=False)
class Topology:
    """A loaded fabric with `nodes` scale-up domains in use (`cluster.nodes` of the scenario).

    `devices_per_node` is the number of devices per scale-up domain (8 on a DGX, 72 on a GB200
    NVL72 rack); `devices_per_host` the devices per physical server or tray (equal to it unless
    the domain spans several hosts)."""
    name: str
    kind: str
    file: str
    nodes: int
    devices_per_node: int
    device_label: str
    scale_up_efficiency: float
    scale_out_efficiency: float
    spec: object = None
    devices_per_host: int = 0        # 0: one host per domain
    node_label: str = "node"
    host_label: str = "host"
    source: str = ""
    efficiency_sources: tuple = ()
    collectives: tuple = ()          # the `collectives:` section as sorted (key, value) pairs (see COLLECTIVES)

    def __post_init__(self):
        if not self.devices_per_host:
            object.__setattr__(self, "devices_per_host", self.devices_per_node)

    def __getattr__(self, name):
        # builder parameters (e.g. `nic_bw` of a fat-tree) read through the spec
        if name.startswith("__"):
            raise AttributeError(name)
        spec = self.__dict__.get("spec")
        if spec is not None and hasattr(spec, name):
            return getattr(spec, name)
        raise AttributeError(f"{type(self).__name__} {self.kind!r} has no attribute {name!r}")

    @cached_property
    def fabric(self) -> "Fabric":
        return BUILDERS[self.kind].fabric(self)

    # ---- sizes and indices (the same for every builder)
    @property
    def num_devices(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def hosts_per_node(self) -> int:
        return self.devices_per_node // self.devices_per_host

    def node_of(self, device: int) -> int:
        """Index of the device's scale-up domain."""
        return device // self.devices_per_node

    def host_of(self, device: int) -> int:
        """Index of the device's physical server / compute tray (global, domain by domain)."""
        return device // self.devices_per_host

    @property
    def domain_name(self) -> str:
        """How messages name a scale-up domain: `node` when a domain is one server."""
        if self.devices_per_host == self.devices_per_node:
            return "node"
        return (f"scale-up domain ({self.node_label} of {self.hosts_per_node} {self.host_label}s x "
                f"{self.devices_per_host} = {self.devices_per_node} {self.device_label}s)")

    # ---- delegated to the builder
    def device_id(self, device: int) -> str:
        return self.fabric.device_id(device)

    def leaf_of(self, device: int) -> int:
        return self.fabric.leaf_of(device)

    def graph(self) -> nx.Graph:
        return self.fabric.graph()

    def route(self, src: int, dst: int, pick: Pick | None = None, cache: dict | None = None) -> tuple:
        """Graph node names of the route src -> dst. `pick(options, salt=None)` chooses among
        equal-cost options (ECMP; by default the first); `cache` holds the builder's path cache."""
        return self.fabric.route(src, dst, pick, cache)

    def link_class_name(self, a: int, b: int) -> str:
        return self.fabric.link_class_name(a, b)

    @property
    def scale_up_mesh(self) -> bool:
        """True where the devices of a scale-up domain are joined pairwise, one dedicated link per
        pair (a full mesh: MLU-Link, xGMI); the `scale_up` link class is then one such link."""
        return self.fabric.scale_up_mesh

    def link(self, a: int, b: int) -> LinkClass:
        return self._link_by_class(self.link_class_name(a, b))

    def _link_by_class(self, cls: str) -> LinkClass:
        return self.fabric.link_class(cls)

    def span_class(self, devices: Iterable[int]) -> str:
        """The link class of the widest hop a group of devices spans (for collectives)."""
        return self.fabric.span_class(devices)

    @property
    def oversubscribed(self) -> bool:
        """True where `tier_bandwidth` can answer (an oversubscribed tier with a closed form)."""
        return self.fabric.oversubscribed

    def tier_bandwidth(self, src: np.ndarray, dst: np.ndarray) -> float | None:
        """Per-flow bandwidth of the slowest of these concurrent flows on the oversubscribed
        tiers, alone on the fabric (`Fabric.tier_bandwidth`); None: the full-load link class."""
        return self.fabric.tier_bandwidth(src, dst)

    def tier_loads(self, src: np.ndarray, dst: np.ndarray, rate: float) -> tuple:
        """((tier resource, fraction of its capacity), ...) these concurrent flows use at `rate`
        bytes/s each (`Fabric.tier_loads`); () where `tier_bandwidth` is None."""
        return self.fabric.tier_loads(src, dst, rate)

    def placement_levels(self) -> list:
        """Nested containers for topology-aware placement, coarsest first: per level, the
        container of each node (e.g. [pod of node, unit of node] on a three-level fat-tree)."""
        return self.fabric.placement_levels()

    @property
    def nodes_per_leaf(self) -> int:
        return self.fabric.nodes_per_unit

    def describe(self, count: bool = True) -> str:
        """One line: the scale-up domains (how many, with `count`) and the fabric."""
        return self.fabric.describe(count)


class Fabric(ABC):
    """A builder's view of one Topology. Subclasses implement `load` (YAML values -> Topology
    fields), `build`, `leaf_of`, `device_id`, `route`, `link_class_name` and `_link_class`."""

    nodes_per_unit = 1
    scale_up_mesh = False      # a domain's devices joined pairwise by dedicated links (see Topology)
    oversubscribed = False     # has a tier that `tier_bandwidth` answers for

    def __init__(self, topo: Topology):
        self.t = topo
        self.s = topo.spec
        self._g = None
        self._classes: dict = {}

    @classmethod
    @abstractmethod
    def load(cls, v: dict, nodes: int, errs: Collector) -> dict:
        """YAML values -> Topology fields (each builder its own)."""

    def graph(self) -> nx.Graph:
        if self._g is None:
            self._g = self.build()
        return self._g

    @abstractmethod
    def build(self) -> nx.Graph:
        """The fabric's networkx graph."""

    def link_class(self, cls: str) -> LinkClass:
        hit = self._classes.get(cls)
        if hit is None:
            hit = self._classes[cls] = (LinkClass("self", float("inf"), 0.0, 1.0) if cls == "self"
                                        else self._link_class(cls))
        return hit

    @abstractmethod
    def _link_class(self, cls: str) -> LinkClass:
        """The LinkClass of a class name (a representative route walked on the graph)."""

    def efficiency(self, cls: str) -> float:
        return self.t.scale_up_efficiency if cls == "scale_up" else self.t.scale_out_efficiency

    def leaf_array(self) -> list:
        """leaf_of of every device (builders with closed-form indices override it with numpy)."""
        return [self.leaf_of(d) for d in range(self.t.num_devices)]

    def leaves_of(self, devices: np.ndarray) -> np.ndarray:
        """leaf_of of a numpy array of devices, as a numpy array."""
        return np.asarray(self.leaf_array(), dtype=np.int64)[devices]

    def link_class_names(self, a: np.ndarray, b: np.ndarray) -> list:
        """link_class_name of every pair (a[i], b[i]) (arrays of device indices)."""
        return [self.link_class_name(int(x), int(y)) for x, y in zip(a, b)]

    def link_class_codes(self, a: np.ndarray, b: np.ndarray) -> tuple:
        """(codes, names): names[codes[i]] is link_class_name(a[i], b[i])."""
        names: dict = {}
        codes = np.asarray([names.setdefault(n, len(names)) for n in self.link_class_names(a, b)], dtype=np.int64)
        return codes, list(names)

    def tier_bandwidth(self, src: np.ndarray, dst: np.ndarray) -> float | None:
        """Per-flow bandwidth (bytes/s, before efficiency) of the slowest of these concurrent,
        equal-sized flows (device src[i] -> dst[i]) on the fabric's oversubscribed tiers when
        nothing else runs, or None where the full-load link class stands (no oversubscribed tier,
        or no closed form for this builder). The analytical backend times a ring's network hops
        with it, as the flow backend's max-min sharing does (fat-tree: perfect ECMP spreading)."""
        return None

    def tier_loads(self, src: np.ndarray, dst: np.ndarray, rate: float) -> tuple:
        """The oversubscribed tiers' load of these flows at `rate` each (see `tier_bandwidth`):
        () where that has no closed form."""
        return ()

    def span_class(self, devices: Iterable[int]) -> str:
        t = self.t
        devices = list(devices)
        if len({t.node_of(d) for d in devices}) <= 1:
            return "scale_up"
        if len({t.leaf_of(d) for d in devices}) <= 1:
            return "leaf"
        return "spine"

    def placement_levels(self) -> list:
        return []

    def describe(self, count: bool = True) -> str:
        t = self.t
        return f"{t.nodes} nodes x {t.devices_per_node} {t.device_label}s" if count else f"{t.devices_per_node} {t.device_label}s per node"


def path_class(g: nx.Graph, path: Sequence, name: str, efficiency: float, extra_bw: float = float("inf"),
               extra_latency: float = 0.0) -> LinkClass:
    """LinkClass of a path of graph nodes: the smallest per-flow bandwidth on it and the sum of its
    latencies (plus `extra_*` for links outside the path, e.g. injection links of unused routers)."""
    bw = min([g.edges[u, v]["flow_bw"] for u, v in zip(path, path[1:])] + [extra_bw])
    lat = sum(g.edges[u, v]["latency"] for u, v in zip(path, path[1:])) + extra_latency
    return LinkClass(name, bw, lat, efficiency)


@dataclass(frozen=True)
class Builder:
    kind: str
    schema: dict
    fabric: type
    doc: str


BUILDERS: dict = {}


def register(kind: str, schema: dict, doc: str = "") -> Callable[[type], type]:
    """Registers a Fabric subclass as the builder of `kind` with its YAML schema."""
    def deco(cls):
        BUILDERS[kind] = Builder(kind, schema, cls, doc or (cls.__doc__ or kind).strip().splitlines()[0])
        return cls
    return deco


# How collectives behave on this fabric (read by simtrain.network.collectives; every kind accepts it)
COLLECTIVES = {
    "overhead": Key("time", "0 us", "fixed cost per collective (launch + sync)"),
    "overhead_source": Key("str", "", "where overhead comes from"),
    "nvls_efficiency": Key("float", None, "NVLink SHARP in-switch reduction: measured NVLS algbw / link bandwidth, in (0, 1]; "
                           "null: the switch has none", optional=True),
    "nvls_source": Key("str", "", "where nvls_efficiency comes from"),
    "latency_model": Key(("nccl", "none"), "nccl", "none: an ideal fabric without protocol latencies"),
    "network_step_latency": Key("time", "0 us", "added to NCCL's latency per network step (measured fabrics)"),
    "network_step_latency_source": Key("str", "", "where network_step_latency comes from"),
    "nvls_chunk_cost": Key("time", "0 us", "synchronisation per NVLS chunk round (NVLS as a chunk pipeline)"),
    "nvls_chunk_cost_source": Key("str", "", "where nvls_chunk_cost comes from"),
    "two_node_tree_saving": Key("bool", True, "false: a tree over two nodes moves 2n per node across the network, as on more"),
    "two_node_tree_saving_source": Key("str", "", "where two_node_tree_saving comes from"),
}


def link_schema(latency_default: str | None = None, doc: str = "") -> Key:
    """Schema of a `{bandwidth, latency}` link section; latency required unless it has a default."""
    return Key("map", REQUIRED, doc, section=Section({
        "bandwidth": Key("bandwidth", doc="per device, per direction"),
        "latency": Key("time", REQUIRED if latency_default is None else latency_default, "per hop"),
    }))


# keys every kind accepts
COMMON = {
    "name": Key("str", doc="topology name"),
    "kind": Key("str", doc="the builder that reads the rest of the file", choices=lambda: tuple(sorted(BUILDERS))),
    "source": Key("str", "", "where the numbers come from"),
    "device_label": Key("str", "gpu", "device label in names and results"),
    "collectives": Key("map", {}, "how collectives behave on this fabric", section=Section(COLLECTIVES)),
}


def collectives_section(v: dict, errs: Collector) -> tuple:
    c = dict(v.get("collectives") or {})
    eff = c.get("nvls_efficiency")
    if eff is not None and not 0 < eff <= 1:
        errs.add("collectives.nvls_efficiency", "must be in (0, 1]", "give the measured NVLS algbw / link bandwidth ratio")
    for key in ("overhead", "network_step_latency", "nvls_chunk_cost"):
        if c.get(key) is not None and c[key] < 0:
            errs.add(f"collectives.{key}", "must be >= 0", "write e.g. `18 us`")
    return tuple(sorted(c.items()))
