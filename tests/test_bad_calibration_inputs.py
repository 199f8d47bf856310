"""Bad calibration inputs, case by case: each exits 2 with one `<file>: <key.path>: <problem>; <fix>`
line per problem, no traceback, within seconds and bounded memory.

Each case is a row of CASES: an id, the input kind, a builder that writes the input into a fresh
directory and returns the command line and the file the error must name, the key path the error
must name and words it must contain. Every case runs `simtrain calibrate ...` (or `simtrain check`
for a scenario's schedule CSV, or `simtrain bench`) in a subprocess under a timeout and an
address-space limit, so a hang or a runaway allocation fails the case instead of the test run.

Run `python tests/test_bad_calibration_inputs.py [ROOT]` for the outcome of every case against
the code at ROOT, counted by input kind.
"""
from __future__ import annotations

import copy
import gzip
import json
import os
import resource
import subprocess
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from simtrain.calibration.fit import check_loads
from simtrain.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data" / "nccl"
TIMEOUT_S = 30
MEMORY_LIMIT = 3 * 2**30
BASE = "h100-sxm5-80gb"

NCCL_JSON = json.loads((DATA / "reduce_scatter_2.19.json").read_text())
NCCL_TEXT = (DATA / "all_reduce_2.17.txt").read_text()
NCCL_ROW = "     1048576        262144     float     sum      -1    38.74   27.07   47.37      0    38.52   27.22   47.64      0"

BENCH = {
    "schema": "simtrain-calibration/1",
    "provenance": {"device": "NVIDIA H100 80GB HBM3", "backend": "cuda", "dtype": "bf16"},
    "gemm": [{"m": 4096, "n": 4096, "k": 4096, "dtype": "bf16", "median_s": 2.0e-4, "p10_s": 1.9e-4, "p90_s": 2.1e-4, "reps": 20}],
    "attention": [{"batch": 1, "heads": 8, "seq": 1024, "head_dim": 64, "causal": True, "pass": "fwd+bwd", "dtype": "bf16",
                   "median_s": 1.0e-4, "p10_s": 1.0e-4, "p90_s": 1.0e-4, "reps": 20}],
    "memory": [{"op": "add", "elements": 65536, "bytes": 393216, "dtype": "bf16", "median_s": 1.0e-5,
                "p10_s": 1.0e-5, "p90_s": 1.0e-5, "reps": 20}],
    "collectives": [{"collective": "all_reduce", "ranks": 8, "nodes": 1, "bytes": 1048576, "dtype": "bf16",
                     "median_s": 4.0e-5, "p10_s": 4.0e-5, "p90_s": 4.0e-5, "reps": 20, "algbw": 2.6e10, "busbw": 4.6e10}],
}


def _ev(cat: str, name: str, ts: float, dur: float, ext: int, dims=None, tid: int = 1) -> dict:
    args = {"External id": ext}
    if dims is not None:
        args.update({"Input Dims": dims, "Input type": ["c10::BFloat16", "c10::BFloat16", ""]})
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


TRACE = {"traceEvents": [
    _ev("cpu_op", "aten::linear", 0, 100, 1, dims=[[64, 128], [256, 128], []]),
    _ev("kernel", "sm90_gemm", 200, 30, 1, tid=7),
]}

SCENARIO = {
    "name": "small",
    "model": {"architecture": "gpt", "num_layers": 8, "hidden_size": 256, "num_attention_heads": 8,
              "vocab_size": 1024, "seq_length": 128},
    "training": {"micro_batch_size": 1, "global_batch_size": 8},
    "parallel": {"tp": 1, "pp": 2, "dp": 1, "schedule_csv": "sched.csv"},
    "cluster": {"device": "a100-sxm4-80gb", "topology": "topo.yaml", "nodes": 1},
}
TOPOLOGY = {
    "name": "small", "kind": "two_tier", "devices_per_node": 2,
    "scale_up": {"bandwidth": "300 GB/s", "latency": "3 us"},
    "scale_out": {"nics_per_node": 4, "nic_bandwidth": "200 Gb/s", "latency": "5 us"},
}
# GPipe over 2 ranks and 8 microbatches: valid, the base the CSV cases edit
GOOD_CSV = "\n".join(",".join([f"{r}F{i}" for i in range(8)] + [f"{r}B{i}" for i in range(8)]) for r in range(2)) + "\n"

Builder = Callable[[Path], tuple[list, str]]


@dataclass(frozen=True)
class Case:
    id: str
    kind: str                 # nccl-tests JSON | nccl-tests text | Kineto trace | bench file | schedule CSV | special file | bench command
    build: Builder            # writes the input into a directory; (argv, the file the error names)
    key: str = ""             # the key path the error names
    words: str = ""           # words the error contains


def calibrate(name: str, data: bytes | str) -> Builder:
    """`simtrain calibrate NAME` of a file holding `data`."""
    def b(d: Path) -> tuple[list, str]:
        f = d / name
        f.write_bytes(data if isinstance(data, bytes) else data.encode())
        return ["calibrate", str(f), "--device", "x", "--base", BASE, "-o", str(d / "out.yaml")], str(f)
    return b


def nccl_json(edit: Callable[[dict], object] | None = None, text: str | None = None) -> Builder:
    doc = copy.deepcopy(NCCL_JSON)
    if edit is not None:
        edit(doc)
    return calibrate("rs.json", text if text is not None else json.dumps(doc))


def nccl_text(old: str, new: str) -> Builder:
    assert old in NCCL_TEXT
    return calibrate("all_reduce.txt", NCCL_TEXT.replace(old, new, 1))


def bench_yaml(edit: Callable[[dict], object] | None = None, text: str | None = None) -> Builder:
    doc = copy.deepcopy(BENCH)
    if edit is not None:
        edit(doc)
    return calibrate("bench.yaml", text if text is not None else yaml.safe_dump(doc, sort_keys=False))


def trace(edit: Callable[[dict], object] | None = None, raw: bytes | None = None, name: str = "trace.json") -> Builder:
    doc = copy.deepcopy(TRACE)
    if edit is not None:
        edit(doc)
    return calibrate(name, raw if raw is not None else json.dumps(doc))


def _set(path: str, value: object) -> Callable[[dict], None]:
    """An edit setting a dotted path (list indexes as numbers) of a document."""
    def edit(doc: dict) -> None:
        node = doc
        parts = [int(p) if p.isdigit() else p for p in path.split(".")]
        for p in parts[:-1]:
            node = node[p]
        if value is _DEL:
            del node[parts[-1]]
        else:
            node[parts[-1]] = value
    return edit


_DEL = object()


def special(path: str | None = None, fifo: bool = False) -> Builder:
    def b(d: Path) -> tuple[list, str]:
        f = path
        if fifo:
            f = str(d / "fifo.json")
            os.mkfifo(f)
        return ["calibrate", f, "--device", "x", "--base", BASE, "-o", str(d / "out.yaml")], f
    return b


def schedule_csv(text: str | None = None, path: str | None = None, fifo: bool = False) -> Builder:
    """`simtrain check` of a scenario whose parallel.schedule_csv is the file written (or `path`)."""
    def b(d: Path) -> tuple[list, str]:
        (d / "topo.yaml").write_text(yaml.safe_dump(TOPOLOGY))
        f = d / "sched.csv"
        if fifo:
            os.mkfifo(f)
        elif text is not None:
            f.write_text(text)
        sc = copy.deepcopy(SCENARIO)
        sc["parallel"]["schedule_csv"] = path or str(f)
        (d / "scenario.yaml").write_text(yaml.safe_dump(sc))
        return ["check", str(d / "scenario.yaml")], path or str(f)
    return b


def bench_cmd(*argv: str) -> Builder:
    def b(d: Path) -> tuple[list, str]:
        return ["bench", "-o", str(d / "b.yaml"), *argv], argv[0]
    return b


def _gz_bomb() -> bytes:
    """A small gzip file that decompresses to 300 MiB (a trace's JSON padded with spaces)."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [c.compress(b'{"traceEvents": [')]
    chunk = b" " * 2**20
    for _ in range(300):
        out.append(c.compress(chunk))
    out.append(c.compress(b"]}"))
    out.append(c.flush())
    return b"".join(out)


CASES = [
    # nccl-tests -J JSON
    Case("nccl-json-results-ints", "nccl-tests JSON", nccl_json(_set("results", [1, 2])), "results[0]", "mapping"),
    Case("nccl-json-size-string", "nccl-tests JSON", nccl_json(_set("results.0.size", "1048576")), "results[0].size", "whole number"),
    Case("nccl-json-time-string", "nccl-tests JSON", nccl_json(_set("results.0.out_of_place.time", "20.0")),
         "results[0].out_of_place.time", "number"),
    Case("nccl-json-body-list", "nccl-tests JSON", nccl_json(_set("results.0.out_of_place", [20.0])),
         "results[0].out_of_place", "mapping"),
    Case("nccl-json-time-nan", "nccl-tests JSON", nccl_json(text=json.dumps(NCCL_JSON).replace('"time": 20.0', '"time": NaN', 1)),
         "results[0].out_of_place.time", "finite"),
    Case("nccl-json-time-inf", "nccl-tests JSON", nccl_json(text=json.dumps(NCCL_JSON).replace('"time": 20.0', '"time": Infinity', 1)),
         "results[0].out_of_place.time", "finite"),
    Case("nccl-json-size-1e38", "nccl-tests JSON", nccl_json(_set("results.0.size", 10**38)), "results[0].size", "<="),
    Case("nccl-json-size-negative", "nccl-tests JSON", nccl_json(_set("results.0.size", -1048576)), "results[0].size", ">"),
    Case("nccl-json-devices-strings", "nccl-tests JSON", nccl_json(_set("devices", ["gpu0", "gpu1"])), "devices", "device records"),
    Case("nccl-json-hostname-list", "nccl-tests JSON", nccl_json(_set("devices.0.hostname", ["n0"])), "devices[0].hostname", "text"),
    Case("nccl-json-args-string", "nccl-tests JSON", nccl_json(_set("args", "all_reduce_perf -b 8")), "args", "list"),
    Case("nccl-json-top-list", "nccl-tests JSON", nccl_json(text="[" + json.dumps(NCCL_JSON) + "]"), "", "mapping"),
    Case("nccl-json-duplicate-key", "nccl-tests JSON", nccl_json(text=json.dumps(NCCL_JSON)[:-1] + ', "results": []}'), "", "duplicate"),
    Case("nccl-json-truncated", "nccl-tests JSON", nccl_json(text=json.dumps(NCCL_JSON)[:500]), "", "not valid JSON"),
    Case("nccl-json-deep", "nccl-tests JSON", nccl_json(text='{"results": ' + "[" * 100_000 + "]" * 100_000 + "}"), "", "deep"),
    # nccl-tests text log
    Case("nccl-text-time-nan", "nccl-tests text", nccl_text(NCCL_ROW, NCCL_ROW.replace("38.74", "  nan")), "line 18", "finite"),
    Case("nccl-text-time-inf", "nccl-tests text", nccl_text(NCCL_ROW, NCCL_ROW.replace("38.74", "  inf")), "line 18", "finite"),
    Case("nccl-text-size-huge", "nccl-tests text", nccl_text(NCCL_ROW, NCCL_ROW.replace("1048576", "1" + "0" * 38, 1)), "line 18", "<="),
    Case("nccl-text-size-5000-digits", "nccl-tests text", nccl_text(NCCL_ROW, NCCL_ROW.replace("1048576", "9" * 5000, 1)),
         "line 18", "size"),
    # Kineto (torch.profiler) trace
    Case("kineto-gz-truncated", "Kineto trace", trace(raw=gzip.compress(json.dumps(TRACE).encode())[:40], name="t.json.gz"),
         "", "gzip"),
    Case("kineto-gz-bomb", "Kineto trace", trace(raw=_gz_bomb(), name="t.json.gz"), "", "MiB"),
    Case("kineto-not-gzip", "Kineto trace", trace(raw=b"\x1f\x8b" + b"x" * 100, name="t.json.gz"), "", "gzip"),
    Case("kineto-no-name", "Kineto trace", trace(_set("traceEvents.0.name", _DEL)), "traceEvents[0].name", "missing"),
    Case("kineto-name-int", "Kineto trace", trace(_set("traceEvents.0.name", 7)), "traceEvents[0].name", "text"),
    Case("kineto-args-list", "Kineto trace", trace(_set("traceEvents.0.args", [1, 2])), "traceEvents[0].args", "mapping"),
    Case("kineto-dims-strings", "Kineto trace", trace(_set("traceEvents.0.args.Input Dims", [["64", "128"], [256, 128]])),
         "traceEvents[0].args.Input Dims", "whole number"),
    Case("kineto-dims-string", "Kineto trace", trace(_set("traceEvents.0.args.Input Dims", "64x128")),
         "traceEvents[0].args.Input Dims", "list"),
    Case("kineto-dims-1e38", "Kineto trace", trace(_set("traceEvents.0.args.Input Dims", [[10**38, 128], [256, 128]])),
         "traceEvents[0].args.Input Dims", "<="),
    Case("kineto-dims-zero", "Kineto trace", trace(_set("traceEvents.0.args.Input Dims", [[0, 128], [256, 128]])),
         "traceEvents[0].args.Input Dims", ">"),
    Case("kineto-dur-nan", "Kineto trace", calibrate("trace.json", json.dumps(TRACE).replace('"dur": 30', '"dur": NaN', 1)),
         "traceEvents[1].dur", "finite"),
    Case("kineto-dtype-unknown", "Kineto trace", trace(_set("traceEvents.0.args.Input type", ["c10::Float8_e4m3fnuz", "", ""])),
         "traceEvents[0].args.Input type", "no peak"),
    Case("kineto-dur-negative", "Kineto trace", trace(_set("traceEvents.1.dur", -30)), "traceEvents[1].dur", ">= 0"),
    Case("kineto-events-map", "Kineto trace", trace(_set("traceEvents", {"a": 1})), "traceEvents", "list"),
    Case("kineto-event-int", "Kineto trace", trace(_set("traceEvents.1", 5)), "traceEvents[1]", "mapping"),
    # a binary file that is none of the formats: the fix lists what calibrate reads
    Case("binary-file", "special file", calibrate("run.bin", bytes(range(256)) * 16), "", "an Nsight Systems export"),
    Case("kineto-deep", "Kineto trace", calibrate("trace.json", '{"traceEvents": ' + "[" * 100_000 + "]" * 100_000 + "}"), "", "deep"),
    # simtrain bench calibration file
    Case("bench-list", "bench file", bench_yaml(text="- schema: simtrain-calibration/1\n- gemm: []\n"), "", "mapping"),
    Case("bench-missing-n", "bench file", bench_yaml(_set("gemm.0.n", _DEL)), "gemm[0].n", "missing"),
    Case("bench-median-zero", "bench file", bench_yaml(_set("gemm.0.median_s", 0)), "gemm[0].median_s", "> 0"),
    Case("bench-median-nan", "bench file", bench_yaml(_set("gemm.0.median_s", float("nan"))), "gemm[0].median_s", "finite"),
    Case("bench-median-inf", "bench file", bench_yaml(_set("memory.0.median_s", float("inf"))), "memory[0].median_s", "finite"),
    Case("bench-median-string", "bench file", bench_yaml(_set("gemm.0.median_s", "fast")), "gemm[0].median_s", "number"),
    Case("bench-m-1e38", "bench file", bench_yaml(_set("gemm.0.m", 1e38)), "gemm[0].m", "whole number"),
    Case("bench-m-huge-int", "bench file", bench_yaml(_set("gemm.0.m", 10**38)), "gemm[0].m", "<="),
    Case("bench-k-zero", "bench file", bench_yaml(_set("gemm.0.k", 0)), "gemm[0].k", ">"),
    Case("bench-bytes-negative", "bench file", bench_yaml(_set("memory.0.bytes", -5)), "memory[0].bytes", ">"),
    Case("bench-seq-zero", "bench file", bench_yaml(_set("attention.0.seq", 0)), "attention[0].seq", ">"),
    Case("bench-causal-string", "bench file", bench_yaml(_set("attention.0.causal", "yes")), "attention[0].causal", "true or false"),
    Case("bench-ranks-one", "bench file", bench_yaml(_set("collectives.0.ranks", 1)), "collectives[0].ranks", ">= 2"),
    Case("bench-collective-unknown", "bench file", bench_yaml(_set("collectives.0.collective", "gossip")),
         "collectives[0].collective", "all_reduce"),
    Case("bench-dtype-unknown", "bench file", bench_yaml(_set("gemm.0.dtype", "fp64")), "gemm[0].dtype", "fp64"),
    Case("bench-gemm-map", "bench file", bench_yaml(_set("gemm", {"m": 1})), "gemm", "list"),
    Case("bench-gemm-entry-string", "bench file", bench_yaml(_set("gemm", ["4096x4096"])), "gemm[0]", "mapping"),
    Case("bench-provenance-list", "bench file", bench_yaml(_set("provenance", [1])), "provenance", "mapping"),
    Case("bench-python-tag", "bench file",
         bench_yaml(text="schema: simtrain-calibration/1\ngemm: !!python/object/apply:os.system [echo hi]\n"), "", "not valid YAML"),
    Case("bench-duplicate-key", "bench file",
         bench_yaml(text=yaml.safe_dump(BENCH, sort_keys=False) + "gemm: []\n"), "", "duplicate key 'gemm'"),
    Case("bench-anchor-bomb", "bench file", bench_yaml(
        text="schema: simtrain-calibration/1\na0: &a0 [x, x, x, x, x, x, x, x, x, x]\n"
             + "".join(f"a{i + 1}: &a{i + 1} [{', '.join([f'*a{i}'] * 10)}]\n" for i in range(7))), "", "aliases"),
    # special files given to calibrate
    Case("special-dev-zero", "special file", special("/dev/zero"), "", "regular file"),
    Case("special-fifo", "special file", special(fifo=True), "", "regular file"),
    Case("special-directory", "special file", special("/tmp"), "", "regular file"),
    Case("special-missing", "special file", special("/nonexistent/x.json"), "", "cannot read"),
    Case("special-big-file", "special file", calibrate("big.txt", "#" * (20 * 2**20)), "", "MiB"),
    # the schedule CSV of parallel.schedule_csv (simtrain check)
    Case("csv-stage-absurd", "schedule CSV", schedule_csv(GOOD_CSV.replace("0F0", "999999999F0", 1)), "row 1, cell 1", "stage"),
    Case("csv-microbatch-absurd", "schedule CSV", schedule_csv(GOOD_CSV.replace("0F0", "0F999999999", 1)), "row 1, cell 1",
         "microbatch"),
    Case("csv-microbatch-beyond-plan", "schedule CSV", schedule_csv(GOOD_CSV.replace("0F7", "0F8", 1)), "row 1, cell 8", "microbatch"),
    Case("csv-index-5000-digits", "schedule CSV", schedule_csv(GOOD_CSV.replace("0F0", "0F" + "9" * 5000, 1)), "row 1, cell 1",
         "microbatch"),
    Case("csv-rows-huge", "schedule CSV", schedule_csv(GOOD_CSV + "0F0\n" * 200_000), "row 3", "rows"),
    Case("csv-bad-cell", "schedule CSV", schedule_csv(GOOD_CSV.replace("1B3", "1X3", 1)), "row 2, cell 12", "not an action"),
    Case("csv-dev-zero", "schedule CSV", schedule_csv(path="/dev/zero"), "parallel.schedule_csv", "regular file"),
    Case("csv-fifo", "schedule CSV", schedule_csv(fifo=True), "parallel.schedule_csv", "regular file"),
    Case("csv-directory", "schedule CSV", schedule_csv(path="/tmp"), "parallel.schedule_csv", "regular file"),
    Case("csv-big-file", "schedule CSV", schedule_csv(GOOD_CSV + ("," * 1000 + "\n") * 20_000), "parallel.schedule_csv", "MiB"),
    # simtrain bench arguments, refused before anything is measured
    Case("bench-reps-0", "bench command", bench_cmd("--reps", "0"), "", ">= 1"),
    Case("bench-collectives-no-torchrun", "bench command", bench_cmd("--collectives"), "", "torchrun"),
    Case("bench-mlu-no-torch-mlu", "bench command", bench_cmd("--device", "mlu"), "", "torch_mlu"),
]


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_case(case: Case, d: Path, root: Path = ROOT) -> tuple[str, str]:
    """(outcome, stderr): clean | traceback | hang | accepted | wrong-message."""
    argv, target = case.build(d)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(root)
    try:
        p = subprocess.run([sys.executable, "-m", "simtrain", *argv], cwd=d, env=env, capture_output=True, text=True,
                           timeout=TIMEOUT_S, preexec_fn=_limit_memory)
    except subprocess.TimeoutExpired:
        return "hang", ""
    err = p.stderr
    if "Traceback" in err or p.returncode not in (0, 2):
        return "traceback", err[-2000:]
    if p.returncode == 0:
        return "accepted", err[-500:]
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("warning:")]
    ok = bool(lines) and (f": {case.key}:" in err if case.key else True) and case.words.lower() in err.lower() \
        and all(len(line) <= 600 and ": " in line and "; " in line for line in lines) \
        and any(line.startswith(target) for line in lines)
    return ("clean" if ok else "wrong-message"), err[-2000:]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_calibration_input(case: Case, tmp_path: Path) -> None:
    outcome, err = run_case(case, tmp_path)
    assert outcome == "clean", f"{outcome}: {err}"


def _calibrate(d: Path, *files: str, base: str = BASE) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "simtrain", "calibrate", *files, "--device", "x", "--base", base,
                           "-o", str(d / "out.yaml")], cwd=d, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


def test_the_valid_bench_file_calibrates_without_a_warning(tmp_path: Path) -> None:
    """The base the cases edit is valid: its GEMM is 2 x 4096^3 FLOP in 2e-4 s = 687.19 TFLOP/s
    (hand-derived), written as measured, and no warning (an H100 measured onto an H100 preset)."""
    argv, f = bench_yaml()(tmp_path)
    p = _calibrate(tmp_path, f)
    assert p.returncode == 0, p.stderr
    assert "warning" not in p.stderr
    prof = yaml.safe_load((tmp_path / "out.yaml").read_text())
    assert prof["gemm"][0]["points"][0]["tflops"] == pytest.approx(2 * 4096**3 / 2e-4 / 1e12, rel=1e-4)


def test_cpu_measurements_onto_a_gpu_preset_warn_once(tmp_path: Path) -> None:
    """A bench file recorded on the CPU, calibrated onto the H100 preset: written (a user may mean
    it), with one warning line naming both."""
    _, f = bench_yaml(lambda d: d["provenance"].update(backend="cpu", device="x86_64"))(tmp_path)
    p = _calibrate(tmp_path, f)
    assert p.returncode == 0, p.stderr
    warns = [ln for ln in p.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warns) == 1 and "the CPU (x86_64)" in warns[0] and BASE in warns[0] and f in warns[0]


def test_nccl_log_of_another_gpu_warns(tmp_path: Path) -> None:
    """The shipped nccl-tests log ran on "NVIDIA H100 80GB HBM3" devices; onto the A100 preset it warns."""
    p = _calibrate(tmp_path, str(DATA / "all_reduce_2.17.txt"), base="a100-sxm4-80gb")
    assert p.returncode == 0, p.stderr
    assert "warning:" in p.stderr and "NVIDIA H100 80GB HBM3" in p.stderr and "a100-sxm4-80gb" in p.stderr


def test_a_profile_the_loader_refuses_is_not_written(tmp_path: Path) -> None:
    """The last check before writing loads the profile through the loader `simtrain run` uses: a
    zero throughput (the loader wants every point > 0) is an error at the output file and key path."""
    prof = {"schema": "simtrain-profile/1", "device": "x", "base": BASE,
            "gemm": [{"dtype": "bf16", "points": [{"m": 1, "n": 1, "k": 1, "tflops": 0.0}]}]}
    out = tmp_path / "out.yaml"
    with pytest.raises(ConfigError) as e:
        check_loads(prof, yaml.safe_dump(prof).encode(), out)
    assert str(e.value).startswith(f"{out}: gemm[0].points[0].tflops:") and "would be refused" in str(e.value)
    assert not out.exists()


if __name__ == "__main__":
    import collections
    import tempfile
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    counts: collections.Counter = collections.Counter()
    for c in CASES:
        with tempfile.TemporaryDirectory() as t:
            outcome, err = run_case(c, Path(t), root)
        counts[(c.kind, outcome)] += 1
        print(f"{c.id:34s} {outcome:14s} {err.strip().splitlines()[-1][:140] if err.strip() else ''}", flush=True)
    for kind in dict.fromkeys(c.kind for c in CASES):
        print(f"{kind:18s} " + ", ".join(f"{o} {n}" for (k, o), n in sorted(counts.items()) if k == kind))
    print(f"tried {len(CASES)}")
