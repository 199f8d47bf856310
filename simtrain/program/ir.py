"""The programs' representation: `EOp`, one op on one stream of one rank class, and the streams'
issue order (`stream_sequences`). The lowering produces a list of EOps (ids are positions in
the list); the engine, the attribution and the exporters read it.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EOp:
    """One op of a program. `deps` are op ids; `rendezvous` names a collective across classes."""
    id: int
    cls: int
    stream: str
    kind: str                 # compute | coll | send
    category: str             # F | B | W | BW | opt | tp | dp | pp
    duration: float
    label: str
    mb: int = -1
    chunk: int = 0
    deps: list = field(default_factory=list)
    rendezvous: tuple | None = None
    peers: int = 1            # number of classes that must arrive at the rendezvous
    alloc: float = 0.0        # activation bytes allocated when the op starts
    free: float = 0.0         # activation bytes freed when the op ends (negative: allocated)
    transient: float = 0.0    # bytes held only while the op runs
    inflight: int = 0         # +1 at start (a microbatch-chunk's activations come alive), -1 at end
    bytes: float = 0.0        # communication size (for the trace)
    flops: float = 0.0        # compute: FLOPs executed (the Chakra export's num_ops; exact on unfused
                              # programs, simulate(fuse=False), which the export runs)
    mem_bytes: float = 0.0    # compute: bytes read and written (the Chakra export's tensor_size)
    order: float = -1.0       # position on its stream (defaults to the id)
    load: tuple = ()          # ((link, fraction of its capacity used when alone), ...): shared with overlapping ops
    net_key: object = None    # the network backend's key of the collective or transfer (its link report)
    fused: tuple = ()         # ((stream, category, seconds, label), ...): the parts of a compute op that absorbed
                              # collectives or the compute ops after it, in order (empty: the op is one part)


def stream_sequences(ops: list[EOp]) -> dict[tuple[int, str], list[EOp]]:
    """(class, stream) -> its ops in issue order."""
    streams: dict = {}
    for op in ops:
        streams.setdefault((op.cls, op.stream), []).append(op)
    for seq in streams.values():
        seq.sort(key=lambda o: (o.order, o.id))
    return streams
