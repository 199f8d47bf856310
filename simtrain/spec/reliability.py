"""The scenario's `reliability:` section (failures, recovery, checkpoints, spares of a long run):
its keys declared once, and the check that turns it into a frozen ReliabilitySpec.

The section is part of the scenario file format, so it is declared and checked here, with the
rest of the scenario (`simtrain.spec.loading.load_scenario` runs `check_section`); the
reliability study (simtrain.studies.reliability) consumes the spec.

The shipped defaults (simtrain/data/reliability.yaml, every number with its source) are merged
under the user's section key by key, then the whole tree is checked at once: every problem is
collected as `<file>: reliability.<key.path>: <problem>; <fix>`. Keys ending in `source` or
`reasoning` are free text (where a number comes from) and are kept out of the checks.

Durations accept the units of simtrain.units plus days (`simtrain.units.parse_duration`):
"30 days", "12 h", "90 s". Failure rates are per unit-hour (`rate_per_unit_hour`) or a published
`count` over the `exposure` of the defaults (Llama 3: 54 days on 16,384 GPUs / 2,048 hosts /
16,384 NICs), e.g. faulty_gpu: 148 / (16,384 GPUs x 1,296 h) = 6.97e-6 per GPU-hour:

>>> round(148 / (16384 * 54 * 24), 8)
6.97e-06
"""
from __future__ import annotations

import copy
import difflib
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Optional

import yaml

from simtrain import resources
from simtrain.errors import Collector
from simtrain.spec.fields import Key, Section, parse_value
from simtrain.units import UnitError, parse_duration

DATA = resources.DATA / "reliability.yaml"

PER = ("gpu", "host", "nic", "job")
ACTIONS = ("swap", "restart")
DETECTIONS = ("crash", "hang", "none")
METHODS = ("sync", "async", "in_memory")
DISTRIBUTIONS = ("exponential", "weibull")


@dataclass(frozen=True)
class Category:
    name: str
    rate_per_unit_hour: float
    per: str                 # gpu | host | nic | job
    action: str              # swap | restart
    detection: str           # crash | hang | none
    group: str
    planned: bool = False


@dataclass(frozen=True)
class FailureSpec:
    categories: tuple
    distribution: str = "exponential"
    weibull_shape: float = 1.0
    rate_scale: float = 1.0      # multiplies every rate (what-if: a less or more reliable fleet)
    from_scenario: bool = False  # the scenario gives its own categories or exposure (not the shipped H100 rates)


@dataclass(frozen=True)
class RecoverySpec:
    detect_crash_s: float
    detect_hang_s: float
    requeue_s: float
    launch_s: float
    comm_init_base_s: float
    comm_init_per_rank_s: float
    read_bandwidth: float
    load_fixed_s: float
    warmup_steps: int
    warmup_slowdown: float


@dataclass(frozen=True)
class CheckpointSpec:
    method: str
    interval_s: float | None         # None: auto (Daly's higher-order optimum)
    size_bytes: float | None         # None: from the memory model
    write_bandwidth: float
    node_bandwidth: float | None     # None: the topology's NICs x NIC bandwidth per host
    fixed_overhead_s: float
    snapshot_bandwidth: float
    snapshot_overhead_s: float
    background_slowdown: float
    replicas: int
    persist_interval_s: float
    host_memory_bytes: float
    usable_host_memory_fraction: float


@dataclass(frozen=True)
class SparesSpec:
    hot_nodes: int
    repair_time_s: float
    swap_time_s: float
    elastic: bool
    min_dp_fraction: float


@dataclass(frozen=True)
class ReliabilitySpec:
    horizon_s: float | None
    tokens: float | None
    trials: int
    seed: int
    step_time_s: float | None        # None: from the step simulation
    step_time_cv: float
    failures: FailureSpec
    recovery: RecoverySpec
    checkpoint: CheckpointSpec
    spares: SparesSpec


def _is_note(key: Any) -> bool:
    return isinstance(key, str) and (key.endswith("source") or key.endswith("reasoning"))


# --- the keys of `reliability:` ---------------------------------------------------------------------
SHIPPED = "shipped (simtrain/data/reliability.yaml)"


def _sec(keys: dict, doc: str = "") -> Section:
    return Section(keys, doc=doc, required=False, notes=_is_note)


def _part(section: Section, doc: str) -> Key:
    """A sub-section merged key by key over the shipped defaults."""
    return Key("any", None, doc, section=section, derived=SHIPPED)


def _shipped(kind: Any, doc: str, **kw: Any) -> Key:
    return Key(kind, None, doc, derived=SHIPPED, **kw)


EXPOSURE = _sec({
    "gpus": _shipped("int", "GPUs of the fleet the counts were observed on"),
    "hosts": _shipped("int", "hosts of that fleet"),
    "nics": _shipped("int", "scale-out NICs of that fleet"),
    "days": _shipped("float", "days the counts span"),
    "interruptions": _shipped("int", "all interruptions of the span (for reference)"),
    "planned": _shipped("int", "planned interruptions of the span (for reference)"),
    "unexpected": _shipped("int", "unexpected interruptions of the span (for reference)"),
}, "the fleet and span published failure counts were observed over")

CATEGORY = _sec({
    "count": Key("float", None, "failures observed over failures.exposure (or give rate_per_unit_hour)", optional=True),
    "rate_per_unit_hour": Key("float", None, "failures per unit and hour (0..1)", unit="1/h", optional=True),
    "per": Key(PER, "gpu", "the unit a rate counts (job: one per job)"),
    "action": Key(ACTIONS, None, "swap: the failed node is replaced; restart: the job restarts on the same nodes",
                  derived="swap (planned: restart)"),
    "detection": Key(DETECTIONS, None, "how the failure is noticed (hang: after the collective timeout)",
                     derived="crash (planned: none)"),
    "group": Key("str", None, "the group results are summed under", derived="the category name (planned: planned)"),
    "enabled": Key("bool", True, "false: leave the category out"),
}, "one failure category: a rate (or a count over the exposure), its unit and what it costs")

FAILURES = _sec({
    "exposure": _part(EXPOSURE, "the fleet and span of the published counts"),
    "categories": Key("any", None, "failure categories by name; `name: null` or `false` drops a shipped one",
                      section=CATEGORY, named=True, derived=SHIPPED),
    "planned": Key("any", None, "planned interruptions (maintenance) as one category; null or false: none", optional=True,
                   section=CATEGORY, derived=SHIPPED),
    "distribution": Key(DISTRIBUTIONS, "exponential", "time between failures"),
    "weibull_shape": Key("float", 1.0, "weibull: the shape (0.05..20; 1 is exponential)"),
    "rate_scale": Key("float", 1.0, "multiplies every rate (> 0, <= 1000; what-if: a less or more reliable fleet)"),
    "cross_check": Key("any", None, "published numbers the defaults are compared with (not read)", json={"type": "object"}),
}, "failure rates")

RECOVERY = _sec({
    "detection": _part(_sec({
        "crash": _shipped("duration", "until a crash is noticed"),
        "hang": _shipped("duration", "until a hang is noticed (the collective timeout)"),
    }), "time to notice a failure"),
    "restart": _part(_sec({
        "requeue": _shipped("duration", "scheduler re-queue and allocation"),
        "launch": _shipped("duration", "process start to model built"),
        "comm_init_base": _shipped("duration", "communicator initialisation, fixed part"),
        "comm_init_per_rank": _shipped("duration", "communicator initialisation per rank"),
    }), "time to start the job again"),
    "load": _part(_sec({
        "read_bandwidth": _shipped("bandwidth", "checkpoint read bandwidth of the storage"),
        "fixed": _shipped("duration", "fixed cost of loading a checkpoint"),
    }), "loading the last checkpoint"),
    "warmup": _part(_sec({
        "steps": _shipped("int", "slow steps after a restart (>= 0)"),
        "slowdown": _shipped("float", "step time factor of those steps (>= 1)"),
    }), "the first steps after a restart"),
}, "what a restart costs")

CHECKPOINT = _sec({
    "method": _shipped(METHODS, "sync: training waits for the write; async: a snapshot, written in the background; "
                                "in_memory: copies in peer hosts' memory"),
    "interval": _shipped("any", "time between checkpoints, or `auto` (Daly's higher-order optimum)",
                         json={"anyOf": [{"const": "auto"}, {"type": "string"}], "description": "`auto` or a duration"}),
    "size": Key("bytes", None, "bytes of one checkpoint", optional=True, derived="from the memory model"),
    "storage": _part(_sec({
        "write_bandwidth": _shipped("bandwidth", "aggregate write bandwidth of the storage"),
        "node_bandwidth": _shipped("any", "write bandwidth of one host, or `topology` (its NICs x NIC bandwidth)",
                                   json={"type": "string", "description": "`topology` or a bandwidth"}),
    }), "where checkpoints are written"),
    "fixed_overhead": _shipped("duration", "fixed cost of one checkpoint"),
    "snapshot_bandwidth": _shipped("bandwidth", "device-to-host copy of a snapshot, per device"),
    "snapshot_overhead": _shipped("duration", "synchronisation before a snapshot"),
    "background_slowdown": _shipped("float", "step time added while a background write runs (>= 0; 0.05: 5 %)"),
    "in_memory": _part(_sec({
        "replicas": _shipped("posint", "copies of each host's checkpoint (>= 2 for in_memory)"),
        "persist_interval": _shipped("duration", "time between writes of the in-memory checkpoint to storage"),
        "host_memory": _shipped("bytes", "memory of one host"),
        "usable_host_memory_fraction": _shipped("float", "share of the host memory free for copies, in (0, 1]"),
    }), "in-memory checkpoints"),
}, "how and how often checkpoints are taken")

SPARES = _sec({
    "hot_nodes": _shipped("int", "spare nodes ready to replace a failed one (>= 0)"),
    "repair_time": _shipped("duration", "until a failed node is back in the spare pool"),
    "swap_time": _shipped("duration", "swapping a spare in"),
    "elastic": _shipped("bool", "true: without a spare, continue on fewer data-parallel replicas"),
    "min_dp_fraction": _shipped("float", "elastic: the smallest share of the data-parallel replicas to run on, in (0, 1]"),
}, "spare nodes")

RELIABILITY = _sec({
    "horizon": Key("duration", "30 days", "wall-clock span of the run (or give tokens)"),
    "tokens": Key("float", None, "a token budget instead of a horizon (> 0)", optional=True),
    "trials": Key("posint", 100, "Monte Carlo trials"),
    "seed": Key("int", None, "seed of the trials", derived="the scenario's seed"),
    "step_time": Key("duration", None, "time of one step (> 0)", optional=True, derived="from the step simulation"),
    "step_time_cv": Key("float", 0.0, "coefficient of variation of the step time, in [0, 1]"),
    "failures": _part(FAILURES, "failure rates"),
    "recovery": _part(RECOVERY, "what a restart costs"),
    "checkpoint": _part(CHECKPOINT, "checkpoints"),
    "spares": _part(SPARES, "spare nodes"),
}, "failures, checkpoints and restarts of a long run (simtrain reliability)")


def _merge(base, over):
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = _merge(base.get(k), v) if k in base else copy.deepcopy(v)
        return out
    return copy.deepcopy(over)


class _Reader:
    """Reads one mapping of the merged tree against its allowed keys, collecting problems."""

    def __init__(self, errs: Collector, path: str):
        self.errs, self.path = errs, path

    def sub(self, tree: dict, key: str, allowed) -> dict:
        p = f"{self.path}.{key}"
        node = tree.get(key, {})
        if node is None:
            node = {}
        if not isinstance(node, dict):
            self.errs.add(p, f"expected a mapping, got {type(node).__name__}", "write it as `key: value` lines")
            return {}
        self.unknown(node, allowed, p)
        return node

    def unknown(self, node: dict, allowed, path: str):
        for k in node:
            if _is_note(k) or k in allowed:
                continue
            close = difflib.get_close_matches(str(k), list(allowed), n=1)
            self.errs.add(f"{path}.{k}", "unknown key", f"did you mean `{close[0]}`?" if close else f"allowed keys: {', '.join(allowed)}")

    def duration(self, node: dict, key: str, path: str, allow_none=False):
        v = node.get(key)
        if v is None and allow_none:
            return None
        try:
            return parse_duration(v)
        except UnitError as e:
            self.errs.add(f"{path}.{key}", str(e), 'write e.g. "90 s", "10 min", "12 h" or "30 days"')
            return None

    def value(self, node: dict, key: str, kind, path: str):
        return parse_value(node.get(key), kind, f"{path}.{key}", self.errs)

    def number(self, node: dict, key: str, path: str, lo=0.0, hi=None, lo_open=False):
        v = parse_value(node.get(key), "float", f"{path}.{key}", self.errs)
        if v is None:
            return None
        bad = (v <= lo) if lo_open else (v < lo)
        if bad or (hi is not None and v > hi):
            rng = f"{'>' if lo_open else '>='} {lo:g}" + (f" and <= {hi:g}" if hi is not None else "")
            self.errs.add(f"{path}.{key}", f"{v!r} is out of range", f"use a number {rng}")
            return None
        return v


SECTION_KEYS = tuple(RELIABILITY)


def parse_section(user: Any, errs: Collector, scenario_seed: int = 0) -> ReliabilitySpec | None:
    """User section (or None) + shipped defaults -> ReliabilitySpec; None when any problem was found."""
    root = "reliability"
    n0 = len(errs.problems)
    if user is None:
        user = {}
    if not isinstance(user, dict):
        errs.add(root, f"expected a mapping, got {type(user).__name__}", "write e.g. `reliability: {horizon: \"30 days\"}`")
        return None
    r = _Reader(errs, root)
    r.unknown(user, SECTION_KEYS, root)
    d = defaults()
    tree = {"failures": copy.deepcopy(d["failures"]), "recovery": copy.deepcopy(d["recovery"]),
            "checkpoint": copy.deepcopy(d["checkpoint"]), "spares": copy.deepcopy(d["spares"])}
    for k in ("failures", "recovery", "checkpoint", "spares"):
        if k in user and user[k] is not None and not isinstance(user[k], dict):
            errs.add(f"{root}.{k}", f"expected a mapping, got {type(user[k]).__name__}", "write it as `key: value` lines")
            continue
        if k in user and user[k] is not None:
            tree[k] = _merge(tree[k], user[k])

    horizon = tokens = None
    if "horizon" in user and "tokens" in user:
        errs.add(root, "both `horizon` and `tokens` are given", "give one: a wall-clock horizon or a token budget")
    if "tokens" in user:
        tokens = r.number(user, "tokens", root, lo=0, lo_open=True)
    else:
        horizon = r.duration({"horizon": user.get("horizon", "30 days")}, "horizon", root)
        if horizon is not None and horizon <= 0:
            errs.add(f"{root}.horizon", "must be > 0", 'write e.g. "30 days"')
    trials = parse_value(user.get("trials", 100), "posint", f"{root}.trials", errs)
    seed = parse_value(user.get("seed", scenario_seed), "int", f"{root}.seed", errs)
    step_time = r.duration(user, "step_time", root, allow_none=True)
    if step_time is not None and step_time <= 0:
        errs.add(f"{root}.step_time", "must be > 0", 'write e.g. "12 s" or leave it out (taken from the step simulation)')
    cv = r.number({"step_time_cv": user.get("step_time_cv", 0.0)}, "step_time_cv", root, lo=0.0, hi=1.0)

    failures = _failures(r, tree, root)
    uf = user.get("failures")
    if failures is not None and isinstance(uf, dict) and ("categories" in uf or "exposure" in uf):
        failures = replace(failures, from_scenario=True)
    recovery = _recovery(r, tree, root)
    checkpoint = _checkpoint(r, tree, root)
    spares = _spares(r, tree, root)
    if len(errs.problems) > n0:
        return None
    return ReliabilitySpec(horizon_s=horizon, tokens=tokens, trials=trials, seed=seed, step_time_s=step_time,
                           step_time_cv=cv, failures=failures, recovery=recovery, checkpoint=checkpoint, spares=spares)


def _failures(r: _Reader, tree: dict, root: str):
    p = f"{root}.failures"
    f = r.sub(tree, "failures", FAILURES)
    exp = f.get("exposure") or {}
    days = r.number({"days": exp.get("days", 0)}, "days", f"{p}.exposure", lo=0.0, hi=36525.0) if isinstance(exp, dict) else None
    if days is None and isinstance(exp, dict) and "days" in exp:
        return None             # its error is reported; every count over it would repeat it
    hours = (days or 0.0) * 24.0
    units = {"gpu": exp.get("gpus"), "host": exp.get("hosts"), "nic": exp.get("nics"), "job": 1}
    dist = r.value({"distribution": f.get("distribution", "exponential")}, "distribution", DISTRIBUTIONS, p)
    # a shape below 0.05 or above 20 puts almost every failure at t = 0 or at one instant: not a
    # fleet's failure process, and the inverse-CDF sampling loses its precision there
    shape = r.number({"weibull_shape": f.get("weibull_shape", 1.0)}, "weibull_shape", p, lo=0.05, hi=20.0)
    # rate_scale 0 would mean a fleet that never fails (the MTBF divides by it); 1000x the published
    # rates is already one failure every few seconds on a large job
    scale = r.number({"rate_scale": f.get("rate_scale", 1.0)}, "rate_scale", p, lo=0.0, hi=1000.0, lo_open=True)
    cats = []
    raw = f.get("categories") or {}
    if not isinstance(raw, dict):
        r.errs.add(f"{p}.categories", "expected a mapping of category name -> fields", "write e.g. `faulty_gpu: {count: 148, per: gpu}`")
        raw = {}

    def one(name, c, cp, planned):
        if c is None or c is False:
            return None                         # `name: null` / `name: false` drops a shipped category
        if not isinstance(c, dict):
            r.errs.add(cp, f"expected a mapping, got {type(c).__name__}", "write e.g. `{rate_per_unit_hour: 1.0e-6, per: gpu}` or `null` to drop it")
            return None
        r.unknown(c, CATEGORY, cp)
        if c.get("enabled", True) is False:
            return None
        per = r.value({"per": c.get("per", "gpu")}, "per", PER, cp)
        if "rate_per_unit_hour" in c:
            rate = r.number(c, "rate_per_unit_hour", cp, lo=0.0, hi=1.0)    # one failure per unit-hour at most
        elif "count" in c:
            cnt = r.number(c, "count", cp, lo=0.0, hi=1e9)
            n = units.get(per) if per else None
            if cnt is None or per is None:
                return None
            if not n or hours <= 0:
                r.errs.add(cp, f"a count needs the exposure (failures.exposure.days and the number of {per}s)",
                           "give `rate_per_unit_hour:` instead")
                return None
            rate = cnt / (float(n) * hours)
        else:
            r.errs.add(cp, "no rate", "give `rate_per_unit_hour:` (failures per unit-hour) or `count:` over failures.exposure")
            return None
        action = r.value({"action": c.get("action", "restart" if planned else "swap")}, "action", ACTIONS, cp)
        det = r.value({"detection": c.get("detection", "none" if planned else "crash")}, "detection", DETECTIONS, cp)
        group = c.get("group", "planned" if planned else name)
        if None in (rate, per, action, det):
            return None
        return Category(str(name), rate, per, action, det, str(group), planned)

    for name, c in raw.items():
        cat = one(name, c, f"{p}.categories.{name}", False)
        if cat is not None:
            cats.append(cat)
    pl = f.get("planned")
    if pl not in (None, False):
        cat = one("planned", pl, f"{p}.planned", True)
        if cat is not None:
            cats.append(cat)
    return FailureSpec(tuple(cats), dist, shape, scale) if None not in (dist, shape, scale) else None


def _recovery(r: _Reader, tree: dict, root: str):
    p = f"{root}.recovery"
    rec = r.sub(tree, "recovery", RECOVERY)
    det = r.sub(rec, "detection", RECOVERY["detection"].entries())
    rs = r.sub(rec, "restart", RECOVERY["restart"].entries())
    ld = r.sub(rec, "load", RECOVERY["load"].entries())
    wu = r.sub(rec, "warmup", RECOVERY["warmup"].entries())
    vals = dict(
        detect_crash_s=r.duration(det, "crash", f"{p}.detection"), detect_hang_s=r.duration(det, "hang", f"{p}.detection"),
        requeue_s=r.duration(rs, "requeue", f"{p}.restart"), launch_s=r.duration(rs, "launch", f"{p}.restart"),
        comm_init_base_s=r.duration(rs, "comm_init_base", f"{p}.restart"),
        comm_init_per_rank_s=r.duration(rs, "comm_init_per_rank", f"{p}.restart"),
        read_bandwidth=r.value(ld, "read_bandwidth", "bandwidth", f"{p}.load"), load_fixed_s=r.duration(ld, "fixed", f"{p}.load"),
        warmup_steps=r.value({"steps": wu.get("steps", 0)}, "steps", "int", f"{p}.warmup"),
        warmup_slowdown=r.number({"slowdown": wu.get("slowdown", 1.0)}, "slowdown", f"{p}.warmup", lo=1.0),
    )
    if vals["warmup_steps"] is not None and vals["warmup_steps"] < 0:
        r.errs.add(f"{p}.warmup.steps", "must be >= 0", "write e.g. `3`")
        return None
    return None if None in vals.values() else RecoverySpec(**vals)


def _checkpoint(r: _Reader, tree: dict, root: str):
    p = f"{root}.checkpoint"
    ck = r.sub(tree, "checkpoint", CHECKPOINT)
    st = r.sub(ck, "storage", CHECKPOINT["storage"].entries())
    im = r.sub(ck, "in_memory", CHECKPOINT["in_memory"].entries())
    method = r.value(ck, "method", METHODS, p)
    iv = ck.get("interval", "auto")
    interval = None
    if iv != "auto":
        interval = r.duration(ck, "interval", p)
        if interval is not None and interval <= 0:
            r.errs.add(f"{p}.interval", "must be > 0", 'write e.g. "30 min" or `auto`')
            interval = None
            method = None
    size = None
    if ck.get("size") is not None:
        size = r.value(ck, "size", "bytes", p)
    nb = st.get("node_bandwidth", "topology")
    node_bw = None if nb == "topology" else r.value(st, "node_bandwidth", "bandwidth", f"{p}.storage")
    vals = dict(
        method=method, write_bandwidth=r.value(st, "write_bandwidth", "bandwidth", f"{p}.storage"),
        fixed_overhead_s=r.duration(ck, "fixed_overhead", p), snapshot_bandwidth=r.value(ck, "snapshot_bandwidth", "bandwidth", p),
        snapshot_overhead_s=r.duration(ck, "snapshot_overhead", p),
        background_slowdown=r.number(ck, "background_slowdown", p, lo=0.0),
        replicas=r.value(im, "replicas", "posint", f"{p}.in_memory"),
        persist_interval_s=r.duration(im, "persist_interval", f"{p}.in_memory"),
        host_memory_bytes=r.value(im, "host_memory", "bytes", f"{p}.in_memory"),
        usable_host_memory_fraction=r.number(im, "usable_host_memory_fraction", f"{p}.in_memory", lo=0.0, hi=1.0, lo_open=True),
    )
    if vals["replicas"] is not None and vals["replicas"] < 2 and method == "in_memory":
        r.errs.add(f"{p}.in_memory.replicas", "an in-memory checkpoint needs a copy on at least one peer host", "use replicas: 2 or more")
        return None
    if None in vals.values() or (nb != "topology" and node_bw is None) or (ck.get("size") is not None and size is None):
        return None
    return CheckpointSpec(interval_s=interval, size_bytes=size, node_bandwidth=node_bw, **vals)


def _spares(r: _Reader, tree: dict, root: str):
    p = f"{root}.spares"
    sp = r.sub(tree, "spares", SPARES)
    hot = r.value(sp, "hot_nodes", "int", p)
    if hot is not None and hot < 0:
        r.errs.add(f"{p}.hot_nodes", "must be >= 0", "write e.g. `32`")
        hot = None
    vals = dict(hot_nodes=hot, repair_time_s=r.duration(sp, "repair_time", p), swap_time_s=r.duration(sp, "swap_time", p),
                elastic=r.value(sp, "elastic", "bool", p),
                min_dp_fraction=r.number(sp, "min_dp_fraction", p, lo=0.0, hi=1.0, lo_open=True))
    return None if None in vals.values() else SparesSpec(**vals)


def scenario_seed(raw_scenario: dict) -> int:
    """The scenario's `seed:` where it is a whole number (the section's default seed), else 0."""
    seed = raw_scenario.get("seed", 0)
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else 0


def check_section(raw_scenario: dict, errs: Collector) -> Optional[ReliabilitySpec]:
    """The `reliability:` section of a raw scenario, checked with the rest of it (load_scenario)."""
    return parse_section(raw_scenario.get("reliability"), errs, scenario_seed(raw_scenario))


@lru_cache(maxsize=None)
def defaults() -> dict:
    """The shipped defaults (simtrain/data/reliability.yaml)."""
    with open(DATA) as f:
        return yaml.safe_load(f)
