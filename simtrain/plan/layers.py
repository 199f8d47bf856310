"""The layer split over pipeline stages: how many language-model layers each model stage holds.

Takes a Scenario and the number of model stages; returns layer counts per stage as given
(`parallel.layers_per_stage`), from Megatron's first/last-stage counts, an even split (the
embedding and loss counted as layers where Megatron-core's account_for_* flags say so), or in
proportion to each stage's device speed (`balanced`, for mixed clusters, measured on the dense
layer's calibrated compute time).
"""
from __future__ import annotations

from simtrain.cost.roofline import CalibratedRoofline
from simtrain.hardware.devices import get_device
from simtrain.spec.scenario import Scenario
from simtrain.workload.ir import Ring
from simtrain.workload.transformer import LayerBuilder


def stage_layer_counts(sc: Scenario, num_stages: int) -> tuple:
    """Language-model layers of each model stage: `parallel.layers_per_stage` as given, else
    Megatron's first/last-stage counts with the rest spread evenly, else an even split (validated
    on load). An encoder on its own k pipeline stages takes the first k (0 LM layers there)."""
    p = sc.parallel
    k = sc.model.encoder.pipeline_stages if sc.model.encoder is not None else 0
    if p.layers_per_stage == "balanced":
        return (0,) * k + balanced_layers(sc, num_stages - k, k)
    if p.layers_per_stage is not None:
        return (0,) * k + tuple(p.layers_per_stage)
    e, l = int(p.account_for_embedding_in_pipeline_split), int(p.account_for_loss_in_pipeline_split)
    if e or l:
        return (0,) * k + accounted_split(sc.model.num_layers, num_stages - k, e, l)
    return (0,) * k + even_split(sc.model.num_layers, num_stages - k, p.first_stage_layers, p.last_stage_layers)


def accounted_split(layers: int, stages: int, embedding: int, loss: int) -> tuple:
    """Megatron-core's split with account_for_embedding_in_pipeline_split (`embedding` 1) and
    account_for_loss_in_pipeline_split (`loss` 1): the embedding and the loss count as one layer
    each, the total splits evenly over the model stages, and the first (last) stage holds one
    transformer layer fewer (megatron/core/transformer/transformer_block.py, the layers to build
    per virtual stage; the loader checks that the total divides).

    Worked example (Llama 3.1 405B: 126 layers, pp 8 x vpp 8 = 64 stages, both counted): 128 / 64
    = 2 per stage, 1 on the first and 1 on the last.

    >>> c = accounted_split(126, 64, 1, 1); (c[0], c[1], c[-2], c[-1], sum(c))
    (1, 2, 2, 1, 126)
    >>> accounted_split(31, 4, 1, 0)
    (7, 8, 8, 8)
    """
    each = (layers + embedding + loss) // stages
    counts = [each] * stages
    counts[0] -= embedding
    counts[-1] -= loss
    return tuple(counts)


def even_split(layers: int, stages: int, first: int | None = None, last: int | None = None) -> tuple:
    """Megatron's uneven split: `first` layers on the first stage and `last` on the last (when
    given), the rest spread evenly over the other stages (the loader checks that they divide).

    Worked example (30 layers, 4 stages, first 6, last 6): 18 over the 2 middle stages, 9 each.

    >>> even_split(30, 4, first=6, last=6)
    (6, 9, 9, 6)
    >>> even_split(32, 4, last=2)          # 30 over the first three stages
    (10, 10, 10, 2)
    >>> even_split(24, 4)
    (6, 6, 6, 6)
    """
    fixed = [x for x in (first, last) if x is not None]
    rest = stages - len(fixed)
    each = (layers - sum(fixed)) // rest if rest else 0
    counts = [each] * stages
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return tuple(counts)


def stage_speeds(sc: Scenario, stages: int, offset: int = 0) -> tuple:
    """Layers per second of the slowest device of each pipeline stage in Megatron placement (stage
    s on the s-th block of tp·cp·dp consecutive devices), from cluster.mixed: 1 / the compute time
    of one layer (forward, recompute, backward) under that device's calibrated costs. Peak FLOP/s
    would mislead where small or memory-bound operators dominate."""
    c, p = sc.cluster, sc.parallel
    lp = LayerBuilder(sc).layer()
    items = [it for seq in (lp.forward, lp.recompute, lp.backward) for it in seq]
    segs = [it for it in items if isinstance(it, tuple)] + [it.segment for it in items if isinstance(it, Ring) for _ in range(it.steps)]
    speed: dict = {}

    def layer_speed(dev: str) -> float:
        if dev not in speed:
            costs = CalibratedRoofline(get_device(dev), sc.training.precision)
            speed[dev] = 1.0 / sum(costs.sequence_time(seg) for seg in segs)
        return speed[dev]
    per = p.tp * p.cp * p.dp
    total_nodes = c.nodes
    dpn = max(1, sc.world_size // total_nodes)
    kinds = []
    for n, dev in c.mixed:
        kinds += [dev] * n
    kinds += [c.device] * (total_nodes - len(kinds))
    out = []
    for s in range(offset, offset + stages):
        lo, hi = s * per // dpn, ((s + 1) * per - 1) // dpn
        out.append(min(layer_speed(kinds[n]) for n in range(lo, hi + 1)))
    return tuple(out)


def balanced_layers(sc: Scenario, stages: int, offset: int = 0) -> tuple:
    """`layers_per_stage: balanced`: layers in proportion to each stage's speed (`stage_speeds`),
    at least one each, summing to num_layers (largest remainder). The same devices everywhere
    give the even split (`proportional_split`). Assumes Megatron placement (stage s on the s-th
    block of devices)."""
    return proportional_split(sc.model.num_layers, stage_speeds(sc, stages, offset))


def proportional_split(layers: int, speeds: tuple) -> tuple:
    """`layers` in proportion to `speeds`, at least one per stage, by largest remainder (ties to
    the earlier stage).

    Worked example (24 layers, speeds 2, 2, 1, 1): 24·2/6 = 8, 8, then 4, 4. With speeds 3, 2, 2
    and 10 layers the raw shares are 4.29, 2.86, 2.86: floors 4, 2, 2, the two spare layers to the
    largest remainders (stages 1 and 2).

    >>> proportional_split(24, (2, 2, 1, 1))
    (8, 8, 4, 4)
    >>> proportional_split(10, (3, 2, 2))
    (4, 3, 3)
    >>> proportional_split(4, (100, 1, 1))   # every stage keeps at least one layer
    (2, 1, 1)
    """
    L, v, stages = layers, speeds, len(speeds)
    tot = sum(v)
    raw = [L * x / tot for x in v]
    counts = [max(1, int(r)) for r in raw]
    order = sorted(range(stages), key=lambda i: (-(raw[i] - int(raw[i])), i))
    i = 0
    while sum(counts) < L:
        counts[order[i % stages]] += 1
        i += 1
    while sum(counts) > L:
        j = max((j for j in range(stages) if counts[j] > 1), key=lambda j: (counts[j] - raw[j], j))
        counts[j] -= 1
    return tuple(counts)
