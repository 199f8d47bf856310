"""Rewrites of a lowered op list that keep its timeline: `merge_chains` folds runs of compute ops
that nothing can separate into one op; `merge_pair` interleaves two overlapped chains unit by
unit. Both take and return lists of `ir.EOp`.
"""
from __future__ import annotations

from simtrain.program.ir import EOp, stream_sequences


def merge_chains(ops: list[EOp]) -> list[EOp]:
    """Merges runs of compute ops that nothing can separate: b follows a on a's compute stream,
    waits for nothing but a, and nothing else waits for a (no send, bucket or gather hangs on
    a's end), within one action (same category, microbatch, chunk). b would start the instant a
    ends, so one op of both durations gives the same timeline. Memory is kept: the merged op
    allocates what a allocated at its start and frees what b freed at its end (a run never spans
    a microbatch's first allocation and its last free, checked by `inflight`). Returns the new
    list, ids renumbered in order."""
    refs = [0] * len(ops)
    for op in ops:
        for d in op.deps:
            refs[d] += 1
    streams = stream_sequences(ops)
    gone: dict = {}                      # absorbed op id -> the op that absorbed it

    def root(i):
        while i in gone:
            i = gone[i]
        return i
    for (cls, stream), seq in streams.items():
        if stream != "compute":
            continue
        head = None
        for b in seq:
            a = head
            bd = [root(d) for d in b.deps]
            ok = (a is not None and bd in ([], [a.id]) and refs[a.id] == len(bd)
                  and a.category == b.category and a.mb == b.mb and a.chunk == b.chunk
                  and not (a.inflight > 0 and b.inflight < 0) and b.alloc == 0 and a.free == 0
                  and b.transient == a.transient)
            if not ok:
                head = b
                continue
            a.fused = (a.fused or (("compute", a.category, a.duration, a.label),)) + (
                b.fused or (("compute", b.category, b.duration, b.label),))
            a.duration += b.duration
            a.flops += b.flops
            a.mem_bytes += b.mem_bytes
            a.free += b.free
            a.inflight += b.inflight
            refs[a.id] = refs[b.id]
            gone[b.id] = a.id
    if not gone:
        return ops
    keep = [op for op in ops if op.id not in gone]
    new_id = {op.id: i for i, op in enumerate(keep)}
    for op in keep:
        op.deps = sorted({new_id[root(d)] for d in op.deps})
        op.order = float(new_id[op.id]) if op.order == float(op.id) else op.order
    for op in keep:
        op.id = new_id[op.id]
    return keep


def merge_pair(ops: list[EOp], s0: int, s1: int, s2: int) -> tuple:
    """Interleaves two chains (ops[s0:s1] and ops[s1:s2]) unit by unit on every stream.

    A unit starts at a compute op and takes the communication issued after it. The merged order
    alternates units (a1 b1 a2 b2 ...); the ids of both chains are handed out again in that order
    as `order` keys, so each stream runs the pair in one consistent topological order. Returns the
    first compute op of each chain (the caller makes the pair wait for both inputs)."""
    def units(lo, hi):
        out = []
        for op in ops[lo:hi]:
            if op.stream == "compute" or not out:
                out.append([op])
            else:
                out[-1].append(op)
        return out

    ua, ub = units(s0, s1), units(s1, s2)
    merged = []
    for i in range(max(len(ua), len(ub))):
        if i < len(ua):
            merged += ua[i]
        if i < len(ub):
            merged += ub[i]
    keys = sorted(op.order for op in ops[s0:s2])
    for op, k in zip(merged, keys):
        op.order = k
    first_a = next(o for o in ops[s0:s1] if o.stream == "compute")
    first_b = next(o for o in ops[s1:s2] if o.stream == "compute")
    return first_a, first_b
