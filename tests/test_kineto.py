"""PyTorch profiler (Kineto) importer: a trace recorded by torch.profiler on the CPU in the test
itself, and a hand-written device trace whose kernel sums are derived by hand."""
import gzip
import json

import pytest

from simtrain.calibration.kineto import operator_times
from simtrain.errors import ConfigError


def test_trace_recorded_on_cpu_in_the_test(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile
    x, w = torch.randn(64, 128), torch.randn(256, 128)
    ln = torch.nn.LayerNorm(256)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(3):
            y = torch.nn.functional.linear(x, w)
            torch.nn.functional.gelu(ln(y))
    f = tmp_path / "cpu.json"
    prof.export_chrome_trace(str(f))
    ops = operator_times(f)
    # linear's inner matmul / mm are not counted again: one gemm per iteration
    assert [o.operator for o in ops] == ["gemm", "norm", "activation"] * 3
    g = ops[0]
    assert g.aten == "aten::linear" and g.shapes[:2] == ((64, 128), (256, 128)) and g.dtype == "float"
    assert all(o.seconds > 0 and not o.on_device for o in ops)


def _x(cat, name, ts, dur, ext, tid=1):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": {"External id": ext}}


def test_kernels_join_their_cpu_ops_through_the_external_id(tmp_path):
    """aten::linear (ext 1) contains aten::mm (ext 2): kernels of 30 + 10 us launched under mm
    and 5 us under linear itself count 45 us for the one gemm; a Cambricon `mlu_kernel` of 7 us
    under aten::gelu (ext 3) counts for the activation; runtime calls are not device time."""
    ev = [_x("cpu_op", "aten::linear", 0, 100, 1), _x("cpu_op", "aten::mm", 10, 80, 2),
          _x("cpu_op", "aten::gelu", 120, 20, 3),
          _x("cuda_runtime", "cudaLaunchKernel", 15, 3, 2), _x("mlu_runtime", "cnrtInvokeKernel", 125, 2, 3),
          _x("kernel", "sm90_gemm", 200, 30, 2, tid=7), _x("kernel", "sm90_gemm_tail", 231, 10, 2, tid=7),
          _x("kernel", "bias", 242, 5, 1, tid=7), _x("mlu_kernel", "cnnlGelu", 260, 7, 3, tid=8)]
    f = tmp_path / "dev.json.gz"
    f.write_bytes(gzip.compress(json.dumps({"traceEvents": ev}).encode()))
    ops = operator_times(f)
    assert [(o.operator, o.aten) for o in ops] == [("gemm", "aten::linear"), ("activation", "aten::gelu")]
    assert ops[0].seconds == pytest.approx(45e-6) and ops[1].seconds == pytest.approx(7e-6)
    assert all(o.on_device for o in ops)


def test_a_file_that_is_not_a_trace_is_named(tmp_path):
    f = tmp_path / "x.json"
    f.write_text("[1, 2")
    with pytest.raises(ConfigError) as e:
        operator_times(f)
    assert str(f) in str(e.value) and "export_chrome_trace" in str(e.value)


def test_ops_of_two_processes_do_not_nest(tmp_path):
    """A merged trace: pid 1's aten::linear (0-100 us) and pid 2's aten::mm (10-60 us) overlap in
    time on the same tid; each keeps its own kernels (50 and 30 us)."""
    def ev(cat, name, ts, dur, ext, pid, tid=1):
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": {"External id": ext}}
    f = tmp_path / "two.json"
    f.write_text(json.dumps({"traceEvents": [ev("cpu_op", "aten::linear", 0, 100, 1, 1), ev("cpu_op", "aten::mm", 10, 50, 2, 2),
                                             ev("kernel", "k1", 200, 50, 1, 1, 7), ev("kernel", "k2", 200, 30, 2, 2, 7)]}))
    ops = operator_times(f)
    assert sorted(o.seconds for o in ops) == [pytest.approx(30e-6), pytest.approx(50e-6)]


def test_tensor_list_dims_are_read(tmp_path):
    """A tensor-list argument (aten::cat, the fused optimizer) records a list of shapes inside
    Input Dims; that is valid, and the GEMM next to it is still counted (30 us of kernel)."""
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::cat", "pid": 1, "tid": 1, "ts": 0, "dur": 5,
           "args": {"External id": 9, "Input Dims": [[[2, 3], [2, 3]], []]}},
          {**_x("cpu_op", "aten::mm", 10, 20, 1), "args": {"External id": 1, "Input Dims": [[4, 8], [8, 16]], "Input type": ["float", "float"]}},
          _x("kernel", "gemm", 40, 30, 1, tid=7)]
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"traceEvents": ev}))
    ops = operator_times(f)
    assert [(o.operator, o.shapes, o.seconds) for o in ops] == [("gemm", ((4, 8), (8, 16)), pytest.approx(30e-6))]
