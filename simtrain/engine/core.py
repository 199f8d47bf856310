"""Engine (sixth pipeline stage): SimPy execution of the per-class programs.

Each (class, stream) is a SimPy process that issues its ops in order; an op starts when its
dependencies are done and, for a collective spanning several classes, when every peer class has
arrived (rendezvous). Overlap and exposed communication fall out of the run. Memory is a counter
with a peak per class (never a blocking container: an out-of-memory plan still runs to the end).

A drained event queue with ops still pending raises DeadlockError naming, per blocked stream,
the op it waits on and what it waits for.

Ops that carry a network `load` (the flow backend gives one to every collective and pipeline
send that uses the scale-out fabric) do not simply wait out their duration: they share the
links with every other such op running at the same time (`FluidNetwork`).
"""
from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass

import simpy

from simtrain.errors import DeadlockError
from simtrain.program.ir import EOp, stream_sequences


class FluidNetwork:
    """Contention between communication ops that overlap in time, inside the SimPy run.

    Each op i has its duration D_i when it runs alone (from the flow backend, contention among
    its own flows included) and its load: u_ie, the fraction of link e's capacity it uses on
    average when alone. Running ops progress at rates r_i in (0, 1] (isolated seconds per
    second), chosen max-min fair subject to sum_i u_ie r_i <= 1 on every link by progressive
    filling (Bertsekas & Gallager §6.5.2), recomputed whenever an op starts or ends. While no
    link is over-subscribed every rate is 1 and the op takes exactly D_i.
    Worked example: A (D 1 s, u 1.0 on link e) starts at 0, B (the same) at 0.5: A runs alone to
    0.5 (0.5 s left), both at 0.5 until A ends at 1.5; B, 0.5 s done, alone again, ends at 2.0.
    """

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.active: dict = {}    # op id -> [remaining isolated seconds, rate, load, done event, duration]
        self.use: dict = {}       # link -> sum of u of the running ops (at rate 1)
        self.over: set = set()    # links with use > 1
        self.t = 0.0
        self.gen = 0

    def start(self, op: EOp) -> simpy.Event:
        self._advance()
        ev = self.env.event()
        self.active[op.id] = [op.duration, 1.0, op.load, ev, op.duration]
        for e, u in op.load:
            x = self.use.get(e, 0.0) + u
            self.use[e] = x
            if x > 1 + 1e-9:
                self.over.add(e)
        self._rates()
        self._schedule()
        return ev

    def _advance(self):
        dt = self.env.now - self.t
        if dt > 0:
            for a in self.active.values():
                a[0] -= a[1] * dt
        self.t = self.env.now

    def _rates(self):
        act = self.active
        if not self.over:
            for a in act.values():
                a[1] = 1.0
            return
        over = self.over
        contended = [i for i, a in act.items() if any(e in over for e, _ in a[2])]
        for i, a in act.items():
            a[1] = 1.0
        # links that matter: the over-subscribed ones (rates only fall, so no other link can fill)
        fixed = {e: self.use[e] for e in over}
        for i in contended:
            for e, u in act[i][2]:
                if e in over:
                    fixed[e] -= u
        demand = {e: 0.0 for e in over}
        for i in contended:
            for e, u in act[i][2]:
                if e in over:
                    demand[e] += u
        left = set(contended)
        while left:
            level, tight = 1.0, None
            for e, d in demand.items():
                if d > 0:
                    r = (1.0 - fixed[e]) / d
                    if r < level:
                        level, tight = r, e
            if tight is None:
                break                       # every remaining op can run at full speed
            level = max(level, 1e-9)
            frozen = [i for i in left if any(e == tight for e, _ in act[i][2])]
            for i in frozen:
                act[i][1] = level
                left.discard(i)
                for e, u in act[i][2]:
                    if e in demand:
                        demand[e] -= u
                        fixed[e] += u * level
            demand[tight] = 0.0

    def _schedule(self):
        self.gen += 1
        if not self.active:
            return
        ends = {i: (a[0] / a[1] if a[1] > 0 else float("inf")) for i, a in self.active.items()}
        dt = max(min(ends.values()), 0.0)
        # the ops this timer ends: those due at dt (to rounding); the timer, not the float left
        # over after subtracting elapsed time, decides, so an op can never miss its end
        due = [i for i, x in ends.items() if x <= dt * (1 + 1e-9) + 1e-15]
        gen = self.gen
        self.env.timeout(dt).callbacks.append(lambda _ev, g=gen, d=due: self._wake(g, d))

    def _wake(self, gen, due):
        if gen != self.gen:
            return
        self._advance()
        finished = [i for i in due if i in self.active]
        for i in finished:
            a = self.active.pop(i)
            for e, u in a[2]:
                x = self.use[e] - u
                if x <= 1e-12:
                    del self.use[e]
                    self.over.discard(e)
                else:
                    self.use[e] = x
                    if x <= 1 + 1e-9:
                        self.over.discard(e)
            a[3].succeed()
        self._rates()
        self._schedule()


def ready(env: simpy.Environment, op: EOp, done: list[simpy.Event], rdv: dict,
          on_wait: Callable[[int | None], None]) -> Generator[simpy.Event, None, None]:
    """Waits (a generator for `yield from`) until the op may start: its dependencies are done and,
    for a collective across classes, every peer class has arrived at its rendezvous. Before each
    wait it calls on_wait(what): a dependency's op id, or None for the rendezvous. The engine and
    the in-step fault replay (simtrain.studies.reliability.instep) issue ops by this one rule."""
    for d in op.deps:
        ev = done[d]
        if not ev.processed:
            on_wait(d)
            yield ev
    if op.rendezvous is not None:
        slot = rdv.get(op.rendezvous)
        if slot is None:
            slot = rdv[op.rendezvous] = [0, env.event()]
        slot[0] += 1
        if slot[0] == op.peers:
            slot[1].succeed()
        else:
            on_wait(None)
            yield slot[1]


@dataclass
class Timeline:
    start: list
    end: list
    mem_peak: dict        # class id -> peak dynamic (activation) bytes
    inflight_peak: dict   # class id -> most microbatch-chunks whose activations were alive at once
    step_time: float
    events: int           # ops run
    waits: int = 0        # SimPy events the streams waited on (dependencies, rendezvous, durations)


def run(ops: list[EOp], class_ids: list[int]) -> Timeline:
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
    net = FluidNetwork(env)

    waits = [0]

    def proc(key, seq):
        for op in seq:
            def on_wait(what, op=op):
                waiting[key] = (op, "rendezvous" if what is None else what)
                waits[0] += what is not None
            yield from ready(env, op, done, rdv, on_wait)
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
            if op.load and op.duration > 0:
                yield net.start(op)
            elif op.duration > 0:
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
    return Timeline(start, end, mem_peak, infl_peak, max(end) if end else 0.0, n, waits[0] + n)
