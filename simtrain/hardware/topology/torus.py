"""`kind: torus`: devices on routers of a 1-, 2- or 3-D torus (or mesh, `wrap: false`).

Routers sit at integer coordinates of `dims` (router index x + X·(y + Y·z), x fastest); each is
linked to its neighbours in every dimension of size > 1, with wrap-around on a torus (a dimension
of size 2 has one link). `devices_per_router` devices attach to each router by an injection link;
a simtrain node (scale-up domain) is one router's devices, so `cluster.nodes` counts routers in
use (the first ones; the rest of the torus still carries transit traffic). A chip that is its own
router (TPU) is `devices_per_router: 1` with the chip's on-chip injection bandwidth.

Edge values (per direction): router links `bw` = `links.bandwidth`, `flow_bw` = that divided by
devices_per_router (every device of the router drives one flow through it under full load, as
for a NIC shared by several devices); injection links their bandwidth. Latency: each router hop
`links.latency`, each injection link `injection.latency`.

Routing: minimal, dimension by dimension interleaved: at every hop the route may move along any
dimension still off target (both ways on a wrap-around tie), ECMP choosing among those moves by
the caller's `pick` salted with the hop number, so one flow follows one real shortest path and
different flows spread over the torus's many minimal paths. Hop count = sum over dimensions of
min(|dx|, k - |dx|) (torus) or |dx| (mesh).

Link classes: `scale_up` = two devices on one router (injection, router, injection); `leaf` = one
router hop; `spine` = any longer route, represented by the longest shortest path (the diameter,
sum of k // 2 per dimension on a torus) - pessimistic in latency for routes in between, and the
bandwidth (flow_bw) is the same on every router link. `leaf_of` is the router, so a group spanning
routers is costed with the diameter route.

Worked example (torus-2d, 16 x 16, 50 GB/s links, 1 us per hop, 1 chip per router): chip x0y0 ->
chip x15y0 is one hop over the wrap link (leaf class, 50 GB/s, 1 us); the diameter is 8 + 8 = 16
hops (spine class, 16 us).

>>> from simtrain.hardware.topology import REPO_TOPOLOGIES, load_topology
>>> t = load_topology(REPO_TOPOLOGIES / "torus-2d.yaml", 256)
>>> t.fabric.index([15, 0]), t.fabric.coords(15 + 16 * 8)
(15, [15, 8])
>>> t.link_class_name(0, 15), t.fabric.hops(0, 15), t.link(0, 15).bw / 1e9, round(t.link(0, 15).latency * 1e6, 6)
('leaf', 1, 50.0, 1.0)
>>> t.fabric.hops(0, 8 + 16 * 8), round(t.link(0, 8 + 16 * 8).latency * 1e6, 6)
(16, 16.0)
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import networkx as nx

from simtrain.errors import Collector
from simtrain.hardware.topology.base import COMMON, Fabric, LinkClass, Pick, Topology, link_schema, path_class, register
from simtrain.spec.fields import Key
from simtrain.spec.files import short

# the most routers a torus may have (the most nodes a scenario may ask for)
MAX_ROUTERS = 65_536


@dataclass(frozen=True)
class TorusSpec:
    dims: tuple
    wrap: bool
    injection_bw: float
    injection_latency: float
    link_bw: float
    link_latency: float


SCHEMA = dict(COMMON, **{
    "dims": Key("any", doc="routers per dimension, 1 to 3 whole numbers >= 1 (x fastest)",
                json={"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 1, "maxItems": 3,
                      "description": "list of 1 to 3 whole numbers >= 1"}),
    "wrap": Key("bool", True, "true: a torus (wrap-around links); false: a mesh"),
    "devices_per_router": Key("posint", 1, "devices on one router (a simtrain node); 1: a chip that is its own router", maximum=4096),
    "injection": link_schema("0 us", "device to router link"),
    "links": link_schema(doc="router to router link, each dimension"),
    "efficiency": Key("float", 1.0, "measured share of the bandwidth a collective gets, in (0, 1]"),
    "efficiency_source": Key("str", "", "where efficiency comes from"),
})

AXES = "xyz"


@register("torus", SCHEMA)
class Torus(Fabric):
    """Devices on routers of a 1-, 2- or 3-D torus or mesh, minimal routing with ECMP per hop."""

    def __init__(self, topo: Topology) -> None:
        super().__init__(topo)
        self.dims = self.s.dims
        self.routers = math.prod(self.dims)
        self.dpr = topo.devices_per_node

    @classmethod
    def load(cls, v: dict, nodes: int, errs: Collector) -> dict:
        dims = v["dims"]
        if (not isinstance(dims, list) or not 1 <= len(dims) <= 3
                or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in dims)):
            errs.add("dims", f"expected a list of 1 to 3 whole numbers >= 1, got {short(dims, 60)}",
                     "write e.g. `[4, 4, 4]`")
            return {}
        cap = math.prod(dims)
        if cap > MAX_ROUTERS:
            errs.add("dims", f"the {' x '.join(map(str, dims))} torus has {cap:,} routers; at most {MAX_ROUTERS:,} are simulated",
                     f"use dims whose product is at most {MAX_ROUTERS:,} (and at least cluster.nodes)")
            return {}
        if nodes > cap:
            errs.add("dims", f"the {' x '.join(map(str, dims))} torus has {cap} routers, but the scenario asks for "
                             f"{nodes} nodes (one node = one router's devices)",
                     f"enlarge dims or set cluster.nodes to at most {cap}")
        if not 0 < v["efficiency"] <= 1:
            errs.add("efficiency", "must be in (0, 1]", "give the measured busbw / link bandwidth ratio")
        spec = TorusSpec(tuple(dims), v["wrap"], v["injection"]["bandwidth"], v["injection"]["latency"],
                         v["links"]["bandwidth"], v["links"]["latency"])
        return dict(devices_per_node=v["devices_per_router"], device_label=v["device_label"],
                    scale_up_efficiency=v["efficiency"], scale_out_efficiency=v["efficiency"], spec=spec,
                    node_label="router", efficiency_sources=(v["efficiency_source"], v["efficiency_source"]))

    # ------------------------------------------------------------------ indices
    def coords(self, r: int) -> list:
        out = []
        for k in self.dims:
            r, c = divmod(r, k)
            out.append(c)
        return out

    def index(self, c: Sequence[int]) -> int:
        r, stride = 0, 1
        for x, k in zip(c, self.dims):
            r += x * stride
            stride *= k
        return r

    def router_name(self, r: int) -> str:
        return "".join(f"{a}{c}" for a, c in zip(AXES, self.coords(r)))

    def device_id(self, d: int) -> str:
        return f"{self.router_name(d // self.dpr)}.{self.t.device_label}{d % self.dpr}"

    def leaf_of(self, d: int) -> int:
        return d // self.dpr

    def hops(self, ra: int, rb: int) -> int:
        n = 0
        for a, b, k in zip(self.coords(ra), self.coords(rb), self.dims):
            d = abs(a - b)
            n += min(d, k - d) if self.s.wrap else d
        return n

    # ------------------------------------------------------------------ graph
    def build(self) -> nx.Graph:
        s, t = self.s, self.t
        g = nx.Graph(name=t.name)
        for r in range(self.routers):
            g.add_node(self.router_name(r), kind="router")
        for r in range(self.routers):
            c = self.coords(r)
            for i, k in enumerate(self.dims):
                if k == 1 or (not s.wrap and c[i] + 1 >= k):
                    continue
                n = list(c)
                n[i] = (c[i] + 1) % k
                g.add_edge(self.router_name(r), self.router_name(self.index(n)), bw=s.link_bw,
                           flow_bw=s.link_bw / self.dpr, latency=s.link_latency, tier="scale_out")
        for d in range(t.num_devices):
            dev = self.device_id(d)
            g.add_node(dev, kind="device")
            g.add_edge(dev, self.router_name(d // self.dpr), bw=s.injection_bw, flow_bw=s.injection_bw,
                       latency=s.injection_latency, tier="scale_out")
        return g

    # ------------------------------------------------------------------ routing
    def router_path(self, ra: int, rb: int, pick: Pick | None = None) -> list:
        """Router names of one minimal route; `pick(moves, salt=hop)` chooses the next move."""
        ca, cb = self.coords(ra), self.coords(rb)
        rem = []                                   # per dimension: (hops left, allowed directions)
        for a, b, k in zip(ca, cb, self.dims):
            if not self.s.wrap:
                rem.append((abs(b - a), (1 if b > a else -1,)))
                continue
            fwd = (b - a) % k
            bwd = (k - fwd) % k
            if fwd == 0:
                rem.append((0, ()))
            elif fwd < bwd:
                rem.append((fwd, (1,)))
            elif bwd < fwd:
                rem.append((bwd, (-1,)))
            else:
                rem.append((fwd, (-1, 1)))
        cur = list(ca)
        path = [self.router_name(ra)]
        step = 0
        while True:
            moves = sorted((i, dr) for i, (n, dirs) in enumerate(rem) if n for dr in dirs)
            if not moves:
                return path
            i, dr = pick(moves, salt=step) if pick is not None and len(moves) > 1 else moves[0]
            cur[i] = (cur[i] + dr) % self.dims[i]
            rem[i] = (rem[i][0] - 1, (dr,))        # a tie is decided by the first move
            path.append(self.router_name(self.index(cur)))
            step += 1

    def route(self, src: int, dst: int, pick: Pick | None = None, cache: dict | None = None) -> tuple:
        A, B = self.device_id(src), self.device_id(dst)
        return (A,) + tuple(self.router_path(src // self.dpr, dst // self.dpr, pick)) + (B,)

    # ------------------------------------------------------------------ link classes
    def link_class_name(self, a: int, b: int) -> str:
        if a == b:
            return "self"
        ra, rb = a // self.dpr, b // self.dpr
        if ra == rb:
            return "scale_up"
        return "leaf" if self.hops(ra, rb) == 1 else "spine"

    def span_class(self, devices: Iterable[int]) -> str:
        return "scale_up" if len({d // self.dpr for d in devices}) <= 1 else "spine"

    def _link_class(self, cls: str) -> LinkClass:
        s = self.s
        eff = self.efficiency(cls)
        up = LinkClass(cls, s.injection_bw, 2 * s.injection_latency, eff)
        if cls == "scale_up":
            return up
        axes = [i for i, k in enumerate(self.dims) if k > 1]
        if not axes:
            return up
        far = [0] * len(self.dims)
        if cls == "leaf":
            far[axes[0]] = 1
        elif cls == "spine":
            far = [(k // 2 if s.wrap else k - 1) for k in self.dims]
        else:
            raise KeyError(f"no link class {cls!r} on a torus")
        path = self.router_path(0, self.index(far))
        return path_class(self.graph(), path, cls, eff, extra_bw=s.injection_bw, extra_latency=2 * s.injection_latency)

    def describe(self, count: bool = True) -> str:
        t = self.t
        shape = " x ".join(map(str, self.dims))
        used = f", {t.nodes} in use" if count else ""
        return (f"{'torus' if self.s.wrap else 'mesh'} {shape} ({self.routers} routers{used}), "
                f"{self.dpr} {t.device_label}s per router")
