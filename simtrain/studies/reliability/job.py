"""Job-level SimPy simulation of one trial (run stage of the job model).

Processes (plain generators, DESIGN.md):
  job        train -> checkpoint -> train ... ; on an `Interrupt` from a failure source it rolls
             back to the last durable checkpoint and recovers (detection, a spare host for swap
             failures, restart, checkpoint load, warm-up), then trains again
  sources    failure arrivals in wall-clock time, independent of what the job does (so every
             checkpoint interval of a sweep sees the same failures: common random numbers)
  repairs    a drained host is back in the spare pool after its repair time (a timeout callback);
             a job short of hosts waits on an event the repair triggers

Steps are not events: a run phase is a sequence of checkpoint cycles laid out in closed form
(`UniformRun`) or from gamma-distributed step times (`RandomRun`), and the job waits on one
event until an interrupt or the run's end; the cut at the interrupt time locates the cycle by
arithmetic. One cycle (N steps of step time mu, stall s, background write w, slowdown rho):

    train = G + w rho/(1+rho)   if G >= w/(1+rho)   (G = N mu; the write overlaps the steps)
          = G (1+rho)           otherwise, then wait w - G (1+rho) for the write to finish
    length = train + wait + s

Worked example (sync, w = 0): N mu = 1000 s, s = 100 s: checkpoints end at 1100, 2200, ...;
a failure at 2500 s loses 300 s of work and resumes from the checkpoint taken at 2100-2200.

Time accounting: every second of the trial is in exactly one bucket (BUCKETS); the buckets add
up to the horizon (or the time to train) and the tests hold them to it.
"""
from __future__ import annotations

import bisect
import math
from typing import TYPE_CHECKING

import numpy as np
import simpy

from simtrain.studies.reliability.model import JobParams
from simtrain.studies.reliability.model import levels as levels_of

if TYPE_CHECKING:
    from collections.abc import Sequence

BUCKETS = ("useful", "lost_work", "checkpoint", "detection", "spare_wait", "restart", "load", "warmup", "degraded")


def _cycle(G, pend, rho, s):
    if pend > 0 and G < pend / (1 + rho):
        train = G * (1 + rho)
        return train, pend - train
    return G + (pend * rho / (1 + rho) if pend > 0 else 0.0), 0.0


class UniformRun:
    """Cycles of a run phase with a constant step time, in closed form: cycle 0 has no write in
    flight, cycles 1.. are identical, the last one of a token budget may be short."""

    def __init__(self, t0, N, mu, s, w, rho, rem_steps=None):
        self.t0, self.N, self.mu, self.s, self.w, self.rho = t0, N, mu, s, w, rho
        self.K = None if rem_steps is None else max(1, math.ceil(rem_steps / N - 1e-12))
        self.last_steps = None if rem_steps is None else rem_steps - N * (self.K - 1)
        self.c0 = self._make(0)
        self.c1 = self._make(1) if self.K is None or self.K > 2 else None
        self.L0 = self.c0[2] + self.c0[3] + s
        self.L1 = (self.c1[2] + self.c1[3] + s) if self.c1 else None
        self.b0 = t0 + self.L0

    def _make(self, k):
        steps = self.last_steps if (self.K is not None and k == self.K - 1) else self.N
        G = steps * self.mu
        pend = 0.0 if k == 0 else self.w
        train, wait = _cycle(G, pend, self.rho, self.s)
        return steps, G, train, wait, pend

    def cycle(self, k: int) -> tuple[float, float, float, float, float, float]:
        """(start, steps, G, train, wait, pend) of cycle k."""
        if k == 0:
            c = self.c0
        elif self.K is not None and k == self.K - 1:
            c = self._make(k)
        else:
            c = self.c1
        return self.start(k), c[0], c[1], c[2], c[3], c[4]

    def start(self, k: int) -> float:
        return self.t0 if k == 0 else self.b0 + (k - 1) * self.L1 if self.L1 is not None else self.b0

    def end(self, k: int) -> float:
        if k == 0:
            return self.b0
        if self.K is None or k < self.K - 1:
            return self.b0 + k * self.L1
        st, _, _, train, wait, _ = self.cycle(k)
        return st + train + wait + self.s

    def index_at(self, t: float) -> int:
        """Number of cycles whose stall has ended by t."""
        if t < self.b0:
            return 0
        if self.K == 1:
            return 1
        n = 1 + int((t - self.b0) // self.L1) if self.L1 else 1
        if self.K is not None:
            n = min(n, self.K - 1)
            if self.end(self.K - 1) <= t:
                return self.K
        while n > 1 and self.end(n - 1) > t:
            n -= 1
        while (self.K is None or n < self.K) and self.end(n) <= t:
            n += 1
        return n

    def totals(self, n: int) -> tuple[float, float]:
        """(steps, compute seconds) of cycles 0..n-1."""
        steps = n * self.N
        if self.K is not None and n == self.K:
            steps -= self.N - self.last_steps
        return steps, steps * self.mu


class RandomRun:
    """Cycles of a run phase whose step times are iid Gamma(1/cv^2, mu cv^2) (mean mu, CV cv): the
    sum of a cycle's N steps is then exactly Gamma(N/cv^2, mu cv^2). Laid out lazily in blocks."""

    BLOCK = 64

    def __init__(self, t0, N, mu, s, w, rho, rem_steps, cv, rng):
        self.t0, self.N, self.mu, self.s, self.w, self.rho, self.cv, self.rng = t0, N, mu, s, w, rho, cv, rng
        self.K = None if rem_steps is None else max(1, math.ceil(rem_steps / N - 1e-12))
        self.last_steps = None if rem_steps is None else rem_steps - N * (self.K - 1)
        self.steps, self.G, self.train, self.wait, self.pend, self.ends = [], [], [], [], [], []
        self._grow()

    def _grow(self):
        k0 = len(self.steps)
        n = self.BLOCK if self.K is None else min(self.BLOCK, self.K - k0)
        if n <= 0:
            return False
        steps = np.full(n, float(self.N))
        if self.K is not None and k0 + n == self.K:
            steps[-1] = self.last_steps
        k = 1.0 / self.cv ** 2
        G = self.rng.gamma(steps * k, self.mu / k)
        t = self.ends[-1] if self.ends else self.t0
        for i in range(n):
            pend = 0.0 if k0 + i == 0 else self.w
            train, wait = _cycle(float(G[i]), pend, self.rho, self.s)
            t = t + train + wait + self.s
            self.steps.append(float(steps[i]))
            self.G.append(float(G[i]))
            self.train.append(train)
            self.wait.append(wait)
            self.pend.append(pend)
            self.ends.append(t)
        return True

    def cycle(self, k: int) -> tuple[float, float, float, float, float, float]:
        while k >= len(self.steps):
            self._grow()
        return self.start(k), self.steps[k], self.G[k], self.train[k], self.wait[k], self.pend[k]

    def start(self, k: int) -> float:
        while k > len(self.ends):
            self._grow()
        return self.t0 if k == 0 else self.ends[k - 1]

    def end(self, k: int) -> float:
        while k >= len(self.ends):
            self._grow()
        return self.ends[k]

    def index_at(self, t: float) -> int:
        while self.ends[-1] <= t and (self.K is None or len(self.ends) < self.K):
            self._grow()
        return bisect.bisect_right(self.ends, t)

    def totals(self, n: int) -> tuple[float, float]:
        return float(sum(self.steps[:n])), float(sum(self.G[:n]))


class Trial:
    """One trial: build (processes, pool), run to the horizon or the token budget, collect."""

    def __init__(self, p: JobParams, interval_steps: int, seed: int, trial: int, record: bool = False,
                 injected: Sequence[tuple[float, str]] | None = None) -> None:
        self.p, self.N = p, max(1, int(interval_steps))
        ss = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(trial)])
        self.rng_fail, self.rng_repair, self.rng_step, self.rng_host = [np.random.default_rng(s) for s in ss.spawn(4)]
        self.env = simpy.Environment()
        self.free = p.hot_spares                                 # hosts in the hot-spare pool
        self.waiter = None                                       # the job's event while it waits for a spare
        self.phase = "restart"
        self.cur = None                                          # (phases, start) of the recovery in progress
        self.levels = levels_of(p, self.N)
        self.b = dict.fromkeys(BUCKETS, 0.0)
        self.compute_s = 0.0
        self.progress = 0.0                                      # steps
        self.durable = {lv.name: 0.0 for lv in self.levels}      # level -> progress of its last durable checkpoint
        self.pending = []                                        # (level index, progress, durable time)
        self.count = 0                                           # checkpoints taken
        self.counts: dict = {}
        self.groups: dict = {}
        self.planned = 0
        self.storage_fallbacks = 0
        self.swaps = 0
        self.spare_waits = 0
        self.missing = 0
        self.min_dp = p.dp
        self.failed_hosts: list = []                             # in_memory: hosts lost since the memory copies were refreshed
        self.mem_mark = 0.0
        self.run = None
        self.state = ("init", 0.0)
        self.record = record
        self.events: list = []                                   # (t0, t1, kind) when recording
        self.marks: list = []                                    # (t, category) failures when recording
        self.injected = injected
        self.done_at = None
        self.cats = p.categories

    # -- failure sources ---------------------------------------------------------------------
    def _sources(self):
        env, cats = self.env, self.cats
        if self.injected is not None:
            env.process(self._fixed(self.injected))
            return
        if not cats:
            return
        exp = [c for c in cats if c[5] or self.p.distribution == "exponential"]
        wei = [c for c in cats if not (c[5] or self.p.distribution == "exponential")]
        if exp:
            env.process(self._merged(exp))
        for c in wei:
            env.process(self._weibull(c))

    def _merged(self, cats):
        """Superposition of exponential categories: one Poisson stream of the summed rate, each
        arrival's category drawn in proportion to the rates (equal in law to separate streams)."""
        rates = np.array([c[1] for c in cats])
        total = float(rates.sum())
        cum = np.cumsum(rates / total)
        rng = self.rng_fail
        while True:
            gaps = rng.exponential(1.0 / total, 256)
            picks = np.searchsorted(cum, rng.random(256), side="right")
            for g, k in zip(gaps.tolist(), picks.tolist()):
                yield self.env.timeout(g)
                self._arrive(cats[min(k, len(cats) - 1)])

    def _weibull(self, c):
        """Renewal process of one category at job level: Weibull(k) gaps with mean 1 / rate."""
        k = self.p.weibull_shape
        scale = 1.0 / (c[1] * math.gamma(1.0 + 1.0 / k))
        while True:
            for g in (scale * self.rng_fail.weibull(k, 256)).tolist():
                yield self.env.timeout(g)
                self._arrive(c)

    def _fixed(self, items):
        by = {c[0]: c for c in self.cats}
        for t, name in sorted(items):
            yield self.env.timeout(max(0.0, t - self.env.now))
            c = by.get(name) or (name, 0.0, "restart", "crash", name, False)
            self._arrive(c)

    def _arrive(self, c):
        if self.done_at is not None:
            return
        if c[5] and self.state[0] != "run":
            return              # planned maintenance waits while the job is down
        if c[5]:
            self.planned += 1
        else:
            self.counts[c[0]] = self.counts.get(c[0], 0) + 1
            self.groups[c[4]] = self.groups.get(c[4], 0) + 1
        if self.record:
            self.marks.append((self.env.now, c[0]))
        self.proc.interrupt(c)

    def _repair(self):
        """The drained host is back in the spare pool after an exponential repair time (a timeout
        with a callback: no process per repair)."""
        d = self.rng_repair.exponential(self.p.repair_time_s) if self.p.repair_time_s > 0 else 0.0
        self.env.timeout(d).callbacks.append(self._repaired)

    def _repaired(self, _ev):
        self.free += 1
        if self.waiter is not None and not self.waiter.triggered:
            self.waiter.succeed()

    # -- run phase -----------------------------------------------------------------------------
    @property
    def dp_eff(self) -> int:
        return self.p.dp - math.ceil(self.missing / self.p.hosts_per_replica)

    def _new_run(self):
        p = self.p
        mu = p.step_time_s * p.dp / self.dp_eff
        rem = None if p.target_steps is None else p.target_steps - self.progress
        w, rho = p.write_s, p.background_slowdown
        if p.step_time_cv > 0:
            return RandomRun(self.env.now, self.N, mu, p.stall_s, w, rho, rem, p.step_time_cv, self.rng_step)
        return UniformRun(self.env.now, self.N, mu, p.stall_s, w, rho, rem)

    def _cut(self, t):
        """Account the run phase from its start to t: complete cycles, the cycle in progress, and
        the checkpoints that became durable by t. Leaves self.progress at the progress at t."""
        run = self.run
        n = run.index_at(t)
        steps, comp = run.totals(n)
        p0 = self.run_p0
        if n > 0:
            wall_full = run.end(n - 1) - run.t0
        else:
            wall_full = 0.0
        self.compute_s += comp
        self.b["checkpoint"] += wall_full - comp
        # checkpoints of cycles 0..n-1: counter c0+1 .. c0+n
        c0 = self.count
        for li, lv in enumerate(self.levels):
            forced_last = run.K is not None and n == run.K and li == len(self.levels) - 1
            j = n - 1
            if lv.every > 1:
                j = n - 1 - ((c0 + n) % lv.every)
            hits = []
            while j >= 0:
                tb = run.end(j) + lv.write_s
                prog = p0 + run.totals(j + 1)[0]
                hits.append((tb, prog))
                if tb <= t:
                    break
                j -= lv.every
            if forced_last and (not hits or hits[0][1] < p0 + steps):
                hits.insert(0, (run.end(n - 1) + lv.write_s, p0 + steps))
            for tb, prog in hits:
                if tb <= t:
                    self.durable[lv.name] = max(self.durable[lv.name], prog)
                else:
                    self.pending.append((li, prog, tb))
        still = []
        for li, prog, tb in self.pending:
            if tb <= t:
                nm = self.levels[li].name
                self.durable[nm] = max(self.durable[nm], prog)
            else:
                still.append((li, prog, tb))
        self.pending = still
        self.count += n
        partial_steps = 0.0
        if run.K is None or n < run.K:
            st, stp, G, train, wait, pend = run.cycle(n)
            e = max(0.0, t - st)
            rho = self.p.background_slowdown
            if e < train:
                c = e / (1 + rho) if (pend > 0 and e <= pend) else ((pend / (1 + rho) + (e - pend)) if pend > 0 else e)
                c = min(c, G)
                self.compute_s += c
                self.b["checkpoint"] += e - c
                partial_steps = stp * (c / G) if G > 0 else 0.0
            else:
                self.compute_s += G
                self.b["checkpoint"] += e - G
                partial_steps = stp
            if self.record:
                self._rec_run(n, t, partial=True)
        else:
            self.b["checkpoint"] += max(0.0, t - run.end(run.K - 1))     # final write of a token budget
            if self.record:
                self._rec_run(n, t, partial=False)
        self.progress = p0 + steps + partial_steps
        self.run = None

    def _rec_run(self, n, t, partial):
        run = self.run
        for k in range(n + (1 if partial else 0)):
            st, _, G, train, wait, _ = run.cycle(k)
            a = st + train
            for t0, t1, kind in ((st, a, "train"), (a, a + wait, "checkpoint"), (a + wait, a + wait + run.s, "checkpoint")):
                t1 = min(t1, t)
                if t1 > t0:
                    self.events.append((t0, t1, kind))
        if not partial and self.run.K is not None and t > run.end(run.K - 1):
            self.events.append((run.end(run.K - 1), t, "checkpoint"))

    # -- failures --------------------------------------------------------------------------------
    def _rollback(self, c):
        """Failure c: restore the newest checkpoint that survived it; the work after it is lost."""
        p = self.p
        if c[5]:
            for k in self.durable:
                self.durable[k] = self.progress            # planned stop: saved first
            self.pending = []
            return
        if c[2] == "swap":
            self.swaps += 1
            self._repair()
        restore = self.durable["storage"]
        self.load_from = "storage"
        if "memory" in self.durable:
            if self.durable["memory"] > self.mem_mark:
                self.failed_hosts = []                      # copies refreshed since the last restart
            lost_copies = False
            if c[2] == "swap":
                h = int(self.rng_host.integers(p.hosts))
                g = h // p.replicas
                same = sum(1 for x in self.failed_hosts if x // p.replicas == g)
                self.failed_hosts.append(h)
                lost_copies = same + 1 >= p.replicas
            if lost_copies:
                self.storage_fallbacks += 1
            else:
                restore = max(restore, self.durable["memory"])
                self.load_from = "memory"
        restore = min(restore, self.progress)
        mu = p.step_time_s * p.dp / self.dp_eff
        self.b["lost_work"] += (self.progress - restore) * mu
        self.progress = restore
        for k in self.durable:
            self.durable[k] = min(self.durable[k], restore) if k == "storage" else restore
        self.mem_mark = self.durable.get("memory", 0.0)
        self.pending = []

    # -- the job ---------------------------------------------------------------------------------
    def _open(self, seq):
        """Starts consecutive recovery phases [(bucket, seconds)]; the job waits on one timeout
        for all of them (fewer events than one per phase). Returns that timeout."""
        self.cur = (seq, self.env.now)
        self.state = ("recovery", self.env.now)
        total = 0.0
        for _, d in seq:
            total += d
        return self.env.timeout(total)

    def _close(self):
        """Accounts the phases opened last up to now (all of them, or up to an interrupt or the
        horizon); sets self.phase to the phase now was in."""
        seq, t0 = self.cur
        self.cur = None
        e = self.env.now - t0
        t = t0
        self.phase = seq[-1][0]
        for name, d in seq:
            used = d if d < e else e
            if used > 0:
                self.b[name] += used
                if self.record:
                    self.events.append((t, t + used, name))
                t += used
            e -= d
            if e < 0:
                self.phase = name
                break
        self.state = ("idle", self.env.now)

    def _take(self, need):
        """Hosts for `need` swap failures: hot spares first, then (elastic) fewer replicas. Returns what is still missing."""
        p = self.p
        while need > 0:
            if self.free > 0:
                self.free -= 1
            elif p.elastic and p.dp - math.ceil((self.missing + 1) / p.hosts_per_replica) >= p.min_dp:
                self.missing += 1
            else:
                break
            need -= 1
        while self.missing > 0 and self.free > 0:      # a repaired host rejoins: grow back at this restart
            self.free -= 1
            self.missing -= 1
        return need

    def _job(self):
        env, p = self.env, self.p
        cause = None
        self.load_from = "storage"
        while True:
            if cause is None:
                self.state = ("run", env.now)
                self.run = self._new_run()
                self.run_p0 = self.progress
                try:
                    if self.run.K is None:
                        yield env.event()                   # trains until a failure or the horizon
                    else:
                        final = self.levels[-1].write_s
                        yield env.timeout(self.run.end(self.run.K - 1) + final - env.now)
                        self._cut(env.now)
                        self.done_at = env.now
                        self.state = ("done", env.now)
                        return
                except simpy.Interrupt as i:
                    self._cut(env.now)
                    cause = i.cause
                    self._rollback(cause)
            # recovery: detection, spares, restart, load, warm-up; a failure during it starts over
            det_end = env.now + p.detect_s[cause[3]]
            need = 0 if cause[5] else (1 if cause[2] == "swap" else 0)
            swapped = need > 0
            planned = cause[5]
            while True:
                try:
                    need = self._take(need)
                    if need > 0:
                        yield self._open([("detection", max(0.0, det_end - env.now))])
                        self._close()
                        need = self._take(need)
                        while need > 0:
                            self.spare_waits += 1
                            self.cur = ([("spare_wait", math.inf)], env.now)
                            self.state = ("spare_wait", env.now)
                            self.waiter = env.event()
                            yield self.waiter
                            self.waiter = None
                            self._close()
                            need = self._take(need)
                        det = 0.0
                    else:
                        det = max(0.0, det_end - env.now)
                    self.min_dp = min(self.min_dp, self.dp_eff)
                    load = 0.0 if planned else (p.load_memory_s if self.load_from == "memory" else p.load_storage_s)
                    yield self._open([("detection", det), ("restart", p.restart_s + (p.swap_time_s if swapped else 0.0)),
                                      ("load", load), ("warmup", p.warmup_s)])
                    self._close()
                    cause = None
                    break
                except simpy.Interrupt as i:
                    self.waiter = None
                    if self.cur is not None:
                        self._close()
                    phase = self.phase
                    c = i.cause
                    self._rollback(c)
                    planned = planned and c[5]
                    if not c[5]:
                        need += 1 if c[2] == "swap" else 0
                        swapped = swapped or c[2] == "swap"
                        if phase in ("detection", "spare_wait"):
                            det_end = min(det_end, env.now + p.detect_s[c[3]])
                        else:
                            det_end = env.now + p.detect_s[c[3]]

    def simulate(self) -> dict:
        env, p = self.env, self.p
        self.gen = self._job()
        self.proc = env.process(self.gen)
        self._sources()
        if p.target_steps is None:
            env.run(until=p.horizon_s)
            end = p.horizon_s
            if self.state[0] == "run":
                self._cut(end)
            elif self.cur is not None:
                self._close()       # the recovery phase in progress, up to the horizon
            useful_steps = self.progress
        else:
            env.run(until=self.proc)
            end = self.done_at
            useful_steps = p.target_steps
        self.b["useful"] = useful_steps * p.step_time_s
        self.b["degraded"] = self.compute_s - self.b["lost_work"] - self.b["useful"]
        if abs(self.b["degraded"]) < 1e-9 * max(1.0, end):
            self.b["degraded"] = 0.0
        out = {
            "time_s": end,
            "goodput": self.b["useful"] / end if end > 0 else 0.0,
            "steps": useful_steps,
            "tokens": useful_steps * p.tokens_per_step,
            "interruptions": sum(self.counts.values()),
            "planned": self.planned,
            "by_category": dict(sorted(self.counts.items())),
            "by_group": dict(sorted(self.groups.items())),
            "lost_s": {k: self.b[k] for k in BUCKETS if k != "useful"},
            "checkpoints": self.count,
            "storage_fallbacks": self.storage_fallbacks,
            "spare_waits": self.spare_waits,
            "min_dp": self.min_dp,
        }
        return out


def run_trial(p: JobParams, interval_steps: int, seed: int, trial: int, record: bool = False,
              injected: Sequence[tuple[float, str]] | None = None) -> dict | tuple[dict, list, list]:
    """One trial -> result dict; with record=True also (events, failure marks) for a timeline."""
    t = Trial(p, interval_steps, seed, trial, record, injected)
    out = t.simulate()
    if record:
        return out, t.events, t.marks
    return out
