"""RL post-training iterations: RLJob -> RLRun (phases of every iteration on their pools).

Placements (docs/reference/verl-config.md):
  colocated     every phase in verl's order on one pool of all devices; step = the sum of the phases
  split         gen on the rollout pool, the rest on the training pool, each waiting for the other;
                step = the sum of the phases (update_weights a transfer between the pools)
  one_step_off  the generation of batch k+1 (weights of k-1) overlaps training on batch k; the weight
                update waits for both: step = max(gen, train) + update_weights in steady state
  fully_async   the rollout pool streams: the prompts of batch j are submitted when weight version
                j - 1 - staleness is published (the staleness bound throttles the rollout) and the
                trainer takes the first train_batch_size groups to finish, so a long generation
                delays its own group only. partial_rollout: generations in flight at a weight update
                carry on (resumed under the new weights); otherwise the update first drains them.
                Arrival times depend on the trainer's update times and those on the generation's
                finish times: solved by fixed-point rounds (FIXED_POINT_ROUNDS, stopping when
                the arrivals no longer change).
timing_s/gen is the generation's makespan, except under fully_async, where it is the trainer's wait
for a batch (the generation itself runs all the time). Steady-state means leave out the first iteration when there are several (warm-up: nothing overlaps
yet). Iteration k samples its lengths with numpy.random.default_rng([seed, k]).

Throughput (perf/throughput, perf/total_num_tokens) counts, for every placement, the tokens of the
batch sampled for iteration k (train_batch_size prompts x n responses, prompt + response) over
that iteration's step: what the rollout produces per step in steady state. Under fully_async the
trainer takes the groups that finish first, which inside the simulated window are the shorter ones
(the longest are still generating when the window ends), so the batch it trains is not that
batch; counting what it trains would report fewer tokens per step than one_step_off on the same
job, though in steady state every group is trained once.

`simulate_rl(job, cache)`: a SimCache shares the training-pass simulations (by pool size) and
the generations (by engine and requests) between the jobs of one search.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simtrain.hardware.devices import get_device
from simtrain.rl import phases as ph
from simtrain.rl import sync
from simtrain.rl.spec import RLJob
from simtrain.rollout.engine import GenerationResult, Request, simulate_generation

FIXED_POINT_ROUNDS = 6
TRAIN_PHASES = ("reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor")


@dataclass
class RLResult:
    name: str
    placement: str
    device: str
    devices: int
    timing: dict[str, float]                 # steady-state means, verl's timing_s/<phase> names without the prefix
    throughput: float                        # tokens (prompt + response) per second per device
    response_length_mean: float
    response_length_max: float
    clip_ratio: float
    pools: dict[str, dict]
    memory: dict[str, float]                 # phase -> peak bytes per device
    memory_detail: dict[str, dict[str, float]]
    iterations: list[dict]
    preemptions: int
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d: dict = {"name": self.name, "placement": self.placement, "device": self.device, "devices": self.devices}
        for k in ph.VERL_ORDER:
            d[f"timing_s/{k}"] = self.timing.get(k, 0.0)
        d["timing_s/step"] = self.timing["step"]
        d["perf/throughput"] = self.throughput
        d["response_length/mean"] = self.response_length_mean
        d["response_length/max"] = self.response_length_max
        d["response_length/clip_ratio"] = self.clip_ratio
        d["rollout/preemptions"] = self.preemptions
        d["pools"] = self.pools
        d["memory"] = self.memory
        d["memory_detail"] = self.memory_detail
        d["iterations"] = self.iterations
        d["notes"] = self.notes
        return d


class SimCache:
    """Simulations shared by jobs built from one job tree (same model, device and cluster) that
    differ in placement, pool split, rollout tp or staleness (simtrain.studies.rl_search):
      passes       a PassCache per training pool size (a role's template depends on its pool only)
      generations  GenerationResults by (engine, prompts, responses, arrivals); the synchronous
                   placements on the same rollout pool and tp generate the same batches."""

    def __init__(self) -> None:
        self.passes: dict[int, ph.PassCache] = {}
        self.generations: dict[tuple, GenerationResult] = {}
        self.generation_runs = 0

    def pass_cache(self, job: RLJob) -> ph.PassCache:
        pool = job.total_devices if job.placement == "colocated" else job.train_devices
        return self.passes.setdefault(pool, ph.PassCache())

    def generate(self, job: RLJob, prompts: np.ndarray, responses: np.ndarray, arrivals: np.ndarray | None) -> GenerationResult:
        arr = arrivals if arrivals is not None else np.zeros(len(prompts))
        key = (job.engine, prompts.tobytes(), responses.tobytes(), np.asarray(arr, dtype=float).tobytes())
        hit = self.generations.get(key)
        if hit is None:
            hit = _simulate_generation(job, prompts, responses, arr)
            self.generations[key] = hit
            self.generation_runs += 1
        return hit


@dataclass
class RLRun:
    result: RLResult
    spans: list[tuple[str, str, int, float, float]]     # (pool, phase, iteration, start_s, end_s)
    job: RLJob
    simulations: int = 0


def _sample(job: RLJob, k: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([job.seed, k])
    prompts = np.repeat(job.prompt_length.sample(job.train_batch_size, 1, rng), job.n)
    responses = job.response_length.sample(job.train_batch_size, job.n, rng)
    return prompts, responses


def _simulate_generation(job: RLJob, prompts: np.ndarray, responses: np.ndarray, arrivals: np.ndarray | None = None) -> GenerationResult:
    a = job.roles["actor"]
    dev = get_device(a.scenario.cluster.device)
    arr = arrivals if arrivals is not None else np.zeros(len(prompts))
    reqs = [Request(int(p), int(r), float(t)) for p, r, t in zip(prompts, responses, arr)]
    return simulate_generation(a.scenario.model, dev, job.rollout_topology, job.engine, reqs)


class _Costs:
    """The per-iteration training phases and the (shape-independent) weight update."""

    def __init__(self, job: RLJob, cache: SimCache) -> None:
        self.job = job
        self.sims = cache
        self.cache = cache.pass_cache(job)
        self.dev = get_device(job.roles["actor"].scenario.cluster.device)
        self._sync: tuple | None = None
        self.statics: dict[str, ph.PassCost] = {}

    def train(self, seq: np.ndarray, resp_tokens: int) -> tuple[dict[str, float], dict[str, float]]:
        job, c = self.job, self.cache
        t: dict[str, float] = {}
        peaks: dict[str, float] = {}
        t["reward"], rc = ph.reward_seconds(job, c, seq)
        if rc is not None:
            peaks["reward"] = rc.peak_bytes
            self.statics["reward_model"] = rc
        x = ph.pass_over(c, job.roles["actor"], seq, True)
        t["old_log_prob"], peaks["old_log_prob"] = x.seconds, x.peak_bytes
        if job.needs_ref:
            x = ph.pass_over(c, job.roles["reference"], seq, True)
            t["ref"], peaks["ref"] = x.seconds, x.peak_bytes
            self.statics["reference"] = x
        if job.has_critic:
            x = ph.pass_over(c, job.roles["critic"], seq, True)
            t["values"], peaks["values"] = x.seconds, x.peak_bytes
        t["adv"] = ph.adv_seconds(job, resp_tokens)
        if job.has_critic:
            t["update_critic"], x = ph.update(c, job.roles["critic"], seq, job.n)
            peaks["update_critic"] = x.peak_bytes
            self.statics["critic"] = x
        t["update_actor"], x = ph.update(c, job.roles["actor"], seq, job.n)
        peaks["update_actor"] = x.peak_bytes
        self.statics["actor"] = x
        return t, peaks

    def sync(self, gen: GenerationResult) -> tuple[float, list[str]]:
        """update_weights: resharding / transfer plus the host swaps of offloaded state (seconds, notes)."""
        if self._sync is not None:
            return self._sync
        job = self.job
        a = job.roles["actor"]
        sc = a.scenario
        notes: list[str] = []
        if job.placement == "colocated":
            cost = sync.reshard(sc.model, sc.parallel, a.strategy, job.engine.tp, job.engine.ep, self.dev,
                                job.rollout_topology, list(range(job.total_devices)))
        else:
            cost = sync.transfer(sc.model, sc.parallel, a.strategy, job.engine.tp, job.engine.ep, job.rollout_topology,
                                 list(range(job.rollout_devices, job.total_devices)), list(range(job.rollout_devices)),
                                 sc.network.backend)
        seconds = cost.seconds
        notes += list(cost.notes)
        if job.placement == "colocated":
            st = self.statics["actor"]
            sizes = {"params": st.weight_bytes, "grads": st.grad_bytes, "optimizer": st.optimizer_bytes}
            off = sum(sizes[k] for k, on in a.offload.items() if on)
            if off:
                # offloaded to host before generation and loaded back after it (each way over the host link)
                seconds += 2 * sync.swap_seconds(off, self.dev)
                notes.append(f"actor state offloaded during gen: {off / 2**30:.2f} GiB per device each way")
        self._sync = (seconds, notes)
        return self._sync


def _memory(job: RLJob, costs: _Costs, gen: GenerationResult, peaks: dict[str, float]) -> tuple[dict, dict]:
    """Peak bytes per device of every phase: the phase's own peak plus what other roles keep resident."""
    kv = gen.kv_blocks_total * gen.kv_bytes_per_block
    rw = gen.weight_bytes
    a = job.roles["actor"]
    st = costs.statics["actor"]
    actor_static = st.static_bytes
    actor_resident = 0.0 + sum(v for k, v in (("params", st.weight_bytes), ("grads", st.grad_bytes), ("optimizer", st.optimizer_bytes))
                         if not a.offload[k])
    ref_resident = 0.0
    if job.needs_ref and "reference" in costs.statics and not job.roles["reference"].offload["params"]:
        ref_resident = costs.statics["reference"].weight_bytes
    mem, detail = {}, {}
    if job.placement == "colocated":
        detail["gen"] = {"rollout_weights": rw, "kv_cache": kv, "actor_resident": actor_resident, "reference": ref_resident,
                         "offloaded_to_host": actor_static - actor_resident}
        for p, v in peaks.items():
            own_ref = p == "ref"
            detail[p] = {"phase": v, "rollout_weights": rw, "kv_cache": 0.0 if job.free_cache_engine else kv,
                         "actor_resident": 0.0 if p in ("old_log_prob", "update_actor") else actor_resident,
                         "reference": 0.0 if own_ref else ref_resident}
    else:
        detail["gen"] = {"rollout_weights": rw, "kv_cache": kv}
        for p, v in peaks.items():
            detail[p] = {"phase": v, "actor_resident": 0.0 if p in ("old_log_prob", "update_actor") else actor_static,
                         "reference": 0.0 if p == "ref" else ref_resident}
    for p, d in detail.items():
        mem[p] = float(sum(d.values()) - d.get("offloaded_to_host", 0.0))
    return mem, detail


def _phase_seq(t: dict[str, float]) -> list[tuple[str, float]]:
    return [(p, t[p]) for p in TRAIN_PHASES if p in t]


def simulate_rl(job: RLJob, cache: SimCache | None = None) -> RLRun:
    """Simulates job.iterations iterations of the job's placement (see the module docstring);
    `cache`: simulations shared with other jobs of the same tree (a fresh one by default)."""
    costs = _Costs(job, cache if cache is not None else SimCache())
    sims0 = costs.cache.simulations
    spans: list[tuple[str, str, int, float, float]] = []
    iters: list[dict] = []
    preempt = 0
    last_gen = None
    peaks_all: dict[str, float] = {}
    I = job.iterations
    # one_step_off: the update of the last iteration waits for the generation of the next batch
    # (started on the weights before it), so that batch is sampled and generated too
    extra = {"fully_async": job.staleness, "one_step_off": 1}.get(job.placement, 0)
    samples = [_sample(job, k) for k in range(I + extra)]
    rpool = "actor_rollout" if job.placement == "colocated" else "rollout"
    tpool = "actor_rollout" if job.placement == "colocated" else "train"

    def record(k: int, seqs: np.ndarray, resp: np.ndarray, gen_s: float, t: dict, sync_s: float, step: float) -> None:
        # tokens of the batch sampled for iteration k whatever the placement trains (module docstring)
        tokens = float((samples[k][0] + samples[k][1]).sum())
        row = {"iteration": k, "timing_s/gen": gen_s, **{f"timing_s/{p}": v for p, v in t.items()},
               "timing_s/update_weights": sync_s, "timing_s/step": step, "perf/total_num_tokens": tokens,
               "perf/throughput": tokens / step / job.total_devices if step else 0.0,
               "response_length/mean": float(resp.mean()), "response_length/max": float(resp.max()),
               "response_length/clip_ratio": float((resp >= job.max_response_length).mean())}
        iters.append(row)

    if job.placement in ("colocated", "split", "one_step_off"):
        gens = []
        for k in range(len(samples)):
            p, r = samples[k]
            g = costs.sims.generate(job, p, r, None)
            gens.append(g)
            preempt += g.preemptions
        now = 0.0
        prev_sync_end = 0.0
        gen_start_next = 0.0
        gen_end = [0.0] * I
        for k in range(I):
            p, r = samples[k]
            seq = p + r
            g = gens[k]
            t, peaks = costs.train(seq, int(r.sum()))
            for q, v in peaks.items():
                peaks_all[q] = max(peaks_all.get(q, 0.0), v)
            sync_s, notes = costs.sync(g)
            last_gen = g
            if job.placement in ("colocated", "split"):
                start = now
                spans.append((rpool, "gen", k, now, now + g.makespan_s))
                now += g.makespan_s
                for q, v in _phase_seq(t):
                    spans.append((tpool, q, k, now, now + v))
                    now += v
                spans.append((tpool, "update_weights", k, now, now + sync_s))
                if job.placement == "split":
                    spans.append((rpool, "update_weights", k, now, now + sync_s))
                now += sync_s
                record(k, seq, r, g.makespan_s, t, sync_s, now - start)
            else:
                # gen of k started when the rollout had the weights it needs (k-1's update, or at once for k <= 1)
                gs = gen_start_next if k > 0 else 0.0
                gen_end[k] = gs + g.makespan_s
                spans.append((rpool, "gen", k, gs, gen_end[k]))
                ts = max(gen_end[k], prev_sync_end if k > 0 else 0.0)
                # the rollout starts batch k+1 as soon as batch k is handed over
                gen_start_next = ts
                cur = ts
                for q, v in _phase_seq(t):
                    spans.append((tpool, q, k, cur, cur + v))
                    cur += v
                nxt_gen_end = ts + gens[k + 1].makespan_s
                if k + 1 == I:        # the batch after the window, generated while the last one trains
                    spans.append((rpool, "gen", I, ts, nxt_gen_end))
                ss = max(cur, nxt_gen_end)
                spans.append((tpool, "update_weights", k, ss, ss + sync_s))
                spans.append((rpool, "update_weights", k, ss, ss + sync_s))
                step = ss + sync_s - prev_sync_end
                prev_sync_end = ss + sync_s
                record(k, seq, r, g.makespan_s, t, sync_s, step)
    else:
        preempt, last_gen, peaks_all = _fully_async(job, costs, samples, spans, record)
    sync_s, notes = costs.sync(last_gen)
    steady = iters[1:] if len(iters) > 1 else iters
    mean = lambda key: float(np.mean([row.get(key, 0.0) for row in steady]))  # noqa: E731
    timing = {p: mean(f"timing_s/{p}") for p in ph.VERL_ORDER}
    timing["step"] = mean("timing_s/step")
    mem, detail = _memory(job, costs, last_gen, peaks_all)
    end = max(s[4] for s in spans)
    pools: dict[str, dict] = {}
    sizes = {"actor_rollout": job.total_devices, "rollout": job.rollout_devices, "train": job.train_devices}
    for pool in sorted({s[0] for s in spans}):
        busy = _union(sorted((s[3], s[4]) for s in spans if s[0] == pool))
        pools[pool] = {"devices": sizes[pool], "busy_s": busy, "idle_fraction": 1.0 - busy / end if end else 0.0}
    all_resp = np.concatenate([samples[i][1] for i in range(len(iters))])
    res = RLResult(
        name=job.name, placement=job.placement, device=costs.dev.name, devices=job.total_devices, timing=timing,
        throughput=_ratio(steady, job.total_devices), response_length_mean=mean("response_length/mean"),
        response_length_max=float(max(row["response_length/max"] for row in steady)),
        clip_ratio=mean("response_length/clip_ratio"), pools=pools, memory=mem, memory_detail=detail,
        iterations=iters, preemptions=preempt,
        notes=sorted(set(notes) | {"a packed micro batch is costed as sequences of its mean length (attention per sequence)"}))
    del all_resp
    return RLRun(res, spans, job, costs.cache.simulations - sims0)


def _ratio(rows: list[dict], devices: int) -> float:
    """Tokens per second per device over the steady-state iterations: their tokens over their
    time (not the mean of the iterations' ratios, which weighs a short step as much as a long
    one), so that tokens/s x step x devices is the tokens of a mean iteration."""
    t = sum(row["timing_s/step"] for row in rows)
    return sum(row["perf/total_num_tokens"] for row in rows) / t / devices if t else 0.0


def _union(iv: list[tuple[float, float]]) -> float:
    tot, cur_s, cur_e = 0.0, None, None
    for s, e in iv:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                tot += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        tot += cur_e - cur_s
    return tot


def _fully_async(job: RLJob, costs: _Costs, samples: list, spans: list, record) -> tuple:
    """The streaming trainer (module docstring). Returns (preemptions, a GenerationResult, peak bytes by phase)."""
    I, B, n, s = job.iterations, job.train_batch_size, job.n, job.staleness
    # batches I .. I-1+s are the ones in flight when the last simulated update happens
    nb = len(samples)
    prompts = np.concatenate([x[0] for x in samples])
    resp = np.concatenate([x[1] for x in samples])
    batch_of = np.repeat(np.arange(nb), B * n)
    sync_end = np.zeros(I)
    arrivals = np.zeros(len(prompts))
    g = None
    for _ in range(FIXED_POINT_ROUNDS):
        g = costs.sims.generate(job, prompts, resp, arrivals)
        group_finish = g.finish_s.reshape(-1, n).max(axis=1)
        order = np.argsort(group_finish, kind="stable")
        spans_try: list = []
        peaks_all: dict[str, float] = {}
        rows = []
        prev = 0.0
        for j in range(I):
            take = order[j * B:(j + 1) * B]
            ready = float(group_finish[take].max())
            idx = (take[:, None] * n + np.arange(n)).ravel()
            seq = prompts[idx] + resp[idx]
            t, peaks = costs.train(seq, int(resp[idx].sum()))
            for q, v in peaks.items():
                peaks_all[q] = max(peaks_all.get(q, 0.0), v)
            sync_s, _ = costs.sync(g)
            start = max(ready, prev)
            cur = start
            for q, v in _phase_seq(t):
                spans_try.append(("train", q, j, cur, cur + v))
                cur += v
            ss = cur
            if not job.partial_rollout:      # drain: wait for every generation in flight at the update
                inflight = (arrivals <= cur) & (g.finish_s > cur)
                ss = max(cur, float(g.finish_s[inflight].max()) if inflight.any() else cur)
            spans_try.append(("train", "update_weights", j, ss, ss + sync_s))
            spans_try.append(("rollout", "update_weights", j, ss, ss + sync_s))
            rows.append((j, seq, resp[idx], max(0.0, ready - prev), t, sync_s, ss + sync_s - prev))
            prev = ss + sync_s
            sync_end[j] = prev
        # batch b waits for weight version b - 1 - s (b <= I - 1 + s, so that version is simulated)
        new_arr = np.array([sync_end[b - 1 - s] if b - 1 - s >= 0 else 0.0 for b in range(nb)])[batch_of]
        if np.array_equal(new_arr, arrivals):
            break
        arrivals = new_arr
    assert g is not None
    for b in range(nb):
        sel = batch_of == b
        spans.append(("rollout", "gen", b, float(arrivals[sel].min()), float(g.finish_s[sel].max())))
    spans.extend(spans_try)
    for row in rows:
        record(*row)
    return g.preemptions, g, peaks_all
