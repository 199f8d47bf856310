"""nccl-tests importer: the text tables of two nccl-tests versions (header-driven) and the -J JSON
file, with bus bandwidth recomputed from size and time by nccl-tests' factors
(doc/PERFORMANCE.md: 2(n-1)/n all-reduce, (n-1)/n all-gather / reduce-scatter)."""
from pathlib import Path

import pytest

from simtrain.calibration.nccl_tests import bus_factor, read, tuning_choices
from simtrain.errors import ConfigError

DATA = Path(__file__).parent / "data" / "nccl"


def agrees_with_print(r) -> bool:
    """The log prints time and busbw with 2 decimals: the recomputed busbw may differ from the
    printed one by the time's rounding (0.005 us relative to the time) plus the print's own 0.005."""
    bus = r.busbw / 1e9
    return abs(bus - r.printed_busbw) <= bus * 0.005 / (r.time_s * 1e6) + 0.005 + 1e-9


def test_text_log_with_root_and_wrong_columns():
    """nccl-tests 2.17 prints `size count type redop root time algbw busbw #wrong ...`. Rows are
    the Voltage Park H100 log of validation/data/nccl-tests (sweep nccl_vp_h100_1node_allreduce):
    1 GiB in 4010.54 us -> algbw 267.73, busbw x 14/8 = 468.53."""
    (sw,) = read(DATA / "all_reduce_2.17.txt")
    assert (sw.collective, sw.ranks, sw.nodes, sw.dtype) == ("all_reduce", 8, 1, "float")
    assert sw.provenance["nccl_tests"] == "2.17.9" and sw.provenance["nccl"] == "22403"
    assert [r.bytes for r in sw.rows] == [2**20, 2**22, 2**24, 2**26, 2**28, 2**30]
    last = sw.rows[-1]
    assert last.time_s == pytest.approx(4010.54e-6)
    assert last.busbw == pytest.approx(2**30 / 4010.54e-6 * 2 * 7 / 8, rel=1e-12)
    assert all(agrees_with_print(r) for r in sw.rows)


def test_older_text_log_without_root_column():
    """An older table (`size count type redop time algbw busbw error`, no root column, no
    `Collective test starting` line: the file name says all_gather), 4 ranks on 2 hosts:
    1 MiB in 60 us -> algbw 17.476 GB/s, busbw x 3/4 = 13.107."""
    (sw,) = read(DATA / "all_gather_2.10.txt")
    assert (sw.collective, sw.ranks, sw.nodes) == ("all_gather", 4, 2)
    assert sw.rows[0].busbw == pytest.approx(2**20 / 60e-6 * 3 / 4, rel=1e-12)
    assert all(agrees_with_print(r) for r in sw.rows)


def test_json_output():
    """-J JSON: 4 ranks, reduce_scatter named in args; 16 MiB in 100 us -> 167.77 x 3/4 = 125.83."""
    (sw,) = read(DATA / "reduce_scatter_2.19.json")
    assert (sw.collective, sw.ranks, sw.nodes) == ("reduce_scatter", 4, 1)
    assert sw.rows[-1].busbw == pytest.approx(2**24 / 100e-6 * 0.75, rel=1e-12)
    assert all(agrees_with_print(r) for r in sw.rows)


def test_bus_factors():
    assert bus_factor("all_reduce", 8) == 14 / 8
    assert bus_factor("all_to_all", 4) == 0.75
    assert bus_factor("sendrecv", 2) == 1.0


def test_a_truncated_row_is_named_with_its_line(tmp_path):
    text = (DATA / "all_reduce_2.17.txt").read_text().replace("  1073741824     268435456     float     sum      -1  4010.54",
                                                              "  1073741824     268435456")
    f = tmp_path / "all_reduce_cut.txt"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        read(f)
    assert "line 23" in str(e.value) and str(f) in str(e.value)


def test_the_log_agrees_with_the_validation_sweep_it_was_taken_from():
    """The importer's busbw of the H100 log equals the busbw recorded for the same sizes in the
    validation data (within the log's 2-decimal print)."""
    from simtrain.studies.validate import sweeps
    (sw,) = read(DATA / "all_reduce_2.17.txt")
    (e,) = [e for e, _ in sweeps() if e["id"] == "nccl_vp_h100_1node_allreduce"]
    recorded = {r["bytes"]: r["busbw_GBps"] for r in e["data"]}
    for r in sw.rows:
        assert r.busbw / 1e9 == pytest.approx(recorded[r.bytes], abs=0.01 + r.busbw / 1e9 * 0.005 / (r.time_s * 1e6))


def test_tuning_lines_all_formats():
    """NCCL's TUNING lines: the 2.22 format (NCCL 2.22.3's log of 3 x 8 H100, github.com/NVIDIA/nccl/issues/1453) with indices and the
    model's time, and the 2.24+ format with names (an NCCL 2.30 log of one H100 node)."""
    log = ("host:1:1 [0] NCCL INFO 65536 Bytes -> Algo 0 proto 0 time 37.798233\n"
           "host:1:1 [0] NCCL INFO 1048576 Bytes -> Algo 5 proto 2 time 66.107201\n"
           "host:1:1 [0] NCCL INFO 1048576 Bytes -> Algo 5 proto 2 time 66.107201\n"
           "host:1:1 [0] NCCL INFO AllReduce: 2097152 Bytes -> Algo NVLS proto SIMPLE channel{Lo..Hi}={0..15}\n")
    got = [(c.bytes, c.algorithm, c.protocol, c.collective, c.time_us) for c in tuning_choices(log)]
    assert got == [(65536, "Tree", "LL", None, 37.798233), (1048576, "NVLSTree", "Simple", None, 66.107201),
                   (2097152, "NVLS", "Simple", "AllReduce", None)]
