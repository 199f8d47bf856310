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

With an interference table (a device profile's `interference`), a compute op runs slower while
a collective or pipeline transfer of its own class (the same device's communication streams) is
running: its remaining work progresses at (1 - s) of its rate over exactly the overlapped
interval and speeds back up when the collective ends (`Interference`).
"""
from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass

import simpy

from simtrain.errors import DeadlockError
from simtrain.hardware.devices import slowdown
from simtrain.program.ir import EOp, stream_sequences
from simtrain.workload.ir import overlapped_tp


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


def op_class(op: EOp) -> str:
    """The interference class of a compute op: the optimizer step is memory-bound; forward and
    backward segments (fused operators between two communication points) are counted as GEMMs,
    which carry most of their time."""
    return "memory" if op.category == "opt" else "gemm"


def collective_kind(op: EOp) -> str:
    """The collective of a communication op (its label reads `collective:name`); a pipeline
    transfer is `send_recv`."""
    if op.kind == "send":
        return "send_recv"
    head = op.label.split(":", 1)[0]
    return "send_recv" if head in ("send_recv", "sendrecv") else head


class Interference:
    """Compute slowed by concurrent communication on the same device, exact and piecewise.

    `table` maps (op class, collective) to s (`simtrain.hardware.devices.slowdown` rules: the
    pair, else the op's `any`, else 0). While collectives of one or more kinds run on class c,
    each running compute op of c progresses at rate 1 - s, with s the largest over the running
    kinds (they share the same SMs and HBM; the largest is taken rather than a sum, which could
    pass 1). When the set of kinds running on c changes, the remaining work of c's running
    compute ops is advanced at the old rate, the new rate set and a new end timer armed; the
    op's process waits on the newest timer (`wait`).
    Worked example (the test's): a 10 ms GEMM from 0, a 4 ms collective from 2 ms, s = 0.2: 2 ms
    of work by 2 ms, 4 x 0.8 = 3.2 ms more by 6 ms, the remaining 4.8 ms at full rate: ends at
    10.8 ms.
    """

    def __init__(self, env: simpy.Environment, table: dict):
        self.env = env
        self.table = table
        self.colls: dict = {}      # class -> {collective kind: running count}
        self.running: dict = {}    # class -> {op id: record (see compute)}
        self.rates: dict = {}      # class -> {op class: rate under the kinds running now} (cleared on a change)
        self._kind: dict = {}      # label -> collective kind
        self._s: dict = {}         # (op class, frozenset of kinds) -> s

    def rate(self, c: int, opc: str) -> float:
        rates = self.rates.setdefault(c, {})
        r = rates.get(opc)
        if r is None:
            kinds = self.colls.get(c)
            if not kinds:
                r = 1.0
            else:
                key = (opc, frozenset(kinds))
                s = self._s.get(key)
                if s is None:
                    s = self._s[key] = max(slowdown(self.table, opc, k) for k in kinds)
                r = 1.0 - s
            rates[opc] = r
        return r

    def compute(self, op: EOp) -> list:
        """Starts a compute op; returns its record, whose [3] is the timeout of its current end
        (the process waits on it in `wait`)."""
        opc = op_class(op)
        rate = self.rate(op.cls, opc)
        end = op.duration / rate
        # remaining s, rate, since, end timeout, op class, end time waited on, end time, process
        rec = [op.duration, rate, self.env.now, self.env.timeout(end), opc, 0.0, self.env.now + end, self.env.active_process]
        self.running.setdefault(op.cls, {})[op.id] = rec
        return rec

    def wait(self, op: EOp, rec: list) -> Generator[simpy.Event, None, None]:
        """Waits (a generator for `yield from`) until the op's work is done. A slower rate moves
        its end later: the process wakes at the old end and waits on the new one. A faster rate
        moves it earlier: `comm` interrupts the wait."""
        while True:
            ev = rec[3]
            rec[5] = rec[6]
            try:
                yield ev
            except simpy.Interrupt:
                continue
            if rec[3] is ev:
                break
        del self.running[op.cls][op.id]

    def comm(self, op: EOp, delta: int) -> None:
        """A communication op of class op.cls starts (delta 1) or ends (delta -1). Rates change
        only when a kind starts running or stops (not when a second one of a kind joins)."""
        if overlapped_tp(op.label):
            return                  # an overlapped TP transfer: priced by the SMs the GEMM gives up (Ring.share)
        c = op.cls
        k = self._kind.get(op.label)
        if k is None:
            k = self._kind[op.label] = collective_kind(op)
        kinds = self.colls.get(c)
        if kinds is None:
            kinds = self.colls[c] = {}
        n = kinds.get(k, 0) + delta
        if n:
            kinds[k] = n
            if n != 1 or delta < 0:
                return              # the set of running kinds is the same
        else:
            del kinds[k]
        self.rates.pop(c, None)
        run = self.running.get(c)
        if not run:
            return
        now = self.env.now
        for i, rec in run.items():
            rate = self.rate(c, rec[4])
            if rate == rec[1]:
                continue
            rec[0] = max(rec[0] - rec[1] * (now - rec[2]), 0.0)
            rec[1], rec[2] = rate, now
            dt = rec[0] / rate
            rec[3], rec[6] = self.env.timeout(dt), now + dt
            if rec[6] < rec[5]:
                rec[7].interrupt()   # its end came earlier than the one it waits for


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


def run(ops: list[EOp], class_ids: list[int], interference: dict | None = None) -> Timeline:
    """Runs the programs. `interference`: {(op class, collective): s} (a device profile's
    `interference` table, `Device.slowdown_table`); none or empty: compute never slows."""
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
    slow = Interference(env, interference) if interference and any(interference.values()) else None

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
            comm = slow is not None and op.kind != "compute" and op.duration > 0
            if comm:
                slow.comm(op, 1)
            if op.load and op.duration > 0:
                yield net.start(op)
            elif slow is not None and op.kind == "compute" and op.duration > 0:
                yield from slow.wait(op, slow.compute(op))
            elif op.duration > 0:
                yield env.timeout(op.duration)
            if comm:
                slow.comm(op, -1)
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
