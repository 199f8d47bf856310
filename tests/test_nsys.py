"""Nsight Systems SQLite importer: a report built by hand in the test with the tables and columns
of NVIDIA's "SQLite Export Schema Reference" (StringIds, CUPTI_ACTIVITY_KIND_KERNEL /
_RUNTIME, NVTX_EVENTS with eventType 59 = NvtxPushPopRange), every expected value derived by
hand in the comments below.

The hand-built report (times in us; thread T = pid 100's main thread, A = its autograd thread):

  T  forward [0, 3000]
  T    layer 0 [10, 1000]
  T      aten::linear (4096x4096x4096) [20, 120]
  T        aten::mm [30, 110]      launch [40, 45]   -> K1 gemm bf16, stream 7, [100, 280]  180
                                   (and the nested cudaLaunchKernel_v7000 row [41, 44] of the same call)
  T        (under linear)          launch [112, 115] -> K2 bias, stream 7,      [280, 300]   20
  T      aten::native_layer_norm [130, 160]  launch [135, 140] -> K3 stream 7, [305, 315]  10
  T    layer 1 (text by textId) [1000, 2000]
  T      aten::linear [1010, 1100] launch [1020, 1026] -> K4 gemm, stream 7,  [1100, 1300] 200
  T  backward [3000, 6000];  layer 1 [3010, 4500];  layer 0 [4500, 5990]
  A      aten::mm [3100, 3200]     launch [3110, 3115] -> K5 gemm, stream 7,  [3200, 3450] 250
  A      aten::mm [4600, 4700]     launch [4610, 4618] -> K6 gemm, stream 7,  [4700, 4975] 275
  T      ncclAllReduce [5900, 5950], payload 32 MiB
  T                                launch [5910, 5920] -> K7 NCCL, stream 13, [5920, 6420] 500
"""
import json
import sqlite3
from pathlib import Path

import pytest
import yaml

from simtrain.calibration import nsys
from simtrain.calibration.kineto import operator_times
from simtrain.cli.main import main
from simtrain.errors import ConfigError
from simtrain.hardware.devices import get_device, load_profile

US = 1000
T = 100 * 0x1000000 + 100          # serialized globalTid: pid 100, tid 100
A = 100 * 0x1000000 + 101          # pid 100, tid 101 (autograd thread)
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
LINEAR = "aten::linear, seq = {}, sizes = [[2, 2048, 4096], [4096, 4096], []]"
MM = "aten::mm, seq = {}, sizes = [[4096, 4096], [4096, 4096]]"
MSG = 32 * 2**20


def build(path: Path, second_rank: bool = False) -> Path:
    """The report above; `second_rank` adds pid 200 on device 1 running the same all-reduce in
    400 us, its size in NVTX jsonText, under correlation id 7, which pid 100 uses too (CUPTI's
    ids are per process): each kernel joins its own process's launch."""
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT NOT NULL, end INT NOT NULL, deviceId INT NOT NULL,
            contextId INT NOT NULL, streamId INT NOT NULL, correlationId INT, globalPid INT, demangledName INT NOT NULL,
            shortName INT NOT NULL, gridX INT NOT NULL, gridY INT NOT NULL, gridZ INT NOT NULL);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT NOT NULL, end INT NOT NULL, eventClass INT NOT NULL,
            globalTid INT, correlationId INT, nameId INT NOT NULL, returnValue INT NOT NULL);
        CREATE TABLE NVTX_EVENTS (start INT NOT NULL, end INT, eventType INT NOT NULL, rangeId INT, category INT,
            color INT, text TEXT, globalTid INT, endGlobalTid INT, textId INT, domainId INT, uint64Value INT,
            int64Value INT, doubleValue REAL, uint32Value INT, int32Value INT, floatValue REAL, jsonTextId INT, jsonText TEXT);
    """)
    names = [GEMM, f"void {GEMM}(Params)", "vectorized_elementwise_kernel", "void at::native::vectorized_elementwise_kernel<4, bf16>()",
             "layer_norm_kernel", "void at::native::layer_norm_kernel<float>()", NCCL, f"void {NCCL}(ncclDevComm*, unsigned long, ncclWork*)",
             "cudaLaunchKernel_v7000", "layer 1"]
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", list(enumerate(names, 1)))

    def rng(a, b, text, tid=T, text_id=None, payload=None, js=None):
        db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, textId, uint64Value, jsonText) "
                   "VALUES (?, ?, 59, ?, ?, ?, ?, ?)", (a * US, b * US, text, tid, text_id, payload, js))

    corr = [0]

    def kernel(la, lb, ka, kb, short_id, stream=7, tid=T, device=0, corr_id=None):
        corr[0] += 1
        cid = corr_id or corr[0]
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 1, ?, ?, 9, 0)", (la * US, lb * US, tid, cid))
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?, 132, 1, 1)",
                   (ka * US, kb * US, device, stream, cid, tid // 0x1000000 * 0x1000000, short_id + 1, short_id))

    db.execute("INSERT INTO NVTX_EVENTS (start, eventType, text, globalTid) VALUES (0, 75, 'NCCL', ?)", (T,))   # a domain: no range
    rng(0, 3000, "forward")
    rng(10, 1000, "layer 0")
    rng(20, 120, LINEAR.format(0))
    rng(30, 110, MM.format(0))
    kernel(40, 45, 100, 280, 1)
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 1, ?, 1, 9, 0)", (41 * US, 44 * US, T))   # the nested _v7000 row
    kernel(112, 115, 280, 300, 3)
    rng(130, 160, "aten::native_layer_norm, seq = 1, sizes = [[2, 2048, 4096], [], [], []]")
    kernel(135, 140, 305, 315, 5)
    rng(1000, 2000, None, text_id=10)
    rng(1010, 1100, LINEAR.format(2))
    kernel(1020, 1026, 1100, 1300, 1)
    rng(3000, 6000, "backward")
    rng(3010, 4500, "layer 1")
    rng(4500, 5990, "layer 0")
    rng(3100, 3200, MM.format(2), tid=A)
    kernel(3110, 3115, 3200, 3450, 1, tid=A)
    rng(4600, 4700, MM.format(0), tid=A)
    kernel(4610, 4618, 4700, 4975, 1, tid=A)
    rng(5900, 5950, "ncclAllReduce", payload=MSG)
    kernel(5910, 5920, 5920, 6420, 7, stream=13)
    if second_rank:
        p = 200 * 0x1000000 + 200
        rng(5900, 5950, "ncclAllReduce", tid=p, js=json.dumps({"NCCL communicator ID": 7, "Message size [bytes]": MSG}))
        kernel(5911, 5921, 5930, 6330, 7, stream=13, tid=p, device=1, corr_id=7)
    db.commit()
    db.close()
    return path


@pytest.fixture
def report(tmp_path):
    return nsys.read(build(tmp_path / "report.sqlite"))


def test_kernels_go_to_the_innermost_range_of_their_launch_and_its_layer_and_phase(report):
    """K1 to K7 as in the module docstring: the layer / phase of the backward kernels comes from
    the main thread's ranges (the autograd thread pushed none); K4's layer from a textId."""
    got = [(k.name[:12], k.range.split(",")[0], k.layer, k.phase, k.stream) for k in report.kernels]
    assert got == [(GEMM[:12], "aten::mm", "0", "forward", 7), ("vectorized_e", "aten::linear", "0", "forward", 7),
                   ("layer_norm_k", "aten::native_layer_norm", "0", "forward", 7), (GEMM[:12], "aten::linear", "1", "forward", 7),
                   (GEMM[:12], "aten::mm", "1", "backward", 7), (GEMM[:12], "aten::mm", "0", "backward", 7),
                   (NCCL[:12], "ncclAllReduce", "0", "backward", 13)]
    assert report.kernels[0].grid == (132, 1, 1) and report.kernels[0].thread == T
    assert report.kernels[0].launch_ns == 40 * US            # the outer call, not the nested row at 41 us


def test_op_durations_roll_up_like_the_kineto_importer(report):
    """linear's kernels: 180 (K1, under its mm) + 20 (K2) = 200 us, counted once under linear;
    layer norm 10; layer 1's linear 200; the backward mms 250 and 275 us; dtype from the cuBLAS
    kernel name (bf16); sizes from the emit_nvtx text."""
    got = [(o.operator, o.aten, round(o.seconds * 1e6, 6), o.dtype) for o in report.ops]
    assert got == [("gemm", "aten::linear", 200, "bf16"), ("norm", "aten::native_layer_norm", 10, "?"),
                   ("gemm", "aten::linear", 200, "bf16"), ("gemm", "aten::mm", 250, "bf16"), ("gemm", "aten::mm", 275, "bf16")]
    assert report.ops[0].shapes == ((2, 2048, 4096), (4096, 4096), ())
    assert all(o.on_device for o in report.ops)


def test_host_gap_statistics_by_hand(report):
    """Launch calls on T: [40,45] [112,115] [135,140] [1020,1026] [5910,5920] -> gaps 67, 20, 880,
    4884 us; on A: [3110,3115] [4610,4618] -> 1495. Sorted 20, 67, 880, 1495, 4884: median 880,
    p90 (inclusive quantiles, as simtrain bench) = (1495 x 4 + 4884 x 6) / 10 = 3528.4.
    Call durations 5, 3, 5, 6, 10, 5, 8: median 5, p90 = (8 x 6 + 10 x 4) / 10 = 8.8.
    Stream 7 idle gaps 0, 5, 785, 1900, 1250: median 785, p90 = (1250 x 4 + 1900 x 6) / 10 = 1640.
    CPU per op: forward gemm 100 + 90 us (median 95), norm 30; backward gemm 100 + 100."""
    h = report.host
    assert h.launches == 7                          # the nested row of K1's call is not a launch of its own
    assert [x * 1e6 for x in h.launch_gap_s] == [pytest.approx(880), pytest.approx(3528.4)]
    assert [x * 1e6 for x in h.launch_call_s] == [pytest.approx(5), pytest.approx(8.8)]
    assert [x * 1e6 for x in h.device_idle_s] == [pytest.approx(785), pytest.approx(1640)]
    s = h.summary()["cpu_per_op"]
    assert s == {"backward": {"gemm": {"count": 2, "median_us": 100.0, "total_us": 200.0}},
                 "forward": {"gemm": {"count": 2, "median_us": 95.0, "total_us": 190.0},
                             "norm": {"count": 1, "median_us": 30.0, "total_us": 30.0}}}


def test_nccl_kernel_timing_and_size(report):
    """K7: 500 us, its size the 32 MiB payload of the enclosing ncclAllReduce range. One device
    only: no bus bandwidth point, a warning instead."""
    (c,) = report.collectives
    assert (c.collective, c.bytes, c.device) == ("all_reduce", MSG, 0) and c.seconds == pytest.approx(500e-6)
    rows, warn = nsys.collective_rows(report)
    assert rows == [] and "one device" in warn[0]


def test_calibrate_gives_the_efficiency_by_hand_and_the_collective_table(tmp_path, capsys):
    """Four 4096^3 bf16 GEMMs (2 x 4096^3 = 137438953472 FLOP) in 200, 200, 250, 275 us:
    687.194767, 687.194767, 549.755814, 499.777
    TFLOP/s; the profile keeps the median, (687.194767 + 549.755814) / 2 = 618.475290, and the
    H100 preset's bf16 peak is 989.4 TFLOP/s (devices.yaml, datasheet): efficiency 0.625101.
    The all-reduce ran on two devices (500 and 400 us, 32 MiB): median 450 us, bus factor
    2 x 1 / 2 = 1, busbw 33554432 / 450e-6 = 74.5654 GB/s."""
    f = build(tmp_path / "two.sqlite", second_rank=True)
    out = tmp_path / "prof.yaml"
    assert main(["calibrate", str(f), "--device", "h100-nsys", "--base", "h100-sxm5-80gb", "-o", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    (g,) = doc["gemm"]
    assert g["dtype"] == "bf16" and g["points"] == [{"m": 4096, "n": 4096, "k": 4096, "tflops": 618.48}]
    assert get_device("h100-sxm5-80gb").peak_flop_per_s["bf16"] == pytest.approx(989.4e12)
    e, inside = dict(load_profile(str(out)).gemm_shapes)["16bit"].at_shape(4096, 4096, 4096)
    assert inside and e == pytest.approx(618.475290 / 989.4, rel=1e-4)
    (c,) = doc["collectives"]
    assert (c["collective"], c["ranks"], c["nodes"]) == ("all_reduce", 2, 1)
    assert c["points"] == [{"bytes": MSG, "time_us": 450.0, "busbw_GBps": pytest.approx(74.5654, abs=1e-4)}]
    (p,) = doc["provenance"]["inputs"]
    assert p["kind"] == "nsys sqlite export" and p["host"]["launch_gap"]["median_us"] == pytest.approx(880)


def test_the_same_ops_as_a_kineto_trace_give_the_same_gemm_profile(tmp_path):
    """The forward linears and backward mms written as a torch.profiler trace (cpu_op + kernel,
    joined by External id, the same kernel durations) go through the same path: same points."""
    ev = []
    for ext, (name, dims, dur) in enumerate([("aten::linear", [[2, 2048, 4096], [4096, 4096], []], 200),
                                             ("aten::linear", [[2, 2048, 4096], [4096, 4096], []], 200),
                                             ("aten::mm", [[4096, 4096], [4096, 4096]], 250),
                                             ("aten::mm", [[4096, 4096], [4096, 4096]], 275)], 1):
        ev.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ext * 1000, "dur": 100,
                   "args": {"External id": ext, "Input Dims": dims, "Input type": ["c10::BFloat16"] * len(dims)}})
        ev.append({"ph": "X", "cat": "kernel", "name": GEMM, "pid": 1, "tid": 7, "ts": ext * 1000 + 200, "dur": dur,
                   "args": {"External id": ext}})
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": ev}))
    assert [o.seconds for o in operator_times(trace)] == [pytest.approx(x * 1e-6) for x in (200, 200, 250, 275)]
    docs = []
    for f in (trace, build(tmp_path / "r.sqlite")):
        out = tmp_path / f"{f.stem}.yaml"
        assert main(["calibrate", str(f), "--device", "x", "--base", "h100-sxm5-80gb", "-o", str(out)]) == 0
        docs.append(yaml.safe_load(out.read_text())["gemm"])
    assert docs[0] == [dict(docs[1][0], source="measured: trace.json")]


def _table_without(path: Path, table: str) -> Path:
    build(path)
    db = sqlite3.connect(path)
    db.execute(f"DROP TABLE {table}")
    db.commit()
    db.close()
    return path


def _edit(path: Path, sql: str) -> Path:
    build(path)
    db = sqlite3.connect(path)
    db.execute(sql)
    db.commit()
    db.close()
    return path


def _edit2(path: Path, sql: str) -> Path:
    """`_edit` on a report already built."""
    db = sqlite3.connect(path)
    db.execute(sql)
    db.commit()
    db.close()
    return path


def _corrupt(path: Path) -> Path:
    """A real report cut after its first page: the header stays, the tables are gone."""
    build(path)
    raw = path.read_bytes()
    path.write_bytes(raw[:4096] + b"\x00" * 100)
    return path


def _garbage_pages(path: Path) -> Path:
    build(path)
    raw = bytearray(path.read_bytes())
    raw[4096:] = b"\xff" * (len(raw) - 4096)
    path.write_bytes(bytes(raw))
    return path


BAD = [
    ("not-sqlite", lambda p: (p.write_text("hello, not a database\n"), p)[1], "", "not an SQLite database"),
    ("no-kernel-table", lambda p: _table_without(p, "CUPTI_ACTIVITY_KIND_KERNEL"), "CUPTI_ACTIVITY_KIND_KERNEL", "missing"),
    ("no-runtime-table", lambda p: _table_without(p, "CUPTI_ACTIVITY_KIND_RUNTIME"), "CUPTI_ACTIVITY_KIND_RUNTIME", "missing"),
    ("no-strings", lambda p: _table_without(p, "StringIds"), "StringIds", "missing"),
    ("empty", lambda p: _edit(p, "DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL"), "CUPTI_ACTIVITY_KIND_KERNEL", "empty"),
    ("end-before-start", lambda p: _edit(p, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = start - 5 WHERE rowid = 2"),
     "CUPTI_ACTIVITY_KIND_KERNEL[rowid=2].end", "before its start"),
    ("text-time", lambda p: _edit(p, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'soon' WHERE rowid = 3"),
     "CUPTI_ACTIVITY_KIND_KERNEL[rowid=3].start", "whole number"),
    ("no-kernel-names", lambda p: _edit2(_edit(p, "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN shortName"),
                                         "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN demangledName"),
     "CUPTI_ACTIVITY_KIND_KERNEL.shortName", "missing column"),
    ("nvtx-without-thread", lambda p: _edit(p, "ALTER TABLE NVTX_EVENTS DROP COLUMN globalTid"), "NVTX_EVENTS.globalTid", "missing column"),
    ("bad-string-id", lambda p: _edit(p, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET shortName = 999, demangledName = 998 WHERE rowid = 1"),
     "CUPTI_ACTIVITY_KIND_KERNEL[rowid=1].shortName", "no id in StringIds"),
    ("truncated", _corrupt, "", "SQLite"),
    ("garbage-pages", _garbage_pages, "StringIds", "corrupt"),
    ("zero-bytes", lambda p: (p.write_bytes(b""), p)[1], "", "not an SQLite database"),
]


@pytest.mark.parametrize("case", BAD, ids=[b[0] for b in BAD])
def test_bad_reports_are_one_clear_error(case, tmp_path, capsys):
    _, make, where, words = case
    f = make(tmp_path / "bad.sqlite")
    with pytest.raises(ConfigError) as e:
        nsys.read(f)
    (p, *_) = e.value.problems
    assert p.file == str(f) and p.path.startswith(where) and words in p.problem, e.value.problems
    out = tmp_path / "p.yaml"
    assert main(["calibrate", str(f), "--device", "x", "--base", "h100-sxm5-80gb", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(f) in err and "Traceback" not in err and not out.exists()


def test_a_directory_named_sqlite_is_refused(tmp_path):
    d = tmp_path / "dir.sqlite"
    d.mkdir()
    with pytest.raises(ConfigError, match="not a regular file"):
        nsys.read(d)


def test_mlu_kernels_of_a_torch_mlu_trace_are_device_time(tmp_path):
    """torch_mlu's profiler writes Kineto Chrome traces (Cambricon/torch_mlu
    test/profiler/test_profiler.py): MLU kernels under the category `kernel`, copies under
    `mlu_memcpy`, runtime calls (`cnInvokeKernel`) under `mlu_runtime`, and annotations under
    `mlu_user_annotation` / `mlu_notifier` (its Kineto's ActivityType names). A hand-built trace
    of aten::mm (ext 1) with a 40 us kernel and a 5 us copy counts 45 us, plus 10 us of a kernel
    under Kineto's PrivateUse1 name (`privateuse1_kernel`) = 55 us; the 3 us runtime call, the
    60 us device-side annotation and the notifier count nothing."""
    def x(cat, name, pid, ts, dur):
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": 1, "ts": ts, "dur": dur, "args": {"External id": 1}}
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 30,
           "args": {"External id": 1, "Input Dims": [[1024, 1024], [1024, 1024]], "Input type": ["c10::Half", "c10::Half"]}},
          x("mlu_runtime", "cnInvokeKernel", 1, 5, 3), x("kernel", "void MLUUnion1KernelMatMul<half>()", 0, 40, 40),
          x("mlu_memcpy", "Memcpy DtoD", 0, 81, 5), x("mlu_user_annotation", "step", 0, 30, 60), x("mlu_notifier", "notifier", 0, 90, 1),
          x("privateuse1_kernel", "void MLUBlockKernelAdd<half>()", 0, 100, 10), x("privateuse1_runtime", "cnInvokeKernel", 1, 12, 2)]
    f = tmp_path / "mlu.json"
    f.write_text(json.dumps({"traceEvents": ev, "deviceProperties": [{"id": 0, "name": "MLU590"}]}))
    (o,) = operator_times(f)
    assert (o.operator, o.on_device, o.dtype) == ("gemm", True, "c10::Half") and o.seconds == pytest.approx(55e-6)


def test_correlation_ids_are_joined_within_their_process(tmp_path):
    """pid 100 and pid 200 both launch a kernel under correlation id 7: pid 200's kernel (device 1)
    joins its own launch at 5911 us on its own thread, pid 100's the one at 5910 us."""
    prof = nsys.read(build(tmp_path / "two.sqlite", second_rank=True))
    k7 = [k for k in prof.kernels if k.correlation == 7]
    assert [(k.device, k.process, k.thread, k.launch_ns) for k in k7] == [
        (0, 100, T, 5910 * US), (1, 200, 200 * 0x1000000 + 200, 5911 * US)]
    assert [c.bytes for c in prof.collectives] == [MSG, MSG]


def test_a_generic_nccl_kernel_takes_its_collective_and_size_from_the_range_text(tmp_path):
    """NCCL's ncclDevKernel_Generic names no collective: the enclosing `ncclAllReduce, bytes = 1024`
    range (the text form a user range can carry, no payload) says all-reduce of 1024 bytes."""
    f = _edit(tmp_path / "g.sqlite", "UPDATE NVTX_EVENTS SET text = 'ncclAllReduce, bytes = 1024', uint64Value = NULL "
                                     "WHERE text = 'ncclAllReduce'")
    db = sqlite3.connect(f)
    db.execute("UPDATE StringIds SET value = replace(value, 'AllReduce_Sum_bf16_RING_LL', 'Generic_4')")   # short and demangled
    db.commit()
    db.close()
    (c,) = nsys.read(f).collectives
    assert (c.collective, c.bytes, c.kernel) == ("all_reduce", 1024, "ncclDevKernel_Generic_4")
    assert nsys.read(f).kernels[-1].collective == "all_reduce"
    db = sqlite3.connect(f)
    db.execute("UPDATE NVTX_EVENTS SET text = 'step' WHERE text LIKE 'ncclAllReduce%'")
    db.commit()
    db.close()
    assert nsys.read(f).collectives == ()          # outside any NCCL range: which collective is unknown


def test_a_gemm_dtype_the_base_preset_lacks_is_named_at_its_range(tmp_path, capsys):
    """The GEMM kernels renamed to an fp8 (e4m3) cuBLAS kernel, calibrated onto the A100 preset,
    which has no fp8 peak: an error at the NVTX range of the first GEMM (rowid 4: after the domain
    row, forward and layer 0, the first aten::linear). Left as bf16, the same times are faster
    than the A100's bf16 peak: refused at the same range."""
    f = build(tmp_path / "fp8.sqlite")
    db = sqlite3.connect(f)
    db.execute("UPDATE StringIds SET value = replace(value, 'bf16bf16_bf16f32_f32', 'e4m3e4m3_f32f32_f32')")
    db.commit()
    db.close()
    assert "fp8" not in get_device("a100-sxm4-80gb").peak_flop_per_s
    out = tmp_path / "p.yaml"
    assert main(["calibrate", str(f), "--device", "x", "--base", "a100-sxm4-80gb", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{f}: NVTX_EVENTS[rowid=4].text: aten::linear in 'fp8': a100-sxm4-80gb has no peak" in err and "Traceback" not in err
    g = build(tmp_path / "bf16.sqlite")
    assert main(["calibrate", str(g), "--device", "x", "--base", "a100-sxm4-80gb", "-o", str(out)]) == 2
    assert f"{g}: NVTX_EVENTS[rowid=4]: 687.2 TFLOP/s is faster than a100-sxm4-80gb's peak of 312 TFLOP/s" in capsys.readouterr().err


def test_gemms_whose_kernels_name_no_dtype_are_left_out_with_a_warning(tmp_path, capsys):
    """The GEMM kernels renamed to an sgemm (no dtype in the name): the four GEMMs are left out
    with one warning, printed also when, nothing else being measured, calibrate exits 2."""
    f = _edit(tmp_path / "s.sqlite", "UPDATE StringIds SET value = replace(replace(value, 'bf16bf16_bf16f32_f32', 'sgemm'), 'bf16', 'float')")
    assert [o.dtype for o in nsys.read(f).ops if o.operator == "gemm"] == ["?"] * 4
    assert main(["calibrate", str(f), "--device", "x", "--base", "h100-sxm5-80gb", "-o", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert "no measurements found" in err and "Traceback" not in err
    assert f"warning: {f}: 4 GEMM ops left out: the kernel names say no dtype" in err


def test_a_report_without_nvtx_still_gives_kernels_launch_gaps_and_nccl_timings(tmp_path):
    """NVTX_EVENTS is created only when the application emits NVTX: without it there are no
    ranges, so no operators and no NCCL size (a warning), but kernels and launch gaps as above."""
    prof = nsys.read(_table_without(tmp_path / "plain.sqlite", "NVTX_EVENTS"))
    assert len(prof.kernels) == 7 and prof.ops == () and all(k.range is None and k.layer is None for k in prof.kernels)
    assert [x * 1e6 for x in prof.host.launch_gap_s] == [pytest.approx(880), pytest.approx(3528.4)]
    (c,) = prof.collectives
    assert c.bytes is None and "without a message size" in nsys.collective_rows(prof)[1][0]


def test_the_size_of_a_user_range_around_nccls_own_range_counts(tmp_path):
    """NCCL's own `ncclAllReduce` range (its size in a payload this importer cannot read: none
    here) inside the user's `ncclAllReduce, bytes = 4096` range: the user's size counts."""
    f = _edit(tmp_path / "u.sqlite", "UPDATE NVTX_EVENTS SET uint64Value = NULL WHERE text = 'ncclAllReduce'")
    db = sqlite3.connect(f)
    db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, ?, 59, 'ncclAllReduce, bytes = 4096', ?)",
               (5890 * US, 5960 * US, T))
    db.commit()
    db.close()
    assert [c.bytes for c in nsys.read(f).collectives] == [4096]
