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

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from simtrain.errors import Collector

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
            errs.add(f"line {lineno}", f"size {toks[size_i]!r} / time {toks[time_i]!r} are not numbers", "give the unedited nccl-tests output")
            continue
        printed = None
        if bus_i is not None:
            try:
                printed = float(toks[bus_i])
            except ValueError:
                printed = None
        if t_us <= 0:
            errs.add(f"line {lineno}", f"time {toks[time_i]} us: a measured time must be > 0", "give the unedited nccl-tests output")
            continue
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


def parse_json(doc: dict, source: str, collective: str | None = None) -> list:
    """The sweep of one `-J` JSON file."""
    errs = Collector(source)
    args = doc.get("args") or []
    coll = collective or (_program(" ".join(map(str, args))) if args else None)
    devs = doc.get("devices") or []
    results = doc.get("results")
    if not isinstance(results, list):
        errs.add("results", "missing or not a list", "give the file written by nccl-tests -J")
    if coll is None:
        errs.add("args", "cannot tell which collective this file measures", "pass collective=")
    if not devs or not all(isinstance(d, dict) for d in devs):
        errs.add("devices", "missing or not a list of device records: the number of ranks is unknown", "give the file written by nccl-tests -J")
    errs.raise_if_any()
    n = len(devs)
    sw = Sweep(coll, n, len({d.get("hostname") for d in devs}), "?", source,
               provenance={"nccl": str(doc.get("nccl_version", "")), "args": args,
                           "devices": sorted({str(d.get("device_info", "")) for d in devs}),
                           "start_time": doc.get("start_time", "")})
    for i, r in enumerate(results):
        body = r.get("out_of_place") or r.get("in_place")
        if not body:
            continue
        t = body.get("time", body.get("cpu_time"))
        if not isinstance(r.get("size"), int) or not isinstance(t, (int, float)) or t <= 0:
            errs.add(f"results[{i}]", "size or time missing, or time not > 0", "give the file written by nccl-tests -J")
            continue
        sw.dtype = r.get("type", sw.dtype)
        pb = body.get("bus_bw")
        sw.rows.append(_row(coll, n, r["size"], t * 1e-6, pb if isinstance(pb, (int, float)) else None))
    errs.raise_if_any()
    return [sw]


def read(path: Path, collective: str | None = None) -> list:
    """Sweeps of an nccl-tests log or `-J` JSON file."""
    text = Path(path).read_text(errors="replace")
    if collective is None and _program(text) is None:
        # old logs do not name the test; a file named after it (all_gather_....txt) does
        stem = Path(path).name.lower()
        collective = next((v for k, v in sorted(PROGRAMS.items(), key=lambda kv: -len(kv[0])) if stem.startswith(k)), None)
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            errs = Collector(str(path))
            errs.add("", f"not valid JSON ({e.msg} at line {e.lineno})", "give the complete file nccl-tests -J wrote")
            errs.raise_if_any()
        return parse_json(doc, str(path), collective)
    return parse_text(text, str(path), collective)
