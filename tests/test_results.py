"""The typed step result (simtrain.results.step) and the one memory-fits rule (simtrain.results.memory)."""
from conftest import small_scenario

from simtrain.cli.main import main
from simtrain.results.memory import memory_fit, rank_static, static_memory
from simtrain.results.step import MemoryEntry, StageEntry
from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario
from simtrain.studies.search import memory_bounds
from simtrain.workload.build import build_workload

GiB = 2.0**30


def test_memory_fit_rule_by_hand():
    # every rank's need against its own device: the worst decides, equality fits
    assert memory_fit([(70 * GiB, 80 * GiB), (90 * GiB, 80 * GiB)]).shortfall_bytes == 10 * GiB
    assert not memory_fit([(70 * GiB, 80 * GiB), (90 * GiB, 80 * GiB)]).fits
    assert memory_fit([(80 * GiB, 80 * GiB)]).fits and memory_fit([(80 * GiB, 80 * GiB)]).shortfall_bytes == 0.0
    # mixed devices: 90 GiB fits a 141 GiB device, 70 GiB does not fit a 64 GiB one (6 GiB short)
    f = memory_fit([(90 * GiB, 141 * GiB), (70 * GiB, 64 * GiB)])
    assert not f.fits and f.shortfall_bytes == 6 * GiB
    assert memory_fit([]).fits


def test_static_memory_table_by_hand(tmp_path, plain_topology):
    # bf16: 2 B weights, 4 B fp32 gradients, 12 B optimizer per parameter; ZeRO-1 over dp 4 shards the optimizer
    sc, _ = load_scenario(small_scenario(tmp_path, plain_topology, parallel={"tp": 1, "pp": 1, "dp": 4, "zero_stage": 1}))
    st = static_memory(sc, 1e9)
    assert (st["weights"], st["gradients"], st["optimizer"]) == (2e9, 4e9, 3e9)


def _big(tmp_path, topo, **par):
    # hidden 8192, 8 layers: 8 x 12 x 8192^2 = 6.4e9 parameters; x 18 B (ZeRO 0, bf16) = 116 GB > 80 GiB = 85.9 GB
    # on one rank (tp 1, pp 1); over pp 4 each rank holds 1/4 of it: 29 GB, which fits
    return small_scenario(tmp_path, topo, parallel={"tp": 1, "pp": 1, "dp": 4, **par},
                          model={"architecture": "gpt", "num_layers": 8, "hidden_size": 8192,
                                 "num_attention_heads": 8, "vocab_size": 1024, "seq_length": 128})


def test_check_simulate_and_search_agree_on_what_fits(tmp_path, plain_topology, capsys):
    path = _big(tmp_path, plain_topology)
    sc, topo = load_scenario(path)
    work = build_workload(sc, 1)
    static = rank_static(sc, work, [0]).total
    assert 6.4e9 * 18 < static < 6.5e9 * 18 + 1e9          # the hand count above, plus embeddings and buffers
    r = simulate(sc, topo).result
    assert not r.fits_in_memory and r.memory_shortfall_bytes >= static - 80 * GiB
    assert memory_bounds(sc, topo)[0] > 80 * GiB
    assert main(["check", str(path)]) == 0
    assert "warning: static memory alone exceeds" in capsys.readouterr().out
    ok = _big(tmp_path, plain_topology, pp=4, dp=1)
    sc4, topo4 = load_scenario(ok)
    assert simulate(sc4, topo4).result.fits_in_memory and memory_bounds(sc4, topo4)[0] < 80 * GiB
    assert main(["check", str(ok)]) == 0
    assert "exceeds" not in capsys.readouterr().out


def test_sections_convert_in_field_order_and_leave_out_absent_parts():
    e = StageEntry(class_id=3, stage=1, model_stages=[1], layers=2, ranks=4, representative_rank=8, device="n0/d0",
                   compute_s=1.0, bubble_s=0.5, exposed_comm_s={"tp": 0.1})
    assert list(e.to_dict()) == ["class", "stage", "model_stages", "layers", "ranks", "representative_rank", "device",
                                 "compute_s", "bubble_s", "exposed_comm_s"]
    assert e.class_id == 3 and e.ep_rank is None and "ep_rank" not in e.to_dict()
    e.ep_rank = 0
    assert list(e.to_dict())[:5] == ["class", "stage", "model_stages", "layers", "ep_rank"]
    m = MemoryEntry(stage=0, weights=1.0, gradients=2.0, optimizer=3.0, activations=4.0, communication_buffers=5.0,
                    total=15.0, inflight_peak=1, inflight_microbatches_peak=1.0)
    assert "device" not in m.to_dict() and m.total == 15.0 and m.capacity is None
    assert "capacity" not in m.to_dict()
