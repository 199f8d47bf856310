"""NCCL's own choice of algorithm and protocol per collective and size, release by release.

NCCL predicts, for every (algorithm, protocol) it has enabled, time = latency + size / bandwidth
and runs the one with the smallest prediction (src/graph/tuning.cc: the per-communicator
latency / bandwidth tables built at init, and the per-call time in the tuner of src/enqueue.cc).
This module computes that prediction from NCCL's published constants, per release 2.18-2.23
(`shared/data/calibration/nccl-algorithms/nccl-tuning-constants-2.18-2.23.yaml`, which names the
tag, commit and blob of tuning.cc for each release), so that a scenario can run what a given NCCL
release would run. simtrain then times that choice with its own cost model
(`simtrain.network.collectives`); the NCCL prediction only chooses.

Per (algorithm a, protocol p), all in us and GB/s (NCCL's units):

    busBw   = nChannels x (nNodes <= 2 ? bwIntra : bwInter)         (per-channel graph speeds)
      Ring LL      min(llMaxBw, busBw x 1/2)              (2.18-2.20: x 1/4 across nodes or all-reduce, else 1/3)
      Ring LL128   min(busBw x (ppn < 2 ? 0.7 : 0.92), nChannels x perChMaxRingLL128Bw)   (2.23: 0.92)
      Tree         busBw = min(busBw x 0.92, nChannels x perChMaxTreeBw); then
                   LL min(busBw / 3.8, llMaxBw); LL128 min(busBw x (1 node ? 7/9 : 120/128),
                   nChannels x perChMaxTreeLL128Bw); then x 0.85 (tree graph pattern) across nodes
      NVLS         nvlsChannels x min(bwIntra, bwInter)
      NVLSTree     nvlsChannels x min(bwIntra, nNodes <= 2 ? bwInter : bwInter / 2)
    algBw   = busBw x ratio: Ring nRanks / nsteps, Tree 1/2, NVLS / NVLSTree 5/6
    latency Ring      base + (nsteps - nInter) x max(intraLat, netOverhead) + nInter x interLat
            Tree      base + 2 ((nRanks / nNodes - 1) intraLat + log2i(nNodes) interLat)
            NVLS      base + intraLat + (nNodes > 1 ? interLat : 0)          (2.18: 23 + 18 across nodes)
            NVLSTree  base + intraLat + 2 log2i(nNodes) interLat             (2.18: 23 + 2 (nNodes-1) 19)
    time    latency (x 1.4 for a multi-node Ring/Simple all-reduce of >= 64 B per channel and rank,
            SM80+) + nBytes / (1000 x algBw x treeCorrectionFactor[p][log2i(nBytes / 64)] for Tree)

with nInter = 2 nNodes (2.23: 2 (nNodes - 1)) network steps of a multi-node ring all-reduce and
nNodes - 1 of the other collectives; netOverhead 1 us (2 on AMD CPUs), x 3 for Simple, on more
than one node.

Worked example (NCCL 2.22, 3 nodes x 8 H100, 16 channels, bwInter 12 GB/s, Intel host), checked
against NCCL's own TUNING log of that job (github.com/NVIDIA/nccl/issues/1453): 256 B all-reduce, Tree/LL: latency 6.8 + 2 (7 x 0.6
+ 1 x 5.0) = 25.2 us; busBw 16 x 12 = 192 -> min(192 x 0.92, 16 x 36) = 176.6 -> LL min(176.6 /
3.8, 20.4) = 20.4 -> x 0.85 = 17.34 -> algBw 8.67 GB/s; time 25.2 + 256 / 8670 = 25.2295 us
(logged 25.229528).

The topology inputs are what NCCL's graph search would find, approximated (`inputs_for`):
nChannels 16 (what NCCL logs on 8-NIC H100 nodes), bwInter the largest entry of NCCL's speed
array (src/graph/search.cc) no faster than the node's NIC bandwidth over the channels, bwIntra
likewise from the scale-up bandwidth per GPU. Not modelled: CollNet (SHARP) and PAT (neither is
a simtrain algorithm), the per-call channel reduction for small sizes (it changes only which
channels run, not the prediction in 2.22-2.23), tuner plugins (a profile that ships one is
reproduced by pinning what it picks, `NCCL_ALGO` / `NCCL_PROTO`).
"""
from __future__ import annotations

from dataclasses import dataclass

from simtrain.errors import ConfigError, Problem

VERSIONS = ("2.18", "2.19", "2.20", "2.21", "2.22", "2.23")
LATEST = VERSIONS[-1]
NCCL_ALGOS = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
NCCL_PROTOS = ("LL", "LL128", "Simple")
# NCCL's algorithm name -> simtrain's algorithm that runs it (CollNet and PAT: none)
SIMTRAIN_NAME = {"Tree": "tree", "Ring": "ring", "NVLS": "nvls", "NVLSTree": "nvls_tree"}
MODELLED = ("Tree", "Ring", "NVLS", "NVLSTree")

# --- constants (source: nccl-tuning-constants-2.18-2.23.yaml; 2.18 = 2.18.3-2.18.6) ---------
# baseLat [algo] -> (LL, LL128, Simple), us
_BASE_218 = {"Tree": (6.8, 14.0, 0.0), "Ring": (6.6, 14.0, 8.4), "NVLS": (0.0, 0.0, 23.0), "NVLSTree": (0.0, 0.0, 23.0)}
_BASE_219 = {"Tree": (6.8, 14.0, 0.0), "Ring": (6.6, 14.0, 8.4), "NVLS": (0.0, 0.0, 0.0), "NVLSTree": (0.0, 0.0, 0.0)}
_BASE_223 = {"Tree": (6.8, 14.0, 8.4), "Ring": (6.6, 14.0, 8.4), "NVLS": (0.0, 0.0, 0.0), "NVLSTree": (0.0, 0.0, 0.0)}
# hwLat [NVLINK | NET][algo] -> (LL, LL128, Simple), us
_HW_218 = {"NVLINK": {"Tree": (.6, 1.25, 4.0), "Ring": (.6, 1.9, 3.4), "NVLS": (0, 0, 0), "NVLSTree": (0, 0, 0)},
           "NET": {"Tree": (5.0, 8.5, 14.0), "Ring": (2.7, 4.0, 14.0), "NVLS": (0, 0, 18.0), "NVLSTree": (0, 0, 19.0)}}
_HW_219 = {"NVLINK": {"Tree": (.6, 1.25, 28.0), "Ring": (.6, 1.9, 3.4), "NVLS": (0, 0, 23.0), "NVLSTree": (0, 0, 23.0)},
           "NET": {"Tree": (5.0, 8.5, 28.0), "Ring": (2.7, 4.0, 14.0), "NVLS": (0, 0, 18.0), "NVLSTree": (0, 0, 14.0)}}
_HW_221 = {"NVLINK": {**_HW_219["NVLINK"], "NVLS": (0, 0, 25.0), "NVLSTree": (0, 0, 25.0)}, "NET": _HW_219["NET"]}
_HW_223 = {"NVLINK": {"Tree": (.6, 1.25, 4.0), "Ring": (.6, 1.9, 3.4), "NVLS": (0, 0, 25.0), "NVLSTree": (0, 0, 25.0)},
           "NET": {"Tree": (5.0, 8.5, 14.0), "Ring": (2.7, 4.0, 14.0), "NVLS": (0, 0, 18.0), "NVLSTree": (0, 0, 14.0)}}
# llMaxBws rows: 0 Volta (1 node) / Intel host, 1 Ampere (1 node) / AMD host, 2 Hopper (1 node); columns N1, N2, N4
_LLMAX_218 = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (87.7, 22.5, 19.0))
_LLMAX_221 = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0))
# per-channel ceilings by compute capability (Volta, Ampere, Hopper) and node column (N1, N2, N4)
PER_CH_RING_LL128 = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7))
PER_CH_TREE_LL128 = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0))
PER_CH_TREE = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0))
# treeCorrectionFactor [proto][log2i(nBytes >> 6)], 64 B ... 256 MiB (same in every release here)
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
}
# src/graph/search.cc speed arrays (GB/s per channel): generic, and SM90 (Hopper) per release
SPEED_INTRA = (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0)
SPEED_INTER = (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2, 0.24, 0.12)
SM90_INTRA_218 = (60.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 6.0, 3.0)
SM90_INTRA_219 = (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 6.0, 3.0)
SM90_INTRA_221 = (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0)
SM90_INTER_218 = (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12)
SM90_INTER_219 = (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12)
CHANNELS = 16               # coll channels NCCL logs on 8-NIC H100 nodes (3 x 8 H100 TUNING log: "16 coll channels")
NVLS_CHANNELS = 16          # NCCL_NVLS_NCHANNELS default


@dataclass(frozen=True)
class Constants:
    base: dict
    hw: dict
    llmax: tuple
    ring_ll_half: bool          # 2.21+: Ring LL at busBw / 2 (before: 1/4 or 1/3)
    ring_ll128_ppn1: bool       # up to 2.22: Ring LL128 at 0.7 of busBw with one rank per node
    inter_steps_n_minus_1: bool  # 2.23: a ring all-reduce counts 2 (nNodes - 1) network steps (before: 2 nNodes)
    nvls_218: bool              # 2.18's NVLS / NVLSTree latency and NVLSTree ratio forms
    ppn1_tree_net: bool         # 2.23: one rank per node times the ring's network steps with the tree's latency


def constants(version: str) -> Constants:
    """NCCL's tuning constants for a release ("2.18" ... "2.23")."""
    if version not in VERSIONS:
        raise ValueError(f"NCCL {version}: tuning constants known for {', '.join(VERSIONS)}")
    minor = int(version.split(".")[1])
    base = _BASE_218 if minor == 18 else _BASE_223 if minor >= 23 else _BASE_219
    hw = {18: _HW_218, 19: _HW_219, 20: _HW_219, 21: _HW_221, 22: _HW_221}.get(minor, _HW_223)
    return Constants(base, hw, _LLMAX_221 if minor >= 21 else _LLMAX_218, minor >= 21, minor <= 22, minor >= 23,
                     minor == 18, minor >= 23)


@dataclass(frozen=True)
class Inputs:
    """What NCCL's tuner knows of the communicator: nodes, ranks, ranks per node, the coll
    channel count and per-channel graph speeds (GB/s), the GPUs' compute-capability index
    (0 Volta, 1 Ampere, 2 Hopper), the host CPU (AMD or not) and whether NVLS is supported."""
    nodes: int
    ranks: int
    channels: int = CHANNELS
    bw_intra: float = 24.0
    bw_inter: float = 12.0
    compcap: int = 2
    amd: bool = False
    nvls: bool = True

    @property
    def ppn(self) -> int:
        return self.ranks // max(1, self.nodes)


def _log2i(x: int) -> int:
    return x.bit_length() - 1 if x > 0 else -1


def _node_col(nodes: int) -> int:
    return 0 if nodes == 1 else 1 if nodes == 2 else 2


def bandwidth(version: str, coll: str, algo: str, proto: str, x: Inputs) -> float:
    """NCCL's algorithm bandwidth (GB/s) of one (algorithm, protocol), 0 where NCCL disables it."""
    c = constants(version)
    if algo not in MODELLED or (algo in ("NVLS", "NVLSTree") and (proto != "Simple" or not x.nvls)):
        return 0.0
    if algo in ("Tree", "NVLS", "NVLSTree") and coll != "all_reduce":
        return 0.0
    if (algo == "NVLSTree" and x.nodes == 1) or (algo == "NVLS" and x.nodes > 1):
        return 0.0          # NVLSTree off on one node; NVLS across nodes only with CollNet
    col = _node_col(x.nodes)
    bw = x.bw_intra if x.nodes <= 2 else x.bw_inter
    bus = x.channels * bw
    llmax = c.llmax[x.compcap if x.nodes == 1 else (1 if x.amd else 0)][col]
    if algo == "Ring":
        nsteps = 2 * (x.ranks - 1) if coll == "all_reduce" else x.ranks - 1
        ratio = x.ranks / nsteps
        if proto == "LL":
            share = 0.5 if c.ring_ll_half else (0.25 if (x.nodes > 1 or coll == "all_reduce") else 1 / 3)
            bus = min(llmax, bus * share)
        elif proto == "LL128":
            share = 0.7 if (c.ring_ll128_ppn1 and x.ppn < 2) else 0.92
            bus = min(bus * share, x.channels * PER_CH_RING_LL128[x.compcap][col])
    elif algo == "Tree":
        ratio = 0.5
        bus = min(bus * 0.92, x.channels * PER_CH_TREE[x.compcap][col])
        if proto == "LL":
            bus = min(bus / 3.8, llmax)
        elif proto == "LL128":
            bus = min(bus * (7 / 9 if x.nodes == 1 else 120 / 128), x.channels * PER_CH_TREE_LL128[x.compcap][col])
        if x.nodes > 1:
            bus *= 0.85     # the tree graph pattern (2.18.3+)
    elif algo == "NVLS":
        ratio = 5 / 6
        bus = NVLS_CHANNELS * min(x.bw_intra, x.bw_inter if x.nodes > 1 else x.bw_intra)
    else:
        ratio = 0.70 * x.nodes / (2 * (x.nodes - 1)) if c.nvls_218 else 5 / 6
        bus = NVLS_CHANNELS * min(x.bw_intra, x.bw_inter if x.nodes <= 2 else x.bw_inter / 2)
    return bus * ratio


def latency(version: str, coll: str, algo: str, proto: str, x: Inputs) -> float:
    """NCCL's latency (us) of one (algorithm, protocol) for one call."""
    c = constants(version)
    pi = NCCL_PROTOS.index(proto)
    base = c.base[algo][pi]
    intra = c.hw["NVLINK"][algo][pi]
    inter = c.hw["NET"][algo][pi]
    if algo == "Ring":
        if c.ppn1_tree_net and x.ppn == 1:
            inter = c.hw["NET"]["Tree"][pi]
        nsteps = 2 * (x.ranks - 1) if coll == "all_reduce" else x.ranks - 1
        if x.nodes == 1:
            n_inter = 0
        elif coll == "all_reduce":
            n_inter = 2 * (x.nodes - 1) if c.inter_steps_n_minus_1 else 2 * x.nodes
        else:
            n_inter = x.nodes - 1
        overhead = ((2.0 if x.amd else 1.0) * (3 if proto == "Simple" else 1)) if x.nodes > 1 else 0.0
        return base + (nsteps - n_inter) * max(intra, overhead) + n_inter * inter
    if algo == "Tree":
        return base + 2 * ((x.ppn - 1) * intra + _log2i(x.nodes) * inter)
    if algo == "NVLS":
        if c.nvls_218:
            return 23.0 + (18.0 if x.nodes > 1 else 0.0)
        return base + intra + (inter if x.nodes > 1 else 0.0)
    if c.nvls_218:
        return 23.0 + 2 * (x.nodes - 1) * 19.0
    return base + intra + 2 * _log2i(x.nodes) * inter


def predicted_us(version: str, coll: str, nbytes: float, algo: str, proto: str, x: Inputs) -> float | None:
    """NCCL's predicted time (us) of one call, None where the pair is disabled."""
    bw = bandwidth(version, coll, algo, proto, x)
    if bw <= 0:
        return None
    lat = latency(version, coll, algo, proto, x)
    if (algo == "Ring" and proto == "Simple" and coll == "all_reduce" and x.nodes > 1
            and nbytes / (x.channels * x.ranks) >= 64):
        lat *= 1.9 if x.compcap == 0 else 1.4
    if algo == "Tree" and coll == "all_reduce":
        log_size = _log2i(int(nbytes) >> 6)
        if 0 <= log_size < 23:
            bw *= TREE_CORRECTION[proto][log_size]
    return lat + nbytes / (1000 * bw)


def ranking(version: str, coll: str, nbytes: float, x: Inputs, algos: tuple = MODELLED,
            protos: tuple = NCCL_PROTOS) -> list:
    """[(time us, algorithm, protocol)] of every enabled pair among those allowed, fastest first
    (ties in NCCL's index order: algorithms Tree, Ring, ..., protocols LL, LL128, Simple)."""
    out = []
    for a in NCCL_ALGOS:
        for p in NCCL_PROTOS:
            if a not in algos or p not in protos:
                continue
            t = predicted_us(version, coll, nbytes, a, p, x)
            if t is not None:
                out.append((t, NCCL_ALGOS.index(a), NCCL_PROTOS.index(p), a, p))
    out.sort()
    return [(t, a, p) for t, _, _, a, p in out]


def select(version: str, coll: str, nbytes: float, x: Inputs, algos: tuple = MODELLED,
           protos: tuple = NCCL_PROTOS) -> tuple | None:
    """(algorithm, protocol, time us) NCCL runs, or None when nothing allowed is enabled."""
    r = ranking(version, coll, nbytes, x, algos, protos)
    return (r[0][1], r[0][2], r[0][0]) if r else None


def parse_list(value: str | None, names: tuple, where: str) -> tuple:
    """An NCCL_ALGO / NCCL_PROTO string in NCCL's syntax: names separated by commas, case
    insensitive; a leading ^ excludes the names listed. None or "" allows every name.
    Example: "^LL128" over (LL, LL128, Simple) -> (LL, Simple)."""
    if value is None or not str(value).strip():
        return names
    s = str(value).strip()
    exclude = s.startswith("^")
    if exclude:
        s = s[1:]
    wanted = []
    for part in s.split(","):
        part = part.strip()
        hit = next((n for n in names if n.lower() == part.lower()), None)
        if hit is None:
            raise ConfigError([Problem("scenario", where, f"unknown name {part!r} in {value!r}",
                                       f"use names among {', '.join(names)}, comma-separated, ^ first to exclude")])
        wanted.append(hit)
    return tuple(n for n in names if (n in wanted) != exclude)


@dataclass(frozen=True)
class Policy:
    """The NCCL release whose tuner chooses, and what NCCL_ALGO / NCCL_PROTO allow."""
    version: str = LATEST
    algos: tuple = MODELLED
    protos: tuple = NCCL_PROTOS

    @property
    def pinned(self) -> bool:
        """Whether NCCL_ALGO / NCCL_PROTO restrict the choice (a measured table, taken under
        NCCL's free choice, then no longer times the collective)."""
        return self.algos != MODELLED or self.protos != NCCL_PROTOS

    def simtrain_algorithms(self) -> tuple:
        return tuple(SIMTRAIN_NAME[a] for a in self.algos if a in SIMTRAIN_NAME)


def policy_of(network: object) -> Policy:
    """The policy a scenario's `network` section sets: `nccl_version`, `nccl_algo` /
    `nccl_proto`, or `env: {NCCL_ALGO, NCCL_PROTO}` (the explicit keys win)."""
    env = dict(getattr(network, "env", None) or {})
    algo = getattr(network, "nccl_algo", None) or env.get("NCCL_ALGO")
    proto = getattr(network, "nccl_proto", None) or env.get("NCCL_PROTO")
    where_a = "network.nccl_algo" if getattr(network, "nccl_algo", None) else "network.env.NCCL_ALGO"
    where_p = "network.nccl_proto" if getattr(network, "nccl_proto", None) else "network.env.NCCL_PROTO"
    algos = tuple(a for a in parse_list(algo, NCCL_ALGOS, where_a) if a in MODELLED)
    if not algos:
        raise ConfigError([Problem("scenario", where_a, f"{algo!r} leaves none of {', '.join(MODELLED)} "
                                   "(CollNet and PAT are not modelled)", "allow at least one of them")])
    protos = parse_list(proto, NCCL_PROTOS, where_p)
    if not protos:
        raise ConfigError([Problem("scenario", where_p, f"{proto!r} excludes every protocol", "allow at least one")])
    return Policy(version_of(getattr(network, "nccl_version", None)), algos, protos)


def version_of(value: object) -> str:
    """A release "2.MM" from what a scenario gives: "2.22", "2.22.3", "v2.22.3-1", or the number
    2.22 (YAML reads an unquoted 2.20 as 2.2: a number is read with two decimals)."""
    if value is None or value == "":
        return LATEST
    s = f"{value:.2f}" if isinstance(value, float) else str(value).strip().lstrip("v")
    rel = ".".join(s.split("-")[0].split(".")[:2])
    if rel not in VERSIONS:
        raise ConfigError([Problem("scenario", "network.nccl_version", f"NCCL {value!r}: no tuning constants for it",
                                   f"use one of {', '.join(VERSIONS)}")])
    return rel


def snap(speed: float, array: tuple) -> float:
    """The largest entry of a speed array no faster than `speed` (the array's last if none)."""
    return next((s for s in array if s <= speed + 1e-9), array[-1])


def inputs_for(nodes: int, ranks: int, intra_gbps: float, node_net_gbps: float, compcap: int = 2,
               nvls: bool = True, amd: bool = False, version: str = LATEST,
               channels: int = CHANNELS) -> Inputs:
    """Tuner inputs from a fabric: per-channel speeds as NCCL's graph search would settle them
    (approximated): the scale-up bandwidth per GPU and the node's NIC bandwidth (GB/s) over the
    channels, each snapped down to NCCL's speed array for the GPU generation and release."""
    minor = int(version.split(".")[1])
    if compcap == 2:
        intra_arr = SM90_INTRA_218 if minor == 18 else SM90_INTRA_219 if minor <= 20 else SM90_INTRA_221
        inter_arr = SM90_INTER_218 if minor == 18 else SM90_INTER_219
    else:
        intra_arr, inter_arr = SPEED_INTRA, SPEED_INTER
    bw_intra = snap(intra_gbps / channels, intra_arr)
    bw_inter = snap(node_net_gbps / channels, inter_arr) if nodes > 1 else bw_intra
    return Inputs(nodes, ranks, channels, bw_intra, bw_inter, compcap, amd, nvls)


def borrowed_note(vendor: str, measured: bool) -> str | None:
    """The coverage note of a device whose collective library is not NCCL and has no measured
    collective table: its algorithm and protocol are NCCL's tuner's choice with the constants of
    the generation `compcap_of` falls back to (Ampere, A100), and its fabric is uncalibrated.
    Cambricon only: no public CNCL tuning table or all-reduce sweep was found (docs/modelling/mlu.md)."""
    if vendor != "Cambricon" or measured:
        return None
    return ("collectives borrowed: NCCL's tuning model with its Ampere (A100) constants picks the algorithm and "
            "protocol and prices the protocols for CNCL (no public CNCL tuning table or collective measurement "
            "found); fabric efficiencies uncalibrated (1.0)")


def compcap_of(device_name: str) -> int:
    """NCCL's compute-capability index of a device: 2 Hopper and later, 1 Ampere, 0 older."""
    d = device_name.lower()
    if any(k in d for k in ("h100", "h200", "h800", "h20", "gh200", "b200", "gb200", "b100")):
        return 2
    if any(k in d for k in ("a100", "a800", "a10", "a40", "a30")):
        return 1
    return 1
