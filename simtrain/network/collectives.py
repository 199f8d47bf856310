"""Collective algorithms and protocols (the closed-form network backend; the flow backend in
`flows` times the same algorithms as phases of flows and applies the same protocol terms).

Sizes follow the nccl-tests convention (NVIDIA/nccl-tests doc/PERFORMANCE.md): `n` is the whole
buffer (for all-gather / reduce-scatter: the per-rank count x group size).

A collective runs one algorithm with one protocol. Its time is

    overhead + base(algo, proto) + steps_up · lat_up(algo, proto) + steps_net · lat_net(algo, proto)
             + bytes moved per rank / (link bandwidth x fabric efficiency x bw_factor(algo, proto))

  overhead   the fabric's fixed cost per collective (kernel launch and synchronisation that every
             algorithm pays; the topology's `collectives.overhead`, measured from nccl-tests
             small-message times, 0 if not given); `collectives.network_step_latency` adds a
             measured fabric's extra cost per network step to NCCL's table (and
             `collectives.nvls_chunk_cost` times NVLS as a pipeline of chunk rounds, below)
  base, lat  NCCL's latency model per algorithm and protocol (src/graph/tuning.cc, NCCL 2.30.7,
             via shared/data/calibration/nccl_busbw.yaml `nccl_tuning_model_constants`): a base
             latency plus a latency per step over NVLink (scale-up) or the network (scale-out)
  bw_factor  the protocol's share of the link bandwidth: LL carries 8 bytes of data per 16 (0.5),
             LL128 120 of 128 (NCCL caps ring LL128 at 0.92 of the bus bandwidth), Simple all of it
  efficiency the fabric's measured bus-bandwidth efficiency (nccl-tests; see the topology file)

Algorithms (each one registered function). Under `auto` a scenario runs what NCCL's own tuner
of its `network.nccl_version` picks within NCCL_ALGO / NCCL_PROTO (`nccl_choice`,
`simtrain.network.nccl_tuning`), timed by the forms here; without a policy `auto` picks the
lowest time by these forms per collective, size and group shape over every protocol and NCCL's
own algorithms (ring, tree, nvls, nvls_tree; direct for all-to-all); halving_doubling,
hierarchical and pairwise (other libraries' algorithms) run when the scenario names them:

  ring             2(p-1) steps (all-reduce) or p-1 (reduce-scatter, all-gather); a flat ring
                   with k members per node drives k NIC shares per node: per-rank bandwidth
                   min(scale-up, k x NIC share); 2(N-1) (or N-1) of its steps cross the network
  tree             double binary tree (all-reduce across nodes; Sanders, Speck & Traeff 2009, as in
                   NCCL): 2((k-1) chain steps + log2 N tree steps); the chain moves 2n per rank
                   inside the node, each node 2n across the network over its k NIC shares (half
                   the ring's bus bandwidth, NCCL's tree ratio 0.5), n on two nodes (below)
  halving_doubling recursive halving then doubling (Thakur, Rabenseifner & Gropp 2005), p a power
                   of two: log2 p steps each way; step s exchanges n/2^(s+1), across the network
                   when the partner is on another node
  hierarchical     intra-node ring reduce-scatter, inter-node ring all-reduce of n/k across the
                   members with the same local index (one rail each), intra-node ring all-gather
  nvls             NVLink SHARP in-switch reduction (single scale-up domain, all-reduce; topologies
                   with `collectives.nvls_efficiency`): every rank sends its buffer up once and
                   receives the result once, n / (bandwidth x nvls efficiency); a pipeline of
                   chunk rounds where the fabric gives `collectives.nvls_chunk_cost` (below)
  nvls_tree        NVLS inside each node, a tree across nodes (all-reduce)
  mesh             a full-mesh domain (`scale_up.topology: full_mesh`; MLU-Link, xGMI), inside
                   one domain: every member sends its n/p to every peer at once, each over the
                   pair's dedicated link, as Cambricon CNCL and AMD RCCL use all links of a mesh;
                   all-gather / reduce-scatter in one step, (p-1)/p x n / ((p-1) x link bandwidth),
                   all-reduce as both, two steps (a ring uses one link per member: p-1 times slower).
                   Neither library publishes a latency model: NCCL's ring terms per step are used
                   (assumed). Worked example (8 MLU590s, 300 GB/s over 7 links of 42.86 GB/s, 1 GiB
                   all-gather, Simple, no overhead): 8.4 + 3.4 us + 7/8 x 2^30 / 300e9 = 3.144 ms
  pairwise         all-to-all in p-1 steps; the inter-node part limited by one NIC share per rank
                   (all-to-all cannot aggregate NICs: nccl-tests issues #130/#267, maintainers)
  direct           all-to-all in one step, every pair at once (same bandwidth bound; on a full
                   mesh each pair on its own link, so inside a domain k-1 links at once)

Worked example (ring all-reduce, Simple, 8 devices in one node, 100 GB/s, efficiency 1, no
overhead, n = 1 GB): 8.4 us + 14 x 3.4 us + 14/8 x 1e9 / 100e9 = 17.556 ms.

Trees across two nodes. A double binary tree over N = 2 nodes is two trees of one root and one
child: each node sends n/2 up one tree and n/2 down the other, n in all, where a tree over more
nodes has nodes that are inner in one tree and leaves in the other and send 2n (NCCL models the
same: tuning.cc takes the intra-node graph bandwidth for a tree on nNodes <= 2, and for NVLSTree
min(bwIntra, bwInter) on nNodes <= 2 but bwInter/2 beyond). So `tree` and `nvls_tree` move n per
node across the network on two nodes and 2n on more; the chain inside each node still moves 2n.
A fabric where that saving is measured not to happen says `collectives.two_node_tree_saving:
false`; its trees then move 2n on two nodes as well (the ring's network bytes, nearly: 2(N-1)/N n).

NVLS chunk pipeline (`collectives.nvls_chunk_cost`, t_c). NCCL runs NVLS on 16 channels
(NCCL_NVLS_NCHANNELS), each with one head per rank of the node, and moves the buffer in rounds of
channels x heads chunks; the chunk is NCCL_NVLS_CHUNKSIZE = 128 KiB for big buffers and is cut to
64 / 32 / 16 KiB when the buffer holds fewer than 64 / 8 / 2 rounds of the current chunk
(NVLSTree: 32 / 16 / 4 / 1 rounds down to 256 / 128 / 64 / 32 KiB, at most 64 KiB on 4+ nodes)
-- src/enqueue.cc calcCollChunking (computeCollChunkInfo in 2.20), the same in NCCL 2.18.5, 2.20.5
and 2.24.3, and src/transport/nvls.cc. A round goes through two stages that overlap from one
round to the next (the reduction through the switch, then the multicast of the result), and
each round ends with a synchronisation of the heads, t_c, that the data does not hide. R rounds
through a two-stage pipeline take R + 1 round times:

    (R + 1) x t_c + (n + min(n, 16 x heads x chunk)) / B_inf,   R = ceil(n / (16 x heads x chunk(n))),
    1 / B_inf = 1 / (bandwidth x nvls efficiency) - t_c / (16 x heads x 128 KiB)

so `nvls_efficiency` stays the measured peak (at the 128 KiB chunk), smaller chunks add t_c per
extra round, and the pipeline's fill takes the place of NCCL's NVLS step latency (25 us, the
tuner's estimate, which the fabric then does not pay). Worked example (8 heads, t_c = 6 us,
450 GB/s x 0.61): 16 MiB is below 8 rounds of 64 KiB chunks (64 MiB), so the chunk is 32 KiB,
a round 4 MiB and R = 4; B_inf = 1 / (1/274.5e9 - 6e-6/16 MiB) = 304.4 GB/s; the NVLS part takes
5 x 6 us + (16 + 4) MiB / 304.4 GB/s = 98.9 us against 25 + 61.1 us without the term. On fabrics
with `latency_model: none` the term is off.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from simtrain.hardware.topology import Topology
from simtrain.network import nccl_tuning
from simtrain.plan.grid import GroupShape

PROTOCOLS = ("LL", "LL128", "Simple")
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")

# NCCL's latency model (us): (base, per NVLink step, per network step) by latency family and
# protocol. Source: NCCL src/graph/tuning.cc baseLat / hwLat[NVLINK] / hwLat[NET] (2.30.7), via
# shared/data/calibration/nccl_busbw.yaml `nccl_tuning_model_constants`.
LATENCY_US = {
    "ring": {"LL": (6.6, 0.6, 2.7), "LL128": (14.0, 1.9, 4.0), "Simple": (8.4, 3.4, 14.0)},
    "tree": {"LL": (6.8, 0.6, 5.0), "LL128": (14.0, 1.25, 8.5), "Simple": (8.4, 4.0, 14.0)},
    "nvls": {"Simple": (0.0, 25.0, 18.0)},
    "nvls_tree": {"Simple": (0.0, 25.0, 20.9)},
}
# Multi-node ring all-reduce with Simple: NCCL multiplies the ring's latency by 1.4 on SM80+ (same source),
# once the buffer holds at least 64 B per channel and rank (nBytes / (nChannels x nRanks) >= 64).
RING_SIMPLE_MULTINODE = 1.4
RING_PLATEAU_BYTES = 64
# A multi-node ring's steps inside a node cost at least NCCL's network overhead: the ring latency is
# baseLat + (nsteps - nInter) x max(intraLat, netOverhead) + nInter x interLat, netOverhead 1 us
# (Intel host; 2 us AMD, which simtrain does not distinguish), x 3 for Simple, only when nNodes > 1.
# Source: shared/data/calibration/nccl-algorithms/nccl-tuning-constants-2.18-2.23.yaml
# `latency_model.Ring` and `ring_plateau` (src/graph/tuning.cc).
NET_OVERHEAD_US = {"LL": 1.0, "LL128": 1.0, "Simple": 3.0}
# Off: with it, the measured 4-node H100 all-gather sweep (tests/test_collectives.py) loses one
# size within 15 %; NCCL's tuner (nccl_tuning) keeps the term for its choice.
NET_OVERHEAD_STEPS = False

# NVLS chunking: NCCL's default NVLS channel count and chunk size, and the chunk cuts of
# calcCollChunking as (rounds of channels x heads chunks, chunk size it cuts to), in order.
# Source: NCCL src/transport/nvls.cc (NCCL_NVLS_NCHANNELS 16, NCCL_NVLS_CHUNKSIZE 128 KiB) and
# src/enqueue.cc calcCollChunking / computeCollChunkInfo (2.18.5, 2.20.5, 2.24.3 alike).
NVLS_CHANNELS = 16
NVLS_CHUNK = 128 * 1024
NVLS_CUTS = ((64, 65536), (8, 32768), (2, 16384))
NVLS_TREE_CUTS = ((32, 262144), (16, 131072), (4, 65536), (1, 32768))
NVLS_TREE_MAX_CHUNK_4NODES = 65536      # NCCL_NVLSTREE_MAX_CHUNKSIZE default on nNodes >= 4


def nvls_chunk(n: float, heads: int, nodes: int = 1) -> int:
    """The NVLS (nodes == 1) or NVLSTree chunk NCCL uses for an n-byte all-reduce with `heads`
    ranks per node. Example: 16 MiB on 8 heads: 16 MiB < 64 x 16 x 8 x 128 KiB -> 64 KiB;
    < 8 x 16 x 8 x 64 KiB = 64 MiB -> 32 KiB; not < 2 x 16 x 8 x 32 KiB = 8 MiB: 32 KiB."""
    ops = NVLS_CHANNELS * heads
    chunk = NVLS_CHUNK
    cuts = NVLS_CUTS
    if nodes > 1:
        cuts = NVLS_TREE_CUTS
        if nodes >= 4:
            chunk = min(chunk, NVLS_TREE_MAX_CHUNK_4NODES)
    for rounds, size in cuts:
        if n < rounds * ops * chunk and chunk > size:
            chunk = size
    return chunk


def _nvls_transfer(n: float, heads: int, nodes: int, bw: float, topo: Topology) -> float:
    """The NVLS part's transfer time: n / bw without the chunk pipeline, else the pipeline of
    chunk rounds where the fabric gives `nvls_chunk_cost` (module docstring)."""
    t_c = _nvls_chunk_cost(topo)
    if not t_c:
        return n / bw
    ops = NVLS_CHANNELS * heads
    chunk = nvls_chunk(n, heads, nodes)
    rounds = math.ceil(n / (ops * chunk))
    inv_b = 1 / bw - t_c / (ops * NVLS_CHUNK)
    return (rounds + 1) * t_c + (n + min(n, ops * chunk)) * inv_b


def _nvls_chunk_cost(topo: Topology) -> float:
    params = _params(topo)
    return 0.0 if params.get("latency_model") == "none" else (params.get("nvls_chunk_cost") or 0.0)


# Share of the bus bandwidth each protocol reaches (same source: LL is half data, half flags;
# ring LL128 min(0.92 busBw); tree Simple 0.92; tree LL busBw/3.8; tree LL128 7/9 in one node,
# 120/128 across nodes).
BW_FACTOR = {
    "ring": {"LL": 0.5, "LL128": 0.92, "Simple": 1.0},
    "tree": {"LL": 1 / 3.8, "LL128": 120 / 128, "Simple": 0.92},
    "nvls": {"Simple": 1.0},
    "nvls_tree": {"Simple": 1.0},
}


@dataclass(frozen=True)
class Cost:
    """A collective's predicted time split into its terms (seconds)."""
    algorithm: str
    protocol: str
    latency: float       # overhead + base + step latencies
    transfer: float      # bytes over bandwidth

    @property
    def seconds(self) -> float:
        return self.latency + self.transfer


@dataclass(frozen=True)
class Algorithm:
    name: str
    family: str          # latency / bandwidth-factor family in the NCCL tables
    collectives: tuple
    source: str
    cost: object         # (coll, n, g, topo) -> (steps_up, steps_net, transfer seconds at full protocol bw) | None
    tuned: bool          # among those `auto` chooses from (NCCL's own algorithms); others only when named


ALGORITHMS: dict = {}


def register(name: str, family: str, collectives: tuple, source: str, tuned: bool = True) -> Callable[[Callable], Callable]:
    def deco(fn: Callable) -> Callable:
        ALGORITHMS[name] = Algorithm(name, family, collectives, source, fn, tuned)
        return fn
    return deco


def _up(topo: Topology, g: GroupShape | None = None) -> float:
    """Per-rank bandwidth inside a scale-up domain (a domain spanning hosts: its host-to-host link)."""
    link = topo._link_by_class("domain" if g is not None and g.span == "domain" else "scale_up")
    return link.bw * link.efficiency


def _up_all(topo: Topology, g: GroupShape, peers: int) -> float:
    """Per-rank bandwidth sending to `peers` members of its domain at once: the scale-up link on a
    switch; on a full mesh (`Topology.scale_up_mesh`) one dedicated link per peer, so peers x link."""
    b = _up(topo, g)
    return b * peers if topo.scale_up_mesh and peers > 1 else b


def _net_class(g: GroupShape) -> str:
    """The link class of the group's widest scale-out hop: the topology's span class where it is
    one of the wide ones (spine, core, cross-plane), else leaf or spine by the leaves spanned."""
    span = g.span or ""
    if span in ("spine", "core") or span.startswith("pxn_"):
        return span
    return "spine" if g.leaves > 1 else "leaf"


def _net(topo: Topology, leaves: int, g: GroupShape | None = None) -> float:
    link = topo._link_by_class(_net_class(g) if g is not None else ("spine" if leaves > 1 else "leaf"))
    return link.bw * link.efficiency


def _params(topo: Topology) -> dict:
    return dict(getattr(topo, "collectives", None) or ())


@dataclass(frozen=True)
class LoadedShape(GroupShape):
    """A group shape with the per-flow scale-out bandwidth its ring hops get from the placement:
    the ring and hierarchical algorithms' network hops run at `ring_net_bw` (bytes/s, before
    efficiency) instead of the full-load link class (analytical backend, `Topology.tier_bandwidth`)."""
    ring_net_bw: float = 0.0


def _ring_net(topo: Topology, g: GroupShape) -> float:
    """Per-rank network bandwidth of a ring hop: the placement's share where the backend gave it
    (an oversubscribed tier that the ring's own concurrent flows do not fill), else the link class."""
    bw = getattr(g, "ring_net_bw", 0.0)
    if bw > 0:
        return bw * topo._link_by_class(_net_class(g)).efficiency
    return _net(topo, g.leaves, g)


def _ring_bw(g: GroupShape, topo: Topology) -> float:
    b_up = _up(topo, g)
    if not g.spans_nodes:
        return b_up
    k = g.min_per_node or g.per_node
    b_net = _ring_net(topo, g)
    return min(b_up, k * b_net) if k > 1 else b_net


def _ring_steps(coll: str, p: int) -> int:
    return 2 * (p - 1) if coll == "all_reduce" else p - 1


def _factor(coll: str, p: int) -> float:
    return 2 * (p - 1) / p if coll == "all_reduce" else (p - 1) / p


@register("ring", "ring", ("all_reduce", "reduce_scatter", "all_gather"),
          "ring (Patarasuk & Yuan 2009); NCCL ring latency model")
def _ring(coll, n, g, topo):
    p = g.size
    steps = _ring_steps(coll, p)
    inter = ((2 if coll == "all_reduce" else 1) * (g.nodes - 1)) if g.spans_nodes else 0
    return steps - inter, inter, _factor(coll, p) * n / _ring_bw(g, topo)


@register("tree", "tree", ("all_reduce",),
          "double binary tree (Sanders, Speck & Traeff 2009), NCCL tree latency model and 0.5 bandwidth ratio")
def _tree(coll, n, g, topo):
    if not g.spans_nodes or not g.uniform:
        return None
    k, N = g.per_node, g.nodes
    # the chain inside the node moves 2n per rank; across the network each node moves n on two
    # nodes and 2n on more (module docstring), over its k NIC shares
    net = _tree_net_bytes(n, N, topo) / (k * _net(topo, g.leaves, g))
    return 2 * (k - 1), 2 * math.ceil(math.log2(N)), max(tree_intra_seconds("tree", n, g, topo), net)


def tree_intra_seconds(algorithm: str, n: float, g: GroupShape, topo: Topology) -> float:
    """The part of a tree or NVLSTree all-reduce inside each node (the flow backend times the
    network part as flows and takes the larger of the two, as the closed form does): the
    chain's 2n per rank over the scale-up link, or the NVLS chunk pipeline."""
    if algorithm == "nvls_tree":
        eff = _params(topo).get("nvls_efficiency")
        return _nvls_transfer(n, g.per_node, g.nodes, topo._link_by_class("scale_up").bw * eff, topo)
    return 2 * n / _up(topo, g) if g.per_node > 1 else 0.0


def two_node_tree_saving(topo: Topology) -> bool:
    """Whether a tree over two nodes moves n per node across the network (module docstring)."""
    return bool(_params(topo).get("two_node_tree_saving", True))


def _tree_net_bytes(n: float, nodes: int, topo: Topology) -> float:
    """Bytes each node sends across the network in a double binary tree all-reduce."""
    return n if nodes <= 2 and two_node_tree_saving(topo) else 2 * n


@register("halving_doubling", "ring", ("all_reduce", "reduce_scatter", "all_gather"),
          "recursive halving-doubling (Thakur, Rabenseifner & Gropp 2005)", tuned=False)
def _halving_doubling(coll, n, g, topo):
    p = g.size
    if p & (p - 1) or not g.uniform or (g.spans_nodes and g.per_node & (g.per_node - 1)):
        return None
    k = g.per_node if g.spans_nodes else p
    b_up = _up(topo, g)
    b_net = _net(topo, g.leaves, g) if g.spans_nodes else b_up
    up = net = 0
    t = 0.0
    for s in range(p.bit_length() - 1):          # partner distance p/2^(s+1), members node by node
        dist = p >> (s + 1)
        if dist >= k:
            net += 1
            t += n / 2 ** (s + 1) / b_net
        else:
            up += 1
            t += n / 2 ** (s + 1) / b_up
    if coll == "all_reduce":
        return 2 * up, 2 * net, 2 * t
    return up, net, t


@register("hierarchical", "ring", ("all_reduce", "reduce_scatter", "all_gather"),
          "intra-node reduce-scatter, inter-node all-reduce across NIC rails, intra-node all-gather (2-D)", tuned=False)
def _hierarchical(coll, n, g, topo):
    if not g.spans_nodes or g.per_node == 1 or not g.uniform:
        return None
    k, N = g.per_node, g.nodes
    b_up, b_net = _up(topo, g), _ring_net(topo, g)
    intra = (k - 1) / k * n / b_up
    inter_t = _factor(coll, N) * (n / k) / b_net
    inter = _ring_steps(coll, N)
    if coll == "all_reduce":
        return 2 * (k - 1), inter, 2 * intra + inter_t
    return k - 1, inter, intra + inter_t


@register("nvls", "nvls", ("all_reduce",), "NVLink SHARP in-switch reduction (NCCL NVLS)")
def _nvls(coll, n, g, topo):
    eff = _params(topo).get("nvls_efficiency")
    if not eff or g.spans_nodes:
        return None
    return 1, 0, _nvls_transfer(n, g.size, 1, topo._link_by_class("scale_up").bw * eff, topo)


@register("nvls_tree", "nvls_tree", ("all_reduce",), "NVLS inside nodes, tree across nodes (NCCL NVLSTree)")
def _nvls_tree(coll, n, g, topo):
    eff = _params(topo).get("nvls_efficiency")
    if not eff or not g.spans_nodes or not g.uniform or g.per_node < 2:
        return None          # one member per node: nothing for the switch to reduce
    inter = _tree_net_bytes(n, g.nodes, topo) / (g.per_node * _net(topo, g.leaves, g))
    return 1, 2 * math.ceil(math.log2(g.nodes)), max(tree_intra_seconds("nvls_tree", n, g, topo), inter)


@register("mesh", "ring", ("all_reduce", "reduce_scatter", "all_gather"),
          "direct over a full mesh: every member sends to every peer at once over its dedicated link "
          "(Cambricon CNCL on MLU-Link, AMD RCCL on xGMI); latency terms assumed as NCCL's ring per step")
def _mesh(coll, n, g, topo):
    if g.spans_nodes or not topo.scale_up_mesh:
        return None
    p = g.size
    # each member sends n/p to each of its p-1 peers (all-gather: its shard; reduce-scatter: the
    # peer's shard of its buffer) over p-1 links at once: (p-1)/p x n / ((p-1) x link)
    t = (p - 1) / p * n / _up_all(topo, g, p - 1)
    return (2, 0, 2 * t) if coll == "all_reduce" else (1, 0, t)


@register("pairwise", "ring", ("all_to_all",), "pairwise-exchange all-to-all", tuned=False)
def _pairwise(coll, n, g, topo):
    p = g.size
    if not g.spans_nodes:
        return p - 1, 0, (p - 1) / p * n / _up(topo, g)
    k, kmin = g.per_node, g.min_per_node or g.per_node   # the emptiest node sends the most across
    t = max((k - 1) / p * n / _up(topo, g), (p - kmin) / p * n / _net(topo, g.leaves, g))
    return k - 1, p - kmin, t


@register("direct", "ring", ("all_to_all",), "direct all-to-all (every pair at once)")
def _direct(coll, n, g, topo):
    p = g.size
    if not g.spans_nodes:
        return 1, 0, (p - 1) / p * n / _up_all(topo, g, p - 1)
    k, kmin = g.per_node, g.min_per_node or g.per_node
    return 0, 1, max((k - 1) / p * n / _up_all(topo, g, k - 1), (p - kmin) / p * n / _net(topo, g.leaves, g))


def steps(coll: str, n: float, g: GroupShape, topo: Topology, algorithm: str) -> tuple | None:
    """(steps inside nodes, steps across the network) the latency model counts for an algorithm,
    or None where it does not apply. The flow backend charges these same latency terms and
    takes the transfer time from its flows."""
    a = ALGORITHMS.get(algorithm)
    if a is None or coll not in a.collectives:
        return None
    terms = a.cost(coll, n, g, topo)
    return None if terms is None else terms[:2]


def cost(coll: str, n: float, g: GroupShape, topo: Topology, algorithm: str, protocol: str) -> Cost | None:
    """The cost of one algorithm with one protocol, or None where it does not apply."""
    a = ALGORITHMS[algorithm]
    if coll not in a.collectives or protocol not in LATENCY_US[a.family]:
        return None
    terms = a.cost(coll, n, g, topo)
    if terms is None:
        return None
    return with_protocol(algorithm, a.family, coll, protocol, *terms, topo, n, g.size)


def with_protocol(algorithm: str, family: str, coll: str, protocol: str, up: int, net: int, t: float,
                  topo: Topology, n: float | None = None, ranks: int = 0) -> Cost:
    """Adds the protocol's latency terms and bandwidth share to an algorithm's step counts and its
    transfer time at full bandwidth (shared by both network backends). A ring across nodes
    (`net` > 0) pays NCCL's per-step latency on every one of its steps: max(intra, network
    overhead) on the steps inside a node, the network latency on the 2(N-1) (or N-1) that cross,
    so its latency grows with the ring's length (a 1,536-rank ring all-reduce: 3,070 steps).
    `n` and `ranks` (buffer bytes and group size) decide NCCL's x1.4 plateau of a multi-node
    Ring/Simple all-reduce (at least 64 B per channel and rank); without them it applies."""
    base, l_up, l_net = LATENCY_US[family][protocol]
    params = _params(topo)
    if params.get("latency_model") == "none":
        base = l_up = l_net = 0.0
    else:
        l_net += (params.get("network_step_latency") or 0.0) * 1e6
        if family in ("nvls", "nvls_tree") and _nvls_chunk_cost(topo):
            l_up = 0.0          # the chunk pipeline's fill stands for NCCL's NVLS step latency
        if algorithm == "ring" and net and NET_OVERHEAD_STEPS:
            l_up = max(l_up, NET_OVERHEAD_US[protocol])
    lat = (base + up * l_up + net * l_net) * 1e-6
    if (algorithm == "ring" and protocol == "Simple" and coll == "all_reduce" and net
            and (n is None or not ranks or n / (nccl_tuning.CHANNELS * ranks) >= RING_PLATEAU_BYTES)):
        lat *= RING_SIMPLE_MULTINODE
    lat += _params(topo).get("overhead", 0.0)
    return Cost(algorithm, protocol, lat, t / BW_FACTOR[family][protocol])


def measured_cost(coll: str, n: float, g: GroupShape, tables: tuple) -> tuple | None:
    """(Cost, note) from a device profile's measured collective tables (simtrain calibrate), or
    None without a usable table.

    A table serves a group of the same collective on the same side of the node boundary; across
    nodes it must also have the group's ranks per node (the NIC shares a ring aggregates depend on
    it). Among those, the one closest in node count, then rank count, is used. Its measured time
    is interpolated linearly in log size and log time between the measured sizes, and rescaled
    by the bus factors when the group has another rank count (bus bandwidth is what nccl-tests
    makes comparable across rank counts). Below the smallest measured size the smallest size's
    time is used; above the largest, the table's fitted alpha/beta, and the note says so."""
    per_node = lambda t: t["ranks"] // max(1, t.get("nodes", 1))
    cands = []
    for t in tables:
        if t.get("collective") != coll or (t.get("nodes", 1) > 1) != g.spans_nodes:
            continue
        if g.spans_nodes and per_node(t) != g.per_node:
            continue
        pts = sorted((p["bytes"], p["time_us"] * 1e-6) for p in t.get("points") or ()
                     if p.get("bytes", 0) > 0 and p.get("time_us", 0) > 0)
        if pts:
            cands.append((t, pts))
    if not cands:
        return None
    t, pts = min(cands, key=lambda c: (abs(c[0].get("nodes", 1) - g.nodes), abs(c[0]["ranks"] - g.size), c[0]["ranks"]))
    bus = lambda p: _factor(coll, p) if coll != "all_to_all" else (p - 1) / p
    scale = bus(g.size) / bus(t["ranks"]) if t["ranks"] > 1 else 1.0
    note = None
    if n <= pts[0][0]:
        seconds = pts[0][1]
    elif n <= pts[-1][0]:
        for (x0, t0), (x1, t1) in zip(pts, pts[1:]):
            if x0 <= n <= x1:
                w = (math.log(n) - math.log(x0)) / (math.log(x1) - math.log(x0))
                seconds = math.exp(math.log(t0) + w * (math.log(t1) - math.log(t0)))
                break
    else:
        peak = (t.get("peak_busbw_GBps") or 0) * 1e9
        if peak > 0:
            seconds = t.get("alpha_us", 0.0) * 1e-6 + n * bus(t["ranks"]) / peak
        else:
            seconds = pts[-1][1] * n / pts[-1][0]
        note = f"{coll} of {n:.0f} B beyond the largest measured size {pts[-1][0]:.0f} B: fitted alpha/beta used"
    if t["ranks"] != g.size or t.get("nodes", 1) != g.nodes:
        extra = f"{coll} over {g.size} ranks on {g.nodes} node(s) timed with the table measured on {t['ranks']} ranks on {t.get('nodes', 1)} node(s)"
        note = f"{note}; {extra}" if note else extra
    return Cost("measured", "measured", 0.0, seconds * scale), note


def nccl_inputs(g: GroupShape, topo: Topology, version: str = nccl_tuning.LATEST) -> nccl_tuning.Inputs:
    """What NCCL's tuner sees of a group on this fabric (`nccl_tuning.inputs_for`): the raw
    scale-up link per GPU and the NIC bandwidth of the group's ranks on one node (k NIC shares)."""
    intra = topo._link_by_class("domain" if g.span == "domain" else "scale_up").bw / 1e9
    k = g.min_per_node or g.per_node if g.spans_nodes else 1
    net = k * _link_raw(topo, g) / 1e9 if g.spans_nodes else 0.0
    cc = nccl_tuning.compcap_of(f"{topo.device_label} {topo.name}")
    return nccl_tuning.inputs_for(g.nodes if g.spans_nodes else 1, g.size, intra, net, cc,
                                  bool(_params(topo).get("nvls_efficiency")), version=version)


def _link_raw(topo: Topology, g: GroupShape) -> float:
    return topo._link_by_class(_net_class(g)).bw


def nccl_choice(coll: str, n: float, g: GroupShape, topo: Topology, policy: nccl_tuning.Policy,
                protocol: str = "auto") -> Cost | None:
    """The (algorithm, protocol) NCCL's tuner of `policy.version` runs, among those the policy
    allows, timed by simtrain's model; where simtrain has no form for NCCL's first choice on this
    group (a tree inside one node, NVLS on a fabric without it) the tuner's next one. None where
    NCCL does not choose (all-to-all) or nothing allowed applies."""
    if coll == "all_to_all" or g.size <= 1:
        return None
    protos = policy.protos if protocol == "auto" else tuple(p for p in policy.protos if p == protocol) or (protocol,)
    x = nccl_inputs(g, topo, policy.version)
    for _, a, p in nccl_tuning.ranking(policy.version, coll, n, x, policy.algos, protos):
        c = cost(coll, n, g, topo, nccl_tuning.SIMTRAIN_NAME[a], p)
        if c is not None:
            return c
    return None


def choose(coll: str, n: float, g: GroupShape, topo: Topology, algorithm: str = "auto",
           protocol: str = "auto", measured: tuple = (), notes: set | None = None,
           nccl: nccl_tuning.Policy | None = None) -> Cost:
    """The (algorithm, protocol) run: with `nccl` (a scenario's NCCL release and NCCL_ALGO /
    NCCL_PROTO) and `auto`, NCCL's tuner's choice (`nccl_choice`); else the fastest by simtrain's
    model among those allowed, ties to the first registered. With `measured` tables (a
    calibrated device profile) and `auto`, the measurement is used where one exists for the
    collective (not where NCCL_ALGO / NCCL_PROTO pin the choice: the table measured NCCL's free
    choice); `notes` collects what the lookup had to stretch."""
    if g.size <= 1 or n <= 0:
        return Cost("none", "none", 0.0, 0.0)
    if measured and algorithm == "auto" and protocol == "auto" and not (nccl is not None and nccl.pinned):
        hit = measured_cost(coll, n, g, measured)
        if hit is not None:
            if hit[1] and notes is not None:
                notes.add(hit[1])
            return hit[0]
    if nccl is not None and algorithm == "auto":
        hit = nccl_choice(coll, n, g, topo, nccl, protocol)
        if hit is not None:
            return hit
    algos = [n for n, a in ALGORITHMS.items() if a.tuned] if algorithm == "auto" else [algorithm]
    protos = PROTOCOLS if protocol == "auto" else (protocol,)
    if nccl is not None and algorithm == "auto" and nccl.pinned:
        # NCCL's pick has no simtrain form on this group (a tree inside one node): the fastest of
        # what the pins allow
        algos = [a for a in algos if a in nccl.simtrain_algorithms() or a in ("direct", "mesh")] or ["ring"]
        protos = tuple(p for p in protos if p in nccl.protos) or protos
    best = None
    for a in algos:
        for pr in protos:
            c = cost(coll, n, g, topo, a, pr)
            if c is not None and (best is None or c.seconds < best.seconds):
                best = c
    if best is None:
        # the pinned algorithm does not apply to this group (e.g. hierarchical inside one node):
        # the ring always does, for every collective but all-to-all
        fallback = "direct" if coll == "all_to_all" else "ring"
        return choose(coll, n, g, topo, fallback, protocol)
    return best


def collective_time(coll: str, n: float, g: GroupShape, topo: Topology, algorithm: str = "auto",
                    protocol: str = "auto") -> float:
    return choose(coll, n, g, topo, algorithm, protocol).seconds


def p2p_time(n: float, link_class: str, topo: Topology) -> float:
    link = topo._link_by_class(link_class)
    if link_class == "self":
        return 0.0
    return link.latency + n / (link.bw * link.efficiency)
