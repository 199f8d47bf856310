"""`kind: dragonfly`: devices on routers in all-to-all groups joined by global links.

Kim, Dally, Scott & Abts, "Technology-Driven, Highly-Scalable Dragonfly Topology" (ISCA 2008):
`groups` groups of `routers_per_group` routers (a), every router linked to every other router of
its group (local links), with `global_links_per_router` (h) global links and `devices_per_router`
(p) devices. A group has a·h global ports; they are dealt to the other groups round-robin (pair
(i, j) for i < j in order, port by port, a router's ports consecutive), so every pair of groups is
joined by (a·h) // (groups - 1) global links (one in the balanced maximum, groups = a·h + 1).
Parallel links between the same two routers are merged into one edge of their summed bandwidth.
A simtrain node (scale-up domain) is one router's devices; `cluster.nodes` counts routers in use.

Edge values (per direction): `bw` the link's bandwidth, `flow_bw` that divided by p (every device
of a router drives one flow through it under full load); injection links their bandwidth.

Routing: minimal, local-global-local. Inside a group one local hop; between groups, over each
global link joining the two groups: [local hop to its router] + global hop + [local hop], the
shortest of these kept and ECMP choosing among them (so a minimal route crosses exactly one global
link, never two, even where a two-global detour would be as short in the graph).

Link classes: `scale_up` = same router; `leaf` = same group (`leaf_of` is the group; one local
hop); `spine` = another group, represented by the longest minimal route between group 0 and
group 1 (local + global + local where such a pair exists).

Worked example (dragonfly.yaml: 9 groups x 8 routers, h = 4, 25 GB/s links): 8·4 = 32 global
ports per group, 32 // 8 = 4 links to each other group; g0r5 -> g3r2 is 1 to 3 hops.

>>> links = global_links(9, 8, 4)
>>> len(links), len(links) // (9 * 8 // 2)
(144, 4)
>>> sum(1 for (gi, _), (gj, _) in links if {gi, gj} == {0, 3})
4
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from simtrain.errors import Collector
from simtrain.hardware.topology.base import COMMON, Fabric, LinkClass, Pick, Topology, link_schema, path_class, register
from simtrain.spec.fields import Key


@dataclass(frozen=True)
class DragonflySpec:
    groups: int
    routers_per_group: int
    global_links_per_router: int
    injection_bw: float
    injection_latency: float
    local_bw: float
    local_latency: float
    global_bw: float
    global_latency: float


SCHEMA = dict(COMMON, **{
    "groups": Key("posint", doc="groups of routers, joined by global links", maximum=65_536),
    "routers_per_group": Key("posint", doc="routers of a group (a), linked all-to-all by local links", maximum=65_536),
    "global_links_per_router": Key("int", doc="global links of one router (h)", minimum=0, maximum=65_536),
    "devices_per_router": Key("posint", 1, "devices on one router (p; a simtrain node)", maximum=4096),
    "injection": link_schema("0 us", "device to router link"),
    "local_links": link_schema(doc="router to router link inside a group"),
    "global_links": link_schema(doc="router to router link between groups"),
    "efficiency": Key("float", 1.0, "measured share of the bandwidth a collective gets, in (0, 1]"),
    "efficiency_source": Key("str", "", "where efficiency comes from"),
})


def global_links(groups: int, a: int, h: int) -> list:
    """((group, router), (group, router)) of every global link, as dealt in the module docstring."""
    if groups < 2 or h == 0:
        return []
    per_pair = (a * h) // (groups - 1)
    nxt = [0] * groups
    out = []
    for _ in range(per_pair):
        for i in range(groups):
            for j in range(i + 1, groups):
                out.append(((i, nxt[i] // h), (j, nxt[j] // h)))
                nxt[i] += 1
                nxt[j] += 1
    return out


@register("dragonfly", SCHEMA)
class Dragonfly(Fabric):
    """Devices on routers in all-to-all groups joined by global links, minimal (local-global-local) routing."""

    def __init__(self, topo: Topology) -> None:
        super().__init__(topo)
        s = self.s
        self.a = s.routers_per_group
        self.nodes_per_unit = self.a
        self.dpr = topo.devices_per_node
        self.links = global_links(s.groups, self.a, s.global_links_per_router)
        self.between: dict = {}                    # (group, group) -> sorted unique (router, router)
        for (gi, ri), (gj, rj) in self.links:
            u, v = gi * self.a + ri, gj * self.a + rj
            self.between.setdefault((gi, gj), set()).add((u, v))
            self.between.setdefault((gj, gi), set()).add((v, u))
        self.between = {k: sorted(x) for k, x in self.between.items()}
        self._cache: dict = {}

    @classmethod
    def load(cls, v: dict, nodes: int, errs: Collector) -> dict:
        g, a, h = v["groups"], v["routers_per_group"], v["global_links_per_router"]
        if h < 0:
            errs.add("global_links_per_router", "must be >= 0", "write e.g. `4`")
        elif g > 1 and a * h < g - 1:
            errs.add("global_links_per_router", f"a group has {a} x {h} = {a * h} global ports, too few to reach the "
                                                f"other {g - 1} groups", f"use at least {-(-(g - 1) // a)} or fewer groups")
        if nodes > g * a:
            errs.add("groups", f"the dragonfly has {g} x {a} = {g * a} routers, but the scenario asks for {nodes} nodes "
                               f"(one node = one router's devices)", f"add groups or set cluster.nodes to at most {g * a}")
        if not 0 < v["efficiency"] <= 1:
            errs.add("efficiency", "must be in (0, 1]", "give the measured busbw / link bandwidth ratio")
        spec = DragonflySpec(g, a, h, v["injection"]["bandwidth"], v["injection"]["latency"],
                             v["local_links"]["bandwidth"], v["local_links"]["latency"],
                             v["global_links"]["bandwidth"], v["global_links"]["latency"])
        return dict(devices_per_node=v["devices_per_router"], device_label=v["device_label"],
                    scale_up_efficiency=v["efficiency"], scale_out_efficiency=v["efficiency"], spec=spec,
                    node_label="router", efficiency_sources=(v["efficiency_source"], v["efficiency_source"]))

    def router_name(self, r: int) -> str:
        g, j = divmod(r, self.a)
        return f"g{g}r{j}"

    def device_id(self, d: int) -> str:
        return f"{self.router_name(d // self.dpr)}.{self.t.device_label}{d % self.dpr}"

    def leaf_of(self, d: int) -> int:
        return (d // self.dpr) // self.a

    def build(self) -> nx.Graph:
        s, t = self.s, self.t
        g = nx.Graph(name=t.name)
        R = s.groups * self.a
        for r in range(R):
            g.add_node(self.router_name(r), kind="router")
        for grp in range(s.groups):
            for i in range(self.a):
                for j in range(i + 1, self.a):
                    g.add_edge(self.router_name(grp * self.a + i), self.router_name(grp * self.a + j), bw=s.local_bw,
                               flow_bw=s.local_bw / self.dpr, latency=s.local_latency, tier="scale_out", kind="local")
        for (gi, ri), (gj, rj) in self.links:
            u, v = self.router_name(gi * self.a + ri), self.router_name(gj * self.a + rj)
            if g.has_edge(u, v):
                e = g.edges[u, v]
                e["bw"] += s.global_bw
                e["flow_bw"] += s.global_bw / self.dpr
            else:
                g.add_edge(u, v, bw=s.global_bw, flow_bw=s.global_bw / self.dpr, latency=s.global_latency,
                           tier="scale_out", kind="global")
        for d in range(t.num_devices):
            dev = self.device_id(d)
            g.add_node(dev, kind="device")
            g.add_edge(dev, self.router_name(d // self.dpr), bw=s.injection_bw, flow_bw=s.injection_bw,
                       latency=s.injection_latency, tier="scale_out", kind="injection")
        return g

    def router_paths(self, ra: int, rb: int) -> list:
        """Every minimal local-global-local route between two routers (router names), sorted."""
        hit = self._cache.get((ra, rb))
        if hit is not None:
            return hit
        if ra == rb:
            paths = [(self.router_name(ra),)]
        elif ra // self.a == rb // self.a:
            paths = [(self.router_name(ra), self.router_name(rb))]
        else:
            cands = set()
            for u, v in self.between.get((ra // self.a, rb // self.a), ()):
                cands.add(tuple([ra] + ([u] if u != ra else []) + [v] + ([rb] if v != rb else [])))
            if not cands:
                raise KeyError(f"groups {ra // self.a} and {rb // self.a} share no global link")
            best = min(len(c) for c in cands)
            paths = sorted(tuple(self.router_name(r) for r in c) for c in cands if len(c) == best)
        self._cache[(ra, rb)] = paths
        return paths

    def route(self, src: int, dst: int, pick: Pick | None = None, cache: dict | None = None) -> tuple:
        paths = self.router_paths(src // self.dpr, dst // self.dpr)
        chosen = pick(paths) if pick is not None and len(paths) > 1 else paths[0]
        return (self.device_id(src),) + chosen + (self.device_id(dst),)

    def link_class_name(self, a: int, b: int) -> str:
        if a == b:
            return "self"
        ra, rb = a // self.dpr, b // self.dpr
        if ra == rb:
            return "scale_up"
        return "leaf" if ra // self.a == rb // self.a else "spine"

    def _link_class(self, cls: str) -> LinkClass:
        s = self.s
        eff = self.efficiency(cls)
        if cls == "scale_up":
            return LinkClass(cls, s.injection_bw, 2 * s.injection_latency, eff)
        pairs = {"leaf": [(0, 1)] if self.a > 1 else [],
                 "spine": [(ra, rb) for ra in range(self.a) for rb in range(self.a, 2 * self.a)] if s.groups > 1 else []}
        if cls not in pairs:
            raise KeyError(f"no link class {cls!r} on a dragonfly")
        if not pairs[cls]:
            other = "spine" if cls == "leaf" else "leaf"
            x = self.link_class(other) if pairs[other] else self.link_class("scale_up")
            return LinkClass(cls, x.bw, x.latency, x.efficiency)
        path = max((self.router_paths(ra, rb)[0] for ra, rb in pairs[cls]), key=len)
        return path_class(self.graph(), path, cls, eff, extra_bw=s.injection_bw, extra_latency=2 * s.injection_latency)

    def placement_levels(self) -> list:
        groups = [n // self.a for n in range(self.t.nodes)]
        return [groups] if len(set(groups)) > 1 else []

    def describe(self, count: bool = True) -> str:
        s, t = self.s, self.t
        used = f", {t.nodes} in use" if count else ""
        return (f"dragonfly {s.groups} groups x {self.a} routers{used}, {s.global_links_per_router} "
                f"global links per router, {self.dpr} {t.device_label}s per router")
