"""`kind: explicit`: every device, switch, NIC and link listed in the file.

    devices_per_node: 2               # devices per scale-up domain; devices are listed domain by domain
    devices: [n0.gpu0, n0.gpu1, ...]  # names, in device-index order
    switches:                         # kind: scale_up_switch | nic | switch | leaf | spine | core | router
      - {name: n0.nvswitch, kind: scale_up_switch}
    links:                            # per direction; flow_bandwidth (per flow under full load) defaults to bandwidth
      - {a: n0.gpu0, b: n0.nvswitch, bandwidth: "450 GB/s", latency: "1.5 us"}

Every reference is checked: a link naming an unknown element is an error at its key path
(`links[3].b`), with the closest known name. Every pair of devices in use must be joined by a
route that passes through no third device (checked for all pairs, so every communication group a
plan can form -- tp, cp, ep, dp, pipeline neighbours -- has a route): a pair joined only through
another device is refused, naming the pair, unless the file says `allow_device_transit: true`
(the fabric forwards through devices, e.g. PXN over NVLink to a rail NIC). `cluster.nodes` may
use the first domains of the listed ones; the devices of the others (and their links) are left
out of the graph.

Routing: shortest paths by hop count in which no device other than the two ends appears, ECMP
among them; with `allow_device_transit: true`, where a pair has no such path, the shortest paths
through devices; cached per device pair. A link touching a `scale_up_switch` is a scale-up link (the
scale-up efficiency applies), every other a scale-out link; list a direct device-to-device
scale-up link as device - element of kind scale_up_switch - device.

Link classes: `scale_up` (same domain), `leaf` (the same attachment switch: the first `switch` /
`leaf` / `router` element reached from the device directly or through its NICs), `spine`
(otherwise). The representative of a class is, among the routes from device 0 to the devices of
that class, the one with the smallest per-flow bandwidth (then the largest latency).
"""
from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass

import networkx as nx

from simtrain.errors import Collector, SimulationError
from simtrain.hardware.topology.base import COMMON, Fabric, LinkClass, Pick, Topology, path_class, register
from simtrain.spec.fields import Key, Section, validate_map

KINDS = ("scale_up_switch", "nic", "switch", "leaf", "spine", "core", "router")
ATTACH = ("switch", "leaf", "router")


@dataclass(frozen=True)
class ExplicitSpec:
    devices: tuple
    switches: tuple      # (name, kind)
    links: tuple         # (a, b, bw, flow_bw, latency)
    allow_device_transit: bool = False


_EFF = Key("float", 1.0, "measured share of the bandwidth a collective gets on this tier, in (0, 1]")
_EFF_SOURCE = Key("str", "", "where efficiency comes from")

# one entry of `switches:`
SWITCH = Section({
    "name": Key("str", doc="unique name of the element (links refer to it)"),
    "kind": Key(KINDS, doc="scale_up_switch: its links are scale-up links; switch, leaf, router: a device's attachment"),
}, doc="a switch or NIC")

# one entry of `links:`
LINK = Section({
    "a": Key("str", doc="one end: a listed device or switch"),
    "b": Key("str", doc="the other end"),
    "bandwidth": Key("bandwidth", doc="per direction"),
    "latency": Key("time", doc="one hop"),
    "flow_bandwidth": Key("bandwidth", None, "what one flow gets under full load (absent: bandwidth)", optional=True),
}, doc="a link between two elements")

SCHEMA = dict(COMMON, **{
    "devices_per_node": Key("posint", 1, "devices per scale-up domain; devices are listed domain by domain", maximum=4096),
    "allow_device_transit": Key("bool", False, "true: a pair of devices with no route through switches and NICs alone may be "
                                "routed through other devices (the fabric forwards through them, e.g. PXN); false: refused"),
    "scale_up": Key("map", {}, "the scale-up tier (links touching a scale_up_switch)",
                    section=Section({"efficiency": _EFF, "efficiency_source": _EFF_SOURCE})),
    "scale_out": Key("map", {}, "the scale-out tier (every other link)",
                     section=Section({"efficiency": _EFF, "efficiency_source": _EFF_SOURCE})),
    "devices": Key("any", doc="device names, in device-index order",
                   json={"type": "array", "items": {"type": "string"}, "minItems": 1, "description": "list of names"}),
    "switches": Key("any", [], "switches and NICs", many=True, section=SWITCH),
    "links": Key("any", doc="every link, listed once (bandwidth per direction)", many=True, section=LINK),
})


def _unknown(name, known):
    close = difflib.get_close_matches(str(name), list(known), n=1)
    return f"did you mean `{close[0]}`?" if close else "name one of the listed devices or switches"


ROUTE_CHECK_DEVICES = 16_384     # all-pairs check beyond the common case: bounded work and memory


def _check_routes(used: list, names: dict, links: list, devices: set, transit: bool, errs: Collector) -> None:
    """Every pair of the devices in use has a route (through no third device unless `transit`);
    the first pair that has none is one error. With devices taken out, the switches and NICs fall
    into connected components; two devices are joined without transit when they are linked
    directly or touch a common component. The common case -- one component every device touches
    (a spine, a shared switch) -- is settled in O(links); otherwise each device's one-hop reach is
    a bit set (a device's own bits, precomputed for components of 64 devices or more)."""
    inuse = {d: i for i, d in enumerate(used)}
    adj: dict = {}
    for a, b, *_ in links:
        if (a in devices and a not in inuse) or (b in devices and b not in inuse):
            continue              # a device left out of the graph and its links
        adj.setdefault(a, []).append(b)
        adj.setdefault(b, []).append(a)
    comp: dict = {}               # switch or NIC -> component index
    members: list = []            # component -> indices of the devices it touches
    for start in adj:
        if start in inuse or start in comp:
            continue
        c = comp[start] = len(members)
        m, todo = set(), [start]
        while todo:
            u = todo.pop()
            for w in adj[u]:
                if w in inuse:
                    m.add(inuse[w])
                elif w not in comp:
                    comp[w] = c
                    todo.append(w)
        members.append(sorted(m))
    if len(used) <= 1 or any(len(m) == len(used) for m in members):
        return
    if len(used) > ROUTE_CHECK_DEVICES:
        errs.add("devices", f"{len(used)} devices in use and no switch or NIC fabric that joins them all",
                 "join the devices through switches (e.g. a spine), or list at most "
                 f"{ROUTE_CHECK_DEVICES} devices")
        return
    big = {c: sum(1 << j for j in m) for c, m in enumerate(members) if len(m) >= 64}

    def reach(i: int) -> int:
        r = 1 << i
        for w in adj.get(used[i], ()):
            if w in inuse:
                r |= 1 << inuse[w]
            else:
                c = comp[w]
                if c in big:
                    r |= big[c]
                else:
                    for j in members[c]:
                        r |= 1 << j
        return r
    full = (1 << len(used)) - 1
    for i, d in enumerate(used):
        r = reach(i)
        if r == full:
            continue
        j = next(j for j in range(len(used)) if not r >> j & 1)
        via = _transit(i, j, reach, len(used))
        other = used[j]
        if via is None:
            errs.add(f"devices[{j}]", f"no route between {d} and {other}, not even through other devices",
                     f"link {other} to a switch or NIC that {d} reaches")
        elif not transit:
            errs.add(f"devices[{j}]", f"{d} and {other} are joined only through another device ({used[via]} on the "
                     "way), and a plan's communication group may need the pair",
                     "link both to a common switch or NIC, or set `allow_device_transit: true` if the fabric forwards "
                     "through devices (e.g. PXN)")
        else:
            continue
        return


def _transit(a: int, b: int, reach: Callable[[int], int], n: int) -> int | None:
    """The device just before b on a shortest chain of device hops a -> ... -> b (each hop
    joined without transit), or None where b cannot be reached at all."""
    prev = {a: a}
    seen = 1 << a
    frontier = [a]
    while frontier:
        nxt = []
        for u in frontier:
            new = reach(u) & ~seen
            seen |= new
            while new:
                w = (new & -new).bit_length() - 1
                new &= new - 1
                prev[w] = u
                if w == b:
                    return u
                nxt.append(w)
        frontier = nxt
    return None


@register("explicit", SCHEMA)
class Explicit(Fabric):
    """Devices, switches, NICs and links listed one by one; shortest-path routing with ECMP."""

    def __init__(self, topo: Topology) -> None:
        super().__init__(topo)
        self.dpn = topo.devices_per_node
        self.kind = {n: k for n, k in self.s.switches}
        self.index = {n: i for i, n in enumerate(self.s.devices)}
        self._paths: dict = {}
        self._leaf: dict | None = None

    @classmethod
    def load(cls, v: dict, nodes: int, errs: Collector) -> dict:
        devs, sws, links = v["devices"], v["switches"], v["links"]
        names: dict = {}
        dlist = []
        if not isinstance(devs, list) or not devs:
            errs.add("devices", "expected a list of device names", "write e.g. `devices: [n0.gpu0, n0.gpu1]`")
            devs = []
        for i, d in enumerate(devs):
            if not isinstance(d, str):
                errs.add(f"devices[{i}]", f"expected a name, got {d!r}", "write it as text, e.g. `n0.gpu0`")
            elif d in names:
                errs.add(f"devices[{i}]", f"{d!r} is listed twice", "give every element a unique name")
            else:
                names[d] = "device"
                dlist.append(d)
        slist = []
        if not isinstance(sws, list):
            errs.add("switches", "expected a list of {name, kind} entries", "write e.g. `- {name: leaf0, kind: switch}`")
            sws = []
        for i, sw in enumerate(sws):
            x = validate_map(sw, SWITCH, f"switches[{i}]", errs)
            n = x.get("name")
            if n is None or x.get("kind") is None:
                continue
            if n in names:
                errs.add(f"switches[{i}].name", f"{n!r} is listed twice", "give every element a unique name")
                continue
            names[n] = x["kind"]
            slist.append((n, x["kind"]))
        llist = []
        seen = set()
        if not isinstance(links, list):
            errs.add("links", "expected a list of {a, b, bandwidth, latency} entries",
                     'write e.g. `- {a: n0.gpu0, b: leaf0, bandwidth: "400 Gb/s", latency: "1 us"}`')
            links = []
        for i, ln in enumerate(links):
            x = validate_map(ln, LINK, f"links[{i}]", errs)
            ok = True
            for end in ("a", "b"):
                n = x.get(end)
                if n is not None and n not in names:
                    errs.add(f"links[{i}].{end}", f"unknown element {n!r}", _unknown(n, names))
                    ok = False
            if not ok or None in (x.get("a"), x.get("b"), x.get("bandwidth"), x.get("latency")):
                continue
            if x["a"] == x["b"]:
                errs.add(f"links[{i}]", f"links {x['a']!r} to itself", "join two different elements")
                continue
            pair = frozenset((x["a"], x["b"]))
            if pair in seen:
                errs.add(f"links[{i}]", f"{x['a']} - {x['b']} is linked twice", "list each link once (its bandwidth is per direction)")
                continue
            seen.add(pair)
            llist.append((x["a"], x["b"], x["bandwidth"], x["flow_bandwidth"] or x["bandwidth"], x["latency"]))
        dpn = v["devices_per_node"]
        if dlist and len(dlist) % dpn:
            errs.add("devices_per_node", f"{len(dlist)} devices do not fill scale-up domains of {dpn}",
                     f"list a multiple of {dpn} devices or change devices_per_node")
        elif dlist and nodes > len(dlist) // dpn:
            errs.add("devices", f"lists {len(dlist) // dpn} scale-up domains of {dpn} devices, but the scenario asks for {nodes} nodes",
                     f"list more devices or set cluster.nodes to at most {len(dlist) // dpn}")
        for sect in ("scale_up", "scale_out"):
            if not 0 < v[sect]["efficiency"] <= 1:
                errs.add(f"{sect}.efficiency", "must be in (0, 1]", "give the measured busbw / link bandwidth ratio")
        if not errs.problems and dlist:
            used = dlist[:(nodes or len(dlist) // dpn) * dpn]
            _check_routes(used, names, llist, set(dlist), v["allow_device_transit"], errs)
        spec = ExplicitSpec(tuple(dlist), tuple(slist), tuple(llist), v["allow_device_transit"])
        return dict(devices_per_node=dpn, device_label=v["device_label"],
                    scale_up_efficiency=v["scale_up"]["efficiency"], scale_out_efficiency=v["scale_out"]["efficiency"],
                    spec=spec, efficiency_sources=(v["scale_up"]["efficiency_source"], v["scale_out"]["efficiency_source"]))

    def device_id(self, d: int) -> str:
        return self.s.devices[d]

    def build(self) -> nx.Graph:
        t, s = self.t, self.s
        g = nx.Graph(name=t.name)
        used = set(s.devices[:t.num_devices])
        for n, k in s.switches:
            g.add_node(n, kind=k)
        for d in s.devices[:t.num_devices]:
            g.add_node(d, kind="device")
        for a, b, bw, fbw, lat in s.links:
            if (a in self.index and a not in used) or (b in self.index and b not in used):
                continue
            up = self.kind.get(a) == "scale_up_switch" or self.kind.get(b) == "scale_up_switch"
            g.add_edge(a, b, bw=bw, flow_bw=fbw, latency=lat, tier="scale_up" if up else "scale_out")
        return g

    def leaf_of(self, d: int) -> int:
        if self._leaf is None:
            g = self.graph()
            att, ids = {}, {}
            for i in range(self.t.num_devices):
                dev = self.s.devices[i]
                cands = set()
                for w in g.adj[dev]:
                    k = g.nodes[w].get("kind")
                    if k in ATTACH:
                        cands.add(w)
                    elif k == "nic":
                        cands.update(x for x in g.adj[w] if g.nodes[x].get("kind") in ATTACH)
                att[i] = ids.setdefault(min(cands), len(ids)) if cands else -1 - i // self.dpn
            self._leaf = att
        return self._leaf[d]

    def paths(self, a: str, b: str) -> list:
        """Every shortest path a -> b (by hops) with no other device on it, sorted; with
        `allow_device_transit`, where there is none, every shortest path through devices."""
        hit = self._paths.get((a, b))
        if hit is not None:
            return hit
        out = self._shortest(a, b, False)
        if not out and self.s.allow_device_transit:
            out = self._shortest(a, b, True)
        if not out:
            # the loader refuses such a file; a graph built some other way gets the same clear error
            raise SimulationError(f"{self.t.file}: devices: no route from {a} to {b} on topology {self.t.name!r}; "
                                  "link both to a switch or NIC on the way (or set allow_device_transit: true)")
        self._paths[(a, b)] = out
        return out

    def _shortest(self, a: str, b: str, transit: bool) -> list:
        g = self.graph()
        kind = g.nodes
        dist, preds, frontier = {a: 0}, {a: []}, [a]
        while frontier and b not in dist:
            nxt = []
            for u in frontier:
                if not transit and u != a and kind[u].get("kind") == "device":
                    continue
                for w in g.adj[u]:
                    if not transit and w != b and kind[w].get("kind") == "device":
                        continue
                    if w not in dist:
                        dist[w] = dist[u] + 1
                        preds[w] = [u]
                        nxt.append(w)
                    elif dist[w] == dist[u] + 1:
                        preds[w].append(u)
            frontier = nxt
        if b not in dist:
            return []
        out = []

        def back(n, tail):
            if n == a:
                out.append((a,) + tail)
                return
            for p in preds[n]:
                back(p, (n,) + tail)
        back(b, ())
        out.sort()
        return out

    def route(self, src: int, dst: int, pick: Pick | None = None, cache: dict | None = None) -> tuple:
        paths = self.paths(self.s.devices[src], self.s.devices[dst])
        return pick(paths) if pick is not None and len(paths) > 1 else paths[0]

    def link_class_name(self, a: int, b: int) -> str:
        if a == b:
            return "self"
        if a // self.dpn == b // self.dpn:
            return "scale_up"
        return "leaf" if self.leaf_of(a) == self.leaf_of(b) else "spine"

    def _link_class(self, cls: str) -> LinkClass:
        if cls not in ("scale_up", "leaf", "spine"):
            raise KeyError(f"no link class {cls!r} on an explicit fabric")
        g = self.graph()
        eff = self.efficiency(cls)
        cands = [path_class(g, self.route(0, b), cls, eff) for b in range(1, self.t.num_devices)
                 if self.link_class_name(0, b) == cls]
        if cands:
            return min(cands, key=lambda x: (x.bw, -x.latency))
        for other in {"scale_up": ("leaf", "spine"), "leaf": ("spine", "scale_up"), "spine": ("leaf", "scale_up")}[cls]:
            if any(self.link_class_name(0, b) == other for b in range(1, self.t.num_devices)):
                x = self.link_class(other)
                return LinkClass(cls, x.bw, x.latency, eff)
        return LinkClass(cls, float("inf"), 0.0, eff)

    def placement_levels(self) -> list:
        leaves = [self.leaf_of(n * self.dpn) for n in range(self.t.nodes)]
        return [leaves] if len(set(leaves)) > 1 else []

    def describe(self, count: bool = True) -> str:
        t, s = self.t, self.s
        dom = f"{t.nodes} nodes x {self.dpn} {t.device_label}s" if count else f"{len(s.devices) // self.dpn} nodes of {self.dpn} {t.device_label}s"
        return f"{dom}, {len(s.switches)} switches and NICs, {len(s.links)} links"
