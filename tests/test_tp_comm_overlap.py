"""Tensor-parallel communication overlapped with its GEMMs (`parallel.tp_comm_overlap`: Megatron-LM's
--tp-comm-overlap on Transformer Engine's userbuffers).

The layer's TP collectives become `Ring`s: ring exchange (the all-gathers into QKV and fc1, and into
the output projection's and fc2's dgrad: tp pieces, tp - 1 one-hop transfers of one shard, no SMs
held), pipeline (the reduce-scatters after the output projection and fc2: 4 pieces, each piece's
output reduce-scattered, 16 SMs held) and bulk (the re-gather of QKV's and fc1's input beside
their dgrad GEMM, the reduce-scatter of that input gradient beside their wgrad GEMM, 16 SMs held). Expected values: the closed forms derived by hand
in the docstrings below, with GEMMs at a fixed FLOP rate (conftest.FlopCost) and the A100's 108 SMs
(NVIDIA A100 whitepaper)."""
import pytest
import yaml
from conftest import FlopCost, node_topology

from simtrain.errors import ConfigError
from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario
from simtrain.workload.base import UB_COMM_SMS, UB_PIPELINE_SPLITS
from simtrain.workload.build import build_workload
from simtrain.workload.flops import model_flops_per_step
from simtrain.workload.ir import Comm, Op, Ring

H, S, TP = 256, 128, 4
SHARE = (108 - 16) / 108          # A100: 108 SMs, 16 held by the pipelined / bulk overlap's kernels


def scenario(tmp_path, h=H, s=S, **par):
    parallel = {"tp": TP, "pp": 1, "dp": 1, "sequence_parallel": True, "tp_comm_overlap": "userbuffers"}
    parallel.update(par)
    doc = {"name": "ub",
           "model": {"architecture": "gpt", "num_layers": 2, "hidden_size": h, "num_attention_heads": 8,
                     "vocab_size": 1024, "seq_length": s},
           "training": {"micro_batch_size": 1, "global_batch_size": 1, "precision": "bf16"},
           "parallel": parallel,
           "cluster": {"device": "a100-sxm4-80gb", "topology": str(node_topology(tmp_path, TP)), "nodes": 1, "variability": "none"},
           "network": {"nccl_algo": "Ring", "nccl_proto": "Simple"}}
    p = tmp_path / f"ub-{len(list(tmp_path.glob('ub-*.yaml')))}.yaml"
    p.write_text(yaml.safe_dump(doc))
    return load_scenario(p)


def test_closed_forms_of_the_three_modes():
    """ring: c + (n-1)·max(c, x); pipeline: c + (n-1)·max(c, x) + x; bulk: max(c, x); c taken
    over the share of the SMs the compute keeps."""
    seg = (Op("g", "gemm", "F", 1.0, 1.0),)
    x = Comm("tp", "send_recv", 1.0)
    assert Ring(4, seg, x).time(1.0, 2.0) == 1 + 3 * 2
    assert Ring(4, seg, x).time(3.0, 2.0) == 3 + 3 * 3
    assert Ring(4, seg, x, "pipeline").time(2.0, 1.0) == 2 + 3 * 2 + 1
    assert Ring(4, seg, x, "pipeline").time(1.0, 2.0) == 1 + 4 * 2
    assert Ring(1, seg, x, "bulk").time(3.0, 5.0) == 5.0
    assert Ring(1, seg, x, "bulk", 0.5).time(3.0, 5.0) == 6.0
    assert Ring(4, seg, x, "ring").transfers == 3 and Ring(4, seg, x, "pipeline").transfers == 4


def test_layer_items_and_their_pieces(tmp_path):
    """One layer: the four ring exchanges split their GEMM in tp row pieces and move one shard
    (msg / tp, msg = 2·S·H bytes) per hop; the two pipelines split theirs in 4 and reduce-scatter
    msg / 4 per piece; the four bulks keep the dgrad GEMM whole beside the full re-gather of the
    input, and the wgrad GEMM whole beside the full reduce-scatter.
    Every piece's FLOPs add up to the GEMM it came from, so the model FLOPs do not change."""
    sc, _ = scenario(tmp_path)
    off, _ = scenario(tmp_path, tp_comm_overlap="none")
    lp = build_workload(sc, 1)[0].layers[0]
    rings = {it.comm.name: it for it in lp.forward + lp.backward if isinstance(it, Ring)}
    assert sorted(rings) == sorted(["ub_qkv_ag", "ub_proj_rs", "ub_fc1_ag", "ub_fc2_rs",
                                    "ub_proj_dgrad_ag", "ub_qkv_wgrad_rs", "ub_fc2_dgrad_ag", "ub_fc1_wgrad_rs",
                                    "ub_qkv_dgrad_ag", "ub_fc1_dgrad_ag"])
    msg = 2 * S * H
    for name in ("ub_qkv_ag", "ub_fc1_ag", "ub_proj_dgrad_ag", "ub_fc2_dgrad_ag"):
        r = rings[name]
        assert (r.mode, r.steps, r.share, r.comm.collective, r.comm.size_bytes) == ("ring", TP, 1.0, "send_recv", msg / TP)
        assert r.segment[0].shape[0] == S / TP
    for name in ("ub_proj_rs", "ub_fc2_rs"):
        r = rings[name]
        assert (r.mode, r.steps, r.comm.collective, r.comm.size_bytes) == ("pipeline", UB_PIPELINE_SPLITS, "reduce_scatter", msg / 4)
        assert r.share == pytest.approx(SHARE) and UB_COMM_SMS == 16
    for name, g, coll in (("ub_qkv_wgrad_rs", "qkv.wgrad", "reduce_scatter"), ("ub_fc1_wgrad_rs", "fc1.wgrad", "reduce_scatter"),
                          ("ub_qkv_dgrad_ag", "qkv.dgrad", "all_gather"), ("ub_fc1_dgrad_ag", "fc1.dgrad", "all_gather")):
        r = rings[name]
        assert (r.mode, r.steps, r.segment[0].name, r.comm.collective, r.comm.size_bytes) == ("bulk", 1, g, coll, msg)
        assert r.share == pytest.approx(SHARE)
    assert not [it for it in lp.forward + lp.backward if isinstance(it, Comm) and it.kind == "tp"]
    assert model_flops_per_step(sc, build_workload(sc, 1)) == pytest.approx(model_flops_per_step(off, build_workload(off, 1)))


def test_deferred_weight_gradients_leave_the_bulk_collective_in_b(tmp_path):
    """A zero-bubble schedule defers W: the bulk reduce-scatter stays in B as a plain collective,
    its wgrad GEMM goes to W with the others."""
    sc, _ = scenario(tmp_path)
    lp = build_workload(sc, 1)[0].layers[0]
    b_comms = [it.name for it in lp.backward_input if isinstance(it, Comm)]
    assert b_comms == ["ub_fc1_wgrad_rs", "ub_qkv_wgrad_rs"]
    w = [o.name for seg in lp.backward_weight for o in seg]
    assert {"qkv.wgrad", "fc1.wgrad", "attn_out.wgrad", "fc2.wgrad"} <= set(w)


@pytest.mark.parametrize("method", ["userbuffers", "async_tp"])
def test_the_engine_runs_the_closed_forms(tmp_path, method):
    """Unfolded (fuse=False), every piece and transfer is its own op, and the engine's timeline
    realises each Ring's closed form: from its first piece's start to the end of its last op.
    Folded (the default: the tp group is one rank class), each Ring is one op of the closed form,
    so the step time is the same."""
    sc, topo = scenario(tmp_path, tp_comm_overlap=method)
    cost = FlopCost()
    run = simulate(sc, topo, cost, fuse=False)
    tl = run.timeline
    lp = build_workload(sc, 1)[0].layers[0]
    rings = [it for it in lp.forward if isinstance(it, Ring)]
    by_label = {}
    for o in run.ops:
        if o.cls == run.ops[0].cls:
            by_label.setdefault(o.label, []).append(o)
    checked = 0
    for r in rings:
        pieces = [o for o in run.ops if o.cls == run.ops[0].cls and o.stream == "compute"
                  and o.label.startswith("F0:") and f":{r.mode}0:" in o.label and r.segment[0].name in o.label]
        xs = [o for o in run.ops if o.cls == run.ops[0].cls and o.label == f"{r.comm.collective}:{r.comm.name}"]
        first = pieces[0]
        c = r.segment[0].flops / cost.P
        assert first.duration == pytest.approx(c / r.share)
        x = xs[0].duration
        layer_xs = xs[:r.transfers]
        end = max(tl.end[o.id] for o in layer_xs)
        if r.mode == "ring":
            # the last piece waits for the last transfer: find it as the compute op after it
            last_piece = next(o for o in run.ops if o.stream == "compute" and o.deps == [layer_xs[-1].id])
            end = tl.end[last_piece.id]
        assert end - tl.start[first.id] == pytest.approx(r.time(c, x), rel=1e-9)
        checked += 1
    assert checked == 4
    folded = simulate(sc, topo, cost)
    assert folded.result.step_time_s == pytest.approx(run.result.step_time_s, rel=1e-12)
    assert len(folded.ops) < len(run.ops)


def test_overlap_hides_tensor_parallel_time(tmp_path):
    """h 2048, 2048 tokens (8 MiB per TP collective), GEMMs at 200 TFLOP/s on a 100 GB/s switch:
    the overlap leaves less TP communication exposed and a shorter step, and gives up SM time on
    the pipelined and bulk GEMMs (compute grows). At h 256 and 128 tokens the same overlap loses:
    each of the tp - 1 hops pays the link latency where one all-gather paid it once."""
    on_sc, topo = scenario(tmp_path, 2048, 2048)
    off_sc, _ = scenario(tmp_path, 2048, 2048, tp_comm_overlap="none")
    on, off = simulate(on_sc, topo, FlopCost(2e14)).result, simulate(off_sc, topo, FlopCost(2e14)).result
    assert on.breakdown.exposed_comm_s["tp"] < off.breakdown.exposed_comm_s["tp"]
    assert on.breakdown.compute_s > off.breakdown.compute_s
    assert on.step_time_s < off.step_time_s
    small_on, small_off = (simulate(*scenario(tmp_path, tp_comm_overlap=v), FlopCost(1e13)).result for v in ("userbuffers", "none"))
    assert small_on.breakdown.exposed_comm_s["tp"] > small_off.breakdown.exposed_comm_s["tp"]


@pytest.mark.parametrize("par,device,words", [
    ({"sequence_parallel": False}, "a100-sxm4-80gb", "needs sequence parallelism"),
    ({}, "h20-96gb", "no published SM count"),
])
def test_refused_where_megatron_or_the_device_cannot(tmp_path, par, device, words):
    parallel = {"tp": TP, "pp": 1, "dp": 1, "sequence_parallel": True, "tp_comm_overlap": "userbuffers", **par}
    doc = {"name": "ub", "model": {"architecture": "gpt", "num_layers": 2, "hidden_size": H, "num_attention_heads": 8,
                                   "vocab_size": 1024, "seq_length": S},
           "training": {"micro_batch_size": 1, "global_batch_size": 1},
           "parallel": parallel, "cluster": {"device": device, "topology": str(node_topology(tmp_path, TP)), "nodes": 1}}
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as e:
        load_scenario(p)
    (prob,) = [x for x in e.value.problems if x.path == "parallel.tp_comm_overlap"]
    assert words in prob.problem


def test_chakra_export_refuses_the_ring_exchange(tmp_path, capsys):
    """Chakra has no collective type for one hop of a ring exchange: one error, nothing written."""
    pytest.importorskip("chakra")
    from simtrain.cli.main import main
    scenario(tmp_path)
    assert main(["export", "chakra", str(tmp_path / "ub-0.yaml"), "-o", str(tmp_path / "et")]) == 2
    assert "tp_comm_overlap=none" in capsys.readouterr().err
    assert not (tmp_path / "et").exists()


def test_async_tp_decomposes_every_tp_collective(tmp_path):
    """PyTorch async TP: all eight collectives of a layer (forward and backward) are rings of tp
    pieces with tp - 1 copy-engine transfers of one shard, and the GEMMs keep every SM. The
    wgrad GEMMs run on their own after the input gradient's ring."""
    sc, _ = scenario(tmp_path, tp_comm_overlap="async_tp")
    lp = build_workload(sc, 1)[0].layers[0]
    rings = [it for it in lp.forward + lp.backward if isinstance(it, Ring)]
    assert sorted(r.comm.name for r in rings) == sorted(["atp_qkv_ag", "atp_proj_rs", "atp_fc1_ag", "atp_fc2_rs",
                                                        "atp_proj_dgrad_ag", "atp_qkv_dgrad_rs", "atp_fc2_dgrad_ag",
                                                        "atp_fc1_dgrad_rs"])
    assert {(r.mode, r.steps, r.share, r.comm.collective, r.comm.size_bytes) for r in rings} == {
        ("ring", TP, 1.0, "send_recv", 2 * S * H / TP)}
    assert not [it for it in lp.backward if isinstance(it, Comm)]


def test_async_tp_needs_no_sm_count(tmp_path):
    """The H20 has no published SM count: userbuffers is refused there (above), async TP is not."""
    doc = yaml.safe_load((scenario(tmp_path) and (tmp_path / "ub-0.yaml")).read_text())
    doc["cluster"]["device"] = "h20-96gb"
    doc["parallel"]["tp_comm_overlap"] = "async_tp"
    p = tmp_path / "h20.yaml"
    p.write_text(yaml.safe_dump(doc))
    sc, _ = load_scenario(p)
    assert sc.parallel.tp_comm_overlap == "async_tp"


def test_run_header_names_the_overlap(tmp_path, capsys):
    """The run summary's second line says which tensor-parallel overlap the step used; without one
    it says nothing."""
    from simtrain.cli.main import main
    scenario(tmp_path)
    scenario(tmp_path, tp_comm_overlap="none")
    assert main(["run", str(tmp_path / "ub-0.yaml")]) == 0
    assert capsys.readouterr().out.splitlines()[1].endswith(", tp overlap userbuffers")
    assert main(["run", str(tmp_path / "ub-1.yaml")]) == 0
    assert "tp overlap" not in capsys.readouterr().out


class HostFlopCost(FlopCost):
    """FlopCost with a host issue cost of c per operator (the device profile's op_overhead):
    a sequence of operators takes the host queue of their device times (`roofline.host_queue`)."""

    def __init__(self, c: float):
        super().__init__()
        self.c = c

    def device_time(self, op):
        return op.flops / self.P

    def sequence_time(self, ops):
        from simtrain.cost.roofline import host_queue
        return host_queue([self.device_time(o) for o in ops], self.c)


def test_a_userbuffers_overlap_pays_the_host_cost_once():
    """Transformer Engine launches every piece of a userbuffers overlap from one framework call, so
    a profile's per-operator host cost c is paid once per overlapped GEMM, not once per piece:
    4 pieces of 1 ms with c = 0.1 ms are 1 ms each plus 0.1 ms once. Ring attention (cp) issues
    each piece from Python and keeps c per piece (1.1 ms)."""
    from types import SimpleNamespace

    from simtrain.program.lowering import Lowering
    cost = HostFlopCost(1e-4)
    seg = (Op("qkv/ring", "gemm", "F", 1e12, 1.0),)         # 1e12 FLOPs at 1e15 FLOP/s: 1 ms
    fake = SimpleNamespace(seg_time=lambda s, c: (c.sequence_time(s), "qkv/ring"))
    ub = Ring(4, seg, Comm("tp", "send_recv", 1.0, "ub_qkv_ag"))
    piece, _, host = Lowering.ring_piece_time(fake, ub, cost)
    assert (piece, host) == (pytest.approx(1e-3), pytest.approx(1e-4))
    cp = Ring(4, seg, Comm("cp", "send_recv", 1.0, "cp_kv"))
    piece, _, host = Lowering.ring_piece_time(fake, cp, cost)
    assert (piece, host) == (pytest.approx(1.1e-3), 0.0)


def test_userbuffers_step_with_a_host_cost(tmp_path):
    """End to end on the small GPT: with a host cost the userbuffers step grows by less than
    c per ring piece would make it (each of a layer's four ring exchanges has tp = 4 pieces, each
    pipelined GEMM 4), and the folded and unfolded runs agree."""
    sc, topo = scenario(tmp_path)
    free, host = HostFlopCost(0.0), HostFlopCost(1e-5)
    base = simulate(sc, topo, free).result.step_time_s
    folded = simulate(sc, topo, host).result.step_time_s
    unfolded = simulate(sc, topo, host, fuse=False).result.step_time_s
    assert folded == pytest.approx(unfolded, rel=1e-9)
    pieces = 2 * 2 * (4 * TP + 2 * UB_PIPELINE_SPLITS)     # 2 layers, forward and backward
    assert folded - base < pieces * 1e-5


def _rings(sc):
    lp = build_workload(sc, 1)[0].layers[0]
    return {it.comm.name: it for it in (*lp.forward, *lp.backward) if isinstance(it, Ring)}


def test_per_gemm_settings_shape_the_overlaps(tmp_path):
    """parallel.tp_comm_overlap_cfg (TE's per-GEMM userbuffers settings): defaults are TE's
    initialize_ub ones (proj / fc2 forward pipelined in 4 on 108 - 16 SMs, the bulks on 108 - 16);
    proj_fprop with 2 splits and 24 SMs keeps (108 - 24) / 108 of the A100 in 2 pieces; fc2_fprop as
    a ring exchange runs tp pieces on copy engines (every SM); qkv_dgrad with 4 SMs keeps
    (108 - 4) / 108 beside the re-gather."""
    base = _rings(scenario(tmp_path)[0])
    assert (base["ub_proj_rs"].mode, base["ub_proj_rs"].steps) == ("pipeline", UB_PIPELINE_SPLITS)
    assert base["ub_proj_rs"].share == pytest.approx(SHARE) and base["ub_qkv_dgrad_ag"].share == pytest.approx(SHARE)
    cfg = {"proj_fprop": {"num_splits": 2, "num_sm": 24}, "fc2_fprop": {"method": "ring_exchange"},
           "qkv_dgrad": {"num_sm": 4}}
    r = _rings(scenario(tmp_path, tp_comm_overlap_cfg=cfg)[0])
    assert (r["ub_proj_rs"].mode, r["ub_proj_rs"].steps) == ("pipeline", 2)
    assert r["ub_proj_rs"].share == pytest.approx((108 - 24) / 108)
    assert r["ub_proj_rs"].comm.size_bytes == pytest.approx(base["ub_proj_rs"].comm.size_bytes * UB_PIPELINE_SPLITS / 2)
    assert (r["ub_fc2_rs"].mode, r["ub_fc2_rs"].steps, r["ub_fc2_rs"].share) == ("ring", TP, 1.0)
    assert r["ub_fc2_rs"].comm.collective == "send_recv"
    assert r["ub_qkv_dgrad_ag"].share == pytest.approx((108 - 4) / 108)
    assert r["ub_fc1_dgrad_ag"].share == pytest.approx(SHARE)          # not named: TE's default


@pytest.mark.parametrize("cfg,needle", [
    ({"qkv_fprop": {"method": "bulk"}}, "qkv_fprop does not run as bulk"),
    ({"fc1_wgrad": {"method": "pipeline"}}, "fc1_wgrad does not run as pipeline"),
    ({"qkv_dgrad": {"num_splits": 2}}, "applies to a pipelined overlap"),
    ({"fc3_fprop": {"method": "bulk"}}, "unknown key"),
])
def test_per_gemm_settings_are_checked(tmp_path, cfg, needle):
    with pytest.raises(ConfigError, match="parallel.tp_comm_overlap_cfg") as e:
        scenario(tmp_path, tp_comm_overlap_cfg=cfg)
    assert needle in str(e.value)


def test_per_gemm_settings_without_userbuffers_warn(tmp_path):
    with pytest.warns(UserWarning, match="tp_comm_overlap_cfg applies only with parallel.tp_comm_overlap: userbuffers"):
        scenario(tmp_path, tp_comm_overlap="async_tp", tp_comm_overlap_cfg={"qkv_dgrad": {"num_sm": 4}})


def test_megatron_reads_the_userbuffers_yaml(tmp_path):
    """--tp-comm-overlap-cfg names TE's userbuffers YAML; its method / num_sm / num_splits become
    parallel.tp_comm_overlap_cfg, the keys simtrain does not time are named in a warning, and a
    file that is not there leaves TE's defaults with a warning."""
    from simtrain.errors import Collector
    from simtrain.imports import megatron
    from simtrain.imports.common import Options
    (tmp_path / "ub.yaml").write_text("proj_fprop: {method: ring_exchange, num_sm: 1, set_sm_margin: 1}\n"
                                      "qkv_dgrad: {method: bulk, num_sm: 4, cga_size: 2}\n")
    script = tmp_path / "run.sh"
    args = ("torchrun --nnodes 1 --nproc-per-node 4 pretrain_gpt.py --num-layers 2 --hidden-size 256 "
            "--num-attention-heads 8 --seq-length 128 --vocab-size 1024 --bf16 --tensor-model-parallel-size 4 "
            "--sequence-parallel --tp-comm-overlap --tp-comm-overlap-cfg ub.yaml --micro-batch-size 1 --global-batch-size 1")
    script.write_text(args + "\n")
    errs = Collector(str(script))
    with pytest.warns(UserWarning, match="cga_size, set_sm_margin are not timed"):
        tree = megatron.to_tree(str(script), args, Options(world_size=4, topology="dgx-h100", device="h100-sxm5-80gb"),
                                errs, tmp_path)
    assert tree["parallel"]["tp_comm_overlap_cfg"] == {"proj_fprop": {"method": "ring_exchange", "num_sm": 1},
                                                       "qkv_dgrad": {"method": "bulk", "num_sm": 4}}
    with pytest.warns(UserWarning, match="no such file here"):
        tree = megatron.to_tree(str(tmp_path / "elsewhere" / "run.sh"), args.replace("ub.yaml", "missing.yaml"),
                                Options(world_size=4, topology="dgx-h100", device="h100-sxm5-80gb"), Collector("x"), tmp_path)
    assert "tp_comm_overlap_cfg" not in tree["parallel"]


def test_per_gemm_sms_must_leave_the_gemm_some(tmp_path):
    """The A100 has 108 SMs: a bulk overlap holding 108 would leave its GEMM none (a share of 0),
    so it is refused; 107 is the most."""
    with pytest.raises(ConfigError, match="108 SMs for the communication kernels leave fc1_dgrad's GEMM none") as e:
        scenario(tmp_path, tp_comm_overlap_cfg={"fc1_dgrad": {"num_sm": 108}})
    assert "use fewer than 108" in str(e.value)
    r = _rings(scenario(tmp_path, tp_comm_overlap_cfg={"fc1_dgrad": {"num_sm": 107}})[0])
    assert r["ub_fc1_dgrad_ag"].share == pytest.approx(1 / 108)
    # a count beyond any device's is refused by the key's range with the device's rule as its fix,
    # not a bound that a second try would meet the device rule under
    with pytest.raises(ConfigError, match="9999 is out of range; use fewer than the device's SMs"):
        scenario(tmp_path, tp_comm_overlap_cfg={"fc1_dgrad": {"num_sm": 9999}})


def test_a_bad_entry_of_the_userbuffers_yaml_is_reported_at_that_file(tmp_path):
    from simtrain.errors import Collector
    from simtrain.imports import megatron
    from simtrain.imports.common import Options
    (tmp_path / "ub.yaml").write_text("qkv_fprop: {method: bulk}\nqkv_dgrad: {num_splits: 2}\n")
    args = ("torchrun --nnodes 1 --nproc-per-node 4 pretrain_gpt.py --num-layers 2 --hidden-size 256 "
            "--num-attention-heads 8 --seq-length 128 --vocab-size 1024 --bf16 --tensor-model-parallel-size 4 "
            "--sequence-parallel --tp-comm-overlap --tp-comm-overlap-cfg ub.yaml --micro-batch-size 1 --global-batch-size 1")
    errs = Collector(str(tmp_path / "run.sh"))
    megatron.to_tree(str(tmp_path / "run.sh"), args, Options(world_size=4, topology="dgx-h100", device="h100-sxm5-80gb"),
                     errs, tmp_path)
    msgs = [f"{p.path}: {p.problem}; {p.fix}" for p in errs.problems]
    assert any(m.startswith(f"--tp-comm-overlap-cfg: {tmp_path / 'ub.yaml'}: qkv_fprop.method: qkv_fprop does not run as bulk")
               for m in msgs)
    assert any("qkv_dgrad.num_splits: applies to a pipelined overlap" in m and m.endswith("remove num_splits") for m in msgs)
