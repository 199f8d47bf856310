import math

import pytest

from simtrain.errors import ConfigError
from simtrain.hardware.devices import _raw, get_device, load_profile, preset_names


def test_gemm_curve_worked_example():
    """A100 cublasLt FP16 sweep (Azure ND A100 v4): 228.0 TFLOP/s at 4096³, 253.7 at 8192³, peak 312."""
    c = get_device("a100-sxm4-80gb").gemm["16bit"]
    assert c.at(2048)[0] == pytest.approx(221.8 / 312)
    side = (2048 * 4608 * 12288) ** (1 / 3)
    e4, e8 = 228.0 / 312, 253.7 / 312
    assert c.at(side) == (pytest.approx(e4 + (e8 - e4) * math.log2(side / 4096)), True)
    eff, inside = c.at(300)          # below the sweep: nearest end, flagged
    assert eff == pytest.approx(119.4 / 312) and inside is False


def test_every_preset_has_sources_and_curves():
    for k in preset_names():
        d = get_device(k)
        assert d.source and d.memory_bytes > 0 and d.memory_bw > 0
        assert "16bit" in d.gemm and 0 < d.mem_efficiency <= 1
        for c in d.gemm.values():
            assert c.source and all(0 < e <= 1 for _, e in c.points)


def test_host_queue_by_hand():
    """Host issues an operator every c, the device runs them in order: c = 10 us with device times
    50, 5, 5 us ends at max(10 + 60, 20 + 10, 30 + 5) = 70 us (the long kernel lets the host run
    ahead); three 1 us kernels end at 3·10 + 1 = 31 us (host-bound); no host cost is the sum."""
    from simtrain.cost.roofline import host_queue
    us = 1e-6
    assert host_queue([50 * us, 5 * us, 5 * us], 10 * us) == pytest.approx(70 * us)
    assert host_queue([1 * us] * 3, 10 * us) == pytest.approx(31 * us)
    assert host_queue([50 * us, 5 * us], 0.0) == pytest.approx(55 * us)
    assert host_queue([], 10 * us) == 0.0


def test_profile_host_overhead_hides_behind_long_kernels():
    """With the A100 profile's per-operator host cost c, a segment's time is host_queue of the
    device times: never less than their sum plus one c, never more than the sum plus c per op,
    and equal to that upper bound for one op (`duration`)."""
    from simtrain.cost.roofline import CalibratedRoofline
    from simtrain.hardware.devices import find_profile, load_profile
    from simtrain.workload.ir import Op
    dev = load_profile(str(find_profile("a100-megatron-deepspeed", None)))
    costs = CalibratedRoofline(dev, "fp16")
    c = dev.op_overhead
    assert c > 0
    big = Op("fc1", "gemm", "F", 2 * 8192 ** 3, 3 * 2 * 8192 ** 2, (8192, 8192, 8192))
    small = Op("add", "memory", "F", 0.0, 3 * 2 * 4096.0, ())
    seq = [big, small, small, small]
    dev_sum = sum(costs.device_time(o) for o in seq)
    t = costs.sequence_time(seq)
    assert dev_sum + c <= t + 1e-15 < dev_sum + len(seq) * c
    assert t == pytest.approx(c + dev_sum)                      # the GEMM outlasts the three issues
    assert costs.duration(small) == pytest.approx(c + costs.device_time(small))
    assert costs.sequence_time([small] * 3) == pytest.approx(3 * c + costs.device_time(small))


def test_a_bad_profile_is_checked_against_its_declaration(tmp_path):
    """Every problem of a profile at its key path, in the `<file>: <key.path>: <problem>; <fix>` form."""
    f = tmp_path / "bad.yaml"
    f.write_text("schema: simtrain-profile/1\nbase: a100-sxm4-80gb\n"
                 "gemm: [bf16, {dtype: bf16, points: [{m: 8, n: 8, k: 8, tflops: 0}]}, {dtype: bf16, points: []}]\n"
                 "memory_bound: {points: [{bytes: 1000}]}\n"
                 "flash_attention: {source: x}\n"
                 "collectives: [{collective: all_reduce, ranks: 0, nodes: 1, points: [{bytes: 8, time_us: -1}]}]\n"
                 "op_overhead: {per_operator: 45}\n")
    with pytest.raises(ConfigError) as e:
        load_profile(str(f))
    text = str(e.value)
    for line in (
        "gemm[0]: expected a mapping, got str; write it as `key: value` lines",
        "gemm[1].points[0].tflops: expected a number > 0, got 0; write e.g. `1.5`",
        "gemm[2].points: empty; give at least one entry",
        "memory_bound.points[0].bandwidth_GBps: missing required key; add `bandwidth_GBps:`",
        "flash_attention.points: missing required key; add `points:`",
        "collectives[0].ranks: expected a whole number >= 1, got 0; write e.g. `8`",
        "collectives[0].points[0].time_us: expected a number > 0, got -1; write e.g. `1.5`",
        "op_overhead.per_operator: 45 has no unit",
        "op_overhead.source: missing required key; add `source:`",
    ):
        assert f"{f}: {line}" in text, line


def test_list_devices_shows_peaks_memory_and_bandwidth(capsys):
    """`simtrain list devices`: dense peak per precision, capacity and bandwidth, as the presets
    state them (A100 SXM4 80GB datasheet: 312 TFLOP/s bf16 and fp16, 156 tf32, 19.5 fp32; 80 GiB
    (nvidia-smi's 81920 MiB) at 2039 GB/s)."""
    from simtrain.cli.main import main
    assert main(["list", "devices"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("a100-sxm4-80gb "))
    assert "bf16 312, fp16 312, tf32 156, fp32 19.5 TFLOP/s; 80 GiB at 2039 GB/s" in line


def test_capacities_are_binary_as_the_devices_expose_them():
    """Capacities are nvidia-smi's memory.total in MiB (2**20 B), not decimal GB. Hand derivation:
    A100 80GB: 81920 MiB = 80 x 2**30 = 85,899,345,920 B (not 80e9); A100 40GB: 40960 MiB =
    42,949,672,960 B; H100 / H800: 81559 MiB x 2**20 = 85,520,809,984 B; H200: 143771 MiB x 2**20
    = 150,754,820,096 B (140.4 GiB, the datasheet's "141 GB"); MLU370-X8 48 GiB = 51,539,607,552 B."""
    assert get_device("a100-sxm4-80gb").memory_bytes == 85_899_345_920 == 80 * 2**30
    assert get_device("a100-sxm4-40gb").memory_bytes == 42_949_672_960
    assert get_device("h100-sxm5-80gb").memory_bytes == get_device("h800-sxm5-80gb").memory_bytes == 85_520_809_984
    assert get_device("h200-sxm-141gb").memory_bytes == 150_754_820_096
    assert get_device("mlu370-x8").memory_bytes == 51_539_607_552
    for key in preset_names():
        assert _raw()[key]["capacity_source"], key


def test_every_preset_has_a_host_link_with_its_kind():
    for k in preset_names():
        dev = get_device(k)
        assert dev.host_bandwidth > 0, k
        assert dev.host_bandwidth_source.split(":")[0] in ("measured", "nominal", "assumed"), k


def test_host_links_by_source():
    """Measured nvbandwidth host-to-device copies where public (Azure ND A100 v4 26.28 GB/s, ND
    H200 v5 52 GB/s, Voltage Park H100 54.8 GB/s); nominal PCIe per direction otherwise: Gen4 x16
    16e9·16·128/130/8 = 31.5 GB/s, Gen5 x16 63.0 GB/s."""
    assert get_device("a100-sxm4-80gb").host_bandwidth == 26.28e9
    assert get_device("h200-sxm-141gb").host_bandwidth == 52e9
    assert get_device("h100-sxm5-80gb").host_bandwidth == 54.8e9
    gen4, gen5 = 16e9 * 16 * 128 / 130 / 8, 32e9 * 16 * 128 / 130 / 8
    assert get_device("a100-sxm4-40gb").host_bandwidth == pytest.approx(gen4, rel=2e-3)
    for k in ("h800-sxm5-80gb", "h20-96gb"):
        assert get_device(k).host_bandwidth == pytest.approx(gen5, rel=2e-3)
        assert get_device(k).host_bandwidth_source.startswith("nominal:")


def test_h20_preset():
    """HGX H20 as publicly reported: dense BF16 148 TFLOP/s, FP8 296, 4.0 TB/s; nvidia-smi's
    97871 MiB = 102,625,181,696 B (95.6 GiB); efficiency curves borrowed from H100 and marked so."""
    dev = get_device("h20-96gb")
    assert dev.peak("bf16") == 148e12 and dev.peak("fp8") == 296e12
    assert dev.memory_bw == 4.0e12
    assert dev.memory_bytes == 97871 * 2**20 == 102_625_181_696
    assert dev.gemm["16bit"].origin == "h100-sxm5-80gb" and dev.mem_origin == "h100-sxm5-80gb"
    assert "ASSUMED" in _raw()["h20-96gb"]["borrows_notes"]


def test_list_devices_and_topologies_cite_their_sources(capsys):
    """Every line of `simtrain list devices` ends with the preset's `source` field from
    simtrain/data/devices.yaml, and every line of `list topologies` with the topology file's
    `source`: the listing says where each number comes from."""
    from simtrain.cli.main import main
    from simtrain.hardware.topology import load_topology, shipped_topologies
    assert main(["list", "devices"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for key in preset_names():
        line = next(ln for ln in lines if ln.startswith(key + " "))
        assert _raw()[key]["source"] and line.endswith(" — " + _raw()[key]["source"]), key
    assert main(["list", "topologies"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for f in shipped_topologies():
        source = load_topology(f, 1).source
        line = next(ln for ln in lines if ln.startswith(f.stem + " "))
        assert source and line.endswith(" — " + source), f.stem
