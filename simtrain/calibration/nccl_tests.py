"""nccl-tests logs -> collective measurements.

Reads both forms nccl-tests writes (NVIDIA/nccl-tests):
  - the text table on stdout. Columns differ between versions (older ones print
    `size count type redop time algbw busbw error ...`, newer ones add `root` and call the error
    column `#wrong`; the very first ones used `bytes N type op ... res`), so the parser is driven
    by the header line, never by column positions;
  - the JSON file of `-J file.json` (`results` list of {size, count, type, redop, root,
    out_of_place: {time, alg_bw, bus_bw, nwrong}, in_place: {...}}, plus `devices` and `args`).

Bus bandwidth is recomputed from size and time with nccl-tests' per-collective factors
(doc/PERFORMANCE.md): algbw = S/t; busbw = algbw x 2(n-1)/n for all-reduce, (n-1)/n for
reduce-scatter, all-gather and all-to-all, 1 for broadcast, reduce and send/recv. S is the size
column (for all-gather / reduce-scatter nccl-tests prints the whole buffer, count x n x dtype).
Worked example: all_reduce over 8 ranks, 1 GiB in 4010.54 us: algbw = 1073741824 / 4010.54e-6
= 267.73 GB/s, busbw = 267.73 x 14/8 = 468.53 GB/s (the VP H100 log in shared/data prints 468.53).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simtrain.calibration.checks import MAX_BYTES, MAX_TIME_S, MIN_TIME_S, Checker, read_input, text_of, tree_of
from simtrain.errors import Collector
from simtrain.spec.files import short

# program name (all_reduce_perf, ...) -> simtrain collective name
PROGRAMS = {
    "all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
    "alltoall": "all_to_all", "all_to_all": "all_to_all", "broadcast": "broadcast", "reduce": "reduce",
    "sendrecv": "sendrecv", "send_recv": "sendrecv",
}


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor (doc/PERFORMANCE.md)."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


@dataclass(frozen=True)
class Row:
    bytes: int
    time_s: float          # out-of-place time (in-place where out-of-place is absent)
    algbw: float           # bytes/s, recomputed
    busbw: float           # bytes/s, recomputed
    printed_busbw: float | None   # GB/s as printed (None if the log had none)


@dataclass
class Sweep:
    collective: str
    ranks: int
    nodes: int
    dtype: str
    source: str
    rows: list = field(default_factory=list)
    provenance: dict = field(default_factory=dict)


def _program(text: str) -> str | None:
    m = re.search(r"([a-z_]+?)_perf", text)
    return PROGRAMS.get(m.group(1)) if m else None


def parse_text(text: str, source: str, collective: str | None = None) -> list:
    """Sweeps in one nccl-tests stdout log (several tests may follow each other)."""
    errs = Collector(source)
    sweeps = []
    coll = collective or _program(text)
    hosts, devices = [], []
    names = None
    prov: dict = {}
    cur = None
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        s = line.strip()
        m = re.match(r"#\s*Collective test starting:\s*(\S+)", s)
        if m:
            coll = collective or PROGRAMS.get(m.group(1).replace("_perf", ""), coll)
            hosts, devices, cur, names = [], [], None, None      # a new test lists its own devices
            continue
        m = re.match(r"#\s*nccl-tests version (\S+)(.*)", s)
        if m:
            prov["nccl_tests"] = m.group(1)
            lib = re.search(r"nccl-library=(\d+)", m.group(2))
            if lib:
                prov["nccl"] = lib.group(1)
            continue
        if cur is not None and s.startswith("#") and "Rank" in s and "device" in s:
            hosts, devices, cur = [], [], None                   # device lines after a table: the next test
        m = re.match(r"#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s*(.*)", s)
        if m:
            hosts.append(m.group(2))
            devices.append(m.group(3).strip())
            continue
        if s.startswith("#") and re.search(r"\b(size|bytes)\b", s) and "time" in s and ("busbw" in s or "algbw" in s):
            names = s.lstrip("#").split()
            cur = None
            continue
        if s.startswith("#") or not s:
            if s.startswith("# Avg bus bandwidth") or s.startswith("# Out of bounds"):
                names = None
            continue
        if names is None:
            continue
        toks = s.split()
        if not toks[0].isdigit():
            continue
        if len(toks) < len(names):
            # nccl-tests leaves the root column empty in some versions' non-rooted tests
            errs.add(f"line {lineno}", f"{len(toks)} values under a header of {len(names)} columns", "give the unedited nccl-tests output")
            continue
        if coll is None:
            errs.add(f"line {lineno}", "cannot tell which collective this log measures", "keep the `# Collective test starting:` line or pass collective=")
            break
        if cur is None:
            n = len(hosts) or None
            cur = Sweep(coll, n or 0, len(set(hosts)) or 0, toks[names.index("type")] if "type" in names else "?", source,
                        provenance=dict(prov, devices=sorted(set(devices))))
            sweeps.append(cur)
        size_i = names.index("size") if "size" in names else names.index("bytes")
        time_i = names.index("time")
        bus_i = names.index("busbw") if "busbw" in names else None
        try:
            size = int(toks[size_i])
            t_us = float(toks[time_i])
        except ValueError:
            errs.add(f"line {lineno}", f"size {short(toks[size_i], 40)} / time {short(toks[time_i], 40)} are not numbers",
                     "give the unedited nccl-tests output")
            continue
        printed = None
        if bus_i is not None:
            try:
                printed = float(toks[bus_i])
            except ValueError:
                printed = None
            if printed is not None and not math.isfinite(printed):
                printed = None
        if not math.isfinite(t_us) or t_us < MIN_TIME_S * 1e6 or t_us > MAX_TIME_S * 1e6:
            errs.add(f"line {lineno}", f"time {short(toks[time_i], 40)} us: a measured time must be finite, between "
                     f"{MIN_TIME_S:g} s and {MAX_TIME_S:g} s", "give the unedited nccl-tests output")
            continue
        if size > MAX_BYTES:
            errs.add(f"line {lineno}", f"size {short(size, 40)} B is beyond any real measurement (must be <= {MAX_BYTES:,})",
                     "give the unedited nccl-tests output")
            continue
        if size == 0:
            continue            # a 0-byte row (-b 0) moves nothing: no bandwidth measured
        cur.rows.append(_row(coll, cur.ranks, size, t_us * 1e-6, printed))
    errs.raise_if_any()
    for sw in sweeps:
        if sw.ranks == 0:
            errs.add("", "no `#  Rank ... device ...` lines: the number of ranks is unknown", "keep the device lines nccl-tests prints before the table")
    errs.raise_if_any()
    return sweeps


def _row(coll: str, n: int, size: int, t: float, printed) -> Row:
    alg = size / t if t > 0 else 0.0
    return Row(size, t, alg, alg * bus_factor(coll, n) if n else 0.0, printed)


def parse_json(doc: Any, source: str, collective: str | None = None) -> list:
    """The sweep of one `-J` JSON file; every value it uses is checked for its type and range."""
    errs = Collector(source)
    fix = "give the file written by nccl-tests -J"
    c = Checker(errs, fix)
    if not isinstance(doc, dict):
        c.add("", f"the top level is a {type(doc).__name__}, not the mapping nccl-tests -J writes")
        c.finish()
    args = doc.get("args")
    if args is None:
        args = []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        c.add("args", f"expected a list of command-line words, got {short(args, 60)}")
        args = []
    coll = collective or (_program(" ".join(args)) if args else None)
    devs = doc.get("devices") or []
    results = doc.get("results")
    if not isinstance(results, list):
        c.add("results", "missing or not a list")
    if coll is None:
        c.add("args", "cannot tell which collective this file measures", "keep the args nccl-tests records, or name the file after the test (all_reduce_....json)")
    if not isinstance(devs, list) or not devs or not all(isinstance(d, dict) for d in devs):
        c.add("devices", "missing or not a list of device records: the number of ranks is unknown")
        devs = []
    for i, d in enumerate(devs):
        for k in ("hostname", "device_info"):
            if k in d:
                c.text(d[k], f"devices[{i}].{k}")
    c.finish()
    n = len(devs)
    if n > 2**20:
        c.add("devices", f"{n:,} ranks is beyond any real measurement (must be <= {2**20:,})")
        c.finish()
    sw = Sweep(coll, n, len({d.get("hostname") for d in devs}), "?", source,
               provenance={"nccl": str(doc.get("nccl_version", "")), "args": args,
                           "devices": sorted({str(d.get("device_info", "")) for d in devs}),
                           "start_time": str(doc.get("start_time", ""))})
    for i, r in enumerate(results):
        if c.mapping(r, f"results[{i}]") is None:
            continue
        side = "out_of_place" if r.get("out_of_place") else "in_place"
        body = r.get(side)
        if not body:
            continue
        if c.mapping(body, f"results[{i}].{side}") is None:
            continue
        tkey = "time" if "time" in body else "cpu_time"
        size = c.whole(r.get("size"), f"results[{i}].size", lo=0, hi=MAX_BYTES)
        t = c.number(body.get(tkey), f"results[{i}].{side}.{tkey}", MIN_TIME_S * 1e6, MAX_TIME_S * 1e6, what=" us")
        if "type" in r:
            c.text(r["type"], f"results[{i}].type")
        if size is None or t is None or not size:
            continue            # a problem (listed), or a 0-byte row: no bandwidth measured
        if isinstance(r.get("type"), str):
            sw.dtype = r["type"]
        pb = body.get("bus_bw")
        ok = isinstance(pb, (int, float)) and not isinstance(pb, bool) and math.isfinite(pb)
        sw.rows.append(_row(coll, n, size, t * 1e-6, pb if ok else None))
    c.finish()
    return [sw]


def read(path: Path, collective: str | None = None, raw: bytes | None = None) -> list:
    """Sweeps of an nccl-tests log or `-J` JSON file, read through the guarded reader (a regular
    file of bounded size; JSON without duplicate keys or runaway nesting). `raw`: the file's
    bytes, when the caller has read them already."""
    errs = Collector(str(path))
    fix = "give an nccl-tests log or the file nccl-tests -J wrote"
    if raw is None:
        raw = read_input(Path(path), errs, fix)
    text = text_of(raw, errs, fix)
    if collective is None and _program(text) is None:
        # old logs do not name the test; a file named after it (all_gather_....txt) does
        stem = Path(path).name.lower()
        collective = next((v for k, v in sorted(PROGRAMS.items(), key=lambda kv: -len(kv[0])) if stem.startswith(k)), None)
    if text.lstrip().startswith(("{", "[")):
        doc = tree_of(text, "json", errs, "give the complete file nccl-tests -J wrote")
        return parse_json(doc, str(path), collective)
    return parse_text(text, str(path), collective)


# NCCL's algorithm and protocol indices as its TUNING log lines print them up to 2.23
# (src/include/devcomm.h order; shared/data/calibration/nccl-algorithms/nccl-tuning-constants-2.18-2.23.yaml)
TUNING_ALGOS = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
TUNING_PROTOS = ("LL", "LL128", "Simple")
_TUNING = re.compile(r"(?:(?P<coll>[A-Za-z]+): )?(?P<bytes>\d+) Bytes -> Algo (?P<algo>\w+) proto (?P<proto>\w+)"
                     r"(?: time (?P<time>[\d.]+))?")


@dataclass(frozen=True)
class TuningChoice:
    """One per-call line of NCCL's tuner (NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING)."""
    bytes: int
    algorithm: str          # NCCL's name: Tree, Ring, NVLS, NVLSTree, ...
    protocol: str           # LL, LL128, Simple
    collective: str | None  # as the line names it (2.23+), else None
    time_us: float | None   # the model's predicted time (2.20-2.23), else None


def tuning_choices(text: str) -> list:
    """NCCL's choice per call from a log with TUNING lines, in all three formats:
    2.20-2.22 '<bytes> Bytes -> Algo <i> proto <j> time <us>', 2.23 '<Coll>: <bytes> Bytes -> ...',
    2.24+ '<Coll>: <bytes> Bytes -> Algo <NAME> proto <NAME> channel{Lo..Hi}={..}'. Indices are
    read in NCCL's order (TUNING_ALGOS, TUNING_PROTOS); repeated sizes are kept once, first seen.
    Example: '65536 Bytes -> Algo 0 proto 0 time 37.798233' -> (65536, Tree, LL, None, 37.798233)."""
    out, seen = [], set()
    for m in _TUNING.finditer(text):
        a, p = m["algo"], m["proto"]
        algo = TUNING_ALGOS[int(a)] if a.isdigit() and int(a) < len(TUNING_ALGOS) else a.upper()
        proto = TUNING_PROTOS[int(p)] if p.isdigit() and int(p) < len(TUNING_PROTOS) else p
        algo = next((n for n in TUNING_ALGOS if n.upper() == algo.upper()), algo)
        proto = next((n for n in TUNING_PROTOS if n.upper() == proto.upper()), proto)
        key = (m["coll"], int(m["bytes"]))
        if key in seen:
            continue
        seen.add(key)
        out.append(TuningChoice(int(m["bytes"]), algo, proto, m["coll"], float(m["time"]) if m["time"] else None))
    return out
