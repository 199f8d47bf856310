"""Collective algorithms (closed-form network backend behind the engine's comm seam).

Sizes follow the nccl-tests convention (NVIDIA/nccl-tests doc/PERFORMANCE.md): `n` is the whole
buffer (for all-gather / reduce-scatter: the per-rank count x group size). Costs per algorithm,
with alpha the per-step latency and B the achievable per-rank bandwidth of the slowest link:

  ring all-reduce        2(p-1)·alpha + 2(p-1)/p · n/B
  ring reduce-scatter    (p-1)·alpha  + (p-1)/p · n/B       (all-gather the same)
  hierarchical (groups spanning N nodes with k members each):
      all-reduce = intra reduce-scatter(k) + inter all-reduce(N) of n/k + intra all-gather(k)
      reduce-scatter / all-gather = intra step(k) + inter step(N) of n/k
  point to point         alpha + n/B

A flat ring over k members per node drives k NIC shares per node, so its per-rank bandwidth is
min(scale-up, k x NIC share); its latency counts 2(N-1) network steps (NCCL's ring model,
src/graph/tuning.cc) and the rest as scale-up steps. Achievable bandwidth = link bandwidth x the
topology's measured bus-bandwidth efficiency (nccl-tests, see the topology file's sources).
"""
from __future__ import annotations

from simtrain.parallel import GroupShape
from simtrain.topology import Topology

ALGORITHMS = {
    "ring": "ring over the group's slowest link (Patarasuk & Yuan 2009 bandwidth-optimal all-reduce; nccl-tests busbw factors)",
    "hierarchical": "intra-node reduce-scatter, inter-node all-reduce across NIC rails, intra-node all-gather (NCCL/Horovod-style 2-D)",
}


def _up(topo: Topology):
    link = topo._link_by_class("scale_up")
    return link.latency, link.bw * link.efficiency


def _net(topo: Topology, leaves: int):
    link = topo._link_by_class("spine" if leaves > 1 else "leaf")
    return link.latency, link.bw * link.efficiency


def _ring(coll: str, p: int, n: float, alpha_steps, bw: float) -> float:
    if p == 1 or n <= 0:
        return 0.0
    if coll == "all_reduce":
        return alpha_steps(2 * (p - 1)) + 2 * (p - 1) / p * n / bw
    return alpha_steps(p - 1) + (p - 1) / p * n / bw


def ring_time(coll: str, n: float, g: GroupShape, topo: Topology) -> float:
    p = g.size
    a_up, b_up = _up(topo)
    if not g.spans_nodes:
        return _ring(coll, p, n, lambda s: s * a_up, b_up)
    a_net, b_net = _net(topo, g.leaves)
    # the ring leaves every node through its members' NIC shares: the node with the fewest members
    # limits it (Megatron order gives every node the same count)
    k = g.min_per_node or g.per_node
    bw = min(b_up, k * b_net) if k > 1 else b_net
    n_inter = (2 if coll == "all_reduce" else 1) * (g.nodes - 1)
    return _ring(coll, p, n, lambda s: (s - n_inter) * a_up + n_inter * a_net, bw)


def hierarchical_time(coll: str, n: float, g: GroupShape, topo: Topology) -> float:
    if not g.spans_nodes or g.per_node == 1 or not g.uniform:
        return ring_time(coll, n, g, topo)
    k, N = g.per_node, g.nodes
    a_up, b_up = _up(topo)
    a_net, b_net = _net(topo, g.leaves)
    intra = _ring("reduce_scatter", k, n, lambda s: s * a_up, b_up)
    inter = _ring(coll, N, n / k, lambda s: s * a_net, b_net)
    if coll == "all_reduce":
        return 2 * intra + inter
    return intra + inter


def collective_time(coll: str, n: float, g: GroupShape, topo: Topology, algorithm: str = "auto") -> float:
    if g.size <= 1 or n <= 0:
        return 0.0
    if algorithm == "ring":
        return ring_time(coll, n, g, topo)
    if algorithm == "hierarchical":
        return hierarchical_time(coll, n, g, topo)
    return min(ring_time(coll, n, g, topo), hierarchical_time(coll, n, g, topo))


def p2p_time(n: float, link_class: str, topo: Topology) -> float:
    link = topo._link_by_class(link_class)
    if link_class == "self":
        return 0.0
    return link.latency + n / (link.bw * link.efficiency)
