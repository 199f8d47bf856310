"""Parallel plan (third pipeline stage): rank grid, process groups, placement, equivalence classes.

Rank order is Megatron's `tp-cp-dp-pp`, first varying fastest:
    rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * stage))
Worked example (tp 2, cp 1, dp 2, pp 2): rank 5 = 1 + 2*(0 + 1*(0 + 2*1)) -> tp_rank 1, dp_rank 0,
stage 1; its tp group is {4, 5}, its dp group {5, 7}, its pp group {1, 5}.
Dense gradients are reduced over dp x cp (every cp rank holds the same weights): the `dp` group
is the ranks of a stage with the same tp_rank.
Experts see the same ranks of a stage through Megatron-core's expert grid `etp-ep-edp`
(etp x ep x edp = tp x cp x dp), first fastest, with w = rank mod (tp·cp·dp):
    etp_rank = w mod etp,  ep_rank = (w div etp) mod ep,  edp_rank = w div (etp·ep)
Worked example (tp 1, dp 8, ep 4): ranks 0-3 form an ep group (experts 0..E/4-1 on rank 0, ...),
{0, 4} an edp group, over which those experts' gradients are reduced.
Placement maps rank r onto device r of the topology (devices numbered node by node), so a tp
group of 8 fills one 8-device node.

Equivalence classes: ranks whose stage, group shapes and peers' classes are identical run
identical programs and are simulated once with a multiplicity. The partition is computed by
refinement (start from a local signature, split by the classes of group members and pipeline
neighbours until stable), so anything that makes ranks differ splits exactly the classes it touches.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from simtrain.hardware.topology import Topology

if TYPE_CHECKING:
    from simtrain.spec.scenario import Scenario


@dataclass(frozen=True)
class GroupShape:
    """What a collective's cost depends on: size, nodes spanned, ranks per node, leaves spanned."""
    size: int
    nodes: int
    per_node: int          # largest number of members on one node
    uniform: bool          # every spanned node holds the same number of members
    leaves: int
    min_per_node: int = 0  # smallest number of members on a spanned node
    span: str = ""         # link class of the widest hop the group spans (Topology.span_class):
                           # scale_up, leaf, spine, core (three-level fat-tree), ...

    @property
    def spans_nodes(self) -> bool:
        return self.nodes > 1


@dataclass(frozen=True)
class RankClass:
    id: int
    stage: int
    ranks: tuple           # member ranks (sorted); ranks[0] is the representative
    pp_prev: int | None    # class id of the previous stage's rank in the same pp group
    pp_next: int | None
    link_prev: str | None  # link class to the previous stage's rank
    link_next: str | None
    pp_wrap: int | None = None    # first rank <-> last rank of the pp group (interleaved schedules wrap)
    link_wrap: str | None = None
    pp_mirror: int | None = None  # the rank at stage pp-1-s of the pp group (DualPipe's twin), when asked for
    link_mirror: str | None = None
    device: int = -1              # the representative rank's device
    shapes: dict = None           # kind -> GroupShape, every group kind (tp, dp, cp, ep, etp, edp)
    peers: dict = None            # kind -> sorted class ids present in the group
    ep_rank: int = 0              # expert-parallel rank (which experts it holds)

    @property
    def multiplicity(self) -> int:
        return len(self.ranks)

    def shape_of(self, kind: str) -> GroupShape:
        return self.shapes[kind]

    def peers_of(self, kind: str) -> tuple:
        return self.peers[kind]


class RankGrid:
    def __init__(self, tp: int, cp: int, dp: int, pp: int, ep: int = 1, etp: int = 1):
        self.tp, self.cp, self.dp, self.pp = tp, cp, dp, pp
        self.ep, self.etp = ep, etp
        self.per_stage = tp * cp * dp
        self.edp = self.per_stage // (ep * etp)
        self.world = tp * cp * dp * pp

    def coords(self, rank: int) -> dict:
        """Every coordinate of `rank` (see the module docstring for the order).

        Worked example (tp 2, cp 1, dp 2, pp 2): rank 5 = 1 + 2·(0 + 1·(0 + 2·1)).

        >>> c = RankGrid(tp=2, cp=1, dp=2, pp=2).coords(5)
        >>> c["tp_rank"], c["dp_rank"], c["stage"]
        (1, 0, 1)
        >>> c = RankGrid(tp=1, cp=1, dp=8, pp=1, ep=4).coords(6)     # w = 6: ep_rank 2, edp_rank 1
        >>> c["ep_rank"], c["edp_rank"]
        (2, 1)
        """
        tp_rank = rank % self.tp
        r = rank // self.tp
        cp_rank = r % self.cp
        r //= self.cp
        dp_rank = r % self.dp
        stage = r // self.dp
        w = rank % self.per_stage
        return {"tp_rank": tp_rank, "cp_rank": cp_rank, "dp_rank": dp_rank, "stage": stage,
                "etp_rank": w % self.etp, "ep_rank": (w // self.etp) % self.ep, "edp_rank": w // (self.etp * self.ep)}

    # what a group of each kind holds fixed (its members differ only in the other coordinates)
    _FIXED = {"tp": ("stage", "cp_rank", "dp_rank"), "cp": ("stage", "tp_rank", "dp_rank"),
              "dp": ("stage", "tp_rank"), "pp": ("tp_rank", "cp_rank", "dp_rank"),
              "etp": ("stage", "ep_rank", "edp_rank"), "ep": ("stage", "etp_rank", "edp_rank"),
              "edp": ("stage", "etp_rank", "ep_rank")}

    # rank = tp_rank + tp (cp_rank + cp (dp_rank + dp stage)), and inside a stage
    # w = etp_rank + etp (ep_rank + ep edp_rank): (dims slowest first, the axes that put a group's
    # free coordinates last, in rank order)
    _LAYOUT = {"tp": (("pp", "dp", "cp", "tp"), (0, 1, 2, 3)), "cp": (("pp", "dp", "cp", "tp"), (0, 1, 3, 2)),
               "dp": (("pp", "dp", "cp", "tp"), (0, 3, 1, 2)), "pp": (("pp", "dp", "cp", "tp"), (1, 2, 3, 0)),
               "etp": (("pp", "edp", "ep", "etp"), (0, 1, 2, 3)), "ep": (("pp", "edp", "ep", "etp"), (0, 1, 3, 2)),
               "edp": (("pp", "edp", "ep", "etp"), (0, 2, 3, 1))}

    def groups(self, kind: str) -> list[tuple]:
        """All groups of one kind, each a tuple of ranks in rank order, ordered by first member.
        `dp` is the gradient-reduction group: data- and context-parallel ranks together.

        >>> g = RankGrid(tp=2, cp=1, dp=2, pp=2)
        >>> g.groups("tp")[2], g.groups("dp")[3], g.groups("pp")[1]      # rank 5's groups
        ((4, 5), (5, 7), (1, 5))
        >>> e = RankGrid(tp=1, cp=1, dp=8, pp=1, ep=4)
        >>> e.groups("ep")[0], e.groups("edp")[0]
        ((0, 1, 2, 3), (0, 4))
        """
        fixed = self._FIXED[kind]
        out: dict = {}
        for r in range(self.world):
            c = self.coords(r)
            out.setdefault(tuple(c[k] for k in fixed), []).append(r)
        return [tuple(g) for g in out.values()]

    def size(self, kind: str) -> int:
        """Members of one group of the kind (`dp`: data- and context-parallel ranks together)."""
        return {"tp": self.tp, "cp": self.cp, "dp": self.dp * self.cp, "pp": self.pp,
                "etp": self.etp, "ep": self.ep, "edp": self.edp}[kind]

    def kinds(self, experts: bool = False) -> list:
        """The group kinds a plan communicates over: tp and dp always (their shapes name every
        class), cp when split, and for a model with experts ep, etp and edp when split."""
        extra = ("cp", "ep", "etp", "edp") if experts else ("cp",)
        return ["tp", "dp"] + [k for k in extra if self.size(k) > 1]

    def coord_arrays(self) -> dict:
        """Every coordinate of every rank as numpy arrays (the vectorised form of `coords`)."""
        r = np.arange(self.world, dtype=np.int64)
        w = r % self.per_stage
        return {"rank": r, "tp_rank": r % self.tp, "cp_rank": (r // self.tp) % self.cp,
                "dp_rank": (r // (self.tp * self.cp)) % self.dp, "stage": r // self.per_stage,
                "etp_rank": w % self.etp, "ep_rank": (w // self.etp) % self.ep, "edp_rank": w // (self.etp * self.ep)}

    def group_arrays(self, kind: str, co: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(members, index): members[g] the ranks of group g in rank order (groups ordered by
        first member, as `groups`), index[r] the group of rank r. Every group of a kind has the
        same size, so members is a 2-D array."""
        size = self.size(kind)
        layout = self._LAYOUT.get(kind)
        if layout is not None:
            # ranks as an array over the coordinates (slowest first); a kind's groups are one
            # transpose and reshape of it, already in rank order and ordered by first member
            dims, axes = layout
            shape = tuple(getattr(self, d) for d in dims)
            members = np.arange(self.world, dtype=np.int64).reshape(shape).transpose(axes).reshape(-1, size)
            index = np.empty(self.world, dtype=np.int64)
            index[members.ravel()] = np.repeat(np.arange(members.shape[0]), size)
            return members, index
        co = co or self.coord_arrays()
        fixed = self._FIXED[kind]
        key = np.zeros(self.world, dtype=np.int64)
        for k in fixed:
            key = key * (int(co[k].max()) + 1) + co[k]
        order = np.lexsort((co["rank"], key))
        members = co["rank"][order].reshape(-1, size)
        members = members[np.argsort(members[:, 0], kind="stable")]
        index = np.empty(self.world, dtype=np.int64)
        index[members.ravel()] = np.repeat(np.arange(members.shape[0]), size)
        return members, index


def group_shape(devs: Sequence[int], topo: Topology) -> GroupShape:
    per_node = Counter(topo.node_of(d) for d in devs)
    leaves = {topo.leaf_of(d) for d in devs}
    counts = set(per_node.values())
    return GroupShape(len(devs), len(per_node), max(counts), len(counts) == 1, len(leaves), min(counts),
                      topo.span_class(devs))


POLICIES = ("megatron", "scattered", "random", "topology_aware")   # besides orders such as "dp-tp-cp-pp"


def placement(grid: RankGrid, topo: Topology, policy: str = "megatron", seed: int = 0,
              explicit: Sequence[int] | None = None) -> list[int]:
    """Rank -> device index (devices are numbered node by node).

      megatron      rank r on device r: tp fastest, so a tp group of 8 fills an 8-GPU node
      "dp-tp-cp-pp" any order of the four dimensions, first varying fastest over the devices:
                    device = sum_i coord[dim_i] x prod_{j<i} size[dim_j]
      scattered     Megatron order within a node, but consecutive nodes dealt round-robin over
                    the leaves, as a scheduler that scatters a job's nodes does: node k goes to
                    leaf k mod L (L leaves), slot k div L; tp groups stay inside nodes
      random        a seeded random permutation (a baseline for placement studies)
      topology_aware  tp groups inside a scale-up domain, dp/cp rings on one rail, stage groups
                    packed into the fabric's pods and leaf units (see `topology_aware`)
      explicit      the given list: explicit[r] is rank r's device
    Worked example (tp 2, dp 2, pp 2, order "dp-tp-cp-pp"): rank 1 (tp_rank 1, dp 0, stage 0)
    goes to device 0 + 1 x 2 = 2, so the dp pair {0, 2} of ranks shares devices 0 and 1 (an
    order policy needs no topology).

    >>> placement(RankGrid(tp=2, cp=1, dp=2, pp=2), None, "dp-tp-cp-pp")
    [0, 2, 1, 3, 4, 6, 5, 7]
    """
    if explicit is not None:
        return list(explicit)
    if policy == "megatron":
        return list(range(grid.world))
    if policy == "scattered":
        dpn = topo.devices_per_node
        nodes = grid.world // dpn
        leaves = max(1, -(-nodes // topo.nodes_per_leaf))
        out = []
        for r in range(grid.world):
            k = r // dpn
            phys = (k % leaves) * topo.nodes_per_leaf + k // leaves
            out.append(phys * dpn + r % dpn)
        if sorted(out) != list(range(grid.world)):      # leaves not evenly filled: keep Megatron order
            return list(range(grid.world))
        return out
    if policy == "topology_aware":
        return topology_aware(grid, topo)
    if policy == "random":
        return [int(x) for x in np.random.default_rng(seed).permutation(grid.world)]
    order = policy.split("-")
    size = {"tp": grid.tp, "cp": grid.cp, "dp": grid.dp, "pp": grid.pp}
    key = {"tp": "tp_rank", "cp": "cp_rank", "dp": "dp_rank", "pp": "stage"}
    out = []
    for r in range(grid.world):
        c = grid.coords(r)
        dev, stride = 0, 1
        for d in order:
            dev += c[key[d]] * stride
            stride *= size[d]
        out.append(dev)
    return out


def topology_aware(grid: RankGrid, topo: Topology) -> list[int]:
    """Topology-aware placement: a deterministic permutation built in three steps.

    1. Tensor parallel inside a scale-up domain. A domain of D devices holds s = D / tp whole tp
       groups, tp_rank t of the j-th group on local device j·tp + t. The s groups of a domain are
       consecutive in Megatron order within one pipeline stage (cp fastest, then dp), so a cp
       group of up to s members stays on the domain's scale-up fabric.
    2. Rails. Every rank's dp and cp peers sit at the same local device index j·tp + t on their
       domains, hence on the same NIC index: the same rail leaf of a rail-optimized fabric, the same
       plane of a multi-plane one.
    3. Stage groups into the fabric's hierarchy. The G = cp·dp / s domains of one pipeline stage
       (all of its dp and cp rings run among them) form a stage group. Groups are packed level by
       level, coarsest first (`Topology.placement_levels`: pods, then leaf units of a fat-tree;
       router groups of a dragonfly): in pipeline order, each group goes whole into the first
       container with room for it (first fit), so consecutive stages share a pod or unit; a group
       that fits nowhere whole is split over the containers with the most room, largest first, so
       it spans as few as possible. Then the same inside every container, with its pieces. A
       group's domains are ordered container by container, so its rings cross each container
       boundary once. This minimises the crossings of the coarsest (costliest) level first.
    Falls back to the Megatron order where tp does not divide the domain or cp·dp is not a
    multiple of s (a domain would mix stages); the Megatron order is also what comes out when the
    groups line up with the containers, or on a fabric without levels (a torus).

    Worked example (dgx-a100-2to1: leaf units of 16 nodes, 8 GPUs per node; tp 8, pp 4, dp 12,
    48 nodes): s = 1, G = 12. First fit: stage 0 -> unit 0 (4 left), stage 1 -> unit 1, stage 2
    -> unit 2; stage 3 fits nowhere whole and takes 4 + 4 + 4 nodes of units 0, 1, 2. Its dp
    rings cross the spine 3 times, the others never: 3 spine-crossing hops per rail. The Megatron
    order (stage s on nodes 12s..12s+11) puts stages 1 and 2 across two units each: 2 + 2 = 4."""
    world = grid.world
    dpn, tp = topo.devices_per_node, grid.tp
    if tp > dpn or dpn % tp:
        return list(range(world))
    s = dpn // tp
    per_stage = grid.cp * grid.dp
    if per_stage % s:
        return list(range(world))
    G = per_stage // s
    where = _pack([(st, G) for st in range(grid.pp)], list(range(topo.nodes)), topo.placement_levels())
    out = [0] * world
    for r in range(world):
        c = grid.coords(r)
        k, slot = divmod(c["cp_rank"] + grid.cp * c["dp_rank"], s)
        out[r] = where[c["stage"]][k] * dpn + slot * tp + c["tp_rank"]
    return out


def _pack(items: list, nodes: list, levels: list) -> dict:
    """key -> its nodes, for items [(key, number of nodes)] in order, over `nodes` nested in
    `levels` (per level, the container of every node; coarsest first). See `topology_aware`."""
    if not levels:
        out, pos = {}, 0
        for key, size in items:
            out.setdefault(key, []).extend(nodes[pos:pos + size])
            pos += size
        return out
    level = levels[0]
    members: dict = {}
    for n in nodes:
        members.setdefault(level[n], []).append(n)
    order = list(members)
    if len(order) == 1:
        return _pack(items, nodes, levels[1:])
    free = {c: len(members[c]) for c in order}
    placed: dict = {c: [] for c in order}
    split = []
    for key, size in items:
        for c in order:
            if free[c] >= size:
                placed[c].append((key, size))
                free[c] -= size
                break
        else:
            split.append((key, size))
    rank = {c: i for i, c in enumerate(order)}
    for key, size in split:
        left = size
        while left:
            c = max(order, key=lambda x: (free[x], -rank[x]))
            take = min(left, free[c])
            placed[c].append((key, take))
            free[c] -= take
            left -= take
    out: dict = {}
    for c in order:
        for key, ns in _pack(placed[c], members[c], levels[1:]).items():
            out.setdefault(key, []).extend(ns)
    return out


def placement_of(sc: Scenario, grid: RankGrid, topo: Topology) -> list[int]:
    p = sc.parallel
    return placement(grid, topo, p.placement, sc.seed, p.device_of_rank)


def equivalence_classes(grid: RankGrid, topo: Topology, place: Sequence[int] | np.ndarray | None = None,
                        mirror: bool = False, ep_split: bool = False, every_rank: bool = False,
                        rank_key: Sequence[int] | np.ndarray | None = None, experts: bool = False) -> list[RankClass]:
    """`mirror`: also keep every rank's mirror (stage pp-1-s) consistent, for schedules whose ranks
    exchange gradients with it. `ep_split`: ranks of different expert-parallel rank run different
    programs (uneven expert loads), so the ep_rank is part of the signature. `experts`: the model
    has experts, so the expert groups (ep, etp, edp) are part of it too. `rank_key`: an
    integer per rank that must also match (e.g. a straggler's slowdown class). `every_rank`: one
    class per rank (the brute-force reference the tests compare the grouping with).

    Vectorised over ranks (numpy): a rank's signature is a row of integers (stage, ep key, the
    shape id of each of its groups, the link class ids to its pipeline neighbours); refinement
    replaces it by (class, the sorted classes of each of its groups, the neighbours' classes)
    until the number of classes stops growing. Group shapes are computed once per group."""
    place = np.asarray(place if place is not None else placement(grid, topo), dtype=np.int64)
    world = grid.world
    co = grid.coord_arrays()
    kinds = grid.kinds(experts)
    ga = {k: grid.group_arrays(k, co) for k in kinds}
    node = place // topo.devices_per_node
    leaf = topo.fabric.leaves_of(place)
    shape_objs: list = []
    shape_ids: dict = {}
    gshape = {}
    for k in kinds:
        members, _ = ga[k]
        gshape[k] = _group_shapes(members, place, node, leaf, topo, shape_objs, shape_ids)
    pp_members, pp_index = grid.group_arrays("pp", co)
    P = grid.pp
    pos = co["stage"]
    prev = np.full(world, -1, dtype=np.int64)
    nxt = np.full(world, -1, dtype=np.int64)
    wrap = np.full(world, -1, dtype=np.int64)
    mir = np.full(world, -1, dtype=np.int64)
    row = pp_members[pp_index]                       # each rank's pp group, by stage
    if P > 1:
        prev[pos > 0] = row[pos > 0, pos[pos > 0] - 1]
        nxt[pos < P - 1] = row[pos < P - 1, pos[pos < P - 1] + 1]
        ends = (pos == 0) | (pos == P - 1)
        wrap[ends] = row[ends, np.where(pos[ends] == 0, P - 1, 0)]
    if mirror:
        mir = row[np.arange(world), P - 1 - pos]
    link_names: list = []
    link_ids: dict = {}

    def links(other):
        out = np.full(world, -1, dtype=np.int64)
        has = other >= 0
        if has.any():
            codes, names = topo.fabric.link_class_codes(place[has], place[other[has]])
            table = np.asarray([link_ids.setdefault(n, len(link_ids)) for n in names], dtype=np.int64)
            out[has] = table[codes]
        return out
    ln = links(nxt)
    if getattr(topo.fabric, "symmetric_links", False):
        # a link's class is the same both ways: rank r's link to its previous stage is that
        # rank's link to its next one
        lp = np.where(prev >= 0, ln[np.maximum(prev, 0)], -1)
    else:
        lp = links(prev)
    lw, lm = links(wrap), links(mir)
    link_names = {v: k for k, v in link_ids.items()}
    ep_key = co["ep_rank"] if ep_split else np.zeros(world, dtype=np.int64)
    extra = np.asarray(rank_key, dtype=np.int64) if rank_key is not None else np.zeros(world, dtype=np.int64)
    if every_rank:
        extra = co["rank"]
    cols = [co["stage"], ep_key, extra] + [gshape[k][ga[k][1]] for k in kinds] + [lp, ln, lw, lm]
    cls = _dense_ids(cols)
    n = int(cls.max()) + 1
    # one class per stage is already stable: every group but the pipeline's lies inside a stage
    # and every neighbour sits at a fixed stage, so a refinement round would give each rank of a
    # stage the same signature again (the symmetric case at any scale; skips its sorts)
    stable = n == P and not every_rank
    while not stable:
        cols = [cls]
        for k in kinds:
            members, index = ga[k]
            gsig = _dense_ids(np.sort(cls[members], axis=1))
            cols.append(gsig[index])
        for other in (prev, nxt, wrap, mir):
            cols.append(np.where(other >= 0, cls[np.maximum(other, 0)], -1))
        new = _dense_ids(cols)
        m = int(new.max()) + 1
        cls = new
        if m == n:
            break
        n = m
    order = np.argsort(cls, kind="stable")
    bounds = np.flatnonzero(np.diff(cls[order])) + 1
    groups_of = np.split(order, bounds)
    out = []
    for rs in sorted(groups_of, key=lambda g: int(g[0])):
        r0 = int(rs[0])
        c = int(cls[r0])
        shp = {k: shape_objs[int(gshape[k][ga[k][1][r0]])] for k in kinds}
        prs = {k: tuple(np.unique(cls[ga[k][0][ga[k][1][r0]]]).tolist()) for k in kinds}

        def opt(a, i):
            return int(cls[a[i]]) if a[i] >= 0 else None

        def lname(a, i):
            return link_names[int(a[i])] if a[i] >= 0 else None
        out.append(RankClass(
            id=c, stage=int(co["stage"][r0]), ranks=tuple(rs.tolist()),
            pp_prev=opt(prev, r0), pp_next=opt(nxt, r0), link_prev=lname(lp, r0), link_next=lname(ln, r0),
            pp_wrap=opt(wrap, r0), link_wrap=lname(lw, r0), pp_mirror=opt(mir, r0), link_mirror=lname(lm, r0),
            device=int(place[r0]), shapes=shp, peers=prs, ep_rank=int(co["ep_rank"][r0]),
        ))
    return out


def _dense_ids(rows, with_first: bool = False):
    """Row -> id, numbered by first appearance (deterministic). `rows` is a 2-D array
    (one row per item) or a list of equally long 1-D columns (contiguous, so faster). With
    `with_first`, also the index of each id's first row, in id order."""
    if isinstance(rows, (list, tuple)):
        cols = [np.asarray(c, dtype=np.int64) for c in rows]
    else:
        rows = np.asarray(rows, dtype=np.int64)
        cols = [rows[:, j] for j in range(rows.shape[1])]
    lo = [int(c.min()) for c in cols]
    span = [int(c.max()) - l + 1 for c, l in zip(cols, lo)]
    bits = float(sum(math.log2(x) for x in span))
    if bits < 62:
        # mixed-radix key per row: one 1-D unique instead of a row-wise one
        key = np.zeros(len(cols[0]), dtype=np.int64)
        for c, l, sp in zip(cols, lo, span):
            key = key * sp + (c - l)
        if bits < 24:
            # small key range: rank the keys with a presence table instead of sorting them
            present = np.zeros(int(np.prod(span)), dtype=bool)
            present[key] = True
            dense = np.cumsum(present) - 1
            inv = dense[key]
            first = np.full(int(dense[-1]) + 1, len(key), dtype=np.int64)
            np.minimum.at(first, inv, np.arange(len(key), dtype=np.int64))
        else:
            _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    else:
        _, first, inv = np.unique(np.stack(cols, axis=1), axis=0, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return (rank[inv], np.sort(first)) if with_first else rank[inv]


def _group_shapes(members, place, node, leaf, topo, objs: list, ids: dict):
    """Shape id of every group (rows of `members`): sizes and per-node counts from the node and
    leaf of each member's device, computed with numpy; the span class (a fabric question) is
    asked once per distinct (nodes, leaves) pattern of a group."""
    g, size = members.shape
    nd = np.sort(node[members], axis=1)
    new_run = np.ones((g, size), dtype=bool)
    new_run[:, 1:] = nd[:, 1:] != nd[:, :-1]
    n_nodes = new_run.sum(axis=1)
    # run lengths of equal nodes per row: positions of run starts, differences
    starts = np.flatnonzero(new_run.ravel())
    lengths = np.diff(np.append(starts, g * size))
    row_of = starts // size
    max_c = np.zeros(g, dtype=np.int64)
    min_c = np.full(g, size, dtype=np.int64)
    np.maximum.at(max_c, row_of, lengths)
    np.minimum.at(min_c, row_of, lengths)
    lf = np.sort(leaf[members], axis=1)
    n_leaves = 1 + (lf[:, 1:] != lf[:, :-1]).sum(axis=1) if size > 1 else np.ones(g, dtype=np.int64)
    out = np.empty(g, dtype=np.int64)
    one_host = topo.hosts_per_node == 1
    keys = np.stack([n_nodes, max_c, min_c, n_leaves], axis=1)
    local = (n_nodes == 1) if one_host else np.zeros(g, dtype=bool)
    if local.any():
        # every fabric: a group inside one single-host domain spans its scale-up fabric, so its
        # shape follows from the counts alone; one GroupShape per distinct row of counts
        sub = keys[local]
        inv, first = _dense_ids(sub, with_first=True)   # row -> id by first appearance (no row sort)
        uniq = sub[first]
        sid = []
        for k in uniq:
            shape = GroupShape(size, int(k[0]), int(k[1]), int(k[1]) == int(k[2]), int(k[3]), int(k[2]), "scale_up")
            sid.append(ids.setdefault(shape, len(ids)))
            if sid[-1] == len(objs):
                objs.append(shape)
        out[local] = np.asarray(sid, dtype=np.int64)[inv.reshape(-1)]
    span_of = getattr(topo.fabric, "span_of_leaves", None)
    for i in np.flatnonzero(~local):
        key = tuple(int(x) for x in keys[i])
        if span_of is not None and one_host:
            row = lf[i]
            span = span_of(key[0], row[np.r_[True, row[1:] != row[:-1]]])
        else:
            span = topo.span_class(place[members[i]].tolist())
        shape = GroupShape(size, key[0], key[1], key[1] == key[2], key[3], key[2], span)
        out[i] = ids.setdefault(shape, len(ids))
        if out[i] == len(objs):
            objs.append(shape)
    return out

