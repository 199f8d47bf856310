"""Blackwell (GB200, HGX B200) and CDNA3 (MI300X) presets against their public sources.

NVIDIA's Blackwell tables print Tensor Core rates with 2:4 sparsity; the dense peak is half of each
printed figure. GB200 NVL72 spec table, "Individual Blackwell GPU Specifications"
(nvidia.com/en-us/data-center/gb200-nvl72/): GB200 FP4 20 PF, FP8/FP6 10 PF, FP16/BF16 5 PF, TF32
2.5 PF (sparse), FP32 80 TF, 186 GB at 8 TB/s; HGX B200 FP4 18, FP8 9, FP16/BF16 4.5, TF32 2.2 PF
(sparse), FP32 75 TF, 180 GB at 7.7 TB/s. AMD MI300X datasheet: dense FP16/BF16 1307.4, FP8 2614.9,
TF32 653.7, FP32 163.4 TFLOP/s, 192 GB HBM3 at 5.3 TB/s.
"""
import pytest

from simtrain.cost.roofline import CalibratedRoofline
from simtrain.hardware.devices import _raw, get_device
from simtrain.workload.ir import Op

T = 1e12
NEW = ("gb200-186gb", "b200-sxm-180gb", "mi300x-192gb")


@pytest.mark.parametrize("key,sparse,fp32", [
    # GB200 column: FP4 20000, FP8 10000, BF16 5000, TF32 2500 TFLOP/s with sparsity; FP32 80 dense
    ("gb200-186gb", {"fp4": 20000, "fp8": 10000, "bf16": 5000, "fp16": 5000, "tf32": 2500}, 80),
    # HGX B200 column: FP4 18000, FP8 9000, BF16 4500, TF32 2200 with sparsity; FP32 75 dense
    ("b200-sxm-180gb", {"fp4": 18000, "fp8": 9000, "bf16": 4500, "fp16": 4500, "tf32": 2200}, 75),
])
def test_blackwell_peaks_are_half_the_sparse_figures(key, sparse, fp32):
    dev = get_device(key)
    for dtype, tflops in sparse.items():
        assert dev.peak(dtype) == pytest.approx(tflops / 2 * T), dtype
    assert dev.peak("fp32") == fp32 * T
    assert dev.peak("fp8") == 2 * dev.peak("bf16") and dev.peak("fp4") == 2 * dev.peak("fp8")


def test_mi300x_peaks_from_the_datasheet():
    """MI300X datasheet dense peaks; the with-sparsity figures (2614.9 FP16, 5229.8 FP8) are not used."""
    dev = get_device("mi300x-192gb")
    assert dev.peak("bf16") == dev.peak("fp16") == pytest.approx(1307.4 * T)
    assert dev.peak("fp8") == pytest.approx(2614.9 * T)
    assert dev.peak("tf32") == pytest.approx(653.7 * T) and dev.peak("fp32") == pytest.approx(163.4 * T)
    assert dev.memory_bw == 5.3e12
    assert (dev.vendor, dev.arch) == ("AMD", "cdna3")


def test_capacities_in_bytes():
    """B200: nvidia-smi memory.total 183359MiB (NVIDIA/TensorRT-LLM issue #10278) x 2**20 =
    192,265,846,784 B = 179.06 GiB, NVIDIA's "180GB". GB200: "186GB" read as 186 GiB (assumed, no
    nvidia-smi total found) = 186 x 2**30 = 199,715,979,264 B. MI300X: ROCm's gpu-specs table 192 GiB
    = 206,158,430,208 B, within 16 MiB of 8 CPX partitions x 25,767,706,624 B."""
    assert get_device("b200-sxm-180gb").memory_bytes == 183359 * 2**20 == 192_265_846_784
    assert get_device("gb200-186gb").memory_bytes == 186 * 2**30 == 199_715_979_264
    assert get_device("mi300x-192gb").memory_bytes == 192 * 2**30 == 206_158_430_208
    assert 192 * 2**30 - 8 * 25_767_706_624 == 16 * 2**20
    assert _raw()["gb200-186gb"]["capacity_source"].startswith("assumed:")


def test_bandwidths_and_host_links():
    """HBM: GB200 8 TB/s, B200 7.7 TB/s (NVIDIA's table; 7680 bit / 8 x 3996 MHz x 2 = 7.672 TB/s).
    Host: GB200 measured nvbandwidth host-to-device 201 GB/s over NVLink-C2C (Azure ND GB200 v6);
    B200 and MI300X nominal PCIe Gen5 x16, 32e9 x 16 x 128/130 / 8 = 63.0 GB/s per direction."""
    assert get_device("gb200-186gb").memory_bw == 8.0e12
    assert get_device("b200-sxm-180gb").memory_bw == 7.7e12
    assert 7680 / 8 * 3996e6 * 2 == pytest.approx(7.7e12, rel=4e-3)
    gb = get_device("gb200-186gb")
    assert gb.host_bandwidth == 201e9 and gb.host_bandwidth_source.startswith("measured:")
    gen5 = 32e9 * 16 * 128 / 130 / 8
    for k in ("b200-sxm-180gb", "mi300x-192gb"):
        assert get_device(k).host_bandwidth == pytest.approx(gen5, rel=2e-3)
        assert get_device(k).host_bandwidth_source.startswith("nominal:")


def test_borrowed_curves_are_marked_assumed():
    """GB200 has its own measured FP8 sweep (Azure ND GB200 v6 cublasLt: 2876.6 TFLOP/s at 8192^3
    of a 5000 peak); B200 takes it from GB200 (same GPU); everything else comes from H100, and each
    preset says so in its borrows_notes."""
    gb, b2, mi = (get_device(k) for k in NEW)
    assert gb.gemm["fp8"].origin == "gb200-186gb" and gb.gemm["fp8"].at(8192)[0] == pytest.approx(2876.6 / 5000)
    assert b2.gemm["fp8"].origin == "gb200-186gb"
    for dev in (gb, b2, mi):
        assert dev.gemm["16bit"].origin == dev.mem_origin == dev.flash.origin == "h100-sxm5-80gb"
        assert "ASSUMED" in _raw()[dev.key]["borrows_notes"]
    assert mi.gemm["fp8"].origin == "h100-sxm5-80gb"
    notes = CalibratedRoofline(b2, "bf16").coverage
    assert "b200-sxm-180gb: 16-bit GEMM efficiency borrowed from h100-sxm5-80gb measurements" in notes
    assert "b200-sxm-180gb: fp8 GEMM efficiency borrowed from gb200-186gb measurements" in notes


def test_b200_roofline_gemm_by_hand():
    """One GEMM on B200 by hand: time = max(FLOPs / (peak x eff), bytes / (HBM bw x mem_eff)).
    fp8 8192^3: eff 2876.6 / 5000 = 0.57532 (GB200's sweep, the same GPU), 2 x 8192^3 = 1.0995e12
    FLOPs / (4500e12 x 0.57532) = 424.7 us; its 3 x 8192^2 B = 201 MB move in 29 us, so compute-bound.
    bf16 4096^3: H100's XLA point 783.3 / 989.4 = 0.79169, 1.3744e11 / (2250e12 x 0.79169) = 77.2 us.
    fp8 8192 x 8192 x 16 (memory-bound): cube root 1024, eff 489.2 / 5000 -> 4.88 us of compute;
    bytes 2 x 8192 x 16 + 8192^2 = 67,371,008 at 7.7e12 x 2903/3350 (H100's copy efficiency) = 10.10 us."""
    dev = get_device("b200-sxm-180gb")
    mem_eff = 2903 / 3350
    fp8, bf16 = CalibratedRoofline(dev, "fp8"), CalibratedRoofline(dev, "bf16")
    big = Op("fc1", "gemm", "F", 2 * 8192**3, 3 * 8192**2, (8192, 8192, 8192))
    t = 2 * 8192**3 / (4500e12 * 2876.6 / 5000)
    assert fp8.device_time(big) == pytest.approx(t) and t == pytest.approx(424.7e-6, rel=1e-3)
    assert 3 * 8192**2 / (7.7e12 * mem_eff) < t
    mid = Op("qkv", "gemm", "F", 2 * 4096**3, 3 * 2 * 4096**2, (4096, 4096, 4096))
    t = 2 * 4096**3 / (2250e12 * 783.3 / 989.4)
    assert bf16.device_time(mid) == pytest.approx(t) and t == pytest.approx(77.2e-6, rel=1e-3)
    nbytes = 2 * 8192 * 16 + 8192**2
    thin = Op("proj", "gemm", "F", 2 * 8192 * 8192 * 16, nbytes, (8192, 8192, 16))
    t = nbytes / (7.7e12 * mem_eff)
    assert 2 * 8192 * 8192 * 16 / (4500e12 * 489.2 / 5000) < t
    assert fp8.device_time(thin) == pytest.approx(t) and t == pytest.approx(10.10e-6, rel=1e-3)


def test_list_devices_shows_the_new_presets_with_sources(capsys):
    """`simtrain list devices` prints each new preset's dense peaks, capacity, bandwidth and source."""
    from simtrain.cli.main import main
    assert main(["list", "devices"]) == 0
    lines = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines() if ln.strip()}
    want = {
        "gb200-186gb": "fp8 5000, bf16 2500, fp16 2500, tf32 1250, fp32 80, fp4 10000 TFLOP/s; 186 GiB at 8000 GB/s; host 201 GB/s (measured)",
        "b200-sxm-180gb": "fp8 4500, bf16 2250, fp16 2250, tf32 1100, fp32 75, fp4 9000 TFLOP/s; 179.1 GiB at 7700 GB/s; host 63 GB/s (nominal)",
        "mi300x-192gb": "fp8 2614.9, bf16 1307.4, fp16 1307.4, tf32 653.7, fp32 163.4 TFLOP/s; 192 GiB at 5300 GB/s; host 63 GB/s (nominal)",
    }
    for key, text in want.items():
        assert text in lines[key], key
        assert lines[key].endswith(" — " + _raw()[key]["source"]), key


def test_gb200_scenario_runs_on_one_rack():
    """scenarios/llama3-70b-gb200-nvl72.yaml: tp 2 x pp 4 x dp 9 = 72 GPUs = one NVL72 rack, fp8
    against the GB200's 5000 TFLOP/s dense FP8 peak; it fits in memory and its MFU is a fraction."""
    from conftest import shipped_run
    sc, topo, run = shipped_run("llama3-70b-gb200-nvl72")
    r = run.result
    assert sc.world_size == topo.num_devices == 72 == 2 * 4 * 9
    assert sc.cluster.device == "gb200-186gb" and r.precision == "fp8"
    assert r.fits_in_memory and 0 < r.mfu < 1
