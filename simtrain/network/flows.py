"""Flow-level network model (what `flow_backend.FlowBackend` times a step with; the closed form is `collectives`).

A collective is the sequence of its algorithm's phases; a phase is a set of point-to-point
transfers that start together. Each transfer is a flow routed over the topology graph: fixed
access links (device -> NIC -> leaf), then a shortest path through the switch core, ECMP among
equal-cost core paths by a seeded deterministic hash of the flow id. Flows share
every directed link by max-min fairness (progressive filling), and the rates are recomputed each
time a flow starts or ends, so a phase lasts until its slowest flow has delivered its last byte.

Contention is modelled between all groups that run the same collective at the same time: the
data-parallel (or tensor-parallel) groups of one pipeline stage run the same program in lockstep,
so the backend times one collective as the concurrent phases of every group of that kind in the
stage (other stages are staggered by the schedule). That is where oversubscribed uplinks,
shared NICs and placement bite. Pipeline sends are timed the same way, as the flows of all the
ranks of a class at once.

Ops that overlap in time (a gradient bucket under a pipeline send, two stages' gradient
reductions) then contend inside the SimPy run: each carries its average load on every
scale-out link, and the engine's `FluidNetwork` shares the links among the running ops by
max-min fairness, recomputed whenever one starts or ends.

Max-min fairness, progressive filling (Bertsekas & Gallager, "Data Networks", §6.5.2): raise
every unfrozen flow's rate equally until some link is full; freeze the flows on it; repeat.
Worked example: link A (10) carries f1, f2; link B (10) carries f2, f3, f4. B fills first at
10/3 each, freezing f2, f3, f4; f1 then takes A's remaining 10 - 10/3 = 20/3.
"""
from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from simtrain.hardware.topology import Topology
from simtrain.network.collectives import (
    LATENCY_US,
    PROTOCOLS,
    Cost,
    choose,
    cost,
    steps,
    tree_intra_seconds,
    two_node_tree_saving,
    with_protocol,
)
from simtrain.plan.grid import group_shape


def maxmin(paths: list, cap: dict) -> list:
    """Max-min fair rate of each flow; `paths` are tuples of directed links, `cap` link -> bytes/s."""
    n = len(paths)
    rate = [0.0] * n
    frozen = [False] * n
    on_link: dict = {}
    for i, p in enumerate(paths):
        for e in p:
            on_link.setdefault(e, []).append(i)
    left = {e: cap[e] for e in on_link}
    active = {e: len(fs) for e, fs in on_link.items()}
    todo = n
    for i, p in enumerate(paths):
        if not p:             # a flow to itself: no link, infinite rate
            rate[i], frozen[i] = math.inf, True
            todo -= 1
    while todo:
        share = min(left[e] / active[e] for e in active if active[e])
        full = [e for e in active if active[e] and left[e] / active[e] <= share * (1 + 1e-12)]
        newly = sorted({i for e in full for i in on_link[e] if not frozen[i]})
        for i in newly:
            frozen[i] = True
            rate[i] = share
            todo -= 1
            for e in paths[i]:
                left[e] -= share
                active[e] -= 1
    return rate


def run_flows(paths: list, sizes: list, cap: dict, latency: list | None = None, saturated: dict | None = None) -> list:
    """Finish time of each flow, all starting at t=0: max-min rates recomputed whenever a flow
    ends; a flow finishes when its last byte is sent plus its path latency.
    Worked example: two flows of 1 and 3 bytes on one link of 1 B/s share it at 0.5 until t=2,
    when the first is done; the second then runs at 1 B/s with 2 bytes left and ends at t=4.
    `saturated`, when given, accumulates per link the time it ran at full capacity."""
    n = len(paths)
    remaining = list(map(float, sizes))
    done_at = [0.0] * n
    live = [i for i in range(n) if remaining[i] > 0]
    t = 0.0
    while live:
        rates = maxmin([paths[i] for i in live], cap)
        instant = [i for i, r in zip(live, rates) if r == math.inf]
        if instant:
            # no link (a transfer to itself) or unlimited links: done at once
            for i in instant:
                done_at[i] = t
                remaining[i] = 0.0
            live = [i for i in live if i not in set(instant)]
            continue
        dt = min(remaining[i] / r for i, r in zip(live, rates))
        if saturated is not None:
            load: dict = {}
            for i, r in zip(live, rates):
                for e in paths[i]:
                    load[e] = load.get(e, 0.0) + r
            for e, x in load.items():
                if x >= cap[e] * (1 - 1e-9):
                    saturated[e] = saturated.get(e, 0.0) + dt
        nxt = []
        for i, r in zip(live, rates):
            remaining[i] -= r * dt
            if remaining[i] <= 1e-9 * max(1.0, sizes[i]):
                done_at[i] = t + dt
            else:
                nxt.append(i)
        t += dt
        live = nxt
    lat = latency or [0.0] * n
    return [done_at[i] + lat[i] for i in range(n)]


# -----------------------------------------------------------------------------------------------
# collective algorithms as phases of transfers (member indices 0..p-1, bytes per transfer)

def ring_phases(coll: str, p: int, n: float) -> list:
    """Ring: p-1 steps (reduce-scatter or all-gather) or 2(p-1) (all-reduce), each member sending
    n/p to the next one."""
    steps = 2 * (p - 1) if coll == "all_reduce" else p - 1
    step = [(i, (i + 1) % p, n / p) for i in range(p)]
    return [step] * steps


def halving_doubling_phases(coll: str, p: int, n: float) -> list:
    """Recursive halving (reduce-scatter) then recursive doubling (all-gather), p a power of two:
    step k exchanges n/2^(k+1) with the partner i xor p/2^(k+1) (Thakur, Rabenseifner & Gropp 2005)."""
    if p & (p - 1):
        raise ValueError("halving-doubling needs a power-of-two group")
    k = p.bit_length() - 1
    rs = [[(i, i ^ (p >> (s + 1)), n / 2 ** (s + 1)) for i in range(p)] for s in range(k)]
    ag = list(reversed(rs))
    if coll == "reduce_scatter":
        return rs
    if coll == "all_gather":
        return ag
    return rs + ag


def mesh_phases(coll: str, p: int, n: float) -> list:
    """Direct over a full mesh: every member sends n/p to every other at once (all-gather: its
    shard; reduce-scatter: the peer's shard), one phase; all-reduce is both, two phases."""
    step = [(i, j, n / p) for i in range(p) for j in range(p) if i != j]
    return [step, step] if coll == "all_reduce" else [step]


def pairwise_all_to_all_phases(coll: str, p: int, n: float) -> list:
    """Pairwise exchange: p-1 steps, step k sends n/p to member i+k."""
    return [[(i, (i + k) % p, n / p) for i in range(p)] for k in range(1, p)]


def direct_all_to_all_phases(coll: str, p: int, n: float) -> list:
    """Direct: every member sends n/p to every other member at once."""
    return [[(i, j, n / p) for i in range(p) for j in range(p) if i != j]]


# which phase builders serve which collective in the flow backend, the first being what `auto`
# uses (tree and NVLS have no phases: the flow backend times the algorithms it lays out as flows)
def double_binary_tree_edges(nodes: int) -> list:
    """(parent, child) node-index pairs of both trees of a double binary tree over `nodes` nodes
    (Sanders, Speck & Traeff 2009; the layout NCCL documents for its trees). Tree one: node r > 0
    with lowest set bit b hangs under (r xor b) | 2b, or r xor b where that is past the end; node 0
    is the root. Tree two mirrors tree one (r -> N-1-r) on an even count and shifts it by one on
    an odd count, so that a node inner in one tree is a leaf in the other. Worked example (4
    nodes): tree one 0 <- 2 <- {1, 3}, tree two 3 <- 1 <- {2, 0}."""
    def parent(r):
        b = r & -r
        up = (r ^ b) | (b << 1)
        return up if up < nodes else r ^ b
    one = [(parent(r), r) for r in range(1, nodes)]
    other = (lambda r: nodes - 1 - r) if nodes % 2 == 0 else (lambda r: (r + 1) % nodes)
    return one + [(other(p), other(c)) for p, c in one]


def tree_network_transfers(group_nodes: list, n: float, two_node_saving: bool = True) -> list:
    """(source device, destination device, bytes) of a tree all-reduce's network part: each tree
    carries half the buffer, up every edge (the reduction) and down it (the broadcast); a hop
    between two nodes is striped member j to member j over the k members of each node (NCCL's
    channels leave through different GPUs and their NICs). On two nodes each node sends n; on
    more, an inner node sends 2n. Without the two-node saving (a fabric measured not to have it,
    `collectives.two_node_tree_saving: false`) each node sends 2n on two nodes too."""
    pair: dict = {}
    per_edge = n if len(group_nodes) == 2 and not two_node_saving else n / 2
    for p, c in double_binary_tree_edges(len(group_nodes)):
        for a, b in ((c, p), (p, c)):
            pair[(a, b)] = pair.get((a, b), 0.0) + per_edge
    out = []
    for (a, b), nb in sorted(pair.items()):
        on_a, on_b = group_nodes[a], group_nodes[b]
        k = min(len(on_a), len(on_b))
        out += [(on_a[j], on_b[j], nb / k) for j in range(k)]
    return out


FLOW_ALGORITHMS = {
    "all_reduce": ("ring", "halving_doubling", "hierarchical", "mesh"),
    "reduce_scatter": ("ring", "halving_doubling", "hierarchical", "mesh"),
    "all_gather": ("ring", "halving_doubling", "hierarchical", "mesh"),
    "all_to_all": ("direct", "pairwise"),
}

PHASES = {
    "ring": (ring_phases, "ring (Patarasuk & Yuan 2009)"),
    "halving_doubling": (halving_doubling_phases, "recursive halving-doubling (Thakur, Rabenseifner & Gropp 2005)"),
    "mesh": (mesh_phases, "direct over a full mesh (every peer at once, one link each)"),
    "pairwise": (pairwise_all_to_all_phases, "pairwise-exchange all-to-all"),
    "direct": (direct_all_to_all_phases, "direct all-to-all"),
}


@dataclass(frozen=True)
class Transfer:
    src: int      # device index
    dst: int
    bytes: float


def hierarchical_phases(coll: str, groups_of_nodes: list, n: float) -> list:
    """2-D: intra-node ring reduce-scatter, inter-node ring all-reduce of n/k across the members
    with the same local index (one rail each), intra-node ring all-gather. `groups_of_nodes` is
    the group's members grouped by node (equal sizes k); returns phases of Transfer."""
    k = len(groups_of_nodes[0])
    N = len(groups_of_nodes)
    out = []

    def intra(kind):
        return [[Transfer(node[a], node[b], nb) for node in groups_of_nodes for a, b, nb in ph]
                for ph in ring_phases(kind, k, n)] if k > 1 else []

    inter = [[Transfer(groups_of_nodes[a][j], groups_of_nodes[b][j], nb) for j in range(k) for a, b, nb in ph]
             for ph in ring_phases(coll, N, n / k)] if N > 1 else []
    if coll == "all_reduce":
        out = intra("reduce_scatter") + inter + intra("all_gather")
    elif coll == "reduce_scatter":
        out = intra("reduce_scatter") + inter
    else:
        out = inter + intra("all_gather")
    return out


# -----------------------------------------------------------------------------------------------

def access_path(topo: Topology, src: int, dst: int, core_paths: dict | None = None,
                pick: Callable[..., object] | None = None) -> tuple:
    """Node names of the route src -> dst, as the topology's builder lays it out
    (`Topology.route`): on a fat-tree through the domain's scale-up fabric inside a domain,
    otherwise device -> its NIC -> the NIC's leaf -> a shortest path through the switch core ->
    leaf -> NIC -> device (never through another GPU, except the PXN hop of a multi-plane
    fabric); minimal routes on a torus or dragonfly. `pick(options, salt=None)` chooses among
    equal-cost options (ECMP); by default the first."""
    return topo.route(src, dst, pick, core_paths)


def _bytes_per_link(paths: list, transfers: list) -> dict:
    moved: dict = {}
    for p, t in zip(paths, transfers):
        for e in p:
            moved[e] = moved.get(e, 0.0) + t.bytes
    return moved


class FlowNetwork:
    """Routes and times concurrent transfers over a topology's graph.

    Capacities are each link's `bw` per direction, times the topology's measured bus-bandwidth
    efficiency of its tier (scale-up links by the scale-up efficiency, everything else by the
    scale-out one), the same efficiencies the closed-form backend applies."""

    def __init__(self, topo, seed: int = 0):
        self.topo = topo
        self.g = topo.graph()
        self.seed = seed
        self._phase_cache: dict = {}
        self.cap = {}
        for u, v, d in self.g.edges(data=True):
            up = self.g.nodes[u].get("kind") == "scale_up_switch" or self.g.nodes[v].get("kind") == "scale_up_switch"
            eff = topo.scale_up_efficiency if up else topo.scale_out_efficiency
            self.cap[(u, v)] = self.cap[(v, u)] = d["bw"] * eff
        # scale-out links (everything but the links to a scale-up switch): where ops of different
        # kinds meet, and what the engine's FluidNetwork shares among overlapping ops
        self.scale_out = set()
        for u, v in self.g.edges():
            if "scale_up_switch" not in (self.g.nodes[u].get("kind"), self.g.nodes[v].get("kind")):
                self.scale_out.update(((u, v), (v, u)))
        self.lat = {(u, v): d["latency"] for u, v, d in self.g.edges(data=True)}
        self.lat.update({(v, u): x for (u, v), x in list(self.lat.items())})
        self._core_paths: dict = {}     # (leaf, leaf) -> equal-cost paths through the switch core
        self._node_members: dict = {}

    def route(self, src: int, dst: int, flow_id: Hashable) -> tuple:
        """Directed links of one shortest path; ECMP picks among equal-cost paths by a CRC32 of
        (seed, flow id) (and the hop number where a builder chooses hop by hop, as on a torus),
        so the same input and seed give the same routes."""
        if src == dst:
            return ()

        def pick(options, salt=None):
            key = (self.seed, flow_id) if salt is None else (self.seed, flow_id, salt)
            return options[zlib.crc32(repr(key).encode()) % len(options)]
        p = access_path(self.topo, src, dst, self._core_paths, pick)
        return tuple(zip(p, p[1:]))

    def phase(self, transfers: list) -> tuple:
        """(data seconds, bytes per link, saturated seconds per link, crosses the network) of one
        phase, cached: all transfers start together and the phase ends with its slowest flow. The
        per-step latency is the protocol's (see `collectives`), added by the caller."""
        key = tuple(transfers)
        hit = self._phase_cache.get(key)
        if hit is None:
            paths = self.routes(transfers)
            sat: dict = {}
            dur = max(run_flows(paths, [t.bytes for t in transfers], self.cap, None, sat), default=0.0)
            moved = _bytes_per_link(paths, transfers)
            net = any(self.topo.node_of(t.src) != self.topo.node_of(t.dst) for t in transfers)
            hit = self._phase_cache[key] = (dur, moved, sat, net)
        return hit

    def routes(self, transfers: list) -> list:
        """The route of each transfer (its flow id: source, destination, position)."""
        return [self.route(t.src, t.dst, (t.src, t.dst, i)) for i, t in enumerate(transfers)]

    def link_bytes(self, transfers: list) -> dict:
        """Bytes per directed link of transfers routed as `phase` routes them (no timing)."""
        return _bytes_per_link(self.routes(transfers), transfers)

    def collective_time(self, coll: str, n: float, groups: list, algorithm: str = "ring",
                        protocol: str = "Simple") -> float:
        """Time of one collective run at once by every group in `groups` (device lists)."""
        return self.cost(coll, n, groups, algorithm, protocol)[0].seconds

    def cost(self, coll: str, n: float, groups: list, algorithm: str = "ring", protocol: str = "Simple") -> tuple:
        """(Cost, bytes per link, saturated seconds per link) with one protocol's terms."""
        return self.best(coll, n, groups, algorithm, (protocol,))

    def best(self, coll: str, n: float, groups: list, algorithm: str, protocols: Sequence[str] = PROTOCOLS) -> tuple:
        """(Cost, bytes per link, saturated seconds per link) of the fastest of `protocols`: the
        flows are timed once, the protocols only change the latency and bandwidth-share terms.
        Raises ValueError where the algorithm cannot lay out the group (halving-doubling on a
        group that is not a power of two)."""
        data, up, net, moved, sat = self.collective(coll, n, groups, algorithm)
        if up + net == 0:
            return Cost("none", "none", 0.0, 0.0), moved, sat
        up, net = self.latency_steps(coll, n, groups[0], algorithm, (up, net))
        c = min((with_protocol(algorithm, "ring", coll, pr, up, net, data, self.topo, n, len(groups[0])) for pr in protocols),
                key=lambda c: c.seconds)
        return c, moved, sat

    def select(self, coll: str, n: float, groups: list, named: str = "auto", protocol: str = "auto",
               nccl: object = None) -> tuple:
        """(Cost, bytes per link, saturated seconds per link) of a collective as the flow backend
        runs it. An all-reduce for which the closed form picks (`auto`) or the scenario names NVLS
        or a tree runs in their flow form (`_nvls`, `_tree`); otherwise the named algorithm if it
        has phases, else (and for `auto`) the first of FLOW_ALGORITHMS: ring, or direct for
        all-to-all; inside one full-mesh domain the mesh algorithm where the closed form picks it;
        the fastest protocol (flows are timed once; protocols rescale them). With `nccl` (an
        `nccl_tuning.Policy`) and `auto`, the algorithm and protocol NCCL's tuner picks."""
        if nccl is not None and named == "auto" and coll != "all_to_all":
            pick = choose(coll, n, group_shape(groups[0], self.topo), self.topo, named, protocol, nccl=nccl)
            if pick.protocol in PROTOCOLS:
                protocol = pick.protocol
        if coll == "all_reduce" and named in ("auto", "nvls", "tree", "nvls_tree"):
            g = group_shape(groups[0], self.topo)
            algorithm = choose(coll, n, g, self.topo, named, protocol, nccl=nccl).algorithm
            if algorithm == "nvls" and not g.spans_nodes:
                return self._nvls(n, g, groups, protocol)
            if algorithm in ("tree", "nvls_tree") and g.spans_nodes and g.uniform:
                return self._tree(n, g, groups, algorithm, protocol)
        ring = FLOW_ALGORITHMS[coll][0]
        protos = PROTOCOLS if protocol == "auto" else (protocol,)
        if named in ("auto", "mesh") and coll != "all_to_all" and self.topo.scale_up_mesh:
            # a group inside one full-mesh domain: the mesh algorithm where the closed form would
            # pick it (or it is named), so that both backends run the same algorithm
            g = group_shape(groups[0], self.topo)
            if steps(coll, n, g, self.topo, "mesh") is not None and (
                    named == "mesh" or choose(coll, n, g, self.topo, "auto", protocol).algorithm == "mesh"):
                return self.best(coll, n, groups, "mesh", protos)
        try:
            return self.best(coll, n, groups, named if named in FLOW_ALGORITHMS[coll] else ring, protos)
        except ValueError:      # the named algorithm does not fit this group: the ring does
            return self.best(coll, n, groups, ring, protos)

    def _nvls(self, n: float, g, groups: list, protocol: str) -> tuple:
        """NVLS in flow form, for groups inside one node: every member sends its buffer up to the
        scale-up switches once and receives the result once (n each way on its switch links,
        split over the switches it reaches), timed as the closed form times it. Those links are
        not shared with other kinds of op (the engine shares only scale-out links), so nothing
        changes its time; the report shows the bytes."""
        moved: dict = {}
        for grp in groups:
            for dev in grp:
                d = self.topo.device_id(dev)
                sws = sorted(v for v in self.g.neighbors(d) if self.g.nodes[v].get("kind") == "scale_up_switch")
                for sw in sws:
                    for e in ((d, sw), (sw, d)):
                        moved[e] = moved.get(e, 0.0) + n / len(sws)
        return cost("all_reduce", n, g, self.topo, "nvls", "Simple"), moved, {}

    def _tree(self, n: float, g, groups: list, algorithm: str, protocol: str) -> tuple:
        """The tree or NVLSTree in flow form: the network part as the transfers of both trees of
        every group at once (`tree_network_transfers`) routed over the fabric, lasting as long as
        the most loaded link needs for its bytes (the trees are pipelined: every edge carries its
        bytes at a steady rate through the whole collective, so this is the concurrent-flow time,
        not the makespan of flows started at once); the part inside each node as the closed form
        times it; the larger of the two (as the closed form), then the protocol terms. Nothing
        contending, it equals the closed form; an oversubscribed core or a shared NIC stretches it."""
        topo = self.topo
        saving = two_node_tree_saving(topo)
        ts = []
        for grp in groups:
            by_node: dict = {}
            for d in grp:
                by_node.setdefault(topo.node_of(d), []).append(d)
            ts += [Transfer(a, b, nb) for a, b, nb in tree_network_transfers(list(by_node.values()), n, saving)]
        moved = self.link_bytes(ts)
        load = {e: x / self.cap[e] for e, x in moved.items()}
        dur = max(load.values(), default=0.0)
        sat = {e: dur for e, t in load.items() if t >= dur * (1 - 1e-12)}
        data = max(tree_intra_seconds(algorithm, n, g, topo), dur)
        up, net = steps("all_reduce", n, g, topo, algorithm)
        protos = [p for p in (PROTOCOLS if protocol == "auto" else (protocol,)) if p in LATENCY_US[algorithm]]
        c = min((with_protocol(algorithm, algorithm, "all_reduce", pr, up, net, data, topo) for pr in protos),
                key=lambda c: c.seconds)
        return c, moved, sat

    def latency_steps(self, coll: str, n: float, group: list, algorithm: str, phases: tuple) -> tuple:
        """The latency steps of the closed form (NCCL's pipelined count: a ring over N nodes pays
        2(N-1) network steps, not one per phase), so that both backends charge the same latency;
        the phase counts where the closed form does not apply."""
        return steps(coll, n, group_shape(group, self.topo), self.topo, algorithm) or phases

    def collective(self, coll: str, n: float, groups: list, algorithm: str = "ring") -> tuple:
        """(data seconds, steps inside nodes, steps across the network, bytes per link, saturated
        seconds per link) of one collective run at once by every group in `groups`."""
        if not groups or len(groups[0]) <= 1 or n <= 0:
            return 0.0, 0, 0, {}, {}
        if algorithm == "hierarchical":
            by_node = []
            for g in groups:
                nodes: dict = {}
                for d in g:
                    nodes.setdefault(self.topo.node_of(d), []).append(d)
                by_node.append(list(nodes.values()))
            if any(len({len(x) for x in bn}) != 1 or len(bn) == 1 or len(bn[0]) == 1 for bn in by_node):
                return self.collective(coll, n, groups, "ring")
            per_group = [hierarchical_phases(coll, bn, n) for bn in by_node]
            phases = [sum((pg[i] for pg in per_group), []) for i in range(len(per_group[0]))]
        else:
            build = PHASES[algorithm][0]
            p = len(groups[0])
            members = [self._by_node(g) for g in groups]
            built: dict = {}      # ring steps repeat one pattern: expand and time it once
            phases = []
            for ph in build(coll, p, n):
                if id(ph) not in built:
                    built[id(ph)] = (ph, [t for g, m in zip(groups, members) for a, b, nb in ph
                                          for t in self._channels(m, g[a], g[b], nb)])
                phases.append(built[id(ph)][1])
        total, up, net, moved, sat = 0.0, 0, 0, {}, {}
        times: dict = {}          # identical phases (ring steps) are counted, not re-added link by link
        objs: dict = {}
        for ph in phases:
            times[id(ph)] = times.get(id(ph), 0) + 1
            objs[id(ph)] = ph
        for k, cnt in times.items():
            d, m, sa, crosses = self.phase(objs[k])
            total += cnt * d
            if crosses:
                net += cnt
            else:
                up += cnt
            for e, x in m.items():
                moved[e] = moved.get(e, 0.0) + cnt * x
            for e, x in sa.items():
                sat[e] = sat.get(e, 0.0) + cnt * x
        return total, up, net, moved, sat

    def _by_node(self, group: list) -> dict:
        key = tuple(group)
        hit = self._node_members.get(key)
        if hit is None:
            hit = {}
            for d in group:
                hit.setdefault(self.topo.node_of(d), []).append(d)
            self._node_members[key] = hit
        return hit

    def _channels(self, by_node: dict, src: int, dst: int, nbytes: float) -> list:
        """A hop between two nodes is striped over the group's k members on each node, member c
        to member c (NCCL runs k channels whose rings leave the node through different GPUs and
        their rail NICs), so a ring with k members per node gets k NIC shares between nodes."""
        a, b = self.topo.node_of(src), self.topo.node_of(dst)
        if a == b:
            return [Transfer(src, dst, nbytes)]
        on_a, on_b = by_node[a], by_node[b]
        k = min(len(on_a), len(on_b))
        if k <= 1:
            return [Transfer(src, dst, nbytes)]
        return [Transfer(on_a[c], on_b[c], nbytes / k) for c in range(k)]
