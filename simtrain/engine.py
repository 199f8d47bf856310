"""Engine (sixth pipeline stage): SimPy execution of the per-class programs.

Each (class, stream) is a SimPy process that issues its ops in order; an op starts when its
dependencies are done and, for a collective spanning several classes, when every peer class has
arrived (rendezvous). Overlap and exposed communication fall out of the run. Memory is a counter
with a peak per class (never a blocking container: an out-of-memory plan still runs to the end).

A drained event queue with ops still pending raises DeadlockError naming, per blocked stream,
the op it waits on and what it waits for.
"""
from __future__ import annotations

from dataclasses import dataclass

import simpy

from simtrain.errors import DeadlockError
from simtrain.program import stream_sequences


@dataclass
class Timeline:
    start: list
    end: list
    mem_peak: dict        # class id -> peak dynamic (activation) bytes
    inflight_peak: dict   # class id -> most microbatch-chunks whose activations were alive at once
    step_time: float
    events: int


def run(ops: list, class_ids: list) -> Timeline:
    env = simpy.Environment()
    n = len(ops)
    done = [env.event() for _ in range(n)]
    start = [None] * n
    end = [None] * n
    mem_cur = {c: 0.0 for c in class_ids}
    mem_peak = {c: 0.0 for c in class_ids}
    infl_cur = {c: 0 for c in class_ids}
    infl_peak = {c: 0 for c in class_ids}
    rdv: dict = {}
    streams = stream_sequences(ops)
    waiting = {}

    def proc(key, seq):
        for op in seq:
            for d in op.deps:
                ev = done[d]
                if not ev.processed:
                    waiting[key] = (op, d)
                    yield ev
            if op.rendezvous is not None:
                slot = rdv.get(op.rendezvous)
                if slot is None:
                    slot = rdv[op.rendezvous] = [0, env.event()]
                slot[0] += 1
                if slot[0] == op.peers:
                    slot[1].succeed()
                else:
                    waiting[key] = (op, "rendezvous")
                    yield slot[1]
            waiting.pop(key, None)
            t0 = env.now
            start[op.id] = t0
            c = op.cls
            if op.alloc or op.transient:
                cur = mem_cur[c] + op.alloc
                mem_cur[c] = cur
                if cur + op.transient > mem_peak[c]:
                    mem_peak[c] = cur + op.transient
            if op.inflight > 0:
                infl_cur[c] += op.inflight
                infl_peak[c] = max(infl_peak[c], infl_cur[c])
            if op.duration > 0:
                yield env.timeout(op.duration)
            end[op.id] = env.now
            if op.free:
                mem_cur[c] -= op.free
                if mem_cur[c] > mem_peak[c]:      # a B that keeps more than it frees
                    mem_peak[c] = mem_cur[c]
            if op.inflight < 0:
                infl_cur[c] += op.inflight
            done[op.id].succeed()

    for key in sorted(streams):
        env.process(proc(key, streams[key]))
    env.run()
    pending = [i for i in range(n) if end[i] is None]
    if pending:
        lines = []
        for key, (op, what) in sorted(waiting.items(), key=lambda kv: kv[0]):
            if what == "rendezvous":
                lines.append(f"class {key[0]} stream {key[1]}: {op.label} waits at a collective for peers that never arrived")
            else:
                dep = ops[what]
                lines.append(f"class {key[0]} stream {key[1]}: {op.label} waits on {dep.label} (class {dep.cls}, stream {dep.stream})")
        raise DeadlockError("simulation deadlocked with %d ops pending:\n  %s" % (len(pending), "\n  ".join(lines[:20])))
    return Timeline(start, end, mem_peak, infl_peak, max(end) if end else 0.0, n)
