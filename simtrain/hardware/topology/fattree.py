"""`kind: fat_tree` (alias `two_tier`): scale-up domains on a switched scale-out fat-tree.

Scale-up domain (one `node` of simtrain, `devices_per_node` devices):
  - `scale_up.topology: switch` (default): every device on one scale-up switch (NVSwitch, the
    NVLink switch trays of a GB200 NVL72 rack, an MLU-Link switch), `scale_up.bandwidth` per device;
  - `scale_up.topology: full_mesh`: devices linked pairwise (MLU-Link / Infinity Fabric bridges),
    `scale_up.bandwidth` is a device's total, each of its n-1 links gets bandwidth/(n-1); a link
    is a two-port element `node3.link0-5` (kind scale_up_switch) between its two devices, so a
    route a -> link -> b never passes through a third device;
  - a domain of several hosts (`devices_per_host` < `devices_per_node`): with no `domain` section
    the devices still sit on one domain switch (NVL72: 18 trays x 4 GPUs on the NVLink switch
    system); with `domain: {topology: switch | full_mesh, bandwidth, latency}` each host has its
    own scale-up switch and the hosts are joined by a domain switch or host-to-host links
    (`domain.bandwidth` per host and direction; Cambricon MLU POD: boxes joined by MLU-Link).

Scale-out, per plane (`scale_out.planes`, default 1; NIC k of a domain on plane k mod planes):
  - NICs (`nics_per_node` per domain, shared evenly by its devices) attach to leaves. Plain: all
    NICs of a node (on the plane) on one leaf of `nodes_per_leaf` nodes. `rail_optimized`: a unit
    of `nodes_per_leaf` nodes has one leaf per rail, NIC k on rail k mod `rails` (DGX SuperPOD).
  - leaves connect to `spines` spines (default nics_per_node / planes) by links that carry
    1/`oversubscription` of the leaf's downlinks, at least one NIC / oversubscription;
  - `levels: 3`: `units_per_pod` units share a pod's spines; spine j of every pod connects to core
    group j (`cores_per_spine` cores) by links carrying 1/`core_oversubscription` of its downlinks.
  - a plane is a separate fat-tree. A device whose NIC is on another plane than the destination's
    goes first over its domain's scale-up fabric to the device at the destination's NIC index,
    then out of that device's NIC (PXN, as NCCL does with NCCL_PXN; DeepSeek's multi-plane
    fat-tree forwards cross-plane traffic inside the node the same way).

Edge values (per device and direction): `bw` capacity; `flow_bw` what one flow gets when every
device drives the fabric at once: a NIC shared by k devices gives each nic_bw/k, a leaf uplink
nic_bw/oversubscription, a spine-core link nic_bw/(oversubscription x core_oversubscription), a
host's domain link (or one host-to-host link) its bandwidth / devices_per_host. Latencies:
device -> switch -> device adds up to `scale_up.latency`, NIC -> leaf -> NIC to `scale_out.latency`,
each leaf-spine link is `spine_latency`, each spine-core link `core_latency`.

Routing: inside a domain over its scale-up fabric; otherwise device -> NIC -> leaf -> a shortest
path through the switch core -> leaf -> NIC -> device, ECMP among the equal-cost core paths (one per
spine inside a pod; one per (spine index, core) across pods), which are laid out by structure and
cached per leaf pair (the same set networkx's all_shortest_paths finds, tested).

Link classes (analytical backend): `scale_up` (same domain; with a `domain` section, same host),
`domain` (other host of the domain, with a `domain` section), `leaf` (same leaf), `spine` (other
leaf of the same pod), `core` (other pod), and
`pxn_leaf` / `pxn_spine` / `pxn_core` for cross-plane pairs (the proxy's leaf against the
destination's). Each is the min `flow_bw` and summed latency of a representative route.

Worked example, oversubscribed (dgx-a100-2to1, nodes 128: 16-node leaves, 2:1 uplinks): node3.gpu5
-> node4.gpu5 shares a leaf, 25 GB/s at the NIC; node3.gpu5 -> node40.gpu5 crosses the spine,
min(25 GB/s NIC, 25 GB/s / 2 uplink) = 12.5 GB/s, 5 us.

>>> from simtrain.hardware.topology import REPO_TOPOLOGIES, load_topology

>>> t = load_topology(REPO_TOPOLOGIES / "dgx-a100-2to1.yaml", 128)
>>> a, b, c = 3 * 8 + 5, 4 * 8 + 5, 40 * 8 + 5
>>> t.link_class_name(a, b), t.link(a, b).bw / 1e9
('leaf', 25.0)
>>> t.link_class_name(a, c), t.link(a, c).bw / 1e9, round(t.link(a, c).latency * 1e6, 6)
('spine', 12.5, 5.0)
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

import networkx as nx
import numpy as np

from simtrain.errors import Collector
from simtrain.hardware.topology.base import COMMON, Fabric, LinkClass, Pick, Topology, path_class, register
from simtrain.spec.fields import REQUIRED, Key, Section, validate_map


@dataclass(frozen=True)
class FatTreeSpec:
    scale_up_bw: float
    scale_up_latency: float
    scale_up_topology: str          # switch | full_mesh
    domain_topology: str | None     # None (one domain switch) | switch | full_mesh (between hosts)
    domain_bw: float                # per host and direction
    domain_latency: float
    nics_per_node: int
    nic_bw: float
    scale_out_latency: float
    oversubscription: float
    nodes_per_leaf: int
    spine_latency: float
    rail_optimized: bool
    rails: int
    planes: int
    levels: int
    units_per_pod: int
    core_oversubscription: float
    core_latency: float
    spines: int
    cores_per_spine: int


DOMAIN = {
    "topology": Key(("switch", "full_mesh"), doc="a domain switch, or links between every pair of hosts"),
    "bandwidth": Key("bandwidth", doc="per host, per direction"),
    "latency": Key("time", doc="host to host"),
}

_EFF = Key("float", 1.0, "measured share of the bandwidth a collective gets on this tier")
_EFF_SOURCE = Key("str", "", "where efficiency comes from")

SCHEMA = dict(COMMON, **{
    "devices_per_node": Key("int", doc="devices of one scale-up domain (a simtrain node)", minimum=1, maximum=4096),
    "devices_per_host": Key("posint", None, "devices of one physical host or tray (absent: devices_per_node)", optional=True, maximum=4096),
    "node_label": Key("str", "node", "label of a scale-up domain in names"),
    "host_label": Key("str", "host", "label of a host in names"),
    "scale_up": Key("map", REQUIRED, "the scale-up fabric of a domain (NVLink, MLU-Link)", section=Section({
        "bandwidth": Key("bandwidth", doc="per device, per direction"),
        "latency": Key("time", doc="device to device"),
        "topology": Key(("switch", "full_mesh"), "switch", "a switch, or direct links between every pair"),
        "efficiency": _EFF,
        "efficiency_source": _EFF_SOURCE,
    })),
    "domain": Key("any", None, "hosts of a domain joined by a domain switch or host-to-host links", section=Section(DOMAIN)),
    "scale_out": Key("map", REQUIRED, "NICs, leaves, spines (and cores) between domains", section=Section({
        "nics_per_node": Key("int", doc="NICs of one domain, shared evenly by its devices", minimum=0, maximum=4096),
        "nic_bandwidth": Key("bandwidth", doc="per NIC, per direction"),
        "latency": Key("time", doc="device -> NIC -> leaf -> NIC -> device"),
        "oversubscription": Key("float", 1.0, "leaf downlinks / uplinks", minimum=0.001, maximum=1000.0),
        "nodes_per_leaf": Key("int", 32, "nodes under one leaf (rail_optimized: one leaf per rail of a unit)", maximum=65_536),
        "spine_latency": Key("time", "0 us", "each leaf-spine link"),
        "rail_optimized": Key("bool", False, "NIC k of every node of a unit on the leaf of rail k"),
        "rails": Key("posint", None, "rails of a rail-optimized unit", optional=True, maximum=4096),
        "planes": Key("posint", 1, "independent scale-out planes; NIC k on plane k mod planes", maximum=64),
        "levels": Key((2, 3), 2, "2: leaf-spine; 3: pods of units under core switches"),
        "units_per_pod": Key("posint", None, "levels 3: units sharing a pod's spines", optional=True, maximum=65_536),
        "spines": Key("posint", None, "spines per leaf group (absent: nics_per_node / planes)", optional=True, maximum=65_536),
        "core_oversubscription": Key("float", 1.0, "levels 3: spine downlinks / core uplinks", minimum=0.001, maximum=1000.0),
        "core_latency": Key("time", "0 us", "each spine-core link"),
        "cores_per_spine": Key("posint", 1, "levels 3: cores of the group spine j connects to", maximum=65_536),
        "efficiency": _EFF,
        "efficiency_source": _EFF_SOURCE,
    })),
})


@register("fat_tree", SCHEMA)
@register("two_tier", SCHEMA)
class FatTree(Fabric):
    """Scale-up domains (switch or full mesh, one or several hosts) on a rail-optimized or plain,
    single- or multi-plane, two- or three-level fat-tree with oversubscription at each level."""

    def __init__(self, topo: Topology) -> None:
        super().__init__(topo)
        t, s = topo, self.s
        self.dpn = t.devices_per_node
        self.dph = t.devices_per_host
        self.hosts = self.dpn // self.dph
        self.dpnic = self.dpn // s.nics_per_node
        self.nics_per_host = s.nics_per_node // self.hosts
        self.npl = s.nodes_per_leaf
        self.nodes_per_unit = self.npl
        self.lu = s.rails // s.planes if s.rail_optimized else 1          # leaves per unit and plane
        self.units = math.ceil(t.nodes / self.npl)
        self.upp = s.units_per_pod if s.levels == 3 else max(self.units, 1)
        self.pods = math.ceil(self.units / self.upp)
        self.lpp = self.units * self.lu                                   # leaves per plane
        self._core_cache: dict = {}
        self._probes: dict = {}
        self.scale_up_mesh = s.scale_up_topology == "full_mesh" and s.domain_topology is None and self.dpn > 1
        self.oversubscribed = ((s.oversubscription > 1 or s.core_oversubscription > 1) and s.planes == 1
                               and self.lpp > 1)

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, v: dict, nodes: int, errs: Collector) -> dict:
        up, out = v["scale_up"], v["scale_out"]
        dpn = v["devices_per_node"]
        if dpn is not None and dpn < 1:
            errs.add("devices_per_node", "must be >= 1", "write e.g. `8`")
            return {}
        dph = v["devices_per_host"] or dpn
        if dpn is not None and dph is not None and dpn % dph:
            errs.add("devices_per_host", f"{dph} devices per host do not divide the {dpn} devices of a scale-up domain",
                     f"use a divisor of devices_per_node={dpn} (e.g. 4 for 18 trays x 4 = 72)")
        nics = out["nics_per_node"]
        if nics is not None and dpn is not None and (nics < 1 or dpn % nics):
            errs.add("scale_out.nics_per_node", f"{nics} NICs cannot be shared evenly by {dpn} devices",
                     "use a divisor of devices_per_node")
        elif nics and dph and dpn and (nics % (dpn // dph)):
            errs.add("scale_out.nics_per_node", f"{nics} NICs cannot be spread evenly over the {dpn // dph} hosts of a domain",
                     f"use a multiple of {dpn // dph}")
        if out["oversubscription"] is not None and out["oversubscription"] < 1:
            errs.add("scale_out.oversubscription", "must be >= 1 (1 = non-blocking)", "write e.g. `1` or `2`")
        if out["core_oversubscription"] is not None and out["core_oversubscription"] < 1:
            errs.add("scale_out.core_oversubscription", "must be >= 1 (1 = non-blocking)", "write e.g. `1` or `2`")
        for sect, d in (("scale_up", up), ("scale_out", out)):
            if d["efficiency"] is not None and not 0 < d["efficiency"] <= 1:
                errs.add(f"{sect}.efficiency", "must be in (0, 1]", "give the measured busbw / link bandwidth ratio")
        if out["nodes_per_leaf"] is not None and out["nodes_per_leaf"] < 1:
            errs.add("scale_out.nodes_per_leaf", "must be >= 1", "write e.g. `32`")
        rails = out["rails"]
        if rails is not None and not out["rail_optimized"]:
            errs.add("scale_out.rails", "rails only apply to a rail-optimized fabric", "add `rail_optimized: true` or drop `rails`")
        rails = rails or nics
        if rails and nics and nics % rails:
            errs.add("scale_out.rails", f"{rails} rails do not divide the {nics} NICs of a node", "use a divisor of nics_per_node")
        planes = out["planes"]
        if planes and nics and nics % planes:
            errs.add("scale_out.planes", f"{planes} planes do not divide the {nics} NICs of a node (NIC k is on plane k mod planes)",
                     "use a divisor of nics_per_node")
        elif planes and rails and out["rail_optimized"] and rails % planes:
            errs.add("scale_out.planes", f"{planes} planes do not divide the {rails} rails", "use a divisor of the rail count")
        if out["levels"] == 3 and out["units_per_pod"] is None:
            errs.add("scale_out.units_per_pod", "a three-level fat-tree needs the number of leaf units per pod",
                     "add e.g. `units_per_pod: 4` (4 scalable units share one pod's spines)")
        if out["levels"] != 3:
            for key in ("units_per_pod",):
                if out[key] is not None:
                    errs.add(f"scale_out.{key}", "only applies to a three-level fat-tree", "add `levels: 3` or drop it")
        dom = None
        if v["domain"] is not None:
            dom = validate_map(v["domain"], DOMAIN, "domain", errs)
            if dph == dpn:
                errs.add("domain", "a domain section joins several hosts, but devices_per_host equals devices_per_node",
                         "set devices_per_host to the devices of one server or tray, or drop `domain`")
            if up["topology"] == "full_mesh":
                errs.add("scale_up.topology", "with a `domain` section the devices of a host sit on the host's scale-up switch",
                         "write `topology: switch` (the hosts are joined as `domain.topology` says)")
        if errs.problems:
            return {}
        spines = out["spines"] or max(1, nics // planes)
        spec = FatTreeSpec(
            scale_up_bw=up["bandwidth"], scale_up_latency=up["latency"], scale_up_topology=up["topology"],
            domain_topology=dom["topology"] if dom else None, domain_bw=dom["bandwidth"] if dom else 0.0,
            domain_latency=dom["latency"] if dom else 0.0,
            nics_per_node=nics, nic_bw=out["nic_bandwidth"], scale_out_latency=out["latency"],
            oversubscription=out["oversubscription"], nodes_per_leaf=out["nodes_per_leaf"],
            spine_latency=out["spine_latency"], rail_optimized=out["rail_optimized"], rails=rails,
            planes=planes, levels=out["levels"], units_per_pod=out["units_per_pod"] or 1,
            core_oversubscription=out["core_oversubscription"], core_latency=out["core_latency"],
            spines=spines, cores_per_spine=out["cores_per_spine"])
        return dict(devices_per_node=dpn, devices_per_host=dph, node_label=v["node_label"], host_label=v["host_label"],
                    device_label=v["device_label"], scale_up_efficiency=up["efficiency"],
                    scale_out_efficiency=out["efficiency"], spec=spec,
                    efficiency_sources=(up["efficiency_source"], out["efficiency_source"]))

    # ------------------------------------------------------------------ names and indices
    def node_id(self, node: int) -> str:
        return f"{self.t.node_label}{node}"

    def host_id(self, node: int, host: int) -> str:
        if self.hosts == 1:
            return self.node_id(node)
        return f"{self.node_id(node)}.{self.t.host_label}{host}"

    def device_id(self, d: int) -> str:
        node, local = divmod(d, self.dpn)
        if self.hosts == 1:
            return f"{self.t.node_label}{node}.{self.t.device_label}{local}"
        h, i = divmod(local, self.dph)
        return f"{self.t.node_label}{node}.{self.t.host_label}{h}.{self.t.device_label}{i}"

    def nic_of(self, d: int) -> int:
        """Index of the device's NIC within its domain."""
        return (d % self.dpn) // self.dpnic

    def nic_name(self, node: int, k: int) -> str:
        h, i = divmod(k, self.nics_per_host)
        return f"{self.host_id(node, h)}.nic{i}"

    def plane_of_nic(self, k: int) -> int:
        return k % self.s.planes

    def _leaf_of_nic(self, node: int, k: int) -> int:
        s = self.s
        unit = node // self.npl
        li = unit * self.lu + ((k % s.rails) // s.planes if s.rail_optimized else 0)
        return (k % s.planes) * self.lpp + li

    def leaf_of(self, d: int) -> int:
        """Leaf switch of the device's NIC (global index, plane by plane). Plain fat-tree: all NICs
        of a node (on a plane) on one leaf of `nodes_per_leaf` nodes. Rail-optimized: a unit of
        `nodes_per_leaf` nodes has one leaf per rail, NIC k on rail k mod rails, so
        leaf = unit x rails + rail on one plane."""
        return self._leaf_of_nic(d // self.dpn, self.nic_of(d))

    def leaf_name(self, leaf: int) -> str:
        p, li = divmod(leaf, self.lpp)
        return f"leaf{li}" if self.s.planes == 1 else f"plane{p}.leaf{li}"

    def pod_of_leaf(self, leaf: int) -> int:
        return ((leaf % self.lpp) // self.lu) // self.upp

    def spine_name(self, p: int, q: int, j: int) -> str:
        pre = f"plane{p}." if self.s.planes > 1 else ""
        return f"{pre}pod{q}.spine{j}" if self.pods > 1 else f"{pre}spine{j}"

    def core_name(self, p: int, c: int) -> str:
        pre = f"plane{p}." if self.s.planes > 1 else ""
        return f"{pre}core{c}"

    def proxy(self, src: int, dst: int) -> int:
        """PXN: the device of src's domain at dst's NIC index (on dst's plane), same position
        among the devices sharing that NIC."""
        local = src % self.dpn
        return (src - local) + self.nic_of(dst) * self.dpnic + local % self.dpnic

    # ------------------------------------------------------------------ graph
    def build(self) -> nx.Graph:
        t, s = self.t, self.s
        g = nx.Graph(name=t.name)
        multi_leaf = self.lpp > 1
        per_leaf = s.nics_per_node // (s.rails if s.rail_optimized else s.planes)   # NICs a node puts on a leaf
        down = s.nic_bw * self.npl * per_leaf
        up_bw = max(down / s.spines, s.nic_bw) / s.oversubscription
        up_flow = s.nic_bw / s.oversubscription
        for p in range(s.planes):
            for q in range(self.pods if multi_leaf else 0):
                for j in range(s.spines):
                    g.add_node(self.spine_name(p, q, j), kind="spine")
            for li in range(self.lpp):
                leaf = self.leaf_name(p * self.lpp + li)
                g.add_node(leaf, kind="leaf")
                q = (li // self.lu) // self.upp
                for j in range(s.spines if multi_leaf else 0):
                    g.add_edge(leaf, self.spine_name(p, q, j), bw=up_bw, flow_bw=up_flow, latency=s.spine_latency,
                               tier="scale_out")
            if self.pods > 1:
                spine_down = self.upp * self.lu * up_bw
                core_bw = max(spine_down / s.cores_per_spine, up_flow) / s.core_oversubscription
                core_flow = up_flow / s.core_oversubscription
                for j in range(s.spines):
                    for c in range(s.cores_per_spine):
                        core = self.core_name(p, j * s.cores_per_spine + c)
                        g.add_node(core, kind="core")
                        for q in range(self.pods):
                            g.add_edge(self.spine_name(p, q, j), core, bw=core_bw, flow_bw=core_flow,
                                       latency=s.core_latency, tier="scale_out")
        half_up, half_out = s.scale_up_latency / 2, s.scale_out_latency / 2
        nic_share = s.nic_bw / self.dpnic
        for node in range(t.nodes):
            nid = self.node_id(node)
            if s.domain_topology is None and s.scale_up_topology == "switch":
                g.add_node(f"{nid}.switch", kind="scale_up_switch")
            if s.domain_topology is not None:
                for h in range(self.hosts):
                    g.add_node(f"{self.host_id(node, h)}.switch", kind="scale_up_switch")
                if s.domain_topology == "switch":
                    g.add_node(f"{nid}.switch", kind="scale_up_switch")
                    for h in range(self.hosts):
                        g.add_edge(f"{self.host_id(node, h)}.switch", f"{nid}.switch", bw=s.domain_bw,
                                   flow_bw=s.domain_bw / self.dph, latency=s.domain_latency / 2, tier="scale_up")
                else:
                    pair = s.domain_bw / (self.hosts - 1)
                    for h in range(self.hosts):
                        for h2 in range(h + 1, self.hosts):
                            g.add_edge(f"{self.host_id(node, h)}.switch", f"{self.host_id(node, h2)}.switch", bw=pair,
                                       flow_bw=pair / self.dph, latency=s.domain_latency, tier="scale_up")
            for k in range(s.nics_per_node):
                nic = self.nic_name(node, k)
                g.add_node(nic, kind="nic")
                g.add_edge(nic, self.leaf_name(self._leaf_of_nic(node, k)), bw=s.nic_bw, flow_bw=s.nic_bw,
                           latency=half_out, tier="scale_out")
            base = node * self.dpn
            for i in range(self.dpn):
                dev = self.device_id(base + i)
                g.add_node(dev, kind="device")
                if s.domain_topology is not None:
                    g.add_edge(dev, f"{self.host_id(node, i // self.dph)}.switch", bw=s.scale_up_bw,
                               flow_bw=s.scale_up_bw, latency=half_up, tier="scale_up")
                elif s.scale_up_topology == "switch":
                    g.add_edge(dev, f"{nid}.switch", bw=s.scale_up_bw, flow_bw=s.scale_up_bw, latency=half_up,
                               tier="scale_up")
                g.add_edge(dev, self.nic_name(node, i // self.dpnic), bw=s.nic_bw, flow_bw=nic_share, latency=0.0,
                           tier="scale_out")
            if s.domain_topology is None and s.scale_up_topology == "full_mesh" and self.dpn > 1:
                # each point-to-point link is a two-port scale-up element between its devices, so
                # that it is a scale-up link wherever links are told apart by a scale-up switch
                pair = s.scale_up_bw / (self.dpn - 1)
                for i in range(self.dpn):
                    for j in range(i + 1, self.dpn):
                        link = f"{nid}.link{i}-{j}"
                        g.add_node(link, kind="scale_up_switch")
                        for x in (i, j):
                            g.add_edge(self.device_id(base + x), link, bw=pair, flow_bw=pair, latency=half_up,
                                       tier="scale_up")
        return g

    # ------------------------------------------------------------------ routing
    def _intra(self, a: int, b: int) -> tuple:
        """Route inside one scale-up domain."""
        s = self.s
        A, B = self.device_id(a), self.device_id(b)
        node = a // self.dpn
        if s.domain_topology is None:
            if s.scale_up_topology == "switch":
                return (A, f"{self.node_id(node)}.switch", B)
            i, j = sorted((a % self.dpn, b % self.dpn))
            return (A, f"{self.node_id(node)}.link{i}-{j}", B)
        ha, hb = (a % self.dpn) // self.dph, (b % self.dpn) // self.dph
        sa = f"{self.host_id(node, ha)}.switch"
        if ha == hb:
            return (A, sa, B)
        sb = f"{self.host_id(node, hb)}.switch"
        if s.domain_topology == "switch":
            return (A, sa, f"{self.node_id(node)}.switch", sb, B)
        return (A, sa, sb, B)

    def core_paths(self, la: int, lb: int) -> list:
        """Every shortest path between two leaves of one plane through the switch core, sorted."""
        hit = self._core_cache.get((la, lb))
        if hit is not None:
            return hit
        s = self.s
        A, B = self.leaf_name(la), self.leaf_name(lb)
        if la == lb:
            paths = [(A,)]
        else:
            p = la // self.lpp
            qa, qb = self.pod_of_leaf(la), self.pod_of_leaf(lb)
            if qa == qb:
                paths = sorted((A, self.spine_name(p, qa, j), B) for j in range(s.spines))
            else:
                cps = s.cores_per_spine
                paths = sorted((A, self.spine_name(p, qa, j), self.core_name(p, j * cps + c), self.spine_name(p, qb, j), B)
                               for j in range(s.spines) for c in range(cps))
        self._core_cache[(la, lb)] = paths
        return paths

    def route(self, src: int, dst: int, pick: Pick | None = None, cache: dict | None = None) -> tuple:
        if src // self.dpn == dst // self.dpn:
            return self._intra(src, dst)
        prefix = ()
        s = src
        if self.s.planes > 1 and self.plane_of_nic(self.nic_of(src)) != self.plane_of_nic(self.nic_of(dst)):
            s = self.proxy(src, dst)
            prefix = self._intra(src, s)[:-1]
        paths = self.core_paths(self.leaf_of(s), self.leaf_of(dst))
        chosen = pick(paths) if pick is not None and len(paths) > 1 else paths[0]
        return (prefix + (self.device_id(s), self.nic_name(s // self.dpn, self.nic_of(s))) + chosen
                + (self.nic_name(dst // self.dpn, self.nic_of(dst)), self.device_id(dst)))

    # ------------------------------------------------------------------ link classes
    def link_class_name(self, a: int, b: int) -> str:
        if a == b:
            return "self"
        if a // self.dpn == b // self.dpn:
            if self.s.domain_topology is not None and a // self.dph != b // self.dph:
                return "domain"
            return "scale_up"
        pre = ""
        if self.s.planes > 1 and self.plane_of_nic(self.nic_of(a)) != self.plane_of_nic(self.nic_of(b)):
            a = self.proxy(a, b)
            pre = "pxn_"
        la, lb = self.leaf_of(a), self.leaf_of(b)
        if la == lb:
            return pre + "leaf"
        if self.pod_of_leaf(la) == self.pod_of_leaf(lb):
            return pre + "spine"
        return pre + "core"

    def leaves_of(self, d: np.ndarray) -> np.ndarray:
        """`leaf_of` of a numpy array of devices (same formula)."""
        s = self.s
        node, k = d // self.dpn, (d % self.dpn) // self.dpnic
        li = (node // self.npl) * self.lu + (((k % s.rails) // s.planes) if s.rail_optimized else 0)
        return (k % s.planes) * self.lpp + li

    def leaf_array(self) -> list:
        return self.leaves_of(np.arange(self.t.num_devices, dtype=np.int64)).tolist()

    _CODES = ("self", "scale_up", "domain", "leaf", "spine", "core", "pxn_leaf", "pxn_spine", "pxn_core")

    @property
    def symmetric_links(self) -> bool:
        """link_class_name(a, b) == link_class_name(b, a) for every pair: true on one plane (node,
        domain, leaf and pod equality are symmetric); across planes the PXN proxy hop is taken on
        the sender's side, so not assumed."""
        return self.s.planes == 1

    def link_class_codes(self, a: np.ndarray, b: np.ndarray) -> tuple:
        """`link_class_name` over arrays of device pairs as codes into `_CODES` (numpy)."""
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        s = self.s
        out = np.empty(len(a), dtype=np.int64)
        same_dev = a == b
        same_node = (a // self.dpn == b // self.dpn) & ~same_dev
        dom = same_node & (a // self.dph != b // self.dph) if s.domain_topology is not None else np.zeros(len(a), dtype=bool)
        out[same_dev] = 0
        out[same_node & ~dom] = 1
        out[dom] = 2
        rest = ~(same_dev | same_node)
        if rest.any():
            ar, br = a[rest], b[rest]
            pxn = np.zeros(len(ar), dtype=bool)
            if s.planes > 1:
                ka, kb = (ar % self.dpn) // self.dpnic, (br % self.dpn) // self.dpnic
                pxn = (ka % s.planes) != (kb % s.planes)
                local = ar % self.dpn
                ar = np.where(pxn, (ar - local) + kb * self.dpnic + local % self.dpnic, ar)
            la, lb = self.leaves_of(ar), self.leaves_of(br)
            pod = lambda x: ((x % self.lpp) // self.lu) // self.upp
            base = np.where(la == lb, 3, np.where(pod(la) == pod(lb), 4, 5))
            out[rest] = base + 3 * pxn
        return out, list(self._CODES)

    def link_class_names(self, a: np.ndarray, b: np.ndarray) -> list:
        """`link_class_name` over arrays of device pairs, with the same rules in numpy."""
        codes, names = self.link_class_codes(a, b)
        return [names[c] for c in codes.tolist()]

    def tier_bandwidth(self, src: np.ndarray, dst: np.ndarray) -> float | None:
        """The slowest flow's share of the leaf uplinks (and, on three levels, of the spine-core
        links) when these flows run alone, each tier's capacity spread evenly over its equal-cost
        paths, capped by the NIC share of the full-load class (nic_bw / devices per NIC). None on
        a non-blocking fabric (the full-load class is then the NIC share already) and on several
        planes (PXN hops). Worked example (dgx-a100-2to1, 128 nodes): a leaf's 8 uplinks carry
        16 x 8 NICs x 25 GB/s / 8 / 2 = 200 GB/s each; the 8 dp rings of a tp 8 x dp 128 plan in
        Megatron order leave each 16-node leaf by one hop each, 8 flows over 1.6 TB/s, so each
        gets its NIC's 25 GB/s, not the full-load 12.5 GB/s; with the nodes scattered over the
        leaves every hop leaves its leaf, 128 flows, 12.5 GB/s."""
        tiers = self._tiers(src, dst)
        if tiers is None:
            return None
        bw = self.s.nic_bw / self.dpnic
        for _, up, down, cap in tiers:
            bw = min(bw, cap / max(up.max(), down.max()))
        return float(bw)

    def tier_loads(self, src: np.ndarray, dst: np.ndarray, rate: float) -> tuple:
        """((tier resource, fraction of its capacity), ...) that these concurrent flows use when
        each runs at `rate` bytes/s: per leaf its uplinks out and in, per pod (three levels) its
        core links out and in, each tier's capacity spread evenly over its equal-cost paths as
        in `tier_bandwidth`. () where `tier_bandwidth` is None. Worked example (dgx-a100-2to1,
        128 nodes, scattered): the 8 dp rings of one pipeline stage of tp 8 x pp 2 x dp 64 leave
        each leaf by 64 flows at the NIC's 25 GB/s, 1.6 TB/s of the leaf's 1.6 TB/s: 1.0 out and
        in on every leaf; a second stage's rings at the same time make it 2.0, so each gets half."""
        tiers = self._tiers(src, dst)
        if tiers is None:
            return ()
        out = []
        for name, up, down, cap in tiers:
            for way, counts in (("up", up), ("down", down)):
                out += [((name, way, int(i)), float(n * rate / cap)) for i, n in enumerate(counts.tolist()) if n]
        return tuple(out)

    def _tiers(self, src: np.ndarray, dst: np.ndarray) -> list | None:
        """Per oversubscribed tier crossed by flows src[i] -> dst[i]: (name, flows leaving each
        of its units, flows entering each, the capacity of one unit's links in bytes/s); None on a
        fabric without a closed form (see `tier_bandwidth`) or where no flow leaves its leaf."""
        s = self.s
        if not self.oversubscribed:
            return None
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        la, lb = self.leaves_of(src), self.leaves_of(dst)
        cross = la != lb
        if not cross.any():
            return None
        per_leaf = s.nics_per_node // (s.rails if s.rail_optimized else s.planes)
        up_bw = max(s.nic_bw * self.npl * per_leaf / s.spines, s.nic_bw) / s.oversubscription
        n = int(max(la.max(), lb.max())) + 1
        tiers = [("leaf", np.bincount(la[cross], minlength=n), np.bincount(lb[cross], minlength=n), s.spines * up_bw)]
        if self.pods > 1:
            pa, pb = ((la % self.lpp) // self.lu) // self.upp, ((lb % self.lpp) // self.lu) // self.upp
            far = pa != pb
            if far.any():
                core_bw = max(self.upp * self.lu * up_bw / s.cores_per_spine, s.nic_bw / s.oversubscription) / s.core_oversubscription
                m = int(max(pa.max(), pb.max())) + 1
                tiers.append(("pod", np.bincount(pa[far], minlength=m), np.bincount(pb[far], minlength=m),
                              s.spines * s.cores_per_spine * core_bw))
        return tiers

    def span_of_leaves(self, nodes: int, leaves: np.ndarray) -> str:
        """`span_class` from a group's node count and its distinct leaves (single-host domains)."""
        if nodes <= 1:
            return "scale_up"
        if len(leaves) <= 1:
            return "leaf"
        pods = ((leaves % self.lpp) // self.lu) // self.upp
        return "core" if (pods != pods[0]).any() else "spine"

    def span_class(self, devices: Iterable[int]) -> str:
        devices = np.asarray(devices, dtype=np.int64)
        if len(np.unique(devices // self.dpn)) <= 1:
            if self.s.domain_topology is not None and len(np.unique(devices // self.dph)) > 1:
                return "domain"
            return "scale_up"
        leaves = {int(x) for x in np.unique(self.leaves_of(devices))}
        if len(leaves) <= 1:
            return "leaf"
        return "core" if len({self.pod_of_leaf(x) for x in leaves}) > 1 else "spine"

    def efficiency(self, cls: str) -> float:
        return self.t.scale_up_efficiency if cls in ("scale_up", "domain") else self.t.scale_out_efficiency

    def _sized(self, nodes: int) -> "FatTree":
        """The fabric whose graph a representative route of `nodes` domains is walked on: this one
        if its graph is built (or it is no larger), else the same fabric with just `nodes`
        domains. Per-link bandwidths and latencies do not depend on the domain count, so link
        classes come out the same without building a 16,384-node graph (tests check it)."""
        if nodes >= self.t.nodes or self._g is not None:
            return self._probe(nodes)
        hit = self._probes.get(nodes)
        if hit is None:
            hit = self._probes[nodes] = FatTree(replace(self.t, nodes=nodes))
        return hit

    def _probe(self, nodes: int) -> "FatTree":
        """The same fabric with at least `nodes` domains (to walk a representative route that
        the cluster in use is too small to hold)."""
        if nodes <= self.t.nodes:
            return self
        hit = self._probes.get(nodes)
        if hit is None:
            hit = self._probes[nodes] = FatTree(replace(self.t, nodes=nodes))
        return hit

    def _pair(self, cls: str):
        """(destination node, local index) of a representative pair from device 0, or None."""
        s = self.s
        pxn = cls.startswith("pxn_")
        base = cls[4:] if pxn else cls
        if pxn and s.planes == 1:
            return None
        local = self.dpnic if pxn else 0           # NIC 1 is on plane 1
        if base == "leaf":
            return (1, local) if self.npl >= 2 else None
        if base == "spine":
            if s.levels == 2 or self.upp >= 2:
                return (self.npl, local)
            if s.rail_optimized and self.lu > 1 and self.npl >= 2 and not pxn:
                return (1, s.planes * self.dpnic)  # another rail of the same unit
            return None
        if base == "core":
            return (self.upp * self.npl, local) if s.levels == 3 else None
        return None

    def _link_class(self, cls: str) -> LinkClass:
        s = self.s
        eff = self.efficiency(cls)
        if cls in ("scale_up", "domain"):
            if self.dpn == 1:
                return LinkClass(cls, s.scale_up_bw, s.scale_up_latency, eff)
            b = self.dph if (cls == "domain" and s.domain_topology is not None) else 1
            return path_class(self._sized(1).graph(), self._intra(0, b), cls, eff)
        pair = self._pair(cls)
        if pair is None:
            pre = "pxn_" if cls.startswith("pxn_") and s.planes > 1 else ""
            base = cls[4:] if cls.startswith("pxn_") else cls
            for other in {"leaf": ("spine", "core"), "spine": ("core", "leaf"), "core": ("spine", "leaf")}.get(base, ()):
                if self._pair(pre + other) is not None:
                    x = self.link_class(pre + other)
                    return LinkClass(cls, x.bw, x.latency, x.efficiency)
            raise KeyError(f"no link class {cls!r} on a {self.t.kind} fabric")
        node, local = pair
        fab = self._sized(node + 1)
        b = node * self.dpn + local
        return path_class(fab.graph(), fab.route(0, b), cls, eff)

    def placement_levels(self) -> list:
        unit = [n // self.npl for n in range(self.t.nodes)]
        levels = []
        if self.s.levels == 3 and self.pods > 1:
            levels.append([u // self.upp for u in unit])
        if self.units > 1:
            levels.append(unit)
        return levels

    def describe(self, count: bool = True) -> str:
        t, s = self.t, self.s
        unit = "node" if self.hosts == 1 else t.node_label
        dom = (f"{t.nodes} {unit}s x {self.dpn} {t.device_label}s" if count
               else f"{self.dpn} {t.device_label}s per {unit}")
        if self.hosts > 1:
            dom += f" ({self.hosts} {t.host_label}s x {self.dph}" + (f", {t.host_label}s joined by a {s.domain_topology.replace('_', ' ')})"
                                                                     if s.domain_topology else ")")
        if s.scale_up_topology == "full_mesh":
            dom += ", scale-up full mesh"
        fab = [f"{s.levels}-level", "rail-optimized" if s.rail_optimized else "plain"]
        if s.planes > 1:
            fab.append(f"{s.planes}-plane")
        over = f"{s.oversubscription:g}:1 at the leaves" + (f", {s.core_oversubscription:g}:1 at the core" if s.levels == 3 else "")
        return f"{dom}; {' '.join(fab)} fat-tree, {self.npl} nodes per leaf unit, {over}"
