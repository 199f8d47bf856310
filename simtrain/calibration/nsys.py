"""Nsight Systems reports (`nsys export --type sqlite REPORT.nsys-rep`) -> per-operator device
times under simtrain's operator names (the `kineto.OpTime` records the PyTorch-profiler importer
gives), NCCL collective timings, and host launch-gap statistics.

Tables and columns read (NVIDIA's "SQLite Export Schema Reference" of the nsys exporter; tables
are created lazily, so a report without NVTX has no NVTX_EVENTS; times are integer ns):

  StringIds                    id, value
  CUPTI_ACTIVITY_KIND_KERNEL   start, end, deviceId, streamId, correlationId, shortName /
                               demangledName (ids into StringIds), gridX/Y/Z when present
  CUPTI_ACTIVITY_KIND_RUNTIME  start, end, globalTid, correlationId (the launch call of the
                               kernel of the same correlationId in the same process: CUPTI's
                               correlation ids are per process, so a report of several ranks
                               joins on (process of globalPid / globalTid, correlationId); a
                               call exported twice, cudaLaunchKernel around the nested
                               cudaLaunchKernel_v7000, counts as the outer one)
  NVTX_EVENTS                  start, end, eventType (59 push/pop range, 60 start/end range),
                               text or textId (-> StringIds), globalTid, payload columns
                               uint64Value / int64Value / uint32Value / int32Value, jsonText

A serialized globalTid holds the process id in bits 24..47 (the exporter's "Serialized process
and thread identifiers" recipe: pid = globalTid / 0x1000000 % 0x1000000).

Assignment: a kernel belongs to the innermost NVTX range on its launching thread that encloses
the start of its runtime launch call. Its layer is the innermost enclosing range whose text
names a layer (`layer 3`, `layers.3`, `decoder.layers.3.mlp`), its phase the innermost one that
says forward / backward / optimizer (also fwd / bwd / optim). PyTorch runs backward on an
autograd thread of its own, outside the ranges the training loop pushed: when the launching
thread has no layer or phase range, the one of another thread of the same process enclosing the
launch counts.

Operators: NVTX range text as `torch.autograd.profiler.emit_nvtx(record_shapes=True)` writes it
(`aten::mm, seq = 12, sizes = [[4096, 4096], [4096, 4096]]`): the op name before the first comma
is rolled up to simtrain's operators exactly as the Kineto importer does (the outermost matching
op counts: aten::linear's kernels are not counted again under its aten::mm), the sizes are its
input dims, and its device time is the summed duration of the kernels launched inside it. The
report records no dtype: it is read from the kernel names (bf16, fp16, fp8, tf32 in a cuBLAS /
CUTLASS name), "?" when none says.

NCCL: kernels named ncclDevKernel_* / ncclKernel_* are collectives (AllReduce, AllGather,
ReduceScatter, Broadcast, Reduce, SendRecv; a kernel naming none, as ncclDevKernel_Generic,
is the collective of the NCCL range enclosing its launch). The message size comes from the NCCL range enclosing
the launch (`ncclAllReduce`, NCCL's NVTX domain) where its payload gives it: a numeric payload
column, `"Message size [bytes]"` in jsonText, or `bytes = N` / `size = N` in the range text. NCCL
passes one rank's message; for all-gather and reduce-scatter the size is multiplied by the ranks,
as nccl-tests counts them. Ranks: the distinct devices that ran the collective in the report.

Host statistics (for a framework host-overhead model; recorded in the profile's provenance,
not used by the cost model): per thread, the gap from the end of one kernel launch call to the
start of the next (median, p90), the launch call's own duration, the device idle gap between
consecutive kernels of a stream, and per (phase, operator) the CPU time of the op ranges.
"""
from __future__ import annotations

import bisect
import dataclasses
import json
import os
import re
import sqlite3
import stat
import statistics
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from simtrain.calibration.checks import MAX_DIM, MAX_TIME_S, Checker
from simtrain.calibration.kineto import OpTime, operator_of
from simtrain.errors import Collector
from simtrain.spec.files import short

MAGIC = b"SQLite format 3\x00"
MAX_SQLITE_BYTES = 16 * 2**30       # assumed bound: a report of a few training steps is well below
MAX_NS = int(MAX_TIME_S * 1e9 * 24 * 7)   # an event lasts at most a week
FIX = "give the file `nsys export --type sqlite REPORT.nsys-rep` wrote (profile with --trace=cuda,nvtx)"
KERNEL, RUNTIME, NVTX, STRINGS = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS", "StringIds"
REQUIRED = {
    STRINGS: ("id", "value"),
    KERNEL: ("start", "end", "deviceId", "streamId", "correlationId"),
    RUNTIME: ("start", "end", "globalTid", "correlationId"),
}
NVTX_REQUIRED = ("start", "end", "globalTid")
PAYLOAD_COLUMNS = ("uint64Value", "int64Value", "uint32Value", "int32Value")
RANGE_TYPES = (59, 60)              # NvtxPushPopRange, NvtxStartEndRange
NCCL_KERNEL = re.compile(r"^(?:void\s+)?nccl(?:Dev)?Kernel_(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|Send|Recv)")
NCCL_ANY = re.compile(r"^(?:void\s+)?nccl(?:Dev)?Kernel_")     # e.g. ncclDevKernel_Generic: the collective is its range's
NCCL_COLLECTIVE = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
                   "Broadcast": "broadcast", "Reduce": "reduce", "SendRecv": "sendrecv", "Send": "sendrecv", "Recv": "sendrecv"}
NCCL_RANGE = {"all_reduce": "ncclAllReduce", "all_gather": "ncclAllGather", "reduce_scatter": "ncclReduceScatter",
              "broadcast": "ncclBroadcast", "sendrecv": ("ncclSend", "ncclRecv"), "reduce": "ncclReduce"}
LAYER = re.compile(r"layers?[\s._:/#-]*(\d+)", re.IGNORECASE)
PHASE = re.compile(r"\b(forward|fwd|backward|bwd|optimi[sz]er|optim)\b", re.IGNORECASE)
PHASE_NAME = {"forward": "forward", "fwd": "forward", "backward": "backward", "bwd": "backward",
              "optimizer": "optimizer", "optimiser": "optimizer", "optim": "optimizer"}
DTYPES = (("bf16", re.compile(r"bf16|bfloat16")), ("fp8", re.compile(r"e4m3|e5m2|fp8")),
          ("fp16", re.compile(r"f16|fp16|half|h884|h1688|h16816")), ("tf32", re.compile(r"tf32")))
SIZE_IN_TEXT = re.compile(r"(?:message size \[bytes\]|bytes|size)\s*[:=]\s*(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class Kernel:
    row: int                 # rowid in CUPTI_ACTIVITY_KIND_KERNEL
    name: str                # short name (demangled when the report has no short name)
    start_ns: int
    end_ns: int
    device: int
    stream: int
    correlation: int | None
    process: int | None      # pid of the kernel's process (globalPid), None when not recorded
    grid: tuple              # (gridX, gridY, gridZ), () when not recorded
    launch_ns: int | None    # its runtime launch call (None: no launch recorded)
    thread: int | None       # globalTid of the launching thread
    range: str | None        # innermost enclosing NVTX range on the launching thread
    layer: str | None
    phase: str | None
    collective: str | None   # simtrain collective name of an NCCL kernel

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) * 1e-9


@dataclass(frozen=True)
class Collective:
    collective: str
    kernel: str
    device: int
    bytes: int | None        # one rank's message as NCCL's range gives it; None when not given
    seconds: float           # the kernel's duration on this device (includes waiting for peers)
    row: int


@dataclass(frozen=True)
class HostStats:
    launches: int
    launch_gap_s: tuple      # (median, p90) of the host gap between consecutive launch calls of a thread
    launch_call_s: tuple     # (median, p90) of a launch call's own duration
    device_idle_s: tuple     # (median, p90) of the idle gap between consecutive kernels of a stream
    cpu_per_op: dict         # phase -> operator -> {"count", "median_s", "total_s"} of the op ranges' CPU time

    def summary(self) -> dict:
        """Plain values for the profile's provenance."""
        def pair(p: tuple) -> dict | None:
            return {"median_us": round(p[0] * 1e6, 4), "p90_us": round(p[1] * 1e6, 4)} if p else None
        return {"kernel_launches": self.launches, "launch_gap": pair(self.launch_gap_s), "launch_call": pair(self.launch_call_s),
                "device_idle_gap": pair(self.device_idle_s),
                "cpu_per_op": {ph: {op: {"count": v["count"], "median_us": round(v["median_s"] * 1e6, 4), "total_us": round(v["total_s"] * 1e6, 4)}
                                    for op, v in sorted(ops.items())} for ph, ops in sorted(self.cpu_per_op.items())}}


@dataclass(frozen=True)
class Profile:
    kernels: tuple
    ops: tuple               # kineto.OpTime, `event` = the op range's rowid in NVTX_EVENTS
    collectives: tuple
    host: HostStats
    devices: tuple = field(default=())   # device names the report records (TARGET_INFO_GPU), if any


def is_sqlite(head: bytes) -> bool:
    return head[:16] == MAGIC


def p50_p90(xs: list) -> tuple:
    """(median, 90th percentile) as `simtrain bench` computes them (statistics.quantiles,
    inclusive method); () for no values."""
    if not xs:
        return ()
    if len(xs) == 1:
        return (xs[0], xs[0])
    return (statistics.median(xs), statistics.quantiles(xs, n=10, method="inclusive")[-1])


def _connect(path: Path, errs: Collector) -> sqlite3.Connection:
    """A read-only connection (nothing is written next to the report), after the guarded checks:
    a regular file of at most MAX_SQLITE_BYTES that starts with SQLite's magic."""
    try:
        st = os.stat(path)
    except OSError as e:
        errs.add("", f"cannot read the file ({e.strerror})", FIX)
        errs.raise_if_any()
    if not stat.S_ISREG(st.st_mode):
        errs.add("", "is not a regular file (a device, a FIFO or a directory)", FIX)
    elif st.st_size > MAX_SQLITE_BYTES:
        errs.add("", f"is {st.st_size / 2**30:.1f} GiB; reports of at most {MAX_SQLITE_BYTES // 2**30} GiB are read",
                 "export a shorter capture range (nsys profile --capture-range)")
    else:
        with open(path, "rb") as f:
            if not is_sqlite(f.read(16)):
                errs.add("", "not an SQLite database (no 'SQLite format 3' header)", FIX)
    errs.raise_if_any()
    uri = "file:" + urllib.parse.quote(str(Path(path).resolve())) + "?mode=ro&immutable=1"
    con = sqlite3.connect(uri, uri=True)
    try:
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as e:
        con.close()
        errs.add("", f"unreadable SQLite database ({e})", FIX)
        errs.raise_if_any()
    return con


def _columns(con: sqlite3.Connection, table: str) -> set:
    return {r[1] for r in con.execute(f'PRAGMA table_info("{table}")')}


def _rows(con: sqlite3.Connection, table: str, cols: Iterable, errs: Collector, where: str = "") -> list:
    """rowid and the named columns of every row of `table` (that `where` keeps); a corrupt page
    is a problem there."""
    sel = ", ".join(["rowid"] + [f'"{c}"' for c in cols])
    try:
        return con.execute(f'SELECT {sel} FROM "{table}" {where} ORDER BY rowid').fetchall()
    except sqlite3.DatabaseError as e:
        errs.add(table, f"cannot be read: the SQLite file is corrupt or cut short ({e})", FIX)
        errs.raise_if_any()
    raise AssertionError("unreachable")


def _interval(r: tuple, table: str, c: Checker, end_optional: bool = False) -> tuple | None:
    """(start, end) of row r (rowid, start, end, ...): whole ns, end >= start."""
    rid, s, e = r[0], r[1], r[2]
    p = f"{table}[rowid={rid}]"
    if end_optional and e is None:
        return None
    if c.whole(s, f"{p}.start", lo=-(2**62), hi=2**62) is None or c.whole(e, f"{p}.end", lo=-(2**62), hi=2**62) is None:
        return None
    if e < s:
        c.add(f"{p}.end", f"ends at {e} ns, before its start at {s} ns")
        return None
    if e - s > MAX_NS:
        c.add(f"{p}.end", f"lasts {(e - s) / 1e9:g} s, beyond any real event (at most a week)")
        return None
    return s, e


def read(path: Path) -> Profile:
    """The kernels, op times, collectives and host statistics of an nsys SQLite export; a
    file that is not one, a missing table or column, no kernels, or a bad value is a
    ConfigError naming the file and the table."""
    path = Path(path)
    errs = Collector(str(path))
    con = _connect(path, errs)
    try:
        return _read(con, errs)
    except sqlite3.DatabaseError as e:
        errs.add("", f"unreadable SQLite database ({e})", FIX)
        errs.raise_if_any()
        raise
    finally:
        con.close()


def _read(con: sqlite3.Connection, errs: Collector) -> Profile:
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    cols = {}
    for t, need in REQUIRED.items():
        if t not in tables:
            errs.add(t, "missing: not an nsys export with CUDA trace" if t != STRINGS else "missing: not an nsys export", FIX)
            continue
        cols[t] = _columns(con, t)
        for col in need:
            if col not in cols[t]:
                errs.add(f"{t}.{col}", "missing column", FIX)
    if KERNEL in cols and not {"shortName", "demangledName", "name"} & cols[KERNEL]:
        errs.add(f"{KERNEL}.shortName", "missing column (no shortName, demangledName or name column names the kernels)", FIX)
    has_nvtx = NVTX in tables
    if has_nvtx:
        cols[NVTX] = _columns(con, NVTX)
        for col in NVTX_REQUIRED:
            if col not in cols[NVTX]:
                errs.add(f"{NVTX}.{col}", "missing column", FIX)
        if not {"text", "textId"} & cols[NVTX]:
            errs.add(f"{NVTX}.text", "missing column (neither text nor textId names the ranges)", FIX)
    errs.raise_if_any()
    c = Checker(errs, FIX)
    strings = {i: v for _, i, v in _rows(con, STRINGS, ("id", "value"), errs) if isinstance(v, str)}
    name_cols = [x for x in ("shortName", "demangledName", "name") if x in cols[KERNEL]]     # `name`: older exports
    grid_cols = [x for x in ("gridX", "gridY", "gridZ") if x in cols[KERNEL]]
    has_pid = "globalPid" in cols[KERNEL]
    krows = _rows(con, KERNEL, ["start", "end", "deviceId", "streamId", "correlationId", "globalPid" if has_pid else "correlationId"]
                  + name_cols + grid_cols, errs)
    if not krows:
        errs.add(KERNEL, "empty: the report recorded no kernels", "profile with --trace=cuda around device work (check the capture range)")
        errs.raise_if_any()
    launches = {}                 # (pid or None, correlationId) -> (start, end, globalTid) of the launch call
    for r in _rows(con, RUNTIME, ("start", "end", "globalTid", "correlationId"), errs,
                   f'WHERE "correlationId" IN (SELECT "correlationId" FROM "{KERNEL}")'):
        iv = _interval(r, RUNTIME, c)
        if iv is not None and isinstance(r[4], int) and isinstance(r[3], int):
            key = (_pid(r[3]) if has_pid else None, r[4])
            if key in launches:       # the call recorded twice (cudaLaunchKernel and the nested cudaLaunchKernel_v7000): the outer one
                s0, e0, tid = launches[key]
                launches[key] = (min(s0, iv[0]), max(e0, iv[1]), tid)
            else:
                launches[key] = (iv[0], iv[1], r[3])
    kernels = []
    for r in krows:
        iv = _interval(r, KERNEL, c)
        if iv is None:
            continue
        rid, dev, stream, corr, gpid = r[0], r[3], r[4], r[5], r[6]
        names = [strings.get(v) for v in r[7:7 + len(name_cols)]]
        name = next((n for n in names if n), None)
        if name is None:
            c.add(f"{KERNEL}[rowid={rid}].{name_cols[0]}", f"{short(r[7], 40)} is no id in StringIds")
            continue
        if not all(isinstance(v, int) for v in (dev, stream)) or not isinstance(corr, (int, type(None))):
            c.add(f"{KERNEL}[rowid={rid}]", "deviceId, streamId and correlationId must be whole numbers")
            continue
        pid = _pid(gpid) if has_pid and isinstance(gpid, int) else None
        demangled = next((n for n in names[1:] if n), name)
        m = NCCL_KERNEL.match(name) or NCCL_KERNEL.match(demangled)
        generic = m is None and bool(NCCL_ANY.match(name) or NCCL_ANY.match(demangled))
        kernels.append(dict(row=rid, name=name, demangled=demangled, start_ns=iv[0], end_ns=iv[1], device=dev, stream=stream,
                            correlation=corr, process=pid, key=(pid, corr), grid=tuple(r[7 + len(name_cols):]), collective=NCCL_COLLECTIVE[m.group(1)] if m else ("?" if generic else None)))
    c.finish()
    ranges = _ranges(con, cols.get(NVTX, set()), strings, c) if has_nvtx else []
    c.finish()
    return _assemble(kernels, launches, ranges, _device_names(con, tables))


def _ranges(con: sqlite3.Connection, cols: set, strings: dict, c: Checker) -> list:
    """NVTX ranges as dicts (rowid, start, end, tid, text, payload, json)."""
    want = ["start", "end", "globalTid"] + [x for x in ("eventType", "text", "textId", *PAYLOAD_COLUMNS, "jsonText", "jsonTextId") if x in cols]
    out = []
    for r in _rows(con, NVTX, want, c.errs):
        v = dict(zip(want, r[1:]))
        if "eventType" in v and v["eventType"] not in RANGE_TYPES:
            continue                  # marks, domain and category registrations, thread names
        iv = _interval(r, NVTX, c, end_optional=True)
        if iv is None or not isinstance(v["globalTid"], int):
            continue
        text = v.get("text")
        if not isinstance(text, str):
            text = strings.get(v.get("textId"), "")
        js = v.get("jsonText")
        if not isinstance(js, str):
            js = strings.get(v.get("jsonTextId"))
        payload = next((v[p] for p in PAYLOAD_COLUMNS if isinstance(v.get(p), int) and not isinstance(v.get(p), bool)), None)
        out.append(dict(row=r[0], start=iv[0], end=iv[1], tid=v["globalTid"], text=text, payload=payload, json=js))
    return out


def _device_names(con: sqlite3.Connection, tables: set) -> tuple:
    if "TARGET_INFO_GPU" not in tables or "name" not in _columns(con, "TARGET_INFO_GPU"):
        return ()
    try:
        return tuple(sorted({str(r[0]) for r in con.execute('SELECT name FROM "TARGET_INFO_GPU"') if r[0]}))
    except sqlite3.DatabaseError:
        return ()


def _pid(tid: int) -> int:
    return tid // 0x1000000 % 0x1000000


def _chains(ranges: list, launches: list) -> tuple:
    """Per thread, one sweep in time order: for every range the chain of ranges enclosing it
    (outermost first, itself last) and for every launch (key, start, tid) the chain enclosing
    its start. Ranges are sorted (start, -end) so an outer range opens first; a range ending
    exactly at a launch's start still encloses it."""
    by_tid: dict = {}
    for r in ranges:
        by_tid.setdefault(r["tid"], []).append((r["start"], 0, -r["end"], r["row"], r))
    for key, t, tid in launches:
        by_tid.setdefault(tid, []).append((t, 1, 0, key, None))
    range_chain, launch_chain = {}, {}
    for tid in sorted(by_tid):
        stack: list = []
        for t, kind, _, key, r in sorted(by_tid[tid], key=lambda e: e[:4]):
            while stack and stack[-1]["end"] < t:
                stack.pop()
            if kind == 0:
                stack.append(r)
                range_chain[r["row"]] = tuple(stack)
            else:
                launch_chain[key] = tuple(stack)
    return range_chain, launch_chain


def _label(chain: tuple, rx: re.Pattern, conv: dict | None = None) -> str | None:
    for r in reversed(chain):
        m = rx.search(r["text"])
        if m:
            g = m.group(1)
            return conv.get(g.lower(), g.lower()) if conv is not None else str(int(g))
    return None


class _ProcessRanges:
    """Ranges of a process that name a layer or phase, for launches on a thread without one
    (the autograd thread): the latest-starting such range enclosing the time."""

    def __init__(self, ranges: list, rx: re.Pattern, conv: dict | None):
        self.by_pid: dict = {}
        for r in ranges:
            lab = _label((r,), rx, conv)
            if lab is not None:
                self.by_pid.setdefault(_pid(r["tid"]), []).append((r["start"], r["end"], lab))
        for v in self.by_pid.values():
            v.sort()
        self.starts = {p: [x[0] for x in v] for p, v in self.by_pid.items()}

    def at(self, tid: int, t: int) -> str | None:
        pid = _pid(tid)
        v = self.by_pid.get(pid)
        if not v:
            return None
        i = bisect.bisect_right(self.starts[pid], t) - 1
        for j in range(i, max(-1, i - 64), -1):     # the latest start enclosing t (a nested one starts later)
            if v[j][1] >= t:
                return v[j][2]
        return None


def _op_name(text: str) -> str:
    return text.split(",", 1)[0].strip()


def _sizes(text: str) -> tuple:
    """Input dims of an emit_nvtx range text (`..., sizes = [[4096, 4096], []]`), () if none
    or unreadable."""
    i = text.find("sizes = [")
    if i < 0:
        return ()
    s = text[i + len("sizes = "):]
    depth = 0
    for j, ch in enumerate(s):
        depth += ch == "["
        depth -= ch == "]"
        if depth == 0:
            s = s[:j + 1]
            break
    try:
        v = json.loads(s)
    except ValueError:
        return ()
    if not isinstance(v, list):
        return ()
    out = []
    for d in v:
        if not isinstance(d, list) or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_DIM for x in d):
            return ()
        out.append(tuple(d))
    return tuple(out)


def dtype_of(kernel_name: str) -> str | None:
    """The dtype a cuBLAS / CUTLASS kernel name says (bf16 before fp16: bf16 contains f16)."""
    low = kernel_name.lower()
    return next((dt for dt, rx in DTYPES if rx.search(low)), None)


def _message_bytes(r: dict) -> int | None:
    if r["payload"] is not None and r["payload"] > 0:
        return r["payload"]
    if r["json"]:
        try:
            doc = json.loads(r["json"])
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            for k, v in doc.items():
                if "message size" in str(k).lower() and isinstance(v, int) and not isinstance(v, bool) and v > 0:
                    return v
    m = SIZE_IN_TEXT.search(r["text"])
    return int(m.group(1)) if m and int(m.group(1)) > 0 else None


def _assemble(kernels: list, launches: dict, ranges: list, devices: tuple) -> Profile:
    launch_list = [(k["row"], launches[k["key"]][0], launches[k["key"]][2]) for k in kernels if k["key"] in launches]
    range_chain, launch_chain = _chains(ranges, launch_list)
    layers = _ProcessRanges(ranges, LAYER, None)
    phases = _ProcessRanges(ranges, PHASE, PHASE_NAME)
    out, ops, coll = [], {}, []
    op_kernels: dict = {}
    for k in kernels:
        ln = launches.get(k["key"])
        chain = launch_chain.get(k["row"], ())
        layer = phase = None
        if ln is not None:
            layer = _label(chain, LAYER) or layers.at(ln[2], ln[0])
            phase = _label(chain, PHASE, PHASE_NAME) or phases.at(ln[2], ln[0])
        out.append(Kernel(k["row"], k["name"], k["start_ns"], k["end_ns"], k["device"], k["stream"], k["correlation"], k["process"], k["grid"],
                          ln[0] if ln else None, ln[2] if ln else None, chain[-1]["text"] if chain else None, layer, phase, k["collective"]))
        if k["collective"]:
            name, found = k["collective"], []
            for r in reversed(chain):        # innermost first: NCCL's own range, then one the user wrapped around it
                word = re.match(r"[A-Za-z]*", r["text"].strip()).group(0)       # ncclAllReduce of "ncclAllReduce, bytes = 8"
                got = next((c for c, w in NCCL_RANGE.items() if word in (w if isinstance(w, tuple) else (w,)) and name in ("?", c)), None)
                if got:
                    found.append((got, r))
            name = found[0][0] if name == "?" and found else name
            if name != "?":           # a generic NCCL kernel outside any NCCL range: which collective is unknown
                size = next((b for c, r in found if c == name and (b := _message_bytes(r))), None)
                coll.append(Collective(name, k["name"], k["device"], size, out[-1].seconds, k["row"]))
                out[-1] = dataclasses.replace(out[-1], collective=name)
            continue
        top = next((r for r in chain if operator_of(_op_name(r["text"]))), None)
        if top is not None:
            op_kernels.setdefault(top["row"], []).append(k)
            ops.setdefault(top["row"], top)
    op_times = []
    for row in sorted(ops, key=lambda x: (ops[x]["start"], x)):
        r, ks = ops[row], op_kernels[row]
        name = _op_name(r["text"])
        dtype = next((d for d in (dtype_of(k["demangled"]) for k in ks) if d), "?")
        op_times.append(OpTime(operator_of(name), name, _sizes(r["text"]), dtype, sum(k["end_ns"] - k["start_ns"] for k in ks) * 1e-9, True, row))
    return Profile(tuple(out), tuple(op_times), tuple(coll), _host(out, launches, ranges, range_chain, phases), devices)


def _host(kernels: list, launches: dict, ranges: list, range_chain: dict, phases: _ProcessRanges) -> HostStats:
    calls: dict = {}
    for k in kernels:
        if (k.process, k.correlation) in launches:
            s, e, tid = launches[(k.process, k.correlation)]
            calls.setdefault(tid, set()).add((s, e))
    gaps, durs = [], []
    for tid in sorted(calls):
        seq = sorted(calls[tid])
        durs.extend((e - s) * 1e-9 for s, e in seq)
        gaps.extend(max(0, b[0] - a[1]) * 1e-9 for a, b in zip(seq, seq[1:]))
    idle = []
    by_stream: dict = {}
    for k in kernels:
        by_stream.setdefault((k.device, k.stream), []).append((k.start_ns, k.end_ns))
    for key in sorted(by_stream):
        seq = sorted(by_stream[key])
        idle.extend(max(0, b[0] - a[1]) * 1e-9 for a, b in zip(seq, seq[1:]))
    cpu: dict = {}
    for r in ranges:
        chain = range_chain.get(r["row"], (r,))
        op = operator_of(_op_name(r["text"]))
        if op is None or any(operator_of(_op_name(x["text"])) for x in chain[:-1]):
            continue                # not an op, or counted under its outermost op
        phase = _label(chain, PHASE, PHASE_NAME) or phases.at(r["tid"], r["start"]) or "?"
        cpu.setdefault(phase, {}).setdefault(op, []).append((r["end"] - r["start"]) * 1e-9)
    per_op = {ph: {op: {"count": len(v), "median_s": statistics.median(v), "total_s": sum(v)} for op, v in ops.items()} for ph, ops in cpu.items()}
    return HostStats(sum(len(v) for v in calls.values()), p50_p90(gaps), p50_p90(durs), p50_p90(idle), per_op)


def collective_rows(prof: Profile) -> tuple:
    """(rows for the profile's collectives table, warnings): one row per collective kernel with
    a known size, bytes as nccl-tests counts them, ranks the distinct devices that ran it; a
    collective seen on fewer than two devices, or without a size, is only a warning."""
    ranks: dict = {}
    for c in prof.collectives:
        ranks.setdefault(c.collective, set()).add(c.device)
    rows, warn = [], []
    for name in sorted(ranks):
        cs = [c for c in prof.collectives if c.collective == name]
        n = len(ranks[name])
        sized = [c for c in cs if c.bytes]
        if not sized:
            warn.append(f"{_n(len(cs), name + ' kernel')} without a message size (no NCCL NVTX range with a payload encloses the launch)")
            continue
        if n < 2:
            warn.append(f"{_n(len(cs), name + ' kernel')} on one device only: the ranks are unknown, so no bus bandwidth "
                        "(profile every rank of a node into one report)")
            continue
        for c in sized:
            b = c.bytes * n if name in ("all_gather", "reduce_scatter") else c.bytes
            rows.append({"collective": name, "ranks": n, "nodes": 1, "bytes": b, "median_s": c.seconds, "row": c.row})
    return rows, warn


def _n(k: int, what: str) -> str:
    return f"{k} {what}" + ("" if k == 1 else "s")
