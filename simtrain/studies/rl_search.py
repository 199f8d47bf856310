"""`simtrain search` on a `job: rl` file: the best placement of an RL post-training job.

    enumerate  placement.kind (colocated, split, one_step_off, fully_async); for the split kinds
               placement.rollout_devices in whole nodes (1 .. nodes - 1 of them, the rest train);
               rollout.tp among the divisors of a node's devices and the file's own tp; for
               fully_async placement.staleness in DEFAULT_STALENESS. `--fix KEY=V1,V2` gives an
               axis its values (one value holds it); other keys are overrides of every candidate.
    check      rollout tp must divide the attention heads and pair with the KV heads (a head is
               not split over ranks); every other rule is the job loader's (build_rl_job: pools
               the tp divides, dp that splits the batch, ...). A candidate that fails is skipped
               and counted by the key its problem names.
    simulate   every candidate that loads, with simtrain.rl.iteration.simulate_rl and one
               SimCache: training passes are simulated once per training-pool size and shape, and
               split and one_step_off on the same pool and tp share their generations. A
               generation that does not fit the engine's memory, or a phase whose peak per device
               is over the usable memory (capacity - cluster.memory_reserve), makes the candidate
               infeasible (counted under `memory`).
    rank       by the steady-state step time (objective step_time) or tokens per second per
               device (tokens_per_s); on one cluster both order alike. Ties keep the enumeration
               order (placements in PLACEMENTS order, then pool, tp, staleness), so the same
               file gives the same ranking.
"""
from __future__ import annotations

import argparse
import copy
import csv
import io
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from simtrain import __version__, progress
from simtrain.errors import Collector, ConfigError, Problem, SimtrainError
from simtrain.hardware.devices import get_device
from simtrain.hardware.topology import find_topology_file
from simtrain.results.figures import plain, save_figure
from simtrain.results.io import check_out_dir, staged_dir, write_atomic
from simtrain.results.memory import capacity_of
from simtrain.results.report import write_report
from simtrain.rl.iteration import RLResult, SimCache, simulate_rl
from simtrain.rl.phases import VERL_ORDER
from simtrain.rl.spec import PLACEMENTS, RLJob, build_rl_job, is_rl_file, load_rl_tree
from simtrain.spec.files import TreeError, load_yaml, parse_yaml
from simtrain.units import fmt_bytes, fmt_time, plural

AXES = {"placement": "placement.kind", "rollout_devices": "placement.rollout_devices", "rollout_tp": "rollout.tp",
        "staleness": "placement.staleness"}
KEY_AXIS = {v: k for k, v in AXES.items()}
DEFAULT_STALENESS = (0, 1, 2)
OBJECTIVES = ("step_time", "tokens_per_s")
OUT_FILES = ("best.yaml", "search.csv", "search.png", "report.html")
PLACEMENT_COLORS = {"colocated": "#4C78A8", "split": "#F58518", "one_step_off": "#54A24B", "fully_async": "#E45756"}
GiB = 2.0**30

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def is_rl_job_file(path: str | Path) -> bool:
    """True when `path` reads as a `job: rl` file or a verl config (False when it cannot be read:
    the training search then reports the problem)."""
    try:
        raw = load_yaml(Path(path), Collector(str(path)), "")
    except Exception:        # the scenario loader reports unreadable files with their fix
        return False
    return is_rl_file(raw)


@dataclass(frozen=True)
class RLCandidate:
    placement: str
    rollout_devices: int          # the whole cluster when colocated
    rollout_tp: int
    staleness: int | None         # fully_async only

    def sort_key(self) -> tuple:
        return (PLACEMENTS.index(self.placement), self.rollout_devices, self.rollout_tp, -1 if self.staleness is None else self.staleness)

    def label(self, total: int) -> str:
        if self.placement == "colocated":
            return f"colocated tp{self.rollout_tp}"
        s = f"{self.placement} {self.rollout_devices}+{total - self.rollout_devices} tp{self.rollout_tp}"
        return s + (f" s{self.staleness}" if self.staleness is not None else "")

    def overrides(self) -> list[str]:
        out = [f"placement.kind={self.placement}", f"rollout.tp={self.rollout_tp}"]
        if self.placement != "colocated":
            out.append(f"placement.rollout_devices={self.rollout_devices}")
        if self.staleness is not None:
            out.append(f"placement.staleness={self.staleness}")
        return out

    def apply(self, raw: dict) -> dict:
        """The job tree with this candidate's keys (a colocated job has no rollout_devices)."""
        doc = copy.deepcopy(raw)
        pl = doc.setdefault("placement", {})
        if not isinstance(pl, dict):
            pl = doc["placement"] = {}
        pl["kind"] = self.placement
        if self.placement == "colocated":
            pl.pop("rollout_devices", None)
        else:
            pl["rollout_devices"] = self.rollout_devices
        if self.staleness is not None:
            pl["staleness"] = self.staleness
        ro = doc.setdefault("rollout", {})
        if isinstance(ro, dict):
            ro["tp"] = self.rollout_tp
        return doc


@dataclass
class RLOutcome:
    candidate: RLCandidate
    result: RLResult | None = None
    reason: str | None = None          # why it is infeasible: the category counted
    detail: str | None = None          # its first problem, as the loader or the simulation says it
    peak_bytes: float = 0.0
    usable_bytes: float = 0.0


@dataclass
class RLSearchResult:
    path: str
    objective: str
    total_devices: int
    ranked: list[RLOutcome]            # feasible, best first
    skipped: list[RLOutcome]           # infeasible, in enumeration order
    base_raw: dict
    wall_s: float = 0.0
    generation_runs: int = 0
    pass_simulations: int = 0
    infeasible: dict[str, int] = field(default_factory=dict)

    @property
    def enumerated(self) -> int:
        return len(self.ranked) + len(self.skipped)


def _axis_values(text: str, key: str) -> list:
    out = []
    for part in text.split(","):
        try:
            v = parse_yaml(part.strip())
        except TreeError:
            v = part.strip()
        out.append(v)
    errs = Collector("--fix")
    for v in out:
        if key == "placement.kind":
            if v not in PLACEMENTS:
                errs.add(key, f"--fix value {v!r} is not a placement", f"give one of {', '.join(PLACEMENTS)}")
        elif isinstance(v, bool) or not isinstance(v, int) or v < (0 if key == "placement.staleness" else 1):
            errs.add(key, f"--fix value {v!r} is not a whole number", "give whole numbers separated by commas, e.g. `--fix rollout.tp=1,2`")
    errs.raise_if_any()
    return out


def parse_rl_fixes(fixes: list[str]) -> tuple[dict[str, list], list[str]]:
    """`--fix rollout.tp=1,2` -> ({"rollout_tp": [1, 2]}, []); keys that are not search axes are
    overrides of every candidate, returned second."""
    axes, extra = {}, []
    for f in fixes:
        key, eq, val = f.partition("=")
        key = key.strip()
        if not eq:
            raise ConfigError([Problem("--fix", f, "expected key.path=value", "write e.g. `--fix placement.kind=fully_async`")])
        if key in KEY_AXIS:
            axes[KEY_AXIS[key]] = _axis_values(val, key)
        else:
            extra.append(f)
    return axes, extra


def heads_problem(model: object, tp: int) -> str | None:
    """Why a rollout tp cannot shard the model's attention: tp must divide the query heads and
    either divide the KV heads or be a multiple of them (a KV head is then replicated, as vLLM
    does). Example: Qwen2.5-7B (28 heads, 4 KV heads): tp 1, 2, 4 fit, tp 8 does not (28 / 8)."""
    a, g = model.num_attention_heads, model.num_key_value_heads
    if a % tp:
        return f"rollout.tp {tp} does not divide the {a} attention heads"
    if g % tp and tp % g:
        return f"rollout.tp {tp} neither divides nor is a multiple of the {g} KV heads"
    return None


def enumerate_candidates(base: RLJob, axes: dict[str, list]) -> list[RLCandidate]:
    """Every combination of the axes (module docstring), in a stable order."""
    gpn = base.rollout_topology.devices_per_node
    total = base.total_devices
    nodes = total // gpn
    placements = axes.get("placement", list(PLACEMENTS))
    pools = axes.get("rollout_devices", [gpn * k for k in range(1, nodes)])
    tps = axes.get("rollout_tp", sorted({d for d in range(1, gpn + 1) if gpn % d == 0} | {base.engine.tp}))
    stale = axes.get("staleness", list(DEFAULT_STALENESS))
    out = []
    for kind in placements:
        for rdev in ([total] if kind == "colocated" else pools):
            for tp in tps:
                for s in (stale if kind == "fully_async" else [None]):
                    out.append(RLCandidate(kind, rdev, tp, s))
    return sorted(set(out), key=RLCandidate.sort_key)


def _usable(job: RLJob) -> float:
    cl = job.roles["actor"].scenario.cluster
    cap = capacity_of(cl, get_device(cl.device).memory_bytes)
    return cap - cl.reserve_of(cap)


def _objective(objective: str, r: RLResult) -> float:
    return r.timing["step"] if objective == "step_time" else -r.throughput


def search_rl(path: str | Path, sets: list[str] | None = None, fixes: list[str] | None = None,
              objective: str = "step_time") -> RLSearchResult:
    """Searches the RL job at `path` (module docstring); `sets` override the file for every
    candidate (on an axis key they hold the axis), `fixes` give axes their values."""
    t0 = time.perf_counter()
    path = Path(path)
    if objective not in OBJECTIVES:
        raise ConfigError([Problem("--objective", "", f"{objective!r} is not an objective of an RL search",
                                   f"use one of: {', '.join(OBJECTIVES)}")])
    axes, extra = parse_rl_fixes(list(sets or []) + list(fixes or []))
    raw, base = load_rl_tree(path, extra)       # the file as written must load: it gives the cluster and model
    model = base.roles["actor"].scenario.model
    cache = SimCache()
    ranked, skipped = [], []
    cands = enumerate_candidates(base, axes)
    for c in progress.track(cands, len(cands), "search", "candidate"):
        o = RLOutcome(c)
        hp = heads_problem(model, c.rollout_tp)
        if hp is not None:
            o.reason, o.detail = "rollout.tp: heads", hp
            skipped.append(o)
            continue
        ce = Collector(str(path))
        job = build_rl_job(c.apply(raw), path, ce)
        if job is None:
            p = ce.problems[0]
            o.reason, o.detail = p.path or "job", f"{p.path}: {p.problem}"
            skipped.append(o)
            continue
        try:
            r = simulate_rl(job, cache).result
        except SimtrainError as e:
            line = str(e).splitlines()[0]
            o.reason = "memory: rollout" if ("KV" in line or "memory" in line) else "simulation"
            o.detail = line
            skipped.append(o)
            continue
        o.usable_bytes = _usable(job)
        o.peak_bytes = max(r.memory.values(), default=0.0)
        if o.peak_bytes > o.usable_bytes:
            ph = max(r.memory, key=r.memory.get)
            o.reason = "memory: phase peak"
            o.detail = (f"{ph} peaks at {fmt_bytes(o.peak_bytes)} per device, over the {fmt_bytes(o.usable_bytes)} usable")
            o.result = r
            skipped.append(o)
            continue
        o.result = r
        ranked.append(o)
    ranked.sort(key=lambda o: (_objective(objective, o.result), o.candidate.sort_key()))
    counts: dict[str, int] = {}
    for o in skipped:
        counts[o.reason] = counts.get(o.reason, 0) + 1
    return RLSearchResult(str(path), objective, base.total_devices, ranked, skipped, raw, time.perf_counter() - t0,
                          cache.generation_runs, sum(p.simulations for p in cache.passes.values()),
                          dict(sorted(counts.items())))


def _phases(res: RLSearchResult) -> list[str]:
    return [p for p in VERL_ORDER if any(o.result.timing.get(p, 0.0) > 0 for o in res.ranked)]


def table(res: RLSearchResult, top: int) -> str:
    phases = _phases(res)
    w = max([len(o.candidate.label(res.total_devices)) for o in res.ranked[:top]] + [9])
    head = f"  {'#':>3} {'candidate':<{w}} {'step':>11} {'tokens/s/dev':>12} " + " ".join(f"{p:>14}" for p in phases) + f" {'peak mem':>10}"
    lines = [head]
    for i, o in enumerate(res.ranked[:top], 1):
        r = o.result
        cells = " ".join(f"{fmt_time(r.timing[p]) if r.timing.get(p, 0.0) > 0 else '-':>14}" for p in phases)
        lines.append(f"  {i:>3} {o.candidate.label(res.total_devices):<{w}} {fmt_time(r.timing['step']):>11} "
                     f"{r.throughput:>12,.0f} {cells} {fmt_bytes(o.peak_bytes):>10}")
    return "\n".join(lines)


def counts_line(res: RLSearchResult) -> str:
    parts = ", ".join(f"{n} {k}" for k, n in res.infeasible.items())
    return (f"  {plural(res.enumerated, 'candidate')} enumerated, {len(res.skipped)} infeasible"
            + (f" ({parts})" if parts else "") + f", {len(res.ranked)} ranked")


def best_phases(res: RLSearchResult) -> str:
    """The best candidate's steady-state phases, as `simtrain run` prints them."""
    o = res.ranked[0]
    r = o.result
    c = o.candidate
    step = r.timing["step"]
    pool = ("every device" if c.placement == "colocated"
            else f"{c.rollout_devices} rollout + {res.total_devices - c.rollout_devices} training devices")
    lines = [f"  best: {c.placement} on {pool}, rollout tp {c.rollout_tp}"
             + (f", staleness {c.staleness}" if c.staleness is not None else "")
             + f": step {fmt_time(step)}, {r.throughput:,.1f} tokens/s per device",
             "    phase                     seconds   % of step"]
    for p in VERL_ORDER:
        v = r.timing.get(p, 0.0)
        if v or p in ("gen", "update_actor", "update_weights"):
            lines.append(f"    {p:<18} {fmt_time(v):>14}  {100 * v / step if step else 0.0:6.1f} %")
    if c.placement not in ("colocated", "split"):
        lines.append("    (gen overlaps training in this placement: the phases do not add up to the step)")
    for name, p in r.pools.items():
        lines.append(f"    pool {name:<14} {p['devices']:>5} devices, idle {100 * p['idle_fraction']:.1f} %")
    return "\n".join(lines)


def to_csv(res: RLSearchResult) -> str:
    """Every candidate: the ranked ones first with their rank, then the infeasible with why."""
    keys = [f"timing_s/{p}" for p in VERL_ORDER] + ["timing_s/step", "perf/throughput"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["rank", "candidate", "placement", "rollout_devices", "train_devices", "rollout_tp", "staleness", *keys,
                "peak_memory_bytes", "usable_memory_bytes", "infeasible", "why"])
    for i, o in enumerate(res.ranked + res.skipped, 1):
        c, r = o.candidate, o.result
        tdev = res.total_devices if c.placement == "colocated" else res.total_devices - c.rollout_devices
        vals = ([repr(r.timing.get(k.split("/")[1], 0.0)) for k in keys[:-1]] + [repr(r.throughput)]) if r is not None else [""] * len(keys)
        w.writerow([i if o.reason is None else "", c.label(res.total_devices), c.placement, c.rollout_devices, tdev, c.rollout_tp,
                    "" if c.staleness is None else c.staleness, *vals,
                    repr(o.peak_bytes) if r is not None else "", repr(o.usable_bytes) if r is not None else "",
                    o.reason or "", o.detail or ""])
    return buf.getvalue()


def _entry(o: RLOutcome, total: int) -> dict:
    c = o.candidate
    d: dict = {"candidate": c.label(total), "placement": c.placement, "rollout_devices": c.rollout_devices,
               "rollout_tp": c.rollout_tp, "staleness": c.staleness, "overrides": c.overrides()}
    if o.result is not None:
        r = o.result
        d.update({f"timing_s/{p}": r.timing.get(p, 0.0) for p in VERL_ORDER})
        d["timing_s/step"] = r.timing["step"]
        d["perf/throughput"] = r.throughput
        d["peak_memory_bytes"] = o.peak_bytes
        d["usable_memory_bytes"] = o.usable_bytes
    if o.reason is not None:
        d["infeasible"] = o.reason
        d["why"] = o.detail
    return d


def to_dict(res: RLSearchResult) -> dict:
    """The search as one JSON object (no wall time: the same file gives the same bytes)."""
    out: dict = {"job": res.path, "objective": res.objective, "devices": res.total_devices, "enumerated": res.enumerated,
                 "infeasible": res.infeasible, "ranked": [_entry(o, res.total_devices) for o in res.ranked],
                 "skipped": [_entry(o, res.total_devices) for o in res.skipped]}
    if res.ranked:
        b = res.ranked[0]
        out["best"] = {**_entry(b, res.total_devices), "pools": b.result.pools, "memory": b.result.memory}
    return out


def search_figure(res: RLSearchResult, title: str, top: int = 30) -> Figure:
    """The `top` best candidates' steady-state step times as bars, best at the top, coloured by
    placement."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    rows = res.ranked[:top]
    fig, ax = plt.subplots(figsize=(9, 1.0 + 0.28 * max(len(rows), 1)))
    ys = list(range(len(rows)))[::-1]
    ax.barh(ys, [o.result.timing["step"] for o in rows], color=[PLACEMENT_COLORS[o.candidate.placement] for o in rows])
    ax.set_yticks(ys, [plain(o.candidate.label(res.total_devices)) for o in rows], fontsize=8)
    ax.set_xlabel("steady-state step time (s)")
    ax.set_title(plain(title), fontsize=10)
    used = [k for k in PLACEMENTS if any(o.candidate.placement == k for o in rows)]
    ax.legend(handles=[Patch(color=PLACEMENT_COLORS[k], label=k) for k in used], fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def best_job(res: RLSearchResult, path: Path) -> dict:
    """The job tree with the best candidate's keys; the topology path made absolute so the file
    runs from wherever it is written."""
    doc = res.ranked[0].candidate.apply(res.base_raw)
    cl = doc.get("cluster")
    if isinstance(cl, dict):
        key = "topology_file" if "topology_file" in cl else "topology"
        ref = cl.get(key)
        t = find_topology_file(ref, path.parent) if isinstance(ref, str) else None
        if t is not None:
            cl[key] = str(Path(t).resolve())
    for k in ("prompt_length", "response_length"):
        spec = (doc.get("data") or {}).get(k)
        if isinstance(spec, dict) and isinstance(spec.get("file"), str) and not Path(spec["file"]).is_absolute():
            spec["file"] = str((path.parent / spec["file"]).resolve())
    doc["name"] = f"{doc.get('name', path.stem)}-best"
    return doc


def main(args: argparse.Namespace) -> int:
    """`simtrain search` on a `job: rl` file: table (or --json), the best candidate's phases, --out files."""
    path = Path(args.scenario)
    if args.top < 1:
        raise ConfigError([Problem("--top", "", "must be >= 1", "give a whole number >= 1")])
    if args.out:
        check_out_dir(args.out, "--out", OUT_FILES)
    res = search_rl(path, args.set or [], args.fix or [], args.objective)
    if not res.ranked:
        first = res.skipped[0].detail if res.skipped else "nothing was enumerated"
        raise ConfigError([Problem(str(path), "placement", f"no candidate is feasible ({counts_line(res).strip()}; first: {first})",
                                   "relax --fix, add nodes or use a device with more memory")])
    if args.out:
        out = Path(args.out)
        with staged_dir(out) as tmp:             # the files appear together
            write_atomic(tmp / "best.yaml", yaml.safe_dump(best_job(res, path), sort_keys=False).encode())
            write_atomic(tmp / "search.csv", to_csv(res).encode())
            save_figure(search_figure(res, f"{path.name}: {len(res.ranked)} ranked of {res.enumerated} candidates "
                                      f"(best {res.ranked[0].candidate.label(res.total_devices)})"), tmp / "search.png", dpi=110)
            write_report(tmp, "rl-search", f"search {path.name} (RL job; objective {res.objective})",
                         [("scenario file", str(path)), ("--set", " ".join(args.set or ()) or "none"),
                          ("--fix", " ".join(args.fix or ()) or "none")])
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(to_dict(res)) + "\n")     # no wall time: same file, same bytes
        return 0
    print(f"simtrain {__version__} — search {path} (RL job: placement, pool split, rollout tp, staleness; objective {res.objective})")
    print(counts_line(res) + f"; {res.wall_s:.1f} s ({res.generation_runs} generation simulations, "
          f"{res.pass_simulations} training-step simulations)")
    seen = set()
    for o in res.skipped:            # one example of each reason
        if o.reason not in seen:
            seen.add(o.reason)
            print(f"    skipped {o.candidate.label(res.total_devices)}: {o.detail}")
    print()
    print(table(res, args.top))
    print()
    print(best_phases(res))
    if args.out:
        print(f"\n  wrote {args.out}/: best.yaml (run it: simtrain run {args.out}/best.yaml) search.csv search.png report.html")
    return 0
