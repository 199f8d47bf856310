"""Validation against measured data kept in the project (validation/data; sources and licences in
the README beside each set).

vTrain (MICRO'24 artifact, MIT): 109 Megatron-DeepSpeed runs on 64-512 A100s and 1,440 single-node
runs. The full runs are slow (about a minute): `python -m pytest -m slow`. Tolerances: the target
for the multi-node set, a MAPE of at most 8 % with the shipped A100 profile (vTrain's own
published MAPE on this set is 14.73 %); and, as a floor that catches regressions of the compute
side, the single-node set under 10 %. The figures the README reports, 7.24 % and 9.68 %, are
pinned too: a change that moves them must update the README with them."""
import csv

import pytest

from simtrain import resources
from simtrain.cli.main import main
from simtrain.studies import validate

slow = pytest.mark.slow


def test_the_validation_data_is_in_the_project_with_its_licence():
    assert validate.VTRAIN == resources.VALIDATION / "vtrain"
    assert "Permission is hereby granted, free of charge" in (validate.VTRAIN / "LICENSE").read_text()
    for name, n in validate.VTRAIN_RUNS.items():
        assert sum(1 for _ in validate.vtrain_rows(name)) == n
    assert validate.NCCL_TESTS.is_file() and (validate.NCCL_TESTS.parent / "README.md").is_file()
    assert {e["id"] for e, _ in validate.sweeps()} >= {"nccl_vp_h100_1node_allreduce", "nccl_azure_ndh200v5_allreduce"}


def test_validate_vtrain_command(tmp_path, capsys):
    out = tmp_path / "runs.csv"
    assert main(["validate", "vtrain", "--limit", "3", "--table", "--csv", str(out)]) == 0
    text = capsys.readouterr().out
    assert "vtrain-64g-h3072-l30-t1d64p1-mb8" in text and "multi: 3 runs, MAPE" in text
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 3 and rows[0]["set"] == "multi" and float(rows[0]["measured_s"]) == pytest.approx(3.5665)


def test_validate_busbw_command(capsys):
    assert main(["validate", "busbw"]) == 0
    text = capsys.readouterr().out
    summary = text.split("summary, sizes from 1 MiB up")[1]
    for e, tname in validate.sweeps():
        assert e["id"] in summary and tname in summary
    assert "nccl_vp_h100_1node_allreduce       dgx-h100        14 of 14" in summary


def test_validate_busbw_fit_rejects_an_unknown_key(capsys):
    assert main(["validate", "busbw", "--fit", "bandwidth", "nccl_vp_h100_1node_allreduce"]) == 2
    assert "one or two keys" in capsys.readouterr().err


@slow
def test_multi_node_mape_meets_the_target():
    res = validate.evaluate_vtrain("multi")
    assert len(res) == 109
    m = validate.mape(res)
    assert m <= 0.08
    assert round(100 * m, 2) == 7.24


@slow
def test_single_node_mape_holds():
    res = validate.evaluate_vtrain("single")
    assert len(res) == 1440
    m = validate.mape(res)
    assert m < 0.10
    assert round(100 * m, 2) == 9.68
