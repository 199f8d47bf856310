"""Plan search (above the pipeline): the best parallel plan for a scenario's model, cluster and
global batch, ranked by event-level simulation.

    enumerate  tp x cp x pp x dp = devices (tp within a scale-up domain, dividing the heads and
               pairing with the KV heads; cp only for sequences >= 16k with seq % 2cp = 0; pp
               splitting the layers evenly, vpp for interleaved 1F1B; ep dividing the experts and
               tp x cp x dp for MoE), micro batch (a divisor of global_batch / dp, <= --max-mb),
               sequence parallel (tp > 1), recompute, ZeRO stage, schedule; `--fix` narrows an axis
    validate   each plan through the loader (build_scenario): every divisibility, schedule and
               world-size rule the scenario file would meet; ConfigErrors drop the plan
    prune      memory: static (weights + grads + optimizer) + buffers + one microbatch-chunk of
               activations is a lower bound of the simulated peak: above capacity -> dropped
               step: the closed form `simtrain.studies.estimate` orders the survivors, those whose memory
               estimate (the schedule's in-flight microbatch-chunks) fits first
    simulate   the first `max_candidates` at event level; the final ranking is the simulation's:
               plans with headroom first, then tight plans (a simulated peak within
               `memory_margin` of the usable memory: fits, but with less than the margin to
               spare), then plans that do not fit; by the objective inside each group

Objectives: step_time (s, lower is better), tokens_per_s (higher), cost (US$ per million tokens =
price per device-hour x devices x step time / 3600 / tokens per step x 1e6, from the scenario's
`cost.price_per_device_hour`). At one cluster size the three order plans alike; with `--nodes`
(several cluster sizes) they differ: more devices buy tokens/s at a price.
"""
from __future__ import annotations

import argparse
import copy
import csv
import io
import itertools
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from simtrain import __version__, progress
from simtrain.errors import Collector, ConfigError, Problem, ScheduleError
from simtrain.hardware.devices import device_of
from simtrain.hardware.topology import Topology, find_topology_file, load_topology
from simtrain.network.collectives import Cost, choose
from simtrain.results.figures import plain, save_figure
from simtrain.results.io import check_out_dir, staged_dir, write_atomic
from simtrain.results.memory import capacity_of, memory_fit, rank_static
from simtrain.results.report import write_report
from simtrain.results.step import StepResult
from simtrain.schedules import SCHEDULES, Schedule, schedule_for
from simtrain.spec.files import TreeError, load_yaml, parse_yaml
from simtrain.spec.loading import apply_overrides, build_scenario, load_scenario
from simtrain.spec.scenario import Scenario
from simtrain.studies import rl_search
from simtrain.studies.estimate import estimate
from simtrain.studies.runner import Point, run_factors
from simtrain.units import fmt_bytes, fmt_time
from simtrain.workload.build import build_workload

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from matplotlib.figure import Figure

    from simtrain.plan.grid import GroupShape
    from simtrain.spec.scenario import ModelSpec, ParallelSpec

RECOMPUTE = ("none", "selective", "full")
DEFAULT_SCHEDULES = ("1f1b", "interleaved_1f1b")
VPPS = (2, 3, 4, 6, 8)
LONG_SEQUENCE = 16384
OBJECTIVES = ("step_time", "tokens_per_s", "cost")

# plan axes and the scenario key each one sets
AXES = {"tp": "parallel.tp", "cp": "parallel.cp", "pp": "parallel.pp", "dp": "parallel.dp", "ep": "parallel.ep",
        "vpp": "parallel.vpp", "schedule": "parallel.schedule", "sequence_parallel": "parallel.sequence_parallel",
        "zero_stage": "parallel.zero_stage", "micro_batch_size": "training.micro_batch_size",
        "recompute": "training.recompute", "nodes": "cluster.nodes"}
KEY_AXIS = {v: k for k, v in AXES.items()}
# a plan replaces these: an explicit layer split or rank map belongs to the base plan only
CLEARED = ("parallel.layers_per_stage", "parallel.first_stage_layers", "parallel.last_stage_layers",
           "parallel.schedule_csv", "parallel.device_of_rank")


@dataclass(frozen=True, order=True)
class Plan:
    nodes: int
    tp: int
    cp: int
    pp: int
    dp: int
    ep: int
    schedule: str
    vpp: int
    micro_batch_size: int
    sequence_parallel: bool
    recompute: str
    zero_stage: int
    layers_per_stage: tuple | None = None     # an uneven split when the layers do not divide evenly

    def overrides(self) -> list:
        return [f"{AXES[k]}={json.dumps(getattr(self, k))}" for k in AXES] + [f"{k}=null" for k in CLEARED] + (
            [f"parallel.layers_per_stage={json.dumps(list(self.layers_per_stage))}"] if self.layers_per_stage else [])

    def label(self) -> str:
        s = f"tp{self.tp}" + (f" cp{self.cp}" if self.cp > 1 else "") + f" pp{self.pp} dp{self.dp}"
        s += f" ep{self.ep}" if self.ep > 1 else ""
        s += f" mb{self.micro_batch_size}" + (" sp" if self.sequence_parallel else "")
        s += f" rc-{self.recompute} z{self.zero_stage} {self.schedule}" + (f"/v{self.vpp}" if self.vpp > 1 else "")
        if self.layers_per_stage:
            q = min(self.layers_per_stage)
            s += f" [{q}..{max(self.layers_per_stage)}]"
        return s

    def key_values(self) -> dict:
        return {k: getattr(self, k) for k in AXES}


def uneven_split(L: int, S: int) -> tuple | None:
    """L layers over S stages when S does not divide L: the S − r lighter stages (L // S layers) at
    the ends, first and last first (they also hold the embedding and the head), the r heavier ones
    (one more) in the middle. None when S divides L. Example: 126 over 16 -> (7, 8 x 14, 7), the
    split of the shipped Llama-3-405B scenario."""
    q, r = divmod(L, S)
    if r == 0 or q == 0:
        return None
    light = S - r
    ends = []
    lo, hi = 0, S - 1
    for i in range(light):
        if i % 2 == 0:
            ends.append(lo)
            lo += 1
        else:
            ends.append(hi)
            hi -= 1
    return tuple(q if k in ends else q + 1 for k in range(S))


def divisors(n: int) -> list:
    return [d for d in range(1, n + 1) if n % d == 0]


def parse_fixes(fixes: Sequence[str] | None, path: str) -> dict:
    """`--fix parallel.tp=8` -> {"tp": 8} for plan axes; other keys (e.g. parallel.placement) are
    plain overrides applied to every plan, returned under "_extra"."""
    out, extra = {}, []
    errs = Collector("--fix")
    for f in fixes or ():
        key, eq, val = f.partition("=")
        key = key.strip()
        if not eq:
            errs.add(f, "expected key.path=value", "write e.g. `--fix parallel.tp=8`")
            continue
        try:
            v = parse_yaml(val)
        except TreeError:
            v = val
        if key in KEY_AXIS:
            name = KEY_AXIS[key]
            if name == "sequence_parallel":
                ok, want = isinstance(v, bool), "true or false"
            elif name == "schedule":
                ok, want = v in SCHEDULES, f"one of: {', '.join(SCHEDULES)}"
            elif name == "recompute":
                ok, want = v in RECOMPUTE + ("op",), f"one of: {', '.join(RECOMPUTE + ('op',))}"
            else:
                lo = 0 if name == "zero_stage" else 1
                ok, want = isinstance(v, int) and not isinstance(v, bool) and v >= lo, f"a whole number >= {lo}"
            if not ok:
                errs.add(key, f"--fix value {val!r} is not valid", f"give {want}")
                continue
            out[name] = v
        else:
            extra.append(f)
    errs.raise_if_any()
    out["_extra"] = extra
    return out


def enumerate_plans(model: ModelSpec, global_batch: int, devices_per_node: int, nodes_list: Iterable[int], fixes: dict,
                    schedules: Sequence[str] = DEFAULT_SCHEDULES, max_mb: int = 8, zero_stages: Sequence[int] = (0, 1)) -> list:
    """Every structurally valid plan (the loader still checks each); sorted, so the order is stable.

    Example (tests/test_search.py): 4 devices, 8 layers, 8 heads, global batch 8, with sp, recompute,
    ZeRO and schedule fixed: (tp, pp, dp) in {(1,1,4) (1,2,2) (1,4,1) (2,1,2) (2,2,1) (4,1,1)}, micro
    batches dividing 8/dp -> 2 + 3 + 4 + 3 + 4 + 4 = 20 plans."""
    fx = {k: v for k, v in fixes.items() if k != "_extra"}

    def axis(name, values):
        return [fx[name]] if name in fx else list(values)
    a, g = model.num_attention_heads, model.num_key_value_heads
    L, s = model.num_layers, model.seq_length
    moe = model.moe
    out = []
    for nodes in axis("nodes", nodes_list):
        W = nodes * devices_per_node
        for tp in axis("tp", [d for d in divisors(W) if d <= devices_per_node and a % d == 0 and (g % d == 0 or d % g == 0)]):
            cps = [c for c in divisors(W // tp) if c == 1 or (s >= LONG_SEQUENCE and s % (2 * c) == 0 and c <= 32)] if W % tp == 0 else []
            for cp in axis("cp", cps):
                if W % (tp * cp):
                    continue
                for pp in axis("pp", [p for p in divisors(W // (tp * cp)) if p <= L // 2 or p == 1 or L % p == 0]):
                    if W % (tp * cp * pp):
                        continue
                    dp = W // (tp * cp * pp)
                    if "dp" in fx and fx["dp"] != dp:
                        continue
                    if global_batch % dp:
                        continue
                    eps = [e for e in divisors(moe.num_experts) if (tp * cp * dp) % e == 0] if moe is not None else [1]
                    mbs = [m for m in divisors(global_batch // dp) if m <= max_mb]
                    scheds = []
                    for sch in axis("schedule", schedules if pp > 1 else ("1f1b",)):
                        if sch == "interleaved_1f1b":
                            scheds += [(sch, v) for v in axis("vpp", VPPS) if L % (pp * v) == 0]
                        elif "vpp" not in fx or fx["vpp"] in (1, None):
                            scheds.append((sch, 1))
                    split = uneven_split(L, pp)
                    sps = [False, True] if tp > 1 else [False]
                    if moe is not None and tp > 1:
                        sps = [True]
                    for ep, (sch, vpp), mb, sp, rc, z in itertools.product(
                            axis("ep", eps), scheds, axis("micro_batch_size", mbs), axis("sequence_parallel", sps),
                            axis("recompute", RECOMPUTE), axis("zero_stage", zero_stages)):
                        out.append(Plan(nodes, tp, cp, pp, dp, ep, sch, vpp, mb, sp, rc, z, split if vpp == 1 else None))
    return sorted(set(out))


class PlanCache:
    """The memo tables of one search, passed explicitly to what uses them: thousands of plans
    share a few schedules, one topology per cluster size and a few hundred collective choices.

    schedule     by (name, pp, microbatches, vpp): a registered schedule depends on nothing else
                 (schedules.build_schedule). Built with its builder's own checks but without
                 `validate` (a dependency walk quadratic in the actions, most of a candidate's
                 cost): the registered builders are validated by the schedule tests, and every
                 plan that is simulated goes through the validated `schedule_for` again.
    topology     by (file, nodes, mtime, arguments): the loader for build_scenario; one object
                 per cluster size, which the collective table keys on.
    choose       network.collectives.choose by (collective, bytes, group shape, topology
                 identity, algorithm, protocol, measured tables); it is pure."""

    def __init__(self) -> None:
        self.schedules: dict = {}
        self.topologies: dict = {}
        self.collectives: dict = {}

    def schedule(self, parallel: ParallelSpec, m: int) -> Schedule:
        if parallel.schedule_csv:
            return schedule_for(parallel, m)
        key = (parallel.schedule, parallel.pp, m, parallel.vpp)
        if key not in self.schedules:
            d = SCHEDULES[parallel.schedule]
            problems = d.check(parallel.pp, m, parallel.vpp)
            if problems:
                raise ScheduleError("; ".join(f"{k}: {p}; {f}" for k, p, f in problems))
            self.schedules[key] = d.build(parallel.pp, m, parallel.vpp)
        return self.schedules[key]

    def topology(self, path: str | Path, nodes: int, *args: object, **kwargs: object) -> Topology:
        # repr: the topology overrides are a (nested, unhashable) mapping
        key = (str(path), nodes, os.path.getmtime(path), repr(args), repr(sorted(kwargs.items())))
        if key not in self.topologies:
            self.topologies[key] = load_topology(path, nodes, *args, **kwargs)
        return self.topologies[key]

    def choose(self, coll: str, n: float, g: GroupShape, topo: Topology, algorithm: str = "auto", protocol: str = "auto",
               measured: tuple = (), notes: set | None = None) -> Cost:
        if notes is not None:           # the caller collects lookup notes: not a pure call
            return choose(coll, n, g, topo, algorithm, protocol, measured, notes)
        key = (coll, n, g, id(topo), algorithm, protocol, measured)
        if key not in self.collectives:
            self.collectives[key] = choose(coll, n, g, topo, algorithm, protocol, measured)
        return self.collectives[key]


def closed_form(sc: Scenario, topo: Topology, cache: PlanCache | None = None) -> float:
    """simtrain.studies.estimate's step time: the interleaved pipeline term (m·v + p − 1) chunk times and
    the gradient reduction the last microbatch's backward cannot hide (both found by comparing
    with the simulation over every plan of a small case, tests/test_search.py). With a `cache`,
    its schedules and collective choices."""
    if cache is None:
        return estimate(sc, topo)["step_time_s"]
    return estimate(sc, topo, schedule=cache.schedule(sc.parallel, sc.num_microbatches), collective=cache.choose)["step_time_s"]


def memory_bounds(sc: Scenario, topo: Topology, cache: PlanCache | None = None) -> tuple:
    """(lower bound, estimate) of the peak bytes of the busiest rank, without simulating.
    Lower: static + buffers + the largest single microbatch-chunk's stored activations (every
    schedule holds at least one when its first backward starts). Estimate: the in-flight count
    from walking the schedule's actions (F allocates a chunk's activations, its B / BW frees them;
    with a split backward the W does), the engine's rule, plus the transient working bytes."""
    p = sc.parallel
    sched = (cache or PlanCache()).schedule(p, sc.num_microbatches)
    work = build_workload(sc, sched.num_stages)
    act = [sum(w.act_layers) + w.act_bytes_pre + w.act_bytes_post for w in work]
    lower = est = 0.0
    free_on = "W" if sched.split_backward else None
    for r, held in enumerate(sched.stage_of):
        st = rank_static(sc, work, held).total
        lower = max(lower, st + max(act[k] for k in held))
        cur = peak = 0.0
        for a in sched.actions[r]:
            k = held[a.chunk] if a.chunk < len(held) else held[0]
            if a.kind == "F":
                cur += act[k]
                peak = max(peak, cur)
            elif (free_on == "W" and a.kind in ("W", "BW")) or (free_on is None and a.kind in ("B", "BW")):
                cur -= act[k]
        est = max(est, st + peak + max(work[k].act_working_bytes for k in held))
    return lower, est


def plan_raw(raw: dict, plan: Plan) -> dict:
    """The scenario dict with the plan's values set (what `apply_overrides(raw, plan.overrides())`
    gives, without parsing 17 YAML snippets per plan)."""
    d = copy.deepcopy(raw)
    for k, key in AXES.items():
        sec, name = key.split(".")
        if not isinstance(d.get(sec), dict):
            d[sec] = {}
        d[sec][name] = getattr(plan, k)
    for key in CLEARED:
        sec, name = key.split(".")
        d[sec][name] = None
    if plan.layers_per_stage:
        d["parallel"]["layers_per_stage"] = list(plan.layers_per_stage)
    return d


@dataclass
class Candidate:
    plan: Plan
    scenario: object = None
    topology: object = None
    mem_lower: float = 0.0
    mem_estimate: float = 0.0
    capacity: float = 0.0
    estimate_s: float = 0.0
    result: StepResult | None = None
    error: str | None = None
    objective: float = 0.0

    @property
    def est_fits(self) -> bool:
        return memory_fit([(self.mem_estimate, self.capacity)], self.scenario.cluster.reserve_of).fits

    def headroom(self) -> float:
        """Usable memory (capacity - reserve) less the simulated peak, in bytes; < 0: does not fit."""
        r = self.result
        return r.usable_memory_bytes - r.peak_memory_bytes

    def tight(self, margin: float) -> bool:
        """Fits, but with less than `margin` of the usable memory to spare."""
        return self.result.fits_in_memory and self.headroom() < margin * self.result.usable_memory_bytes


@dataclass
class SearchResult:
    ranked: list                       # simulated candidates, best first
    enumerated: int
    invalid: int                       # dropped by the loader's checks
    memory_pruned: int                 # dropped by the memory lower bound
    estimated: int                     # closed-form estimates computed
    simulated: int
    wall_s: float
    objective: str
    price: float | None
    base_raw: dict = field(default_factory=dict)   # the scenario with the --fix/--set values that are not plan axes
    timing: dict = field(default_factory=dict)
    memory_margin: float = 0.0         # plans with less headroom than this share of usable memory rank later


MEMORY_MARGIN = 0.05
"""Default headroom a plan should keep (a fraction of the usable memory, capacity - reserve)
before search ranks it with the plans that have room: 5 %, ASSUMED. The memory model counts
weights, gradients, optimizer state, activations and the buffers it names, not kernel workspaces
(cuBLAS, attention), temporaries or a peak that moves with data (sequence packing, routing); a plan
planned to the last byte is the first to fail on a real cluster. `--memory-margin 0` ranks by the
objective alone among plans that fit."""


def check_margin(margin: float) -> None:
    """A margin is a fraction of the usable memory in [0, 1)."""
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not (0.0 <= margin < 1.0):
        raise ConfigError([Problem("--memory-margin", "", f"a fraction of the usable memory must be >= 0 and < 1, got {margin!r}",
                                   "write e.g. `--memory-margin 0.05` (5 %), or 0 to rank by the objective alone")])


def rank(chosen: Iterable[Candidate], margin: float) -> list:
    """Simulated candidates, best first: plans with headroom (at least `margin` of the usable
    memory to spare), then tight plans (they fit, with less), then plans that do not fit; by the
    objective inside each group; candidates whose simulation failed last."""
    done = [c for c in chosen if c.result is not None]
    ranked = sorted(done, key=lambda c: (not c.result.fits_in_memory, c.tight(margin), c.objective, c.plan))
    return ranked + [c for c in chosen if c.result is None]


def objective_value(objective: str, r: StepResult, sc: Scenario, price: float | None) -> float:
    """Lower is better for every objective (tokens/s enters negated)."""
    if objective == "step_time":
        return r.step_time_s
    if objective == "tokens_per_s":
        return -r.tokens_per_s
    return cost_per_mtok(price, r)


def cost_per_mtok(price: float, r: StepResult) -> float:
    """US$ per million tokens: price x devices x step / 3600 / tokens per step x 1e6.
    Example: $2/device-h, 1,024 devices, a 10 s step of 3.1M tokens: 2 x 1024 x 10 / 3600 / 3.1e6 x 1e6 = $1.84."""
    return price * r.num_devices * r.step_time_s / 3600.0 / (r.tokens_per_s * r.step_time_s) * 1e6


def search(path: str | Path, objective: str = "step_time", fixes: Sequence[str] = (), max_candidates: int = 20,
           nodes_list: Sequence[int] | None = None, schedules: Sequence[str] = DEFAULT_SCHEDULES, max_mb: int = 8,
           zero_stages: Sequence[int] = (0, 1), exhaustive: bool = False, memory_margin: float = MEMORY_MARGIN) -> SearchResult:
    """`exhaustive` simulates every plan that survives the memory lower bound (the tests' reference);
    `memory_margin` (a fraction of the usable memory) ranks tight plans after those with headroom."""
    check_margin(memory_margin)
    t0 = time.perf_counter()
    path = Path(path)
    if objective not in OBJECTIVES:
        raise ConfigError([Problem("--objective", "", f"unknown objective {objective!r}", f"use one of: {', '.join(OBJECTIVES)}")])
    errs = Collector(str(path))
    raw = load_yaml(path, errs, "check the path: give an existing YAML scenario file")
    if not isinstance(raw, dict):
        load_scenario(path)             # says why a file that is not a mapping is no scenario
    fx = parse_fixes(fixes, str(path))
    extra = fx["_extra"]
    cache = PlanCache()
    raw_x = apply_overrides(raw, extra, errs)           # read once: every plan starts from it
    base, topo0 = build_scenario(raw_x, path, errs, topology_loader=cache.topology)
    price = None
    if objective == "cost":
        price = (raw.get("cost") or {}).get("price_per_device_hour")
        if price is None:
            raise ConfigError([Problem(str(path), "cost.price_per_device_hour", "--objective cost needs a price per device-hour",
                                       "add `cost: {price_per_device_hour: 2.0}` (US$) to the scenario")])
    plans = enumerate_plans(base.model, base.training.global_batch_size, topo0.devices_per_node,
                            nodes_list or [base.cluster.nodes], fx, schedules, max_mb, zero_stages)
    cands, invalid, pruned = [], 0, 0
    t1 = time.perf_counter()
    for plan in plans:
        errs = Collector(str(path))
        try:
            sc, topo = build_scenario(plan_raw(raw_x, plan), path, errs, topology_loader=cache.topology)
        except ConfigError:
            invalid += 1
            continue
        lo, est = memory_bounds(sc, topo, cache)
        cap = capacity_of(sc.cluster, device_of(sc.cluster).memory_bytes)
        if not memory_fit([(lo, cap)], sc.cluster.reserve_of).fits:
            pruned += 1
            continue
        cands.append(Candidate(plan, sc, topo, lo, est, cap))
    t2 = time.perf_counter()
    # closed form for the plans whose memory estimate fits; the others only if too few fit
    fit = [c for c in cands if c.est_fits]
    todo = cands if (exhaustive or len(fit) < max_candidates) else fit
    for c in todo:
        c.estimate_s = closed_form(c.scenario, c.topology, cache)
        W = c.scenario.world_size
        tokens = c.scenario.training.global_batch_size * c.scenario.model.seq_length
        c.objective = {"step_time": c.estimate_s, "tokens_per_s": -tokens / c.estimate_s,
                       "cost": (price or 0.0) * W * c.estimate_s / 3600.0 / tokens * 1e6}[objective]
    cands = todo
    t3 = time.perf_counter()
    cands.sort(key=lambda c: (not c.est_fits, c.objective, c.plan))
    chosen = cands if exhaustive else cands[:max_candidates]
    points = [Point(extra + c.plan.overrides(), c.scenario, c.topology) for c in chosen]
    for o, c in zip(progress.track(run_factors(path, points), len(points), "search", "candidate"), chosen):
        if o.ok:
            c.result = o.result
            c.objective = objective_value(objective, c.result, c.scenario, price)
        else:
            c.error = o.error.splitlines()[0]
    t4 = time.perf_counter()
    ranked = rank(chosen, memory_margin)
    return SearchResult(ranked, len(plans), invalid, pruned, len(todo), len(chosen), time.perf_counter() - t0, objective, price,
                        raw_x, {"validate_and_memory_s": t2 - t1, "estimate_s": t3 - t2, "simulate_s": t4 - t3},
                        memory_margin)


COMPONENTS = ("compute_s", "bubble_s")


def _components(r: StepResult) -> dict:
    b = r.breakdown
    d = {"compute": b.compute_s, "pipeline bubble": b.bubble_s}
    for k, v in b.exposed_comm_s.items():
        d[f"exposed {k} comm"] = v
    return d


def why_best(res: SearchResult) -> str:
    """One line: which part of the busiest rank's step the best plan spends less on than the runner-up."""
    ok = [c for c in res.ranked if c.result is not None]
    if len(ok) < 2:
        return "only one plan was simulated"
    a, b = ok[0], ok[1]
    if a.result.fits_in_memory and not b.result.fits_in_memory:
        return f"{a.plan.label()} is the only simulated plan that fits in memory among the first two"
    ca, cb = _components(a.result), _components(b.result)
    diffs = sorted(((cb[k] - ca[k], k) for k in ca), reverse=True)
    gain, comp = diffs[0]
    dt = b.result.step_time_s - a.result.step_time_s
    line = (f"best {a.plan.label()} beats the runner-up {b.plan.label()} by {fmt_time(dt)} per step"
            f" ({100 * dt / b.result.step_time_s:.1f} %)")
    if gain > 0:
        line += f": its {comp} is {fmt_time(gain)} shorter ({fmt_time(ca[comp])} vs {fmt_time(cb[comp])} on the busiest rank)"
    if res.objective == "cost" and a.result.num_devices != b.result.num_devices:
        line += f"; on {a.result.num_devices} devices vs {b.result.num_devices}"
    return line


def table(res: SearchResult, top: int) -> str:
    head = f"  {'#':>3} {'plan':52s} {'step':>9s} {'estimate':>9s} {'MFU':>6s} {'peak mem':>10s} {'headroom':>10s} {'fits':>5s} {'bubble':>7s} {'exposed comm (tp/cp/ep/pp/dp)':>32s}"
    if res.objective == "cost":
        head += f" {'$/Mtok':>8s}"
    lines = [head]
    for i, c in enumerate(res.ranked[:top], 1):
        if c.result is None:
            lines.append(f"  {i:>3} {c.plan.label():52s} error: {c.error}")
            continue
        r = c.result
        ex = r.breakdown.exposed_comm_s
        comm = "/".join(f"{1e3 * ex[k]:.0f}" for k in ("tp", "cp", "ep", "pp", "dp")) + " ms"
        line = (f"  {i:>3} {c.plan.label():52s} {fmt_time(r.step_time_s):>9s} {fmt_time(c.estimate_s):>9s} {100 * r.mfu:5.1f}% "
                f"{fmt_bytes(r.peak_memory_bytes):>10s} {fmt_bytes(c.headroom()):>10s} "
                f"{('tight' if c.tight(res.memory_margin) else 'yes') if r.fits_in_memory else 'NO':>5s} {100 * r.bubble_fraction:6.1f}% {comm:>32s}")
        if res.objective == "cost":
            line += f" {cost_per_mtok(res.price, r):8.3f}"
        lines.append(line)
    return "\n".join(lines)


def best_scenario(res: SearchResult, path: Path) -> dict:
    """The base scenario's YAML with the best plan applied; file paths made absolute so the file
    runs from wherever it is written."""
    best = res.ranked[0]
    errs = Collector(str(path))
    doc = apply_overrides(res.base_raw, best.plan.overrides(), errs)
    for k in CLEARED:
        sec, key = k.split(".")
        if not (k == "parallel.layers_per_stage" and best.plan.layers_per_stage):
            doc.get(sec, {}).pop(key, None)
    if doc["parallel"].get("vpp") == 1 and doc["parallel"].get("schedule") != "interleaved_1f1b":
        doc["parallel"].pop("vpp")
    topo = doc["cluster"]["topology"]          # a name or path, or {file: ..., overridden keys}
    ref = topo.get("file") if isinstance(topo, dict) else topo
    t = find_topology_file(ref, path.parent) if isinstance(ref, str) else None
    if t is not None:
        if isinstance(topo, dict):
            doc["cluster"]["topology"] = {**topo, "file": str(Path(t).resolve())}
        else:
            doc["cluster"]["topology"] = str(Path(t).resolve())
    for sec, key in (("cluster", "device_profile"), ("model", "hf_config")):
        v = (doc.get(sec) or {}).get(key) if isinstance(doc.get(sec), dict) else None
        if isinstance(v, str) and not Path(v).is_absolute() and (path.parent / v).exists():
            doc[sec][key] = str((path.parent / v).resolve())
    doc["name"] = f"{doc.get('name', path.stem)}-best"
    return doc


def pareto(points: Sequence[tuple[float, float]]) -> list:
    """Indices of the points no other point beats in both coordinates (lower is better in each).
    Example: (1, 5) (2, 3) (3, 4) (4, 1) -> 0, 1, 3 ((3, 4) is beaten by (2, 3))."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front, best_y = [], float("inf")
    for i in order:
        if points[i][1] < best_y:
            front.append(i)
            best_y = points[i][1]
    return sorted(front)


def search_figure(res: SearchResult, title: str) -> Figure:
    """Step time against peak memory for every simulated plan, the Pareto front marked, the best
    plan named; labels escape `$` (no mathtext)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [c for c in res.ranked if c.result is not None]
    GiB = 2.0**30
    pts = [(c.result.peak_memory_bytes / GiB, c.result.step_time_s) for c in ok]
    front = set(pareto(pts))
    fig, ax = plt.subplots(figsize=(8, 5))
    fit = [i for i, c in enumerate(ok) if c.result.fits_in_memory]
    nofit = [i for i, c in enumerate(ok) if not c.result.fits_in_memory]
    ax.scatter([pts[i][0] for i in fit], [pts[i][1] for i in fit], c="#4c72b0", s=22, label="simulated plan (fits)")
    if nofit:
        ax.scatter([pts[i][0] for i in nofit], [pts[i][1] for i in nofit], c="#c44e52", marker="x", s=22, label="does not fit")
    fr = sorted(front, key=lambda i: pts[i][0])
    ax.plot([pts[i][0] for i in fr], [pts[i][1] for i in fr], "-o", c="#dd8452", mfc="none", ms=9, label="Pareto front")
    if ok:
        ax.axvline(ok[0].result.usable_memory_bytes / GiB, c="grey", ls="--", lw=1, label="usable memory (capacity - reserve)")
        b = ok[0]
        ax.annotate(plain(f"best: {b.plan.label()}"), (pts[0][0], pts[0][1]), xytext=(8, 8), textcoords="offset points",
                    fontsize=8)
    ax.set_xlabel("peak memory per device (GiB)")
    ax.set_ylabel("step time (s)")
    ax.set_title(plain(title), fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def figure(res: SearchResult, path: Path, title: str) -> None:
    """Writes `search_figure` to `path`."""
    save_figure(search_figure(res, title), path, dpi=110)


def to_csv(res: SearchResult) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    cols = list(AXES)
    w.writerow(["rank"] + cols + ["estimate_s", "step_time_s", "mfu", "tokens_per_s", "peak_memory_bytes", "fits_in_memory",
                                  "bubble_fraction"] + [f"exposed_{k}_s" for k in ("tp", "cp", "ep", "pp", "dp")] +
               ["usable_memory_bytes", "headroom_bytes", "tight", "error"])
    for i, c in enumerate(res.ranked, 1):
        r = c.result
        ex = r.breakdown.exposed_comm_s if r is not None else {}
        w.writerow([i] + [getattr(c.plan, k) for k in cols] + [repr(c.estimate_s)] +
                   ([repr(getattr(r, k)) for k in ("step_time_s", "mfu", "tokens_per_s", "peak_memory_bytes")] +
                    [r.fits_in_memory, repr(r.bubble_fraction)] if r is not None else [""] * 6) +
                   [repr(ex[k]) if k in ex else "" for k in ("tp", "cp", "ep", "pp", "dp")] +
                   ([repr(r.usable_memory_bytes), repr(c.headroom()), c.tight(res.memory_margin)] if r is not None else [""] * 3) +
                   [c.error or ""])
    return buf.getvalue()


def _int_list(text: str, what: str) -> list:
    try:
        vals = [int(x) for x in text.split(",")]
        if any(v < 1 for v in vals):
            raise ValueError
        return vals
    except ValueError:
        raise ConfigError([Problem(what, "", f"expected whole numbers >= 1 separated by commas, got {text!r}", f"write e.g. `{what} 16,32,64`")])


def main(args: argparse.Namespace) -> int:
    path = Path(args.scenario)
    if rl_search.is_rl_job_file(path):          # placement, pool split, rollout tp, staleness
        return rl_search.main(args)
    if getattr(args, "json", False):
        raise ConfigError([Problem("--json", "", "a plan search prints a table", "leave out --json (it is for `job: rl` files), or use --out DIR for search.csv")])
    if args.max_candidates < 1 or args.top < 1:
        raise ConfigError([Problem("--max-candidates" if args.max_candidates < 1 else "--top", "", "must be >= 1", "give a whole number >= 1")])
    nodes = _int_list(args.nodes, "--nodes") if args.nodes else None
    try:
        zero = tuple(int(z) for z in args.zero.split(",")) if args.zero else (0, 1)
    except ValueError:
        zero = (-1,)
    if any(z not in (0, 1, 2, 3) for z in zero):
        raise ConfigError([Problem("--zero", "", f"ZeRO stages are 0..3, got {args.zero!r}", "write e.g. `--zero 0,1,2`")])
    scheds = tuple(s.strip() for s in args.schedules.split(",")) if args.schedules else DEFAULT_SCHEDULES
    if args.out:
        check_out_dir(args.out, "--out", ("best.yaml", "search.csv", "search.png", "report.html"))    # before searching
    margin = getattr(args, "memory_margin", MEMORY_MARGIN)
    check_margin(margin)
    res = search(path, args.objective, (args.set or []) + (args.fix or []), args.max_candidates, nodes, scheds, args.max_mb, zero,
                 memory_margin=margin)
    print(f"simtrain {__version__} — search {path} (objective {res.objective})")
    print(f"  {res.enumerated} plans enumerated, {res.invalid} rejected by the scenario checks, {res.memory_pruned} pruned by the "
          f"memory lower bound, {res.estimated} estimated in closed form, {res.simulated} simulated; {res.wall_s:.1f} s "
          f"(checks {res.timing['validate_and_memory_s']:.1f} s, estimate {res.timing['estimate_s']:.1f} s, simulation {res.timing['simulate_s']:.1f} s)")
    if not res.ranked:
        raise ConfigError([Problem(str(path), "parallel", "no plan passes the scenario checks and the memory lower bound",
                                   "relax --fix, allow more nodes (--nodes) or a larger --max-mb, or use a device with more memory")])
    print()
    print(table(res, args.top))
    best = res.ranked[0]
    if best.result is not None:
        print(f"\n  why: {why_best(res)}")
        if not best.result.fits_in_memory:
            print("  warning: no simulated plan fits in memory; raise --max-candidates or relax --fix")
    if args.out:
        out = Path(args.out)
        with staged_dir(out) as tmp:             # the files appear together
            write_atomic(tmp / "best.yaml", yaml.safe_dump(best_scenario(res, path), sort_keys=False).encode())
            write_atomic(tmp / "search.csv", to_csv(res).encode())
            figure(res, tmp / "search.png", f"{path.name}: {res.simulated} simulated plans (best {fmt_time(best.result.step_time_s)})"
                   if best.result else path.name)
            write_report(tmp, "search", f"search {path.name} (objective {res.objective})", [
                ("scenario file", str(path)), ("plans", f"{res.enumerated} enumerated, {res.invalid} rejected by the scenario "
                 f"checks, {res.memory_pruned} pruned by the memory lower bound, {res.estimated} estimated, {res.simulated} simulated"),
                ("why", why_best(res) if best.result is not None else "no plan was simulated")])
        print(f"\n  wrote {out}/: best.yaml (run it: simtrain run {out}/best.yaml) search.csv search.png report.html")
    return 0
