"""Sweeps (beside the pipeline, above it): the cartesian product of `--set`-style overrides of one
scenario, each point loaded and simulated as `simtrain run` would, results appended row by row to a
SQLite store keyed by a hash of the *resolved* scenario.

    points = product(grid values)          e.g. cluster.nodes=16,32 x parallel.tp=4,8 -> 4 points
    key    = sha256(json(resolved scenario, sort_keys) + sha256 of the topology / profile files)
    store  = DIR/sweep.sqlite, table `points` (key primary), one committed row per finished point

Why SQLite (standard library, one file): every finished point is one committed transaction, so a
sweep killed at any moment keeps every row it finished and none half-written (the journal rolls
an open transaction back); the rerun asks the primary-key index which keys exist and computes only
the rest; and the rows can be queried afterwards (`sqlite3 DIR/sweep.sqlite "select ... where
fits=1 order by step_time_s"`) without loading a whole file. Parquet serves column scans, but
appending one row per point means one file per row or a rewrite per row.

Two override lists that resolve to the same scenario (a value equal to the default) share a key
and are simulated once. A point whose scenario does not load (a ConfigError from a bad
combination) or does not simulate (any SimtrainError) is stored with its error text (status
`error`, kept on a rerun: it would fail the same way); a point that fails on anything else (a bug,
a worker process that died) is stored with status `failed` and its message, and a rerun tries it
again. The sweep goes on either way and the command exits 2 when any point of the grid has no
result. Rows carry no wall-clock times, so serial, process and dask executors give identical rows
(listed sorted by key).

Executors: `serial` (this process), `process` (concurrent.futures.ProcessPoolExecutor over all
local cores), `dask` (futures on an existing `distributed.Client`; the workers need the scenario
and topology files at the same paths, as on a shared file system).
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import signal
import sqlite3
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import as_completed as futures_completed
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from simtrain import progress
from simtrain.errors import ConfigError, Problem, SimtrainError
from simtrain.results.figures import plain, save_figure
from simtrain.results.io import check_out_dir, write_atomic
from simtrain.spec.files import TreeError, parse_yaml, read_text
from simtrain.spec.loading import load_scenario
from simtrain.spec.overrides import parse_axes, product
from simtrain.studies.runner import Outcome, internal_error, run_factors
from simtrain.studies.textable import Column, render, terminal_width
from simtrain.units import fmt_bytes, fmt_time

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from distributed import Client
    from matplotlib.figure import Figure

    from simtrain.spec.scenario import Scenario

COLUMNS = ("key", "overrides", "status", "error", "step_time_s", "tokens_per_s", "mfu", "peak_memory_bytes",
           "fits_in_memory", "bubble_fraction", "num_devices", "result")

SCHEMA = """CREATE TABLE IF NOT EXISTS points (
    key TEXT PRIMARY KEY, overrides TEXT NOT NULL, status TEXT NOT NULL, error TEXT,
    step_time_s REAL, tokens_per_s REAL, mfu REAL, peak_memory_bytes REAL, fits_in_memory INTEGER,
    bubble_fraction REAL, num_devices INTEGER, result TEXT)"""


def parse_grid(grid: Sequence[str] | None, fixed: Sequence[str] = ()) -> list:
    """`--grid` arguments (`key=v1,v2`, commas inside brackets kept) -> list of override lists, first
    axis varying slowest. `fixed` (`--set`) overrides come first in every point; a `--set` with
    several values is an axis too, after the grid's (the syntax and its meaning are
    simtrain.spec.overrides', shared with `compare`). Keys joined by `+` move together (one axis,
    values joined by `+` too), for values that must change in step:

        ["a.x=1,2", "b=p,q"]         -> [[a.x=1, b=p], [a.x=1, b=q], [a.x=2, b=p], [a.x=2, b=q]]
        ["n+d=32+8,64+16"]           -> [[n=32, d=8], [n=64, d=16]]"""
    _, axes = parse_axes(grid, "--grid", always_axis=True)
    fixed_vals, set_axes = parse_axes(fixed, "--set")
    return [over for _, over in product(fixed_vals, axes + set_axes)]


def grid_keys(grid: Sequence[str] | None, fixed: Sequence[str] = ()) -> list:
    """The keys the grid varies (those of `--grid`, and of a `--set` with several values), in axis order."""
    _, axes = parse_axes(grid, "--grid", always_axis=True)
    _, set_axes = parse_axes(fixed, "--set")
    return [k for a in axes + set_axes for k in a.keys]


def _file_digest(path: str) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return ""


def scenario_key(sc: Scenario) -> str:
    """sha256 of the resolved scenario (json, sorted keys) and of the files it names, whose content
    the resolved dict holds only by path."""
    d = sc.resolved()
    files = {k: _file_digest(v) for k, v in (("topology", sc.cluster.topology_file), ("device_profile", sc.cluster.device_profile)) if v}
    text = json.dumps({"scenario": d, "files": files}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def error_key(path: Path, overrides: list) -> str:
    """A point that does not load has no resolved scenario: key it by the file's bytes and the overrides."""
    text = json.dumps({"file": _file_digest(str(path)), "overrides": list(overrides)}, sort_keys=True)
    return "error-" + hashlib.sha256(text.encode()).hexdigest()


def run_point(path: str, overrides: list) -> dict:
    """Loads and simulates one point (in whatever process the executor chose): the row's fields
    except key and overrides. SimtrainErrors become an error row; anything else is a bug and raises."""
    return row_fields(next(run_factors(path, [overrides])))


def row_fields(o: Outcome) -> dict:
    if not o.ok:
        return {"status": "failed" if o.internal else "error", "error": o.error}
    r = o.result
    return {"status": "ok", "error": None, "step_time_s": r.step_time_s, "tokens_per_s": r.tokens_per_s,
            "mfu": r.mfu, "peak_memory_bytes": r.peak_memory_bytes, "fits_in_memory": int(bool(r.fits_in_memory)),
            "bubble_fraction": r.bubble_fraction, "num_devices": r.num_devices,
            "result": json.dumps(r.to_dict(), sort_keys=True)}


SQLITE_HEADER = b"SQLite format 3\x00"


def not_a_store(path: Path, why: str) -> ConfigError:
    return ConfigError([Problem(str(path), "", f"is not a sweep store ({why})",
                                "move it away or delete it to start the sweep afresh, or give another --out directory")])


class Store:
    """The SQLite result store: one committed row per point. A file that is not a store (not
    SQLite, truncated, another table layout) raises a ConfigError naming it; so does a store
    another process keeps locked past the timeout."""

    def __init__(self, path: Path, timeout_s: float = 30.0):
        self.path = path
        if path.is_dir():
            raise not_a_store(path, "it is a directory")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError([Problem(str(path), "", f"cannot create the store's directory: {e.strerror}",
                                       "give an --out directory you can write to")])
        if path.is_file() and path.stat().st_size:
            with open(path, "rb") as f:
                if f.read(16) != SQLITE_HEADER:
                    raise not_a_store(path, "it is not an SQLite file")
        sidecars = [Path(f"{path}{x}") for x in ("-wal", "-shm", "-journal")]
        had = {f for f in sidecars if f.exists()}
        try:
            self.db = sqlite3.connect(str(path), timeout=timeout_s)
        except sqlite3.Error as e:
            raise ConfigError([Problem(str(path), "", f"cannot open the sweep store: {e}", "give an --out directory you can write to")])
        try:
            with self._errors():
                if self.db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                    raise not_a_store(path, "the file is damaged (PRAGMA quick_check)")
                have = [r[1] for r in self.db.execute("PRAGMA table_info(points)")]
                if have and tuple(have) != COLUMNS:      # checked before anything is written to the file
                    raise not_a_store(path, f"its table `points` has the columns {', '.join(have)}")
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute(SCHEMA)
                self.db.commit()
        except ConfigError:
            self.db.close()
            for f in sidecars:         # leave the broken file as it was found
                if f not in had and f.exists():
                    f.unlink()
            raise

    def _errors(self):
        return _store_errors(self)

    def keys(self) -> set:
        """Keys with a result or a deterministic error; `failed` points are tried again."""
        with self._errors():
            return {k for (k,) in self.db.execute("SELECT key FROM points WHERE status != 'failed'")}

    def put(self, row: dict) -> None:
        with self._errors(), self.db:        # one transaction per row: committed whole or not at all
            self.db.execute(f"INSERT OR REPLACE INTO points ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
                            tuple(row.get(c) for c in COLUMNS))

    def rows(self, keys: set[str] | None = None) -> list:
        with self._errors():
            cur = self.db.execute(f"SELECT {', '.join(COLUMNS)} FROM points ORDER BY key")
            out = [dict(zip(COLUMNS, r)) for r in cur]
        return out if keys is None else [r for r in out if r["key"] in keys]

    def close(self) -> None:
        self.db.close()


@contextmanager
def _store_errors(store: Store):
    """sqlite3 errors of a Store as ConfigErrors naming its file."""
    try:
        yield
    except sqlite3.Error as e:
        path, text = store.path, str(e)
        if "locked" in text:
            raise ConfigError([Problem(str(path), "", f"the sweep store is locked by another process ({text})",
                                       "wait for the other sweep to finish, or give another --out directory")]) from None
        if not isinstance(e, sqlite3.OperationalError) or "not a database" in text or "malformed" in text:
            raise not_a_store(path, text) from None
        raise ConfigError([Problem(str(path), "", f"the sweep store cannot be written: {text}",
                                   "check the directory's permissions and free space, or give another --out directory")]) from None


@dataclass
class SweepStats:
    points: int          # grid points
    distinct: int        # distinct resolved scenarios (keys)
    cached: int          # already in the store: not recomputed
    computed: int        # simulated (or failed) in this run
    failed: int          # rows with an error among this sweep's keys
    wall_s: float


class Progress:
    """The sweep's bar (simtrain.progress: points done of those to compute, rate, ETA; the cached and
    failed counts beside it) on stderr, drawn only on a terminal and never under `quiet`."""

    def __init__(self, total: int, cached: int, quiet: bool = False):
        self.cached, self.failed = cached, 0
        self.bar = None if quiet else progress.bar(total, "sweep", "point")

    def step(self, failed: bool) -> None:
        self.failed += int(failed)
        if self.bar is not None:
            self.bar.set_postfix_str(f"{self.cached} cached, {self.failed} failed", refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


PARENT_POLL_S = 0.5


def _exit_with_parent(parent: int) -> None:
    """Worker initializer: a thread that ends this worker once the sweep's process is gone (killed
    with SIGKILL, it cannot stop its workers itself; a reparented worker sees another parent)."""
    def watch():
        while True:
            time.sleep(PARENT_POLL_S)
            if os.getppid() != parent:
                os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)       # Ctrl-C goes to the parent, which ends the workers
    threading.Thread(target=watch, name="simtrain-parent-watch", daemon=True).start()


def _failed(jobs_by_key: dict, key: str, e: BaseException) -> dict:
    path, over = jobs_by_key[key]
    return {"status": "failed", "error": internal_error(path, over, e)}


def _stop_workers(ex: ProcessPoolExecutor) -> None:
    procs = list((getattr(ex, "_processes", None) or {}).values())
    ex.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5)


def _iter_results(executor: str, jobs: list, client=None, workers: int | None = None):
    """Yields (key, fields) as points finish, in whatever order the executor finishes them. A point
    whose worker raised or died yields a `failed` row; the others go on."""
    by_key = {key: (path, over) for key, path, over in jobs}
    if executor == "serial":
        outcomes = run_factors(jobs[0][1], [over for _, _, over in jobs]) if jobs else ()
        for (key, _, _), o in zip(jobs, outcomes):
            yield key, row_fields(o)
    elif executor == "process":
        if not jobs:
            return
        ex = ProcessPoolExecutor(max_workers=min(len(jobs), workers or os.cpu_count() or 1),
                                 initializer=_exit_with_parent, initargs=(os.getpid(),))
        try:
            futs = {ex.submit(run_point, path, over): key for key, path, over in jobs}
            for f in futures_completed(futs):
                try:
                    fields = f.result()
                except Exception as e:         # the worker died or the point could not travel
                    fields = _failed(by_key, futs[f], e)
                yield futs[f], fields
        except BaseException:
            _stop_workers(ex)
            raise
        ex.shutdown(wait=True)
    elif executor == "dask":
        from distributed import as_completed
        futs = {}
        for key, path, over in jobs:
            futs[client.submit(run_point, path, over, key=f"simtrain-point-{key}", pure=False)] = key
        try:
            for f in as_completed(list(futs)):
                try:
                    fields = f.result()
                except Exception as e:         # the worker died, or the point failed to travel
                    fields = _failed(by_key, futs[f], e)
                yield futs[f], fields
        except BaseException:
            client.cancel(list(futs))
            raise
    else:
        raise ValueError(executor)


def sweep(path: str | Path, grid: Sequence[str] | None, fixed: Sequence[str] = (), out: Path = Path("sweep"),
          executor: str = "serial", client: Client | None = None, workers: int | None = None,
          on_row: Callable[[dict], None] | None = None, quiet: bool = False) -> tuple[list[dict], SweepStats]:
    """Runs the grid into `out/sweep.sqlite`; returns (rows of this grid sorted by key, SweepStats).
    `on_row(row)` is called after each row is committed (the tests interrupt a sweep with it)."""
    t0 = time.perf_counter()
    path = Path(path)
    points = parse_grid(grid, fixed)
    store = Store(Path(out) / "sweep.sqlite")
    try:
        have = store.keys()
        todo, keys, errors = [], {}, []
        for over in points:
            try:
                sc, _ = load_scenario(path, over)
                key = scenario_key(sc)
            except Exception as e:        # a bug at one point is that point's row, not the sweep's end
                key = error_key(path, over)
                if key not in have and key not in keys:
                    bug = not isinstance(e, SimtrainError)
                    errors.append({"key": key, "overrides": json.dumps(over), "status": "failed" if bug else "error",
                                   "error": internal_error(path, over, e) if bug else str(e)})
                keys.setdefault(key, over)
                continue
            if key not in keys:
                keys[key] = over
                if key not in have:
                    todo.append((key, str(path), over))
        cached = sum(1 for k in keys if k in have)
        prog = Progress(len(todo) + len(errors), cached, quiet)
        try:
            for row in errors:            # load errors are known already: store them first
                store.put(row)
                prog.step(True)
                if on_row:
                    on_row(row)
            for key, fields in _iter_results(executor, todo, client, workers):
                row = {"key": key, "overrides": json.dumps(keys[key]), **fields}
                store.put(row)
                prog.step(row["status"] != "ok")
                if on_row:
                    on_row(row)
        finally:
            prog.close()
        rows = store.rows(set(keys))
    finally:
        store.close()
    stats = SweepStats(points=len(points), distinct=len(keys), cached=cached, computed=len(todo) + len(errors),
                       failed=sum(1 for r in rows if r["status"] != "ok"), wall_s=time.perf_counter() - t0)
    return rows, stats


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    cols = [c for c in COLUMNS if c != "result"]
    w.writerow(cols)
    for r in rows:
        w.writerow([" ".join(json.loads(r["overrides"])) if c == "overrides" else ("" if r[c] is None else
                    (repr(r[c]) if isinstance(r[c], float) else r[c])) for c in cols])
    return buf.getvalue()


def varied(rows: list[dict]) -> tuple[list, list]:
    """(keys whose values differ between the rows, in first-seen order; the overrides every row shares)."""
    vals: dict = {}
    for r in rows:
        for o in json.loads(r["overrides"]):
            k, _, v = o.partition("=")
            vals.setdefault(k, []).append(v)
    if len(rows) <= 1:
        return list(vals), []
    keys = [k for k, v in vals.items() if len(v) < len(rows) or len(set(v)) > 1]
    common = [f"{k}={v[0]}" for k, v in vals.items() if k not in keys]
    return keys, common


def table(rows: list[dict], limit: int = 40, width: int | None = None) -> str:
    """The rows, fastest first: each point named by the values of the keys that vary (never cut;
    on a terminal of `width` columns the other columns are left out or the names wrap); the
    overrides all points share on a line above."""
    keys, common = varied(rows)
    cols = [Column("point", key=True), Column("step", ">", drop=3), Column("MFU", ">", drop=1),
            Column("peak mem", ">", drop=2), Column("fits", drop=0)]
    out = []
    for r in sorted(rows, key=lambda r: (r["status"] != "ok", r["step_time_s"] or 0.0, r["key"]))[:limit]:
        over = [o for o in json.loads(r["overrides"]) if o.partition("=")[0] in keys]
        name = " ".join(over) or "(the scenario as written)"
        if r["status"] == "ok":
            out.append([name, fmt_time(r["step_time_s"]), f"{100 * r['mfu']:.1f}%", fmt_bytes(r["peak_memory_bytes"]),
                        "yes" if r["fits_in_memory"] else "NO"])
        else:
            out.append((name, f"error: {r['error'].splitlines()[0][:200]}"))
    lines = ([f"  every point: {' '.join(common)}"] if common else []) + render(cols, out, width)
    if len(rows) > limit:
        lines.append(f"  ... {len(rows) - limit} more rows in the store")
    return "\n".join(lines)


def scaling_points(rows: list[dict], x_key: str, price: float | None = None) -> list[tuple]:
    """The ok rows that set `x_key`, as (x, step s, MFU, tokens/s, US$ per million tokens or None,
    devices), sorted by x."""
    pts = []
    for r in rows:
        if r["status"] != "ok":
            continue
        vals = dict(o.split("=", 1) for o in json.loads(r["overrides"]))
        if x_key not in vals:
            continue
        x = float(parse_yaml(vals[x_key]))
        usd = price * r["num_devices"] / 3600.0 / r["tokens_per_s"] * 1e6 if price else None
        pts.append((x, r["step_time_s"], r["mfu"], r["tokens_per_s"], usd, r["num_devices"]))
    pts.sort()
    return pts


def build_scaling_figure(pts: list[tuple], x_key: str, title: str, price: float | None = None) -> Figure:
    """Step time, MFU and (with a price) US$ per million tokens against the grid key `x_key`,
    the axis the title names; where the device count changes along it, each tick also gives the
    devices. Labels escape `$` (no mathtext)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = 3 if price else 2
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.8))
    xs = [p[0] for p in pts]
    devs = [p[5] for p in pts]
    with_devices = len(set(devs)) > 1 and len(set(xs)) == len(xs)
    log = bool(xs) and min(xs) > 0 and max(xs) / min(xs) >= 8
    panels = [("step time (s)", [p[1] for p in pts]), ("MFU (%)", [100 * p[2] for p in pts])]
    if price:
        panels.append((f"US$ per million tokens (at ${price:g}/device-h)", [p[4] for p in pts]))
    for ax, (label, ys) in zip(axes, panels):
        ax.plot(xs, ys, "-o", c="#4c72b0")
        if log:
            ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{v:,.0f}" if v == int(v) else f"{v:g}" for v in xs]
                           if not with_devices else [f"{v:,.0f}\n{d:,}" for v, d in zip(xs, devs)],
                           rotation=0 if len(xs) <= 5 or with_devices else 45, fontsize=7)
        ax.minorticks_off()
        ax.set_xlabel(plain(x_key + (" (below it: devices)" if with_devices else "")), fontsize=8)
        ax.set_ylabel(plain(label), fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(plain(title), fontsize=10)
    fig.tight_layout()
    return fig


def scaling_figure(rows: list[dict], x_key: str, path: Path, title: str, price: float | None = None) -> list[tuple]:
    """Writes `build_scaling_figure` of the stored rows to `path`; returns the plotted points
    [(x, step, mfu, tokens/s, $/Mtok, devices)]."""
    pts = scaling_points(rows, x_key, price)
    save_figure(build_scaling_figure(pts, x_key, title, price), path, dpi=110)
    return pts


SCHEDULER_TIMEOUT_S = 5.0
OUT_FILES = ("sweep.sqlite", "sweep.csv", "scaling.png")


def check_plot_x(grid: Sequence[str] | None, key: str) -> None:
    """--plot-x must be a grid key whose values are numbers: checked before anything runs."""
    values: dict = {}
    axes = parse_axes(grid, "--grid", always_axis=True)[1]
    others = []
    for axis in axes:
        keys = {o.partition("=")[0] for over in axis.values for o in over}
        if key not in keys and len(axis.values) > 1:
            others.append(f"{'+'.join(sorted(keys))} ({len(axis.values)} values)")
        for over in axis.values:
            for o in over:
                k, _, v = o.partition("=")
                values.setdefault(k, []).append(v.strip())
    if key not in values:
        raise ConfigError([Problem("--plot-x", key, "is not a key of the grid",
                                   f"use one of: {', '.join(values)}" if values else "add it with --grid")])
    if others:
        # one line through points that differ in another axis would join unlike plans
        raise ConfigError([Problem("--plot-x", key, f"the grid also varies {', '.join(others)}, so a line against {key} "
                                   "would join points of different plans",
                                   "sweep only this key (hold the others with --set), or plot from sweep.csv per combination")])
    for v in values[key]:
        try:
            x = parse_yaml(v)
        except TreeError:
            x = v
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            kind = "a list" if isinstance(x, list) else ("a mapping" if isinstance(x, dict) else "not a number")
            raise ConfigError([Problem("--plot-x", key, f"its value {v!r} is {kind}, and the x axis needs numbers",
                                       "plot against a grid key with numeric values, e.g. cluster.nodes")])


def connect(scheduler: str) -> Client:
    """A distributed.Client of `scheduler`, or a ConfigError within SCHEDULER_TIMEOUT_S."""
    try:
        from distributed import Client
    except ImportError:
        raise ConfigError([Problem("--executor", "", "dask is not installed", "pip install 'simtrain[dask]'")])
    try:
        return Client(scheduler, timeout=SCHEDULER_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError) as e:
        raise ConfigError([Problem("--scheduler", scheduler, f"cannot reach the Dask scheduler within {SCHEDULER_TIMEOUT_S:g} s "
                                   f"({type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]})",
                                   "start it (`dask scheduler` prints its address) and check host, port and firewall")]) from None


def main(args: argparse.Namespace) -> int:
    if not args.grid:
        raise ConfigError([Problem("--grid", "", "no grid given", "add e.g. `--grid parallel.tp=4,8`")])
    out = Path(args.out or f"{Path(args.scenario).stem}.sweep")
    parse_grid(args.grid, args.set or ())          # grid syntax, before anything is created
    if args.plot_x:
        check_plot_x(args.grid, args.plot_x)
    if args.workers is not None and args.workers < 1:
        raise ConfigError([Problem("--workers", "", f"must be >= 1, got {args.workers}", "give a whole number >= 1, or leave it out for all cores")])
    check_out_dir(out, "--out", OUT_FILES)
    client = None
    if args.executor == "dask":
        if not args.scheduler:
            raise ConfigError([Problem("--scheduler", "", "--executor dask needs the scheduler address",
                                       "add e.g. `--scheduler tcp://10.0.0.5:8786` (the address `dask scheduler` prints)")])
        client = connect(args.scheduler)
    try:
        rows, st = sweep(args.scenario, args.grid, args.set or (), out, args.executor, client, args.workers)
    finally:
        if client is not None:
            client.close()
    write_atomic(out / "sweep.csv", to_csv(rows).encode())
    wrote = "sweep.csv"
    if args.plot_x:
        raw = parse_yaml(read_text(args.scenario))      # the scenario has loaded already: it reads
        price = ((raw.get("cost") or {}) if isinstance(raw, dict) else {}).get("price_per_device_hour")
        pts = scaling_figure(rows, args.plot_x, out / "scaling.png", f"{Path(args.scenario).name}: against {args.plot_x}", price)
        wrote += " scaling.png"
        print(f"  {'devices':>8s} {'step':>9s} {'MFU':>6s} {'tokens/s':>12s}" + ("  US$/Mtok" if price else ""))
        for x, step, mfu, tps, usd, nd in pts:
            print(f"  {nd:>8,d} {step:8.3f}s {100 * mfu:5.1f}% {tps:12,.0f}" + (f"  {usd:8.3f}" if usd is not None else ""))
    print(f"sweep of {args.scenario}: {st.points} points, {st.distinct} distinct scenarios, {st.cached} from the store, "
          f"{st.computed} computed ({st.failed} failed) in {st.wall_s:.1f} s with the {args.executor} executor")
    print(table(rows, width=terminal_width()))
    print(f"\n  wrote {out}/: sweep.sqlite (table points, keyed by the resolved scenario's hash) {wrote}")
    if st.failed:
        print(f"\n  {st.failed} of {st.distinct} points have no result (status error or failed in {out / 'sweep.csv'}); "
              "a rerun keeps the results and tries failed points again", file=sys.stderr)
        return 2
    return 0
