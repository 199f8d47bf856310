"""The H100 development set (validation/data/h100) and `simtrain validate h100`.

The data checks are structural (every row names its source and states its configuration, the
parallel degrees multiply to the GPU count). The summary statistics are checked on two made-up
runs whose MAPE and mean signed error are worked out by hand; the runner on one cheap row
(8 GPUs) and one row the data marks as skipped. The full run is marked slow."""
from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

import pytest

from simtrain import resources
from simtrain.cli.main import main
from simtrain.studies import validate
from simtrain.studies.validate import Run

ROOT = Path(__file__).resolve().parent.parent


def rows() -> list[dict]:
    return validate.h100_data()["rows"]


def by_id(name: str) -> dict:
    return next(r for r in rows() if r["id"] == name)


def test_the_data_file_loads_and_every_row_has_a_source_and_its_configuration():
    data = validate.h100_data()
    assert validate.H100 == resources.VALIDATION / "h100" / "h100_training.yaml"
    sources = data["sources"]
    for key, s in sources.items():
        assert {"url", "file", "commit", "measured", "licence", "hardware"} <= set(s), key
        assert len(s["commit"]) == 40, key
    ids = [r["id"] for r in data["rows"]]
    assert len(ids) == len(set(ids)) >= 30
    for r in data["rows"]:
        missing = [k for k in validate.H100_KEYS if k not in r]
        assert not missing, (r["id"], missing)
        assert r["source"] in sources, r["id"]
        assert r["precision"] in ("bf16", "fp8"), r["id"]
        assert r["tp"] * r["pp"] * r["cp"] * r["dp"] == r["gpus"], r["id"]
        assert r["tokens_per_s_per_gpu"] > 0
        if any(r[k] is None for k in validate.H100_KEYS):
            assert r.get("skip"), f"{r['id']}: a key is not stated, so the row must say why it is skipped"
        if r["micro_batch"]:
            assert r["global_batch"] % (r["dp"] * r["micro_batch"]) == 0, r["id"]
        for k in r.get("assumed", ()):
            assert k in r and r.get("notes"), (r["id"], k)


def test_the_wheel_ships_the_h100_data():
    """Every file of validation/data/h100 matches a package_data pattern of simtrain._validation in setup.py."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and any(k.arg == "package_data" for k in n.keywords))
    patterns = ast.literal_eval(next(k.value for k in call.keywords if k.arg == "package_data"))["simtrain._validation"]
    files = [p.relative_to(ROOT / "validation" / "data").as_posix() for p in (ROOT / "validation" / "data" / "h100").iterdir()]
    assert {"h100/h100_training.yaml", "h100/README.md"} <= set(files)
    for f in files:
        assert any(fnmatch.fnmatch(f, p) for p in patterns), f


def test_measured_step_time_from_tokens_per_second():
    """torchtitan Table 1, FSDP: 16 sequences x 8192 tokens / (5,762 tokens/s/GPU x 8 GPUs) = 2.8434 s."""
    assert validate.h100_measured_s(by_id("tt24-8b-8g-fsdp")) == pytest.approx(131072 / 46096, rel=1e-12)
    assert 131072 / 46096 == pytest.approx(2.8434, abs=1e-4)


def test_summary_statistics_by_hand():
    """Two made-up runs: 8 GPUs, measured 1.0 s, predicted 1.1 s (+10 %); 64 GPUs, measured 2.0 s,
    predicted 1.6 s (-20 %). MAPE (10 + 20) / 2 = 15 %; mean signed error (10 - 20) / 2 = -5 %;
    by scale one row each, the largest count (64) at 20 % / -20 %."""
    runs = [Run("a", 8, 1.0, 1.1, 0.1, 0.0), Run("b", 64, 2.0, 1.6, 0.2, 0.0)]
    assert validate.mape(runs) == pytest.approx(0.15)
    assert validate.mean_signed(runs) == pytest.approx(-0.05)
    scale = validate.by_scale(list(reversed(runs)))
    assert [s.gpus for s in scale] == [8, 64]
    assert scale[-1].mape == pytest.approx(0.2) and scale[-1].mean_signed == pytest.approx(-0.2)
    lines = validate.scale_lines(runs)
    assert lines[-1].startswith("  largest count, 64 GPUs (1 run)") and "-20.00 %" in lines[-1]


def test_the_runner_on_a_cheap_row_and_a_skipped_one():
    runnable, skipped = by_id("tt24-8b-8g-fsdp"), by_id("tt24-8b-8g-fsdp-compile")
    runs, skips = validate.evaluate_h100([runnable, skipped])
    assert [r.name for r in runs] == ["tt24-8b-8g-fsdp"] and runs[0].gpus == 8
    r = runs[0]
    assert r.measured_s == pytest.approx(validate.h100_measured_s(runnable))
    assert r.predicted_s > 0 and r.error == pytest.approx(abs(r.predicted_s - r.measured_s) / r.measured_s)
    assert skips == [validate.Skipped("tt24-8b-8g-fsdp-compile", 8, skipped["skip"])]


def test_the_scenario_is_what_a_user_writes():
    doc = validate.h100_scenario(by_id("mb2511-llama3-70b-64g-fp8"))
    assert doc["cluster"] == {"device": "h100-sxm5-80gb", "topology": "dgx-h100", "nodes": 8, "device_profile": "h100-public"}
    assert doc["training"]["precision"] == "fp8" and doc["training"]["flash_attention"] is True
    assert doc["parallel"]["vpp"] == 5 and doc["parallel"]["schedule"] == "interleaved_1f1b"


def test_a_row_the_scenario_checks_reject_is_reported_skipped_with_the_reason():
    """The 405B row (126 layers) on pp 8 x vpp 8 = 64 model chunks without the embedding and loss
    counted in the split: the layers do not split evenly, and the runner says so."""
    r = {k: v for k, v in by_id("mb2511-llama31-405b-1024g-fp8").items() if not k.startswith("account_for")}
    runs, skips = validate.evaluate_h100([r])
    assert runs == [] and len(skips) == 1 and "rejects" in skips[0].reason and "126" in skips[0].reason


def test_the_405b_row_counts_the_embedding_and_loss_in_its_split():
    """Megatron-Bridge's llama31_405b_pretrain_config sets both account_for_* flags: 126 + 2 = 128
    over 64 stages, 2 layers each and 1 on the first and last."""
    doc = validate.h100_scenario(by_id("mb2511-llama31-405b-1024g-fp8"))
    assert doc["parallel"]["account_for_embedding_in_pipeline_split"] is True
    assert doc["parallel"]["account_for_loss_in_pipeline_split"] is True
    assert doc["parallel"]["tp_comm_overlap"] == "userbuffers"


def test_torchtitan_rows_run_its_eager_kernels_and_op_policy():
    """Without torch.compile torchtitan 9dec370 runs RMSNorm, SwiGLU and the rotary as eager ops
    (the source's eager_fusions) under the op-level checkpointing its 8B config names; a compiled
    row would not take the eager kernels."""
    eager = validate.h100_data()["sources"]["torchtitan-2024-12"]["eager_fusions"]
    assert eager == {"norm": False, "bias_swiglu": False, "rope": False}
    doc = validate.h100_scenario(by_id("tt24-8b-8g-fsdp"), fusions=eager)
    assert doc["training"]["fusions"] == eager and doc["training"]["recompute"] == "op"
    assert "fusions" not in validate.h100_scenario(by_id("tt24-8b-8g-fsdp-compile"), fusions=eager)["training"]


@pytest.mark.slow
def test_validate_h100_command(tmp_path, capsys):
    out = tmp_path / "h100.csv"
    assert main(["validate", "h100", "--table", "--csv", str(out)]) == 0
    text = capsys.readouterr().out
    assert "h100 (development set):" in text and "mean signed error" in text and "largest count" in text
    n_skip = sum(1 for r in rows() if r.get("skip"))
    assert f"skipped {n_skip} rows:" in text
    assert len(out.read_text().splitlines()) == 1 + len(rows()) - n_skip


def test_validate_vtrain_reports_signed_error_and_scale(capsys):
    """The first three multi-node vTrain runs are all on 64 GPUs: one scale line, which is also the largest count."""
    assert main(["validate", "vtrain", "--limit", "3"]) == 0
    text = capsys.readouterr().out
    assert "mean signed error" in text and "largest count, 64 GPUs (3 runs)" in text


def test_torchtitan_rows_run_on_the_part_their_source_names():
    """Both torchtitan files ran on Grand Teton's 96 GB HBM2e H100 (2.4 TB/s): their rows take that
    preset without the DGX H100 profile; Megatron-Bridge's DGX H100 rows keep both. The preset's
    memory bandwidth is the source's, its memory-bound efficiency H100's measured fraction."""
    from simtrain.hardware.devices import get_device
    data = validate.h100_data()
    assert {k: v.get("device") for k, v in data["sources"].items()} == {
        "torchtitan-2024-12": "h100-sxm5-96gb-hbm2e", "torchtitan-asynctp-2025-06": "h100-sxm5-96gb-hbm2e",
        "megatron-bridge-25.11": None}
    d, h = get_device("h100-sxm5-96gb-hbm2e"), get_device("h100-sxm5-80gb")
    assert d.memory_bw == 2.4e12 and d.mem_efficiency == h.mem_efficiency == pytest.approx(2903 / 3350)
    runs, _ = validate.evaluate_h100([by_id("tt24-8b-8g-fsdp")])
    eager = data["sources"]["torchtitan-2024-12"]["eager_fusions"]
    doc = validate.h100_scenario(by_id("tt24-8b-8g-fsdp"), None, eager, "torch", "h100-sxm5-96gb-hbm2e")
    assert doc["cluster"] == {"device": "h100-sxm5-96gb-hbm2e", "topology": "dgx-h100", "nodes": 1}
    # the same row on the 700 W HBM3 preset is faster: the memory-bound kernels see 3.35 TB/s
    from pathlib import Path

    from simtrain.errors import Collector
    from simtrain.simulate import simulate
    from simtrain.spec.loading import build_scenario
    doc["cluster"]["device"] = "h100-sxm5-80gb"
    sc, topo = build_scenario(doc, Path.cwd() / "row.yaml", Collector("row"))
    assert simulate(sc, topo).result.step_time_s < runs[0].predicted_s
