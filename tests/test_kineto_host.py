"""Host-side statistics of a Kineto trace (`kineto.host_stats`) on a hand-built trace; every
expected value is derived by hand in the comments."""
import json

from simtrain.calibration.kineto import host_stats


def _trace(tmp_path):
    ev = []
    # four launches on one thread at 0, 10, 30, 60 us, each call 4 us long; a
    # cudaStreamSynchronize at 40..55 sits between the third and the fourth launch
    for i, ts in enumerate((0, 10, 30, 60)):
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 4,
                   "pid": 1, "tid": 7, "args": {"External id": 100 + i}})
        ev.append({"ph": "X", "cat": "kernel", "name": "multi_tensor_apply_kernel<AdamFunctor>" if i == 3 else "gemm",
                   "ts": ts + 5, "dur": 2, "pid": 0, "tid": 0, "args": {"External id": 100 + i}})
    ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 40, "dur": 15, "pid": 1, "tid": 7})
    # one outermost CPU op (aten::linear, 0..32 us) holding the first three launches' ext ids via children
    ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": 0, "dur": 36, "pid": 1, "tid": 7, "args": {"External id": 100}})
    ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 9, "dur": 5, "pid": 1, "tid": 7, "args": {"External id": 101}})
    ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 29, "dur": 5, "pid": 1, "tid": 7, "args": {"External id": 102}})
    ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::_fused_adam_", "ts": 58, "dur": 10, "pid": 1, "tid": 7, "args": {"External id": 103}})
    ev.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 70, "pid": 1, "tid": 7})
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    return p


def test_host_stats_by_hand(tmp_path):
    s = host_stats(_trace(tmp_path))
    # start-to-start intervals 10, 20 (the 30..60 one holds the synchronisation): median 15, mean 15
    assert s["issue_interval"]["count"] == 2
    assert abs(s["issue_interval"]["median_s"] - 15e-6) < 1e-12
    assert abs(s["issue_interval"]["mean_s"] - 15e-6) < 1e-12
    # nearest-rank p90 of (10, 20): 20
    assert abs(s["issue_interval"]["p90_s"] - 20e-6) < 1e-12
    # end-to-start gaps: 10 - 4 = 6 and 30 - 14 = 16
    assert abs(s["launch_gap"]["median_s"] - 11e-6) < 1e-12
    # every launch call is 4 us
    assert abs(s["launch_call"]["median_s"] - 4e-6) < 1e-12 and s["launches"] == 4
    # aten::linear (36 us) launched 3 kernels (its own and its two aten::mm children): 12 us each;
    # aten::_fused_adam_ (10 us) launched 1: 10 us. Median of (12, 10) = 11
    assert abs(s["cpu_per_kernel"]["median_s"] - 11e-6) < 1e-12
    # one optimizer kernel (AdamFunctor) of 2 us; one profiler step
    assert s["optimizer"]["kernels"] == 1 and abs(s["optimizer"]["device_s"] - 2e-6) < 1e-12
    assert s["steps"] == 1
