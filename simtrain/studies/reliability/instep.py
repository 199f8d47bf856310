"""A failure inside one training step (the in-step view of the job model).

The step simulation's ops are replayed as SimPy processes, one per (rank class, stream), with
the same dependency and rendezvous rules as simtrain.engine.core and each op's duration as the step
simulation measured it (end - start, contention included), so without a fault the replay gives
the step simulation's timeline. At the fault time every process of the failed rank's class gets
an `Interrupt`: the op it is running is cut there and nothing after it is issued (a rank class
stands for ranks that behave alike; its members share the failed rank's fate in this view).
The other ranks run on until they need something from the failed class: a collective whose
peer never arrives, or a pipeline receive whose send never comes. An op blocked on another
rank (a collective's peers, a receive from another stage) is NCCL work watched by the watchdog (PyTorch's NCCL timeout, 10 min by default); the first
one to expire aborts the job:

    abort = min over ops blocked on another rank (time it started waiting) + timeout

The step is lost (its gradients are never applied): lost work = the fault time into the step
plus everything the other ranks did after it; the job model's `hang` detection is this wait.
Worked example: a fault at 2.0 s on one stage, its dp all-reduce peers block at 2.3 s, timeout
600 s: abort at 602.3 s, 600.3 s after the fault.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import simpy

from simtrain.engine.core import ready
from simtrain.errors import SimulationError
from simtrain.program.ir import stream_sequences

if TYPE_CHECKING:
    from simtrain.simulate import StepRun


@dataclass
class StepFault:
    failed_class: int
    failed_rank: int
    fault_s: float
    timeout_s: float
    abort_s: float
    step_time_s: float
    start: list
    end: list
    status: list                   # per op: done | cut | never
    blocked: list                  # (class, stream, op label, waiting since, what for, waits on another rank)
    next_step: bool = False        # nobody waited in this step: the wait starts at the next step's first exchange
    other_classes: int = 0         # rank classes besides the failed one (0: nobody is left to block)

    def summary(self) -> dict:
        n = len(self.status)
        return {
            "failed_rank": self.failed_rank, "failed_class": self.failed_class, "fault_s": self.fault_s,
            "timeout_s": self.timeout_s, "abort_s": self.abort_s,
            "detection_s": self.abort_s - self.fault_s, "blocked_in_next_step": self.next_step,
            "other_classes": self.other_classes,
            "step_time_s": self.step_time_s,
            "ops_done": sum(1 for s in self.status if s == "done"), "ops_cut": sum(1 for s in self.status if s == "cut"),
            "ops_never_run": sum(1 for s in self.status if s == "never"), "ops": n,
            "blocked": [{"class": c, "stream": s, "op": lbl, "since_s": t, "waits_for": w, "on_peer": peer}
                        for c, s, lbl, t, w, peer in self.blocked if c != self.failed_class],
        }


def replay(ops: list, durations: list, fault: tuple | None = None) -> tuple[list[float | None], list[float | None], list[str], list[tuple]]:
    """Runs the ops; fault = (class id, time). Returns (start, end, status, blocked)."""
    env = simpy.Environment()
    n = len(ops)
    done = [env.event() for _ in range(n)]
    start, end, status = [None] * n, [None] * n, ["never"] * n
    rdv: dict = {}
    waiting: dict = {}
    procs: dict = {}

    def proc(key, seq):
        op = None
        try:
            for op in seq:
                def on_wait(what, op=op):
                    waiting[key] = (op, "peers at the collective" if what is None else ops[what], env.now)
                yield from ready(env, op, done, rdv, on_wait)
                waiting.pop(key, None)
                start[op.id] = env.now
                if durations[op.id] > 0:
                    yield env.timeout(durations[op.id])
                end[op.id] = env.now
                status[op.id] = "done"
                done[op.id].succeed()
        except simpy.Interrupt:
            waiting.pop(key, None)
            if op is not None and start[op.id] is not None and end[op.id] is None:
                end[op.id] = env.now
                status[op.id] = "cut"

    for key, seq in sorted(stream_sequences(ops).items()):
        procs[key] = env.process(proc(key, seq))

    if fault is not None:
        cls, t = fault

        def injector():
            yield env.timeout(t)
            for key, p in sorted(procs.items()):
                if key[0] == cls and p.is_alive:
                    p.interrupt("fault")
        env.process(injector())
    env.run()
    blocked = []
    for key, (op, what, since) in sorted(waiting.items(), key=lambda kv: kv[0]):
        w = what if isinstance(what, str) else f"{what.label} (class {what.cls}, stream {what.stream})"
        # waiting on another rank (a collective's peers, a pipeline send): NCCL work that the watchdog times
        peer = isinstance(what, str) or what.cls != op.cls
        blocked.append((key[0], key[1], op.label, since, w, peer))
    return start, end, status, blocked


def inject(run: StepRun, rank: int, at_s: float, timeout_s: float = 600.0) -> StepFault:
    """A fault of `rank` at `at_s` seconds into the step of a StepRun (simtrain.simulate)."""
    classes = run.classes
    cls = next((c for c in classes if rank in c.ranks), None)
    if cls is None:
        raise SimulationError(f"rank {rank} is not in this job (ranks 0..{sum(c.multiplicity for c in classes) - 1})")
    ops, tl = run.ops, run.timeline
    durations = [tl.end[i] - tl.start[i] for i in range(len(ops))]
    start, end, status, blocked = replay(ops, durations, (cls.id, at_s))
    comm = [b for b in blocked if b[5] and b[0] != cls.id]
    if comm:
        abort, nxt = min(b[3] for b in comm) + timeout_s, False
    else:
        # the others finish this step without the failed ranks (e.g. a fault after its last
        # exchange) and block at the next step's first exchange with them
        abort, nxt = max([at_s] + [e for e in end if e is not None]) + timeout_s, True
    return StepFault(cls.id, rank, at_s, timeout_s, abort, tl.step_time, start, end, status, blocked, nxt,
                     len(classes) - 1)


def trace(run: StepRun, f: StepFault) -> dict:
    """Chrome / Perfetto trace of the faulty step: ops as run (cut ones marked), waits until the
    watchdog aborts the job, the fault and the abort as instants."""
    ops = run.ops
    tids: dict = {}
    ev = []
    for c in run.classes:
        ev.append({"ph": "M", "name": "process_name", "pid": c.id,
                   "args": {"name": f"stage {c.stage} · rank {c.ranks[0]} ×{c.multiplicity} ranks" + ("  [FAILED]" if c.id == f.failed_class else "")}})
    for op in ops:
        tids.setdefault(op.stream, len(tids))
    for c in run.classes:
        for s, t in tids.items():
            ev.append({"ph": "M", "name": "thread_name", "pid": c.id, "tid": t, "args": {"name": s}})
    us = 1e6
    for op in ops:
        s, e = f.start[op.id], f.end[op.id]
        if s is None:
            continue
        name = op.label + (" (interrupted)" if f.status[op.id] == "cut" else "")
        ev.append({"ph": "X", "name": name, "cat": op.category, "pid": op.cls, "tid": tids[op.stream],
                   "ts": round(s * us, 3), "dur": round((e - s) * us, 3)})
    stop = f.abort_s
    for c, stream, label, since, what, peer in f.blocked:
        if c == f.failed_class or not peer:
            continue
        ev.append({"ph": "X", "name": f"waiting: {label}", "cat": "fault", "pid": c, "tid": tids[stream],
                   "ts": round(since * us, 3), "dur": round(max(0.0, stop - since) * us, 3), "args": {"waits for": what}})
    ev.append({"ph": "i", "s": "g", "name": f"failure of rank {f.failed_rank}", "pid": f.failed_class, "tid": 0, "ts": round(f.fault_s * us, 3)})
    ev.append({"ph": "i", "s": "g", "name": f"watchdog timeout ({f.timeout_s:g} s): job aborted", "pid": f.failed_class, "tid": 0,
               "ts": round(f.abort_s * us, 3)})
    return {"traceEvents": ev, "displayTimeUnit": "ms"}
