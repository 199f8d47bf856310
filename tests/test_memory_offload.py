"""CPU offload of the optimizer state (training.optimizer_offload: cpu, ZeRO-Offload, Ren et al.,
USENIX ATC'21): no optimizer bytes on the device, and the step's optimizer op becomes the copy of
the local gradients to the host (4 B per parameter, fp32 for bf16 training) and of the updated
16-bit weights back (2 B) over the preset's host link (A100 80GB: 26.28 GB/s, nvbandwidth)."""
import pytest
from conftest import small_scenario

from simtrain.cost.roofline import CalibratedRoofline
from simtrain.errors import ConfigError
from simtrain.hardware.devices import get_device
from simtrain.program.optimizer import OPT_BYTES_PER_PARAM
from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario
from simtrain.workload.build import build_workload


def _run(tmp_path, topo, offload):
    path = small_scenario(tmp_path, topo, parallel={"pp": 1, "dp": 4}, training={"optimizer_offload": offload})
    sc, t = load_scenario(path)
    return sc, simulate(sc, t).result


def test_offload_moves_the_optimizer_state_and_times_the_host_copies(tmp_path, plain_topology):
    sc, none = _run(tmp_path, plain_topology, "none")
    _, cpu = _run(tmp_path, plain_topology, "cpu")
    params = sum(w.params for w in build_workload(sc))
    assert none.memory[0].optimizer == pytest.approx(12 * params)       # fp32 master + 2 moments, no ZeRO
    assert cpu.memory[0].optimizer == 0.0
    assert cpu.memory[0].weights == none.memory[0].weights and cpu.memory[0].gradients == none.memory[0].gradients
    dev = get_device("a100-sxm4-80gb")
    on_device = CalibratedRoofline(dev, "bf16").memory_time(OPT_BYTES_PER_PARAM * params)
    copies = (4 + 2) * params / dev.host_bandwidth
    assert dev.host_bandwidth == 26.28e9
    # the optimizer step ends the step (no ZeRO re-gather after it): the difference is the op's
    assert cpu.step_time_s - none.step_time_s == pytest.approx(copies - on_device, rel=1e-6)


def test_offload_needs_a_host_link(tmp_path, plain_topology, monkeypatch):
    import simtrain.hardware.devices as devices
    real = devices.get_device

    def no_link(name):
        d = real(name)
        return type(d)(**{**d.__dict__, "host_bandwidth": 0.0}) if hasattr(d, "__dict__") else d
    monkeypatch.setattr(devices, "get_device", no_link)
    path = small_scenario(tmp_path, plain_topology, training={"optimizer_offload": "cpu"})
    with pytest.raises(ConfigError, match="training.optimizer_offload: a100-sxm4-80gb has no host-link bandwidth"):
        load_scenario(path)
