"""Pipeline communication of one rank class's program: sends to the neighbouring pipeline ranks,
the waits of an action on its input, and the tp all-gather that rebuilds a message sent split
over the tp group.

Takes the class's schedule walk (`lowering.ClassLowering`: its class, schedule row, where its
actions ended); adds send ops (timed by the network backend, all the class's ranks at once) and
the gathers to the step's op list, and records the receives that wait for another class's send
(resolved once every class is lowered).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from simtrain.program.ir import EOp
from simtrain.schedules import Action
from simtrain.workload.ir import Comm

if TYPE_CHECKING:
    from simtrain.program.lowering import ClassLowering


class PipelineTraffic:
    """The pipeline sends and receives of one class (`prog`: its ClassLowering)."""

    def __init__(self, prog: ClassLowering):
        self.prog = prog
        self.low = prog.low

    def neighbour(self, r: int) -> tuple[int | None, str | None, str]:
        """(class id, link class, send stream) of pipeline rank r seen from this rank; the two ends
        of the pipeline are neighbours too (interleaving goes from the last rank back to the first)."""
        prog = self.prog
        c = prog.c
        if r == prog.rank + 1:
            return c.pp_next, c.link_next, "pp_next"
        if r == prog.rank - 1:
            return c.pp_prev, c.link_prev, "pp_prev"
        if {r, prog.rank} == {0, prog.sched.pp - 1}:
            return c.pp_wrap, c.link_wrap, ("pp_next" if prog.rank == prog.sched.pp - 1 else "pp_prev")
        raise AssertionError("routes move between neighbouring ranks (checked by schedules.validate)")

    def recv_gather(self, a: Action, kind: str, pos: int) -> EOp | None:
        """The tp all-gather that rebuilds a pipeline message sent split over the tp group
        (`parallel.pp_scatter_gather`), or None where the input is local or not split. It is
        created before the action's own ops, so it comes first on the tp stream, and it waits for
        this rank's last compute op: the framework issues it after the previous action, behind
        that action's tp collectives on the same communicator (whether or not they were folded)."""
        prog, low = self.prog, self.low
        r, _ = prog.sched.route(a.microbatch)[pos]
        if r == prog.rank:
            return None
        ms = prog.sched.stage_of[prog.rank][a.chunk]
        n = low.work_of(prog.c.ep_rank)[ms - 1 if kind == "F" else ms].recv_gather_bytes
        if not n:
            return None
        ops = low.ops
        prev = next((ops[i].id for i in range(len(ops) - 1, prog.op0 - 1, -1) if ops[i].stream == "compute"), None)
        name = f"pp_gather_{'act' if kind == 'F' else 'grad'}{a.microbatch}"
        op = low.comm_op(prog.c, Comm("tp", "all_gather", n, name), [] if prev is None else [prev],
                         a.microbatch, prog.next_seq("tp"), chunk=a.chunk)
        op.category = "pp"          # pipeline communication in the breakdown, on the tp stream
        return op

    def receive(self, first_op: EOp, a: Action, kind: str, pos: int) -> None:
        """Makes the action's first compute op wait for the input produced at route position pos."""
        prog = self.prog
        r, ch = prog.sched.route(a.microbatch)[pos]
        if r == prog.rank:
            first_op.deps.append(prog.local_end[(kind, a.microbatch, ch)])
        else:
            producer, _, _ = self.neighbour(r)
            self.low.pending_recv.append((first_op, producer, kind, a.microbatch, ch))

    def send(self, last: EOp, a: Action, kind: str, pos: int) -> None:
        """Sends the action's output (activations forward, their gradients back) to route
        position pos, after `last`."""
        prog, low = self.prog, self.low
        c = prog.c
        r, _ = prog.sched.route(a.microbatch)[pos]
        prog.local_end[(kind, a.microbatch, a.chunk)] = last.id
        if r == prog.rank:
            return
        peer, link, stream = self.neighbour(r)
        # activations go to the next model stage, their gradients come back: the size of what the
        # earlier of the two stages produces (the same for every language-model stage)
        ms = prog.sched.stage_of[prog.rank][a.chunk]
        nbytes = low.work_of(c.ep_rank)[ms if kind == "F" else ms - 1].send_bytes
        t = low.network.sends(c, r, nbytes, link)
        dur = t.seconds * low.slowest_link((c.id, peer))
        snd = low._new(c, stream=stream, kind="send", category="pp", duration=dur, load=t.load, net_key=t.key,
                       label=f"send_{'act' if kind == 'F' else 'grad'}{a.microbatch}" + (f".{a.chunk}" if prog.sched.chunks > 1 else ""),
                       mb=a.microbatch, chunk=a.chunk, deps=[last.id], bytes=nbytes)
        low.send_of[(c.id, kind, a.microbatch, a.chunk)] = snd.id
