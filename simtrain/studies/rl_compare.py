"""`simtrain compare` on an RL job: each variant's iteration in verl's phases, side by side.

The variants come from the same `--set` axes as a training compare (`placement.kind=colocated,split`,
`rollout.tp=1,2,4`, `placement.kind+placement.rollout_devices=split+8,split+16`); each is loaded
and simulated on its own, and a variant that does not load or simulate is a row with its message.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from simtrain import progress
from simtrain.errors import SimtrainError
from simtrain.rl.iteration import simulate_rl
from simtrain.rl.phases import VERL_ORDER
from simtrain.rl.spec import load_rl_job
from simtrain.studies.compare import variants
from simtrain.studies.textable import Column, render
from simtrain.units import fmt_time

GiB = 2.0**30


@dataclass
class RLRow:
    label: str
    overrides: list
    metrics: dict = field(default_factory=dict)     # RLResult.to_dict()
    error: str | None = None


def run_rl_variants(job: str | Path, sets: Sequence[str] | None) -> list[RLRow]:
    labelled = variants(sets, f"{Path(job).name} as written")
    rows = []
    for label, over in progress.track(labelled, len(labelled), "compare", "variant"):
        row = RLRow(label, list(over))
        try:
            row.metrics = simulate_rl(load_rl_job(job, over)).result.to_dict()
        except SimtrainError as e:          # ConfigError included: the row carries its first line
            row.error = str(e).splitlines()[0]
        rows.append(row)
    return rows


def _phases(rows: list[RLRow]) -> list[str]:
    """The verl phases that take time in at least one variant, in verl's order."""
    return [p for p in VERL_ORDER if any(r.metrics.get(f"timing_s/{p}", 0.0) > 0 for r in rows if not r.error)]


def rl_table(rows: list[RLRow], width: int | None = None) -> str:
    """One row per variant; a phase that takes no time in a variant (fully_async's gen: the trainer
    never waits for data) reads "-"."""
    phases = _phases(rows)
    cols = ([Column("variant", key=True), Column("step", ">", drop=9), Column("tokens/s/dev", ">", drop=8)]
            + [Column(p, ">", drop=7 - min(i, 6)) for i, p in enumerate(phases)] + [Column("peak mem", ">", drop=0)])
    out = []
    for r in rows:
        if r.error:
            out.append((r.label, f"invalid: {r.error}"))
            continue
        m = r.metrics
        peak = max(m.get("memory", {}).values(), default=0.0)
        out.append([r.label, fmt_time(m["timing_s/step"]), f"{m['perf/throughput']:,.0f}"]
                   + [fmt_time(m[f"timing_s/{p}"]) if m[f"timing_s/{p}"] > 0 else "-" for p in phases]
                   + [f"{peak / GiB:.1f} GiB"])
    return "\n".join(render(cols, out, width))


def rl_csv(rows: list[RLRow]) -> str:
    keys = [f"timing_s/{p}" for p in VERL_ORDER] + ["timing_s/step", "perf/throughput", "response_length/mean",
                                                   "response_length/max", "response_length/clip_ratio"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["variant", "overrides", *keys, "peak_memory_gib", "error"])
    for r in rows:
        if r.error:
            w.writerow([r.label, " ".join(r.overrides)] + [""] * (len(keys) + 1) + [r.error])
            continue
        m = r.metrics
        peak = max(m.get("memory", {}).values(), default=0.0)
        w.writerow([r.label, " ".join(r.overrides)] + [f"{m.get(k, 0.0):.9g}" for k in keys] + [f"{peak / GiB:.6g}", ""])
    return buf.getvalue()
