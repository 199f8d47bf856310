"""The Cambricon MLU profiles: every number they price with carries its source, what is borrowed
from the A100 says so (and what was searched), and the costs follow from those numbers."""
import math

import pytest
import yaml
from conftest import ROOT, shipped_run

from simtrain.cost.roofline import CalibratedRoofline
from simtrain.hardware.devices import _raw, find_profile, get_device, load_profile
from simtrain.network.nccl_tuning import borrowed_note, compcap_of
from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario
from simtrain.units import parse_bandwidth, parse_bytes, parse_flops
from simtrain.workload.ir import Op

MLU_PROFILES = {"mlu370-x8-spec": "mlu370-x8", "mlu590-spec": "mlu590"}
BORROWED = "borrowed: A100"
SEARCHED = "no public Cambricon measurement found; searched:"


def _doc(name: str) -> dict:
    return yaml.safe_load(find_profile(name, None).read_text())


@pytest.mark.parametrize("name", sorted(MLU_PROFILES))
def test_mlu_profile_loads_as_uncalibrated_refinement_of_its_preset(name):
    dev = load_profile(str(find_profile(name, None)))
    base = get_device(MLU_PROFILES[name])
    assert dev.key == name and dev.base == base.key and dev.profile_status == "uncalibrated"
    # the profile measures nothing, so it prices exactly as its preset
    assert dev.peak_flop_per_s == base.peak_flop_per_s and dev.memory_bw == base.memory_bw
    assert dev.gemm["16bit"] is base.gemm["16bit"] and dev.mem_efficiency == base.mem_efficiency


@pytest.mark.parametrize("name", sorted(MLU_PROFILES))
def test_every_mlu_profile_number_carries_a_source(name):
    """provenance.values lists each number the profile prices with; each entry equals what the
    loaded device uses, has a non-empty source and confidence, and a curve that is not the
    device's own is labelled as borrowed from the A100 with the searches that found nothing."""
    base = MLU_PROFILES[name]
    dev = load_profile(str(find_profile(name, None)))
    rows = {r["key"]: r for r in _doc(name)["provenance"]["values"]}
    want = {f"peak.{k}" for k in dev.peak_flop_per_s} | {
        "memory.capacity", "memory.bandwidth", "host_link.bandwidth", "gemm.16bit", "memory_bound.efficiency", "flash_attention"}
    assert set(rows) == want
    for r in rows.values():
        assert str(r["source"]).strip() and str(r["confidence"]).strip(), r["key"]
    for k, v in dev.peak_flop_per_s.items():
        assert parse_flops(rows[f"peak.{k}"]["value"]) == v
    assert parse_bytes(rows["memory.capacity"]["value"]) == dev.memory_bytes
    assert parse_bandwidth(rows["memory.bandwidth"]["value"]) == dev.memory_bw
    assert parse_bandwidth(rows["host_link.bandwidth"]["value"]) == dev.host_bandwidth
    origins = {"gemm.16bit": dev.gemm["16bit"].origin, "memory_bound.efficiency": dev.mem_origin,
               "flash_attention": dev.flash.origin}
    for key, origin in origins.items():
        assert rows[key]["value"] == f"curve of {origin}"
        if origin != base:
            assert origin == "a100-sxm4-80gb"
            assert rows[key]["source"].startswith(BORROWED) and SEARCHED in rows[key]["source"], key
            assert "borrowed" in rows[key]["confidence"]
    # the preset carries the same label, so a run on the preset (no profile) is explained too
    assert _raw()[base]["borrows_notes"].startswith(BORROWED) and SEARCHED in _raw()[base]["borrows_notes"]


def test_mlu590_gemm_priced_at_its_sourced_peak_times_efficiency():
    """Closed form: a 4096^3 bf16 GEMM on the MLU590 preset takes 2·4096³ / (390 TFLOP/s × e), with
    e = 228.0 / 312 the A100 cublasLt fp16 efficiency at 4096^3 (Azure ND A100 v4 sweep, the
    borrowed curve) and 390 TFLOP/s the third-party-estimate bf16 peak; fp8 uses the same
    efficiency on the 780 TFLOP/s fp8 estimate. Off the sweep points the efficiency is linear in
    log2 of the side: 2048 x 4608 x 12288 has side 4876, e = 0.7308 + (253.7 - 228.0) / 312 · log2(4876/4096)."""
    dev = load_profile(str(find_profile("mlu590-spec", None)))
    s = 4096
    gemm = Op("fc1", "gemm", "F", 2.0 * s ** 3, 3 * 2.0 * s * s, (s, s, s))
    e4096 = 228.0 / 312.0
    assert CalibratedRoofline(dev, "bf16").device_time(gemm) == pytest.approx(2.0 * s ** 3 / (390e12 * e4096), rel=1e-12)
    fp8 = Op("fc1", "gemm", "F", 2.0 * s ** 3, 3 * 1.0 * s * s, (s, s, s))
    assert CalibratedRoofline(dev, "fp8").device_time(fp8) == pytest.approx(2.0 * s ** 3 / (780e12 * e4096), rel=1e-12)
    m, n, k = 2048, 4608, 12288
    side = (m * n * k) ** (1 / 3)
    e = e4096 + (253.7 - 228.0) / 312.0 * math.log2(side / 4096)
    off = Op("qkv", "gemm", "F", 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n), (m, n, k))
    assert CalibratedRoofline(dev, "bf16").device_time(off) == pytest.approx(2.0 * m * n * k / (390e12 * e), rel=1e-9)
    notes = CalibratedRoofline(dev, "bf16").coverage
    assert any("borrowed from a100-sxm4-80gb" in x for x in notes)
    assert any("uncalibrated" in x for x in notes) and any("low-confidence" in x for x in notes)


def test_shipped_mlu_scenario_runs_on_the_preset_and_on_the_profile(tmp_path):
    """llama3-8b-mlu370-32 runs; with cluster.device_profile mlu370-x8-spec (which measures
    nothing) its step time is the preset's, and the result says the costs are borrowed and uncalibrated."""
    _, _, run = shipped_run("llama3-8b-mlu370-32")
    assert run.result.step_time_s > 0
    assert any("borrowed from a100-sxm4-80gb" in x for x in run.result.coverage)
    assert any(x.startswith("mlu370-x8: collectives borrowed: NCCL's tuning model with its Ampere (A100)")
               for x in run.result.coverage)
    doc = yaml.safe_load((ROOT / "scenarios" / "llama3-8b-mlu370-32.yaml").read_text())
    doc["cluster"]["device_profile"] = "mlu370-x8-spec"
    p = tmp_path / "mlu370-profile.yaml"
    p.write_text(yaml.safe_dump(doc))
    sc, topo = load_scenario(p)
    r = simulate(sc, topo).result
    assert r.step_time_s == run.result.step_time_s
    assert any("uncalibrated" in x for x in r.coverage)


def test_collectives_on_cambricon_fabrics_are_labelled_as_borrowed_from_ampere_nccl():
    """An MLU fabric gets NCCL's tuner with the constants of its fallback generation, which is
    the A100's (Ampere) index, so the note says Ampere; a measured collective table, or an NVIDIA
    device (whose library is NCCL), gets no such note."""
    assert compcap_of("mlu mlu370-x8") == compcap_of("gpu dgx-a100") == 1
    assert "Ampere (A100)" in borrowed_note("Cambricon", False)
    assert borrowed_note("Cambricon", True) is None and borrowed_note("NVIDIA", False) is None
