"""report.html: one self-contained page of what a command wrote into its `--out` directory.

    write_report(out_dir, kind, title, facts)     kind: "run", "rl", "compare", "search" or "rl-search"

The page is built from the files already in `out_dir` (result.json, compare.csv, search.csv,
the PNG figures, the resolved scenario), so its numbers are those files' numbers: every number
cell carries the exact value it shows in a `data-value` attribute (the JSON number, or the CSV
text) beside the rounded text a reader sees. It needs nothing but a browser: the CSS is inline,
figures are embedded as base64 `data:image/png` URIs, there is no script and no font to load.

Every string that comes from the user (scenario names, `--set` labels, file paths, error
messages, YAML) passes through `html.escape`. The page holds no timestamp and no wall time, so
the same input gives the same bytes (the figures are written without matplotlib's software
stamp, see `simtrain.results.figures.save_figure`).
"""
from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
from collections.abc import Sequence
from pathlib import Path

from simtrain import __version__
from simtrain.errors import ConfigError, Problem
from simtrain.results.io import write_atomic
from simtrain.units import fmt_bytes, fmt_time

KINDS = ("run", "rl", "compare", "search", "rl-search", "replay")
REPORT = "report.html"
GiB = 2.0**30

# figures of each kind, in page order: (file name, caption)
FIGURES = {
    "run": (("timeline.png", "Pipeline timeline of the step (one row per rank class)"),),
    "rl": (("timeline.png", "RL iterations: pools (rows) by phase"),),
    "compare": (("compare.png", "The variants' pipeline timelines, step time and peak memory"),),
    "search": (("search.png", "Step time against peak memory of every simulated plan; the Pareto front marked"),),
    "rl-search": (("search.png", "Steady-state step time of the best candidates, coloured by placement"),),
    "replay": (),
}

CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;color:#222}
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:.2em}
p.meta{color:#666;margin-top:0}
table{border-collapse:collapse;font-size:.9em;margin:.5em 0}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.bad td{background:#fdecea}
div.wide{overflow-x:auto}
span.bar{display:inline-block;height:.8em;background:#4C78A8;vertical-align:middle}
figure{margin:1em 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#555;font-size:.9em}
pre{background:#f7f7f7;padding:.8em;overflow-x:auto;font-size:.85em}
ul.notes li{margin:.2em 0}
"""


def esc(text: object) -> str:
    """`text` as HTML text or attribute value: & < > " ' escaped."""
    return html.escape(str(text), quote=True)


def _num(value: object) -> str:
    """The exact value of a number for `data-value`: repr of a float (round-trips), str of the rest."""
    return repr(value) if isinstance(value, float) else str(value)


class Cell:
    """A table cell: its text, and for a number the exact value behind it (`data-value`)."""

    def __init__(self, text: object, value: object = None, bar: float | None = None) -> None:
        self.text = str(text)
        self.value = value
        self.bar = bar            # a fraction in [0, 1] drawn as a bar after the text

    def html(self) -> str:
        if self.value is None:
            return f"<td>{esc(self.text)}</td>"
        bar = ""
        if self.bar is not None:
            w = max(0.0, min(1.0, self.bar)) * 120
            bar = f' <span class="bar" style="width:{w:.1f}px"></span>'
        return f'<td class="n" data-value="{esc(_num(self.value))}">{esc(self.text)}{bar}</td>'


def t(seconds: float) -> Cell:
    return Cell(fmt_time(seconds), seconds)


def b(nbytes: float) -> Cell:
    return Cell(fmt_bytes(nbytes), nbytes)


def gib(nbytes: float) -> Cell:
    return Cell(f"{nbytes / GiB:,.2f}", nbytes)


def pct(fraction: float) -> Cell:
    return Cell(f"{100 * fraction:.1f} %", fraction)


def n(value: float, fmt: str = ",.0f") -> Cell:
    return Cell(format(value, fmt), value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Cell | str]], cls: str = "", bad: Sequence[bool] = ()) -> str:
    """An HTML table (no header row when `headers` is empty); a plain string in `rows` is a text
    cell; rows flagged in `bad` are shaded."""
    attr = f' class="{esc(cls)}"' if cls else ""
    out = [f'<div class="wide"><table{attr}>']
    if headers:
        out.append("<thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in headers) + "</tr></thead>")
    out.append("<tbody>")
    for i, row in enumerate(rows):
        cells = "".join((c if isinstance(c, Cell) else Cell(c)).html() for c in row)
        out.append(f'<tr class="bad">{cells}</tr>' if i < len(bad) and bad[i] else f"<tr>{cells}</tr>")
    out.append("</tbody></table></div>")
    return "\n".join(out)


def figure(path: Path, caption: str) -> str:
    """`path` (a PNG) embedded as a data URI; "" when the command drew no such figure."""
    if not path.is_file():
        return ""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{esc(caption)}">'
            f"<figcaption>{esc(caption)} ({esc(path.name)})</figcaption></figure>")


def notes(items: Sequence[str]) -> str:
    return '<ul class="notes">' + "".join(f"<li>{esc(x)}</li>" for x in items) + "</ul>" if items else ""


def text_file(path: Path, summary: str) -> str:
    """A text file (YAML) shown folded, escaped; "" when it is missing."""
    if not path.is_file():
        return ""
    return f"<details><summary>{esc(summary)} ({esc(path.name)})</summary><pre>{esc(path.read_text())}</pre></details>"


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _share(v: float, whole: float) -> Cell:
    f = v / whole if whole else 0.0
    return Cell(f"{100 * f:.1f} %", f, bar=f)


# ---- the sections of each kind ----------------------------------------------------------------

def run_sections(out: Path) -> list:
    """A training step: summary, where the step goes (busiest rank), memory per stage, notes."""
    r = _json(out / "result.json")
    step = r["step_time_s"]
    fits = "yes" if r["fits_in_memory"] else f"NO ({fmt_bytes(r['memory_shortfall_bytes'])} short)"
    rows = [
        ("scenario", r["scenario"]), ("devices", Cell(f"{r['num_devices']:,} x {r['device']}", r["num_devices"])),
        ("precision", r["precision"]), ("microbatches per step", n(r["num_microbatches"])),
        ("step time", t(step)), ("tokens/s", n(r["tokens_per_s"])), ("MFU", pct(r["mfu"])),
        ("HFU (incl. recompute)", pct(r["hfu"])), ("model FLOPs per step", n(r["model_flops_per_step"], ".4e")),
        ("pipeline bubble (share of device time)", pct(r["bubble_fraction"])),
        ("peak memory", b(r["peak_memory_bytes"])), ("usable memory (capacity - reserve)", b(r["usable_memory_bytes"])),
        ("memory capacity", b(r["memory_capacity_bytes"])), ("fits in memory", fits),
    ]
    if (m := r.get("moe")) is not None:
        rows += [("experts", f"{m['num_experts']} (top-{m['top_k']}) over ep {m['ep']}, routing {m['routing']}"),
                 ("busiest ep rank (x the mean)", n(m["imbalance_max"], ".2f")),
                 ("assignments dropped", pct(m["dropped_fraction_mean"]))]
    if (c := r.get("context_parallel")) is not None:
        rows += [("context parallel", f"cp {c['cp']} ({c['cp_kind']})"), ("tokens per cp rank", n(c["tokens_per_rank"]))]
    if (st := r.get("stragglers")) is not None:
        rows += [("straggler devices", n(st["count"])), ("step time without stragglers", t(st["step_time_without_s"])),
                 ("slowdown by stragglers", n(st["slowdown"], ".3f"))]
    if r.get("forward_only"):
        rows.insert(4, ("forward only", "one forward pass over the batch: no backward, gradient reduction or optimizer step"))
    bd = r["breakdown"]
    parts = [("compute", bd["compute_s"]), ("pipeline bubble", bd["bubble_s"])]
    parts += [(f"exposed {k} comm", v) for k, v in bd["exposed_comm_s"].items() if v > 0 or k in ("tp", "pp", "dp")]
    mem_cols = ("weights", "gradients", "optimizer", "activations", "communication_buffers", "total")
    mem = [[Cell(str(m["stage"]), m["stage"])] + [gib(m[k]) for k in mem_cols] + [n(m["inflight_microbatches_peak"], ",.4g")]
           + ([m["device"]] if "device" in m else [])
           for m in r["memory"]]
    mem_head = ["stage"] + [f"{k.replace('_', ' ')} (GiB)" for k in mem_cols] + ["in-flight microbatches"]
    if any("device" in m for m in r["memory"]):
        mem_head.append("device")
    return [
        ("Summary", table(("quantity", "value"), rows, "summary")),
        (f"Where the step goes (rank {bd['rank']}, stage {bd['stage']}, the busiest)",
         table(("part", "time", "share of step"), [(k, t(v), _share(v, step)) for k, v in parts], "breakdown")),
        ("Memory per stage (peak, the largest rank class of each pipeline rank)", table(mem_head, mem, "memory")),
        ("Coverage notes (costs not backed by a direct measurement)", notes(r.get("coverage") or [])),
    ]


def rl_sections(out: Path) -> list:
    """RL iterations: summary, verl's phases, pools, memory per device by phase, notes."""
    r = _json(out / "result.json")
    step = r["timing_s/step"]
    rows = [
        ("job", r["name"]), ("placement", r["placement"]), ("devices", Cell(f"{r['devices']:,} x {r['device']}", r["devices"])),
        ("iterations simulated", n(len(r["iterations"]))), ("step time (steady state)", t(step)),
        ("throughput (tokens/s per device, prompt + response)", n(r["perf/throughput"], ",.1f")),
        ("response length, mean", n(r["response_length/mean"])), ("response length, max", n(r["response_length/max"])),
        ("responses clipped", pct(r["response_length/clip_ratio"])), ("rollout preemptions", n(r["rollout/preemptions"])),
    ]
    phases = [(k.split("/", 1)[1], v) for k, v in r.items() if k.startswith("timing_s/") and k != "timing_s/step"]
    ph_rows = [(p, t(v), _share(v, step)) for p, v in phases if v or p in ("gen", "update_actor", "update_weights")]
    pools = [(name, n(p["devices"]), t(p["busy_s"]), pct(p["idle_fraction"])) for name, p in r["pools"].items()]
    kinds = sorted({k for d in r["memory_detail"].values() for k, x in d.items() if x})
    mem = [[ph, b(v)] + [b(r["memory_detail"].get(ph, {}).get(k, 0.0)) for k in kinds] for ph, v in r["memory"].items()]
    overlap = "" if r["placement"] in ("colocated", "split") else \
        "<p>gen overlaps training in this placement: the phases do not add up to the step.</p>"
    return [
        ("Summary", table(("quantity", "value"), rows, "summary")),
        ("Time per phase (verl order, steady-state means)", table(("phase", "time", "share of step"), ph_rows, "breakdown") + overlap),
        ("Pools", table(("pool", "devices", "busy", "idle"), pools, "pools")),
        ("Memory per device by phase", table(["phase", "total"] + kinds, mem, "memory")),
        ("Notes", notes(r.get("notes") or [])),
    ]


def _csv_cell(col: str, text: str) -> Cell | str:
    """A CSV value as a cell: numbers keep the CSV text as their exact value and show it rounded
    by their column's unit (name ending _s: time, but _per_s is a rate; _bytes: bytes; _gib: GiB;
    a fraction or ratio: %); other numbers as written when whole, else to 4 significant digits."""
    try:
        v = float(text)
    except ValueError:
        return text
    if col in ("mfu", "bubble_fraction") or col.endswith(("ratio", "_fraction")):
        return Cell(f"{100 * v:.1f} %", text)
    if (col.endswith("_s") and not col.endswith("_per_s")) or col.startswith("timing_s/"):
        return Cell(fmt_time(v), text)
    if col.endswith("_bytes"):
        return Cell(fmt_bytes(v), text)
    if col.endswith("_gib"):
        return Cell(f"{v:,.2f}", text)
    if v.is_integer() or not math.isfinite(v):
        return Cell(text, text)
    return Cell(f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}", text)


def csv_table(path: Path, cls: str) -> str:
    """The CSV file as a table, one cell per value; rows with an error are shaded."""
    rows = list(csv.reader(io.StringIO(path.read_text())))
    if not rows:
        return ""
    head, body = rows[0], rows[1:]
    err = head.index("error") if "error" in head else -1
    cells = [[_csv_cell(c, v) if v != "" else "" for c, v in zip(head, row)] for row in body]
    bad = [err >= 0 and err < len(row) and row[err] != "" for row in body]
    return table(head, cells, cls, bad)


def compare_sections(out: Path) -> list:
    return [("Variants (compare.csv)", csv_table(out / "compare.csv", "compare"))]


def search_sections(out: Path) -> list:
    return [("Simulated plans, best first (search.csv)", csv_table(out / "search.csv", "search")),
            ("Best plan", text_file(out / "best.yaml", "the scenario with the best plan applied"))]


def replay_sections(out: Path) -> list:
    """A replayed execution trace: summary, the busiest rank's split, every rank's, the collectives."""
    r = _json(out / "result.json")
    step = r["step_time_s"]
    cf = r["compute_from"]
    rows = [("trace", f"{r['trace']} ({r['prefix']}.<rank>.et)"), ("ranks", n(r["ranks"])),
            ("nodes", ", ".join(f"{v:,} {k}" for k, v in r["nodes"].items())),
            ("compute nodes priced", f"{cf['trace_duration']:,} at their recorded duration, {cf['cost_model']:,} by the cost model"),
            ("device", r["device"]), ("topology", r["topology"]), ("network backend", r["network_backend"]),
            ("step time", t(step))]
    parts = [("compute", r["compute_s"]), ("exposed communication", r["exposed_comm_s"]), ("idle", r["idle_s"])]
    ranks = [(Cell(str(x["rank"]), x["rank"]), x["device"], t(x["compute_s"]), t(x["exposed_comm_s"]), t(x["idle_s"]), t(x["comm_s"]))
             for x in r["per_rank"][:256]]
    colls = [(c["collective"], b(c["bytes"]), n(c["group_size"]), c["algorithm"], c["protocol"], t(c["seconds"]))
             for c in r["collectives"]]
    return [
        ("Summary", table(("quantity", "value"), rows, "summary")),
        (f"Where the step goes (rank {r['busiest_rank']}, the most compute)",
         table(("part", "time", "share of step"), [(k, t(v), _share(v, step)) for k, v in parts], "breakdown")),
        ("Per rank" + (" (the first 256)" if len(r["per_rank"]) > 256 else ""),
         table(("rank", "device", "compute", "exposed comm", "idle", "comm running"), ranks, "ranks")),
        ("Collectives (each distinct one, as the network backend ran it)",
         table(("collective", "buffer", "group", "algorithm", "protocol", "time alone"), colls, "collectives")),
        ("Coverage notes (costs not backed by a direct measurement)", notes(r.get("coverage") or [])),
    ]


SECTIONS = {"replay": replay_sections, "run": run_sections, "rl": rl_sections, "compare": compare_sections, "search": search_sections,
            "rl-search": search_sections}


def build_report(out_dir: Path, kind: str, title: str, facts: Sequence[tuple[str, str]] = ()) -> str:
    """The page for the files of `kind` in `out_dir`; `facts` are (label, text) lines shown under
    the title (e.g. the scenario file and its overrides, the search's counts)."""
    if kind not in KINDS:
        raise ConfigError([Problem("report", "", f"unknown report kind {kind!r}", f"use one of: {', '.join(KINDS)}")])
    out = Path(out_dir)
    body = [f"<h1>{esc(title)}</h1>", f'<p class="meta">simtrain {esc(__version__)} — simtrain {esc(kind)} report</p>']
    if facts:
        body.append(table((), [(k, v) for k, v in facts], "facts"))
    for head, content in SECTIONS[kind](out):
        if content:
            body.append(f"<h2>{esc(head)}</h2>\n{content}")
    figs = [figure(out / name, cap) for name, cap in FIGURES[kind]]
    if any(figs):
        body.append("<h2>Figures</h2>\n" + "\n".join(f for f in figs if f))
    if kind in ("run", "rl"):
        body.append(text_file(out / "scenario.resolved.yaml", "the scenario as simulated"))
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{esc(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n" + "\n".join(body) + "\n</body>\n</html>\n")


def write_report(out_dir: Path, kind: str, title: str, facts: Sequence[tuple[str, str]] = ()) -> None:
    """Writes `build_report` to out_dir/report.html (atomically); call it after the other files."""
    write_atomic(Path(out_dir) / REPORT, build_report(out_dir, kind, title, facts).encode())
