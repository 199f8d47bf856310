"""FP8 training as Transformer Engine runs it (`training.precision: fp8`, `training.fp8_recipe`).

Expected values are derived by hand from the byte counts of the quantize kernels (simtrain/
workload/fp8.py's docstring): a cast-transpose reads 2 bytes and writes 1 + 1 per element; current
scaling adds an amax read of 2; the block recipes write a scale per block in each layout (fp32 per
128 values, or one byte per 32); a norm fused with its linear under delayed scaling leaves only the
transpose (read 1, write 1). The weight cast is paid once per step, spread over its microbatches."""
import pytest
import yaml
from conftest import node_topology

from simtrain.cli.main import main
from simtrain.cost.roofline import CalibratedRoofline
from simtrain.hardware.devices import gemm_class, get_device
from simtrain.network.collectives import choose
from simtrain.plan.grid import group_shape
from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario
from simtrain.workload import fp8
from simtrain.workload.build import build_workload
from simtrain.workload.ir import Comm, Op, Ring
from simtrain.workload.transformer import LayerBuilder

H, F, S, A, G, V = 256, 512, 128, 8, 2, 1024
D = H // A


def scenario(tmp_path, precision="fp8", recipe=None, tp=1, device="h100-sxm5-80gb", gb=4, arch="llama", **par):
    training = {"micro_batch_size": 1, "global_batch_size": gb, "precision": precision}
    if recipe:
        training["fp8_recipe"] = recipe
    parallel = {"tp": tp, "pp": 1, "dp": 1, "sequence_parallel": tp > 1, **par}
    doc = {"name": "fp8",
           "model": {"architecture": arch, "num_layers": 2, "hidden_size": H, "num_attention_heads": A,
                     "num_key_value_heads": G, "ffn_hidden_size": F, "vocab_size": V, "seq_length": S},
           "training": training, "parallel": parallel,
           "cluster": {"device": device, "topology": str(node_topology(tmp_path, tp)), "nodes": 1}}
    p = tmp_path / f"fp8-{len(list(tmp_path.glob('fp8-*.yaml')))}.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def ops(items):
    for it in items:
        if isinstance(it, tuple):
            yield from it
        elif isinstance(it, Ring):
            yield from it.segment


def test_kernel_bytes_per_recipe():
    """Per element of the quantized tensor: delayed 2 + 1 + 1 = 4 in one kernel; current an amax
    read of 2, then the same cast: 6 in two kernels; blockwise 2 + 2·(1 + 4/128); mxfp8
    2 + 2·(1 + 1/32); a norm-fed input under delayed scaling the transpose alone, 1 + 1."""
    n = 1000.0
    got = {r: [o.bytes / n for o in fp8.quantize_ops(r, "x", n, "F")] for r in fp8.RECIPES if r not in fp8.TORCHAO}
    assert got == {"delayed": [4.0], "current": [2.0, 4.0], "blockwise": [2 + 2 * (1 + 4 / 128)],
                   "mxfp8": [2 + 2 * (1 + 1 / 32)]}
    assert [o.bytes / n for o in fp8.quantize_ops("delayed", "x", n, "F", norm_fused=True)] == [2.0]
    # only delayed scaling lets the norm write FP8 itself: current needs the amax first
    assert [o.bytes / n for o in fp8.quantize_ops("current", "x", n, "F", norm_fused=True)] == [2.0, 4.0]
    # a shard of 1/4 quantized rowwise (read 2, write 1; current: amax 2 first), then the gathered
    # rows transposed (read 1, write 1); the block recipes quantize both layouts on the shard
    assert [o.bytes / n for o in fp8.quantize_ops("delayed", "x", n, "F", shards=4)] == [3 / 4, 2.0]
    assert [o.bytes / n for o in fp8.quantize_ops("current", "x", n, "F", shards=4)] == [2 / 4, 3 / 4, 2.0]
    assert [o.bytes / n for o in fp8.quantize_ops("delayed", "x", n, "F", norm_fused=True, shards=4)] == [2.0]
    assert [o.bytes / n for o in fp8.quantize_ops("mxfp8", "x", n, "F", shards=4)] == [(2 + 2 * (1 + 1 / 32)) / 4]
    # an all-gather in FP8: the rows (1 byte of 2), or both block-scaled layouts with their scales
    assert (fp8.gather_factor("delayed"), fp8.gather_factor("current")) == (0.5, 0.5)
    assert fp8.gather_factor("mxfp8") == (1 + 1 / 32) and fp8.gather_factor("blockwise") == (1 + 4 / 128)


def test_which_gemms_run_in_fp8(tmp_path):
    """TE's linears (QKV, output projection, gate-up, down) are FP8 with FP8 operands (1 byte) and
    a 16-bit output: bytes m·k + k·n + 2·m·n; the LM head stays bf16 at 2·(m·k + k·n + m·n)."""
    sc, _ = load_scenario(scenario(tmp_path))
    st = build_workload(sc, 1)[0]
    layer = {o.name: o for o in ops(st.layers[0].forward + st.layers[0].backward) if o.kind == "gemm"}
    for name in ("qkv", "attn_out", "fc1_gate_up", "fc2", "qkv.dgrad", "fc2.wgrad"):
        assert layer[name].dtype == "fp8", name
    m, n, k = layer["fc2"].shape
    assert (m, n, k) == (S, H, F)
    assert layer["fc2"].bytes == m * k + k * n + 2 * m * n
    head = [o for o in ops(st.post.forward + st.post.backward) if o.kind == "gemm"]
    assert head and all(o.dtype == "bf16" for o in head)
    m, n, k = head[0].shape
    assert head[0].bytes == 2 * (m * k + k * n + m * n)
    bf, _ = load_scenario(scenario(tmp_path, precision="bf16"))
    assert {o.dtype for o in ops(build_workload(bf, 1)[0].layers[0].forward) if o.kind == "gemm"} == {""}


@pytest.mark.parametrize("recipe", fp8.RECIPES[:3])
def test_quantize_bytes_of_one_layer(tmp_path, recipe):
    """A dense Llama layer at tp 1, T = S tokens, M = 4 microbatches, per element q bytes (4 for
    delayed, 6 for current, 4.0625 for blockwise), n bytes for a norm-fed input (2 under delayed
    scaling, else q):
      forward   QKV input T·H (norm-fed), attention output T·H, gate-up input T·H (norm-fed),
                down input T·F; weights (H·(A+2G)·D + H·H + 2F·H + H·F) / M at q
      backward  output gradients of QKV T·(A+2G)·D, attention output T·H, gate-up T·2F, down T·H at q
    """
    sc, _ = load_scenario(scenario(tmp_path, recipe=recipe))
    lp = build_workload(sc, 1)[0].layers[0]
    q = {"delayed": 4.0, "current": 6.0, "blockwise": 2 + 2 * (1 + 4 / 128)}[recipe]
    n = 2.0 if recipe == "delayed" else q
    M, T, qkv_n = sc.num_microbatches, S, (A + 2 * G) * D
    assert M == 4
    fwd = n * T * H + q * T * H + n * T * H + q * T * F + q * (H * qkv_n + H * H + 2 * F * H + H * F) / M
    bwd = q * (T * qkv_n + T * H + T * 2 * F + T * H)
    cast = lambda items: sum(o.bytes for o in ops(items) if ".quantize_" in o.name)  # noqa: E731
    assert cast(lp.forward) == pytest.approx(fwd)
    assert cast(lp.backward) == pytest.approx(bwd)
    assert not [o for o in ops(lp.backward_weight) if ".quantize_" in o.name]   # wgrad reads the columnwise copies


def test_torchao_casts_every_operand_for_every_gemm(tmp_path):
    """torchao float8 (torchtitan) keeps the 16-bit input and weight and casts each GEMM's operands
    itself, amax (read 2) then cast (read 2, write 1): 5 bytes per element of each operand of each
    of the three GEMMs of a linear (x: T x k, W: n x k, dY: T x n):
      forward x and W, input gradient dY and W, weight gradient dY and x
    = 5·(2·T·k + 2·n·k + 2·T·n) per linear, summed over QKV (n = Q, k = H), the output projection
    (n = H, k = A·D), gate-up (n = 2F, k = H) and down (n = H, k = F), at tp 1; and it keeps
    16-bit activations, as a bf16 run does."""
    sc, _ = load_scenario(scenario(tmp_path, recipe="torchao_tensorwise"))
    lp = build_workload(sc, 1)[0].layers[0]
    T, Q = S, (A + 2 * G) * D
    want = sum(5 * (2 * T * k + 2 * n * k + 2 * T * n) for n, k in ((Q, H), (H, A * D), (2 * F, H), (H, F)))
    got = sum(o.bytes for o in ops(lp.forward + lp.backward) if ".quantize_" in o.name)
    assert got == pytest.approx(want)
    w = sum(o.bytes for o in ops(lp.backward_weight) if ".quantize_" in o.name)
    assert w == pytest.approx(sum(5 * (T * k + T * n) for n, k in ((Q, H), (H, A * D), (2 * F, H), (H, F))))
    bf = LayerBuilder(load_scenario(scenario(tmp_path, precision="bf16"))[0]).act_per_layer("none")
    assert LayerBuilder(sc).act_per_layer("none") == bf


def test_sequence_parallel_inputs_are_quantized_on_their_shards(tmp_path):
    """tp 4 with sequence parallelism, delayed scaling, T = S tokens, M = 4 microbatches. A gathered
    input (QKV's and gate-up's, from a norm: its FP8 rows come out of the norm) or output gradient
    (the output projection's and down's) is quantized on the rank's T/4 rows (rowwise: read 2,
    write 1), gathered in FP8, and its gathered rows transposed (read 1, write 1 on T rows):
      forward   QKV 2·T·H; attention output 4·T·(H/4); gate-up 2·T·H; down input 4·T·(F/4);
                weights 4·(H·Q/4 + H·H/4 + 2F·H/4 + H·F/4) / M, Q = (A + 2G)·D
      backward  QKV 4·T·Q/4; output projection 3·T·H/4 + 2·T·H; gate-up 4·T·2F/4; down 3·T·H/4 + 2·T·H
    and every sequence-parallel all-gather moves T·H bytes instead of 2·T·H."""
    sc, _ = load_scenario(scenario(tmp_path, tp=4))
    lp = build_workload(sc, 1)[0].layers[0]
    T, M, Q = S, 4, (A + 2 * G) * D
    fwd = 2 * T * H + 4 * T * H / 4 + 2 * T * H + 4 * T * F / 4 + 4 * (H * Q / 4 + H * H / 4 + 2 * F * H / 4 + H * F / 4) / M
    bwd = 4 * T * Q / 4 + (3 * T * H / 4 + 2 * T * H) + 4 * T * 2 * F / 4 + (3 * T * H / 4 + 2 * T * H)
    cast = lambda items: sum(o.bytes for o in ops(items) if ".quantize_" in o.name)  # noqa: E731
    assert cast(lp.forward) == pytest.approx(fwd)
    assert cast(lp.backward) == pytest.approx(bwd)
    gathers = {c.name: c.size_bytes for c in lp.forward + lp.backward if isinstance(c, Comm) and c.collective == "all_gather"}
    assert gathers == {n: T * H for n in ("tp_all_gather0", "tp_all_gather1", "tp_all_gather2", "tp_all_gather3")}
    bf, _ = load_scenario(scenario(tmp_path, tp=4, precision="bf16"))
    lb = build_workload(bf, 1)[0].layers[0]
    assert {c.size_bytes for c in lb.forward + lb.backward if isinstance(c, Comm) and c.collective == "all_gather"} == {2 * T * H}


def test_pieces_of_an_overlapped_gemm_are_quantized_once(tmp_path):
    """With async TP the GEMMs run in tp pieces; the quantize kernels come once, for the whole
    GEMM, in a segment before its Ring: the same bytes as without the overlap."""
    plain, _ = load_scenario(scenario(tmp_path, tp=4))
    atp, _ = load_scenario(scenario(tmp_path, tp=4, tp_comm_overlap="async_tp"))
    cast = lambda sc: sum(o.bytes for o in ops(build_workload(sc, 1)[0].layers[0].forward)  # noqa: E731
                          if ".quantize_" in o.name)
    assert cast(atp) == pytest.approx(cast(plain)) and cast(plain) > 0
    lp = build_workload(atp, 1)[0].layers[0]
    for i, it in enumerate(lp.forward):
        if isinstance(it, Ring) and it.comm.name == "atp_qkv_ag":
            before = lp.forward[i - 1]
            # the segment before the ring: the norm, then the two quantize kernels of QKV
            assert isinstance(before, tuple) and [o.name for o in before[-2:]] == [
                "qkv.quantize_input/transpose", "qkv.quantize_weight/cast_transpose"]
            break
    else:
        raise AssertionError("no atp_qkv_ag ring")


def test_cost_model_takes_each_gemms_own_rate():
    """In an FP8 run, an FP8 GEMM runs at the FP8 peak times its FP8 curve's efficiency, a bf16
    one at the bf16 peak times the 16-bit curve's; the ratio of their times for the same
    compute-bound shape is the ratio of those products."""
    dev = get_device("h100-sxm5-80gb")
    c = CalibratedRoofline(dev, "fp8")
    shape = (8192.0, 8192.0, 8192.0)
    fl = 2 * 8192.0 ** 3
    t8 = c.device_time(Op("g", "gemm", "F", fl, fp8.gemm_bytes(*shape), shape, fl, "fp8"))
    t16 = c.device_time(Op("g", "gemm", "F", fl, 2 * 3 * 8192.0 ** 2, shape, fl, "bf16"))

    def rate(dt):
        shaped = dict(dev.gemm_shapes).get(gemm_class(dt))
        eff = shaped.at_shape(*shape)[0] if shaped is not None else dev.gemm[gemm_class(dt)].at(8192.0)[0]
        return dev.peak(dt) * eff
    assert t16 / t8 == pytest.approx(rate("fp8") / rate("bf16"))
    assert t8 < t16


def test_activations_kept_in_fp8(tmp_path):
    """A TE linear keeps its input for the weight gradient as the FP8 columnwise copy. Dense Llama
    at tp 1 (Korthikanti's per-token terms, bytes per token): the QKV input 2H -> H, the attention
    output 2·A·D -> A·D, the gate-up input 2H -> H and the down input 2F -> F: FP8 keeps
    s·(2H + A·D + F) bytes less per layer (delayed); blockwise keeps (1 + 4/128) per value."""
    bf = LayerBuilder(load_scenario(scenario(tmp_path, precision="bf16"))[0]).act_per_layer("none")
    f8 = LayerBuilder(load_scenario(scenario(tmp_path))[0]).act_per_layer("none")
    blk = LayerBuilder(load_scenario(scenario(tmp_path, recipe="blockwise"))[0]).act_per_layer("none")
    saved = S * (2 * H + A * D + F)
    assert bf - f8 == pytest.approx(saved)
    assert bf - blk == pytest.approx(saved * (1 - 4 / 128))


def test_mxfp8_needs_blackwell(tmp_path, capsys):
    """MXFP8's block-scaled Tensor Cores exist on Blackwell only: on an H100 the scenario is refused
    with exit code 2, naming the key and the fix; on a B200 it runs."""
    p = scenario(tmp_path, recipe="mxfp8")
    assert main(["run", str(p)]) == 2
    err = capsys.readouterr().err
    assert "training.fp8_recipe" in err and "Blackwell" in err and "Traceback" not in err
    ok = scenario(tmp_path, recipe="mxfp8", device="b200-sxm-180gb")
    assert main(["run", str(ok)]) == 0


def test_current_scaling_is_slower_than_delayed(tmp_path):
    """Current scaling reads every quantized tensor once more and cannot fuse the norm's cast:
    the same step takes longer."""
    from simtrain.simulate import simulate
    t = {}
    for key, prec, recipe in (("delayed", "fp8", "delayed"), ("current", "fp8", "current")):
        sc, topo = load_scenario(scenario(tmp_path, precision=prec, recipe=recipe))
        t[key] = simulate(sc, topo).result.step_time_s
    assert t["delayed"] < t["current"]


def test_result_names_the_recipe_and_a_typo_gets_a_suggestion(tmp_path, capsys):
    """result.json carries fp8_recipe beside precision (left out for a 16-bit run); a misspelled
    recipe is refused with the nearest name."""
    from simtrain.simulate import simulate
    sc, topo = load_scenario(scenario(tmp_path, recipe="current"))
    assert simulate(sc, topo).result.to_dict()["fp8_recipe"] == "current"
    sc, topo = load_scenario(scenario(tmp_path, precision="bf16"))
    assert "fp8_recipe" not in simulate(sc, topo).result.to_dict()
    assert main(["run", str(scenario(tmp_path, recipe="delayd"))]) == 2
    err = capsys.readouterr().err
    assert "training.fp8_recipe" in err and "did you mean delayed?" in err


def test_grouped_expert_gemms_quantize_every_local_expert(tmp_path):
    """An MoE layer's grouped GEMMs run all local experts in one kernel (the op's shape is one
    expert's share), so the quantize kernels cover every row and every expert's weight. By hand,
    ep 1 (E = 4 local experts), top-2 uniform routing, T = S tokens, so R = 2·T rows; delayed
    scaling (4 bytes per element, none of the expert linears is norm-fed), M = 4 microbatches:
      forward   gate-up input R·H, down input R·F; weights E·(2F·H + H·F) / M
      backward  output gradients of down R·H and of gate-up R·2F
    and the forward gate-up GEMM reads R·H + E·2F·H FP8 bytes and writes R·2F 16-bit ones."""
    path = scenario(tmp_path, recipe="delayed")
    doc = yaml.safe_load(path.read_text())
    doc["model"]["moe"] = {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": F}
    path.write_text(yaml.safe_dump(doc))
    sc, _ = load_scenario(path)
    lp = build_workload(sc, 1)[0].layers[0]
    E, R, M = 4, 2 * S, sc.num_microbatches
    q = 4.0
    cast = lambda items: sum(o.bytes for o in ops(items) if o.name.startswith("experts.") and ".quantize_" in o.name)  # noqa: E731
    assert cast(lp.forward) == pytest.approx(q * (R * H + R * F + E * (2 * F * H + H * F) / M))
    assert cast(lp.backward) == pytest.approx(q * (R * H + R * 2 * F))
    up = next(o for o in ops(lp.forward) if o.name == "experts.fc1_gate_up")
    assert (up.group, up.shape) == (E, (R / E, 2 * F, H))
    assert up.bytes == pytest.approx(R * H + E * 2 * F * H + 2 * R * 2 * F)


@pytest.mark.parametrize("recipe,q", [("delayed", 1.0), ("blockwise", 1 + 4 / 128), ("torchao_tensorwise", 2.0)])
def test_deferred_weight_gradient_keeps_fp8_operands_of_every_local_expert(tmp_path, recipe, q):
    """What a deferred W (zero-bubble schedules, DualPipe) keeps of an MoE layer: each wgrad GEMM's
    input X and output gradient dY. By hand, tp 1, T = S tokens, GQA (q H wide, k and v G·D each),
    E = 4 local experts, top-2 uniform routing, R = 2·T rows:
      qkv T·(H + H + 2·G·D), attn_out T·(H + H), router T·(H + E) at 2 bytes (a 16-bit GEMM),
      experts' gate-up R·(H + 2F) and down R·(F + H) over all local experts' rows.
    The FP8 GEMMs keep Transformer Engine's columnwise FP8 copies: q bytes per element (1, with
    blockwise's fp32 scale per 128 values 1 + 4/128); torchao keeps the 16-bit tensors (2)."""
    path = scenario(tmp_path, recipe=recipe)
    doc = yaml.safe_load(path.read_text())
    doc["model"]["moe"] = {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": F}
    path.write_text(yaml.safe_dump(doc))
    sc, _ = load_scenario(path)
    lp = build_workload(sc, 1)[0].layers[0]
    T, E = S, 4
    R = 2 * T
    fp8_elems = T * (2 * H + 2 * G * D) + T * 2 * H + R * (H + 2 * F) + R * (F + H)
    assert lp.weight_grad_inputs == pytest.approx(q * fp8_elems + 2 * T * (H + E))


def _dp2(tmp_path, recipe="delayed", zero=1, gather=False, **training):
    """The Llama of `scenario` on 2 data-parallel ranks of one node."""
    path = scenario(tmp_path, recipe=recipe)
    doc = yaml.safe_load(path.read_text())
    doc["parallel"].update(dp=2, zero_stage=zero)
    doc["training"].update(fp8_param_gather=gather, global_batch_size=4, **training)
    doc["cluster"]["topology"] = str(node_topology(tmp_path, 2))
    path.write_text(yaml.safe_dump(doc))
    return load_scenario(path)


# weights of a layer's FP8 GEMMs (tp 1): QKV H·(H + 2·G·D), the output projection H·H, gate-up and
# down 3·H·F; the norms, the embedding and the LM head stay 16-bit
FP8_W = H * (H + 2 * G * D) + H * H + 3 * H * F


def test_fp8_weights_are_the_te_linears():
    """`fp8_weights` counts every forward FP8 GEMM's n x k: by hand FP8_W per layer, 0 in bf16."""
    import tempfile
    from pathlib import Path

    from simtrain.workload.ir import fp8_weights
    with tempfile.TemporaryDirectory() as d:
        sc, _ = load_scenario(scenario(Path(d), recipe="delayed"))
        assert fp8_weights(build_workload(sc, 1)[0].layers[0]) == (FP8_W, 0.0)
        sc, _ = load_scenario(scenario(Path(d), precision="bf16"))
        assert fp8_weights(build_workload(sc, 1)[0].layers[0]) == (0.0, 0.0)


@pytest.mark.parametrize("recipe,gather,per", [
    ("delayed", False, 2 + 2 * 1.0),             # the 16-bit weight and TE's cached FP8 copy in both layouts
    ("current", True, 2 * 1.0),                  # --fp8-param-gather: the FP8 weight and its columnwise copy
    ("blockwise", False, 2 + 2 * (1 + 4 / 128 ** 2)),   # an fp32 scale per 128 x 128 tile in each layout
    ("torchao_tensorwise", True, 2.0),           # torchao casts per GEMM and caches nothing
])
def test_weight_memory_counts_te_cached_fp8_weights(tmp_path, recipe, gather, per):
    """Weights of one rank (ZeRO-1: unsharded): 2 bytes per parameter, and for the 2 layers' FP8
    GEMM weights `per` bytes instead of 2 (Transformer Engine's get_weight_workspace caches the
    quantized weight, rowwise and columnwise, across a step's microbatches)."""
    from simtrain.results.memory import rank_static
    sc, _ = _dp2(tmp_path, recipe, gather=gather)
    work = build_workload(sc)
    got = rank_static(sc, work, [0]).weights
    assert got == pytest.approx(2 * work[0].params + (per - 2) * 2 * FP8_W)


def test_fp8_param_gather_halves_the_linears_gather(tmp_path):
    """ZeRO-1 gathers the updated parameters after the optimizer step: 2 bytes per parameter, and
    with fp8_param_gather 1 byte for the FP8 GEMMs' weights (2 layers of FP8_W)."""
    def gathered(**kw):
        sc, topo = _dp2(tmp_path, **kw)
        from simtrain.simulate import simulate
        run = simulate(sc, topo)
        ops = [o for o in run.ops if o.label == "all_gather:param_all_gather"]
        assert ops
        return ops[0].bytes, build_workload(sc)[0].params
    plain, params = gathered()
    assert plain == pytest.approx(2 * params)
    fp8_bytes, _ = gathered(gather=True)
    assert fp8_bytes == pytest.approx(2 * params - 2 * FP8_W)
    bf16_bytes, _ = gathered(recipe=None, precision="bf16")
    assert bf16_bytes == pytest.approx(2 * params)


@pytest.mark.parametrize("change,words", [
    ({"zero": 0}, "set parallel.zero_stage: 1"),
    ({"recipe": "torchao_rowwise", "zero": 3}, "tensorwise scaling only"),
    ({"recipe": "blockwise"}, "per-tensor recipes"),
])
def test_fp8_param_gather_rules(tmp_path, change, words):
    """Megatron-LM asserts --fp8-param-gather needs the distributed optimizer or FSDP; torchtitan's
    FP8 all-gather is for tensorwise scaling; the block recipes' gathered scales are not modelled."""
    from simtrain.errors import ConfigError
    with pytest.raises(ConfigError, match=words):
        _dp2(tmp_path, gather=True, **change)


def test_fp8_param_gather_on_a_16_bit_run_warns(tmp_path):
    with pytest.warns(UserWarning, match="training.fp8_param_gather is used only with training.precision: fp8"):
        _dp2(tmp_path, recipe=None, gather=True, precision="bf16")


@pytest.mark.parametrize("recipe,tp,want", [("current", 2, 2), ("delayed", 2, 0), ("current", 1, 0)])
def test_current_scaling_reduces_the_amax_of_sharded_tensors_over_tp(tmp_path, recipe, tp, want):
    """Under sequence parallelism a tensor is quantized on its shard before its FP8 all-gather, so
    with current scaling the shards' amaxes are all-reduced over the tp group first (Transformer
    Engine's Linear: a column-parallel input, a row-parallel output gradient). A Llama layer has two
    of each: QKV's and fc1's inputs in the forward, the attention output's and fc2's output gradients
    in the backward; each a 4-byte (one fp32) all-reduce, placed between the amax and the cast.
    Delayed scaling takes its scale from the amax history, and without tp there is no shard."""
    sc, _ = load_scenario(scenario(tmp_path, recipe=recipe, tp=tp))
    lp = build_workload(sc, 1)[0].layers[0]

    def amax(items):
        return [(i, it) for i, it in enumerate(items) if isinstance(it, Comm) and it.name.startswith("amax_")]
    fwd, bwd = amax(lp.forward), amax(lp.backward)
    assert len(fwd) == len(bwd) == want
    assert {c.name for _, c in fwd} == ({"amax_qkv", "amax_fc1_gate_up"} if want else set())
    assert {c.name for _, c in bwd} == ({"amax_attn_out.dgrad", "amax_fc2.dgrad"} if want else set())
    for i, c in fwd + bwd:
        assert (c.kind, c.collective, c.size_bytes) == ("tp", "all_reduce", 4.0)
        items = lp.forward if (i, c) in fwd else lp.backward
        assert items[i - 1][-1].name.endswith("/amax") and items[i + 1][0].name.endswith("/cast")


@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_delayed_scaling_reduces_every_amax_once_per_chunk_and_pass(tmp_path, recipe):
    """Delayed scaling: Megatron-core runs a TransformerBlock's forward in one fp8_autocast, whose
    exit all-reduces the forward amaxes of every FP8 GEMM in it (input, weight, output: 3 fp32
    each) over the stage's tp x cp x dp ranks, and the end of its backward the backward amaxes
    (output and input gradients: 2 each). Here 2 Llama layers x 4 FP8 linears (QKV, attention
    output, fc1 gate-up, fc2) = 8 GEMMs: 3 x 8 x 4 = 96 B per forward, 2 x 8 x 4 = 64 B per
    backward, on 2 dp ranks, once per microbatch (2 per rank). It blocks the compute stream: the
    action continues after it. Current scaling takes no such all-reduce."""
    sc, topo = _dp2(tmp_path, recipe=recipe)
    assert build_workload(sc, 1)[0].fp8_gemms == 8
    s = simulate(sc, topo)
    red = [o for o in s.ops if o.label.startswith("all_reduce:amax_")]
    if recipe == "current":
        assert red == []
        return
    fwd = [o for o in red if o.label == "all_reduce:amax_forward"]
    bwd = [o for o in red if o.label == "all_reduce:amax_backward"]
    assert len(fwd) == len(bwd) == 2 * len(s.classes)
    assert {o.bytes for o in fwd} == {96.0} and {o.bytes for o in bwd} == {64.0}
    want = choose("all_reduce", 96.0, group_shape([0, 1], topo), topo, "auto", "auto").seconds
    assert all(o.duration == pytest.approx(want, rel=1e-12) for o in fwd)
    for o in red:
        after = next(x for x in s.ops if o.id in x.deps)
        assert after.stream == "compute" and s.timeline.start[after.id] >= s.timeline.end[o.id]


@pytest.mark.parametrize("gather", [False, True])
def test_zero3_gather_buffers_hold_fp8_weights_at_one_byte(tmp_path, gather):
    """ZeRO-3 holds two gathered layers (the current one and the prefetched one). A layer of the
    2-layer Llama has FP8_W FP8 GEMM weight elements; with fp8_param_gather they are gathered
    and held at 1 byte (torchao's FSDP float8 all-gather keeps the gathered FP8 data as the
    weight), the rest of the layer (its two norms, 2H) at 2: the buffers shrink by 2 x FP8_W."""
    from simtrain.results.memory import largest_layer, rank_static
    sc, _ = _dp2(tmp_path, "torchao_tensorwise", zero=3, gather=gather)
    work = build_workload(sc)
    params, fp8_elements = largest_layer(work)
    assert fp8_elements == FP8_W and params == FP8_W + 2 * H
    base = rank_static(sc, work, [0]).buffers
    sc16, _ = _dp2(tmp_path, "torchao_tensorwise", zero=3, gather=False)
    assert base == pytest.approx(rank_static(sc16, build_workload(sc16), [0]).buffers - (2 * FP8_W if gather else 0.0))
