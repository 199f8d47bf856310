"""Bad input, case by case: every case exits 2 with one `<file>: <key.path>: <problem>; <fix>` line
per problem, no traceback, within seconds and bounded memory.

Each case is a row of CASES: an id, how to build the input (a patch of one key of a small
scenario, of its topology file or of a Hugging Face config.json; raw YAML text; `--set`
overrides; a special file), the key path the error must name and words it must contain. Every
case runs `simtrain check` in a subprocess under a timeout and an address-space limit, so a hang
or a runaway allocation fails the case instead of the test run.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 30
MEMORY_LIMIT = 3 * 2**30

TOPOLOGY = {
    "name": "small", "kind": "two_tier", "devices_per_node": 4,
    "scale_up": {"bandwidth": "300 GB/s", "latency": "3 us"},
    "scale_out": {"nics_per_node": 4, "nic_bandwidth": "200 Gb/s", "latency": "5 us"},
}
TORUS = {"name": "t", "kind": "torus", "dims": [4, 4], "devices_per_router": 1,
         "injection": {"bandwidth": "300 GB/s", "latency": "0 us"}, "links": {"bandwidth": "50 GB/s", "latency": "1 us"}}
# two nodes of two devices on a scale-up switch each, device k of each node on rail leaf k, no spine:
# a device reaches the other rail only through its node-mate
_NIC = {"bandwidth": "400 Gb/s", "latency": "1 us"}
RAIL_ONLY = {
    "name": "rails", "kind": "explicit", "devices_per_node": 2, "devices": ["n0.g0", "n0.g1", "n1.g0", "n1.g1"],
    "switches": [{"name": "n0.sw", "kind": "scale_up_switch"}, {"name": "n1.sw", "kind": "scale_up_switch"},
                 {"name": "leaf0", "kind": "leaf"}, {"name": "leaf1", "kind": "leaf"}],
    "links": [{"a": f"n{n}.g{k}", "b": f"n{n}.sw", "bandwidth": "300 GB/s", "latency": "1 us"} for n in (0, 1) for k in (0, 1)]
    + [{"a": f"n{n}.g{k}", "b": f"leaf{k}", **_NIC} for n in (0, 1) for k in (0, 1)],
}
# the same two nodes with no link between them at all
ISLANDS = dict(RAIL_ONLY, links=RAIL_ONLY["links"][:4])
SCENARIO = {
    "name": "small",
    "model": {"architecture": "gpt", "num_layers": 8, "hidden_size": 256, "num_attention_heads": 8,
              "vocab_size": 1024, "seq_length": 128},
    "training": {"micro_batch_size": 1, "global_batch_size": 8},
    "parallel": {"tp": 1, "pp": 4, "dp": 1},
    "cluster": {"device": "a100-sxm4-80gb", "topology": "topo.yaml", "nodes": 1},
}
MOE = {"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 512}
HF = {"model_type": "llama", "num_hidden_layers": 8, "hidden_size": 256, "num_attention_heads": 8,
      "intermediate_size": 512, "vocab_size": 1024}
MARK = "PATCHED_VALUE_HERE"
DEEP = "[" * 100_000 + "]" * 100_000


@dataclass(frozen=True)
class Case:
    id: str
    key: str                       # the key path the error names
    words: str = ""                # words the error contains
    set: tuple = ()                # scenario patches: (dotted key, YAML text of the value)
    topo: tuple = ()               # topology patches
    topology: dict = field(default_factory=lambda: TOPOLOGY)
    hf: object = None              # a config.json (dict, or raw text) referenced by model.hf_config
    text: str = ""                 # the whole scenario file, verbatim
    argv: tuple = ()               # extra command-line arguments (--set)
    path: str = ""                 # check this path instead of the scenario written
    fifo: bool = False
    topo_append: str = ""             # text added to the end of the topology file
    limit: bool = False            # a hang or memory case


def _patch(doc: dict, patches: tuple) -> str:
    """The YAML of doc with each dotted key set to a value given as YAML text (kept verbatim, so
    `.nan`, anchors, duplicate keys and 5,000-digit numbers reach the loader as written)."""
    doc = json.loads(json.dumps(doc))
    texts = []
    for i, (key, _) in enumerate(patches):
        node = doc
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = f"{MARK}{i}"
    out = yaml.safe_dump(doc, sort_keys=False, width=10**9)
    for i, (_, value) in enumerate(patches):
        texts.append(value)
        out = out.replace(f"{MARK}{i}", value if "\n" not in value else "\n    " + value.replace("\n", "\n    "))
    return out


def build(case: Case, d: Path) -> tuple[list, Path]:
    """Writes the case's files into d; the argv of `simtrain check` and the scenario path."""
    (d / "topo.yaml").write_text(_patch(case.topology, case.topo) + case.topo_append)
    sc = d / "scenario.yaml"
    if case.hf is not None:
        (d / "config.json").write_text(case.hf if isinstance(case.hf, str) else json.dumps(case.hf))
    if case.text:
        sc.write_text(case.text)
    else:
        sc.write_text(_patch(SCENARIO, case.set))
    if case.fifo:
        sc = d / "fifo.yaml"
        os.mkfifo(sc)
    target = case.path or str(sc)
    return ["check", target, *case.argv], Path(target)


def _hf(**over) -> dict:
    return {**HF, **over}


def _hfset(*extra) -> tuple:
    return (("model", "{hf_config: config.json, seq_length: 128}"),) + extra


CASES = [
    # numbers out of range or not finite
    Case("vocab-1e30", "model.vocab_size", "whole number", set=(("model.vocab_size", "1.0e+30"),)),
    Case("vocab-huge-int", "model.vocab_size", "out of range", set=(("model.vocab_size", "1" + "0" * 30),)),
    Case("vocab-divisible-1e15", "model.make_vocab_size_divisible_by", "<=",
         set=(("model.make_vocab_size_divisible_by", "1000000000000000"),)),
    Case("bandwidth-1e-300", "scale_out.nic_bandwidth", "", topo=(("scale_out.nic_bandwidth", '"1e-300 Gb/s"'),)),
    Case("latency-1e300", "scale_up.latency", "", topo=(("scale_up.latency", '"1e300 s"'),)),
    Case("oversubscription-inf", "scale_out.oversubscription", "finite", topo=(("scale_out.oversubscription", ".inf"),)),
    Case("oversubscription-nan", "scale_out.oversubscription", "finite", topo=(("scale_out.oversubscription", ".nan"),)),
    Case("straggler-compute-inf", "cluster.stragglers[0].compute", "finite",
         set=(("cluster.stragglers", "[{devices: [1], compute: .inf}]"),)),
    Case("straggler-compute-nan", "cluster.stragglers[0].compute", "finite",
         set=(("cluster.stragglers", "[{devices: [1], compute: .nan}]"),)),
    Case("straggler-fraction-nan", "cluster.stragglers[0].fraction", "finite",
         set=(("cluster.stragglers", "[{fraction: .nan, compute: 1.2}]"),)),
    Case("jitter-sigma-inf", "cluster.jitter.sigma", "finite", set=(("cluster.jitter", "{sigma: .inf}"),)),
    Case("jitter-sigma-nan", "cluster.jitter.sigma", "finite", set=(("cluster.jitter", "{sigma: .nan}"),)),
    Case("step-time-cv-nan", "reliability.step_time_cv", "finite", set=(("reliability", "{step_time_cv: .nan}"),)),
    Case("host-memory-fraction-nan", "reliability.checkpoint.in_memory.usable_host_memory_fraction", "finite",
         set=(("reliability", "{checkpoint: {in_memory: {usable_host_memory_fraction: .nan}}}"),)),
    Case("rate-scale-nan", "reliability.failures.rate_scale", "finite", set=(("reliability", "{failures: {rate_scale: .nan}}"),)),
    Case("category-rate-nan", "reliability.failures.categories.x.rate_per_unit_hour", "finite",
         set=(("reliability", "{failures: {categories: {x: {rate_per_unit_hour: .nan, per: gpu, action: swap, detection: crash, group: gpu}}}}"),)),
    Case("price-nan", "cost.price_per_device_hour", "finite", set=(("cost", "{price_per_device_hour: .nan}"),)),
    Case("shared-expert-negative", "model.moe.shared_expert_ffn_hidden_size", ">= 0",
         set=(("model.moe", json.dumps({**MOE, "shared_expert_ffn_hidden_size": -5})),)),
    Case("zero-stage-bool", "parallel.zero_stage", "true", set=(("parallel.zero_stage", "true"),)),
    Case("tp-bool", "parallel.tp", "true", set=(("parallel.tp", "true"),)),
    Case("capacity-factor-nan", "model.moe.capacity_factor", "finite",
         set=(("model.moe", json.dumps(MOE)[:-1] + ", \"capacity_factor\": .nan}"),)),
    Case("skew-inf", "model.moe.routing.skew", "finite",
         set=(("model.moe", json.dumps(MOE)[:-1] + ", \"routing\": {\"distribution\": \"zipf\", \"skew\": .inf}}"),)),
    Case("loads-nan", "model.moe.routing.loads", "",
         set=(("model.moe", json.dumps(MOE)[:-1] + ", \"routing\": {\"distribution\": \"explicit\", \"loads\": [.nan, 1, 1, 1, 1, 1, 1, 1]}}"),)),
    Case("loads-inf", "model.moe.routing.loads", "",
         set=(("model.moe", json.dumps(MOE)[:-1] + ", \"routing\": {\"distribution\": \"explicit\", \"loads\": [.inf, 1, 1, 1, 1, 1, 1, 1]}}"),)),
    Case("huge-int-5000-digits", "", "number cannot be read", set=(("model.num_layers", "9" * 5000),)),
    Case("huge-int-5000-digits-float-key", "", "number cannot be read",
         set=(("cluster.stragglers", "[{devices: [1], compute: " + "9" * 5000 + "}]"),)),
    # duplicate keys, in every YAML read
    Case("duplicate-key-scenario", "", "duplicate key 'num_layers'",
         text=_patch(SCENARIO, ()).replace("  num_layers: 8\n", "  num_layers: 8\n  num_layers: 4\n")),
    Case("duplicate-key-topology", "", "duplicate key 'devices_per_node'", topo_append="devices_per_node: 8\n"),
    Case("duplicate-key-set", "--set model", "duplicate", argv=("--set", "model={a: 1, a: 2}")),
    # Hugging Face config.json
    Case("hf-disagreeing-widths", "hidden_size", "n_embd",
         set=_hfset(), hf={**_hf(model_type="gpt2", n_layer=8, n_head=8), "n_embd": 256, "hidden_size": 512}),
    Case("hf-list", "model.hf_config", "mapping", set=_hfset(), hf="[1, 2, 3]"),
    Case("hf-missing-comma", "model.hf_config", "line 3, column 2: expecting ',' delimiter", set=_hfset(),
         hf='{"hidden_size": 64,\n "num_hidden_layers": 2\n "x": 1}'),
    Case("hf-deep", "model.hf_config", "deep", set=_hfset(), hf=DEEP),
    Case("hf-moe-layer-freq-0", "model.moe.layer_freq", ">= 1", set=_hfset(),
         hf=_hf(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=128, moe_layer_freq=0)),
    Case("hf-duplicate-key", "model.hf_config", "duplicate", set=_hfset(),
         hf=json.dumps(HF)[:-1] + ', "vocab_size": 7}'),
    Case("hf-huge-number", "model.hf_config", "", set=_hfset(), hf=json.dumps(HF)[:-1] + ', "rope_theta": ' + "9" * 5000 + "}"),
    # wrong types in nested places
    Case("preset-list", "model.preset", "", set=(("model", "{preset: [x]}"),)),
    Case("preset-map", "model.preset", "", set=(("model", "{preset: {a: 1}}"),)),
    Case("moe-list", "model.moe", "mapping", set=(("model.moe", "[1, 2]"),)),
    Case("encoder-preset-list", "model.encoder.preset", "", set=(("model.encoder", "{preset: [a, b]}"),)),
    Case("cost-list", "cost", "mapping", set=(("cost", "[1, 2]"),)),
    # deep nesting and anchor bombs
    Case("deep-scenario", "", "deep", set=(("model.num_layers", DEEP),)),
    Case("deep-set", "--set model.num_layers", "deep", argv=("--set", "model.num_layers=" + "[" * 20_000 + "]" * 20_000)),
    Case("anchor-bomb-value", "", "aliases", limit=True,
         text="b: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
             f"c{i}: &a{i} [{', '.join(['*a' if i == 0 else f'*a{i - 1}'] * 10)}]\n" for i in range(7))
         + _patch(SCENARIO, ()).replace("  num_layers: 8\n", "  num_layers: *a6\n")),
    # sizes that would hang or exhaust memory
    Case("spines-1e9", "scale_out.spines", "<=", limit=True, topo=(("scale_out.spines", "1000000000"),)),
    Case("torus-dims-1e5", "dims", "", limit=True, topology=TORUS, topo=(("dims", "[100000, 100000, 100000]"),),
         set=(("cluster.nodes", "16"), ("parallel.dp", "4"))),
    Case("choice-given-yaml-off", "training.recompute", "YAML reads off, no and false as false; write one of the words (e.g. none)",
         argv=("--set", "training.recompute=off")),
    Case("hidden-size-negative-example-is-a-hidden-size", "model.hidden_size", "write e.g. `4096`",
         set=(("model.hidden_size", "-5"),)),
    Case("num-layers-1e6", "model.num_layers", "<=", limit=True, set=(("model.num_layers", "1000000"),)),
    Case("global-batch-4e6", "training.global_batch_size", "<=", limit=True, set=(("training.global_batch_size", "4000000"),)),
    Case("nodes-1e7", "cluster.nodes", "<=", limit=True, set=(("cluster.nodes", "10000000"), ("parallel.dp", "10000000"))),
    # special files
    Case("dev-zero", "", "regular file", limit=True, path="/dev/zero"),
    Case("dev-urandom", "", "regular file", limit=True, path="/dev/urandom"),
    Case("fifo", "", "regular file", limit=True, fifo=True),
    Case("directory", "", "regular file", path="/tmp"),
    Case("big-file", "", "MiB", limit=True, text="name: x\n" + "# " + "x" * 80 + "\n" * 1 + ("#" + "y" * 1000 + "\n") * 20_000),
    # command-line overrides and topology overrides (simtrain.spec.overrides; cluster.topology.<key>)
    Case("set-topology-key-bad-value", "cluster.topology.scale_out.oversubscription", ">= 1",
         argv=("--set", "cluster.topology.scale_out.oversubscription=0.5")),
    Case("set-topology-key-not-a-number", "cluster.topology.scale_out.oversubscription", "number",
         argv=("--set", "cluster.topology.scale_out.oversubscription=lots")),
    Case("set-topology-key-nan", "cluster.topology.scale_out.oversubscription", "",
         argv=("--set", "cluster.topology.scale_out.oversubscription=.nan")),
    Case("set-topology-key-unknown", "cluster.topology.scale_out.oversubscriptoin", "did you mean",
         argv=("--set", "cluster.topology.scale_out.oversubscriptoin=2")),
    Case("set-topology-key-unknown-section", "cluster.topology.scaleout", "unknown", argv=("--set", "cluster.topology.scaleout.x=2")),
    Case("topology-mapping-without-file", "cluster.topology.file", "missing",
         set=(("cluster.topology", "{scale_out: {oversubscription: 2}}"),)),
    Case("topology-mapping-file-not-text", "cluster.topology.file", "expected", set=(("cluster.topology", "{file: [1, 2]}"),)),
    Case("topology-mapping-bad-key", "cluster.topology.scale_up.bandwidth", "",
         set=(("cluster.topology", "{file: topo.yaml, scale_up: {bandwidth: -3}}"),)),
    # a wrong value given with --set is the command line's, not the file's: the line names the file and the argument
    Case("set-value-named-by-its-argument", "parallel.tp", "(--set parallel.tp=3): parallel.tp:", argv=("--set", "parallel.tp=3")),
    Case("set-joined-value-named-by-its-argument", "parallel.tp", "(--set parallel.tp=3): parallel.tp:",
         argv=("--set", "parallel.tp+parallel.dp=3+1")),
    Case("set-unknown-key-named-by-its-argument", "parallel.tp_comm_overlap_cfg.fc3_fprop",
         "(--set parallel.tp_comm_overlap_cfg.fc3_fprop.method=bulk): parallel.tp_comm_overlap_cfg.fc3_fprop: unknown key",
         argv=("--set", "parallel.tp_comm_overlap_cfg.fc3_fprop.method=bulk")),
    # a rule of another key that names the overridden one: still the argument's
    Case("set-value-named-by-the-rule-it-breaks", "parallel.pp", "(--set model.num_layers=7): parallel.pp: num_layers=7",
         argv=("--set", "model.num_layers=7")),
    # a rule between two overridden keys names both arguments
    Case("set-rule-between-two-arguments", "parallel.pp",
         "(--set parallel.pp=3, --set model.num_layers=7): parallel.pp: num_layers=7",
         argv=("--set", "parallel.pp=3", "--set", "model.num_layers=7")),
    Case("set-joined-keys-value-count", "--set parallel.tp+parallel.pp", "2 keys", argv=("--set", "parallel.tp+parallel.pp=1+2+3")),
    Case("set-empty-key-part", "--set parallel..tp", "empty", argv=("--set", "parallel..tp=2")),
    Case("set-schedule-csv-missing-from-cwd", "parallel.schedule_csv", "", argv=("--set", "parallel.schedule_csv=nope.csv")),
    # topology builders and the network seam: explicit fabrics whose device pairs lack a route
    Case("explicit-transit-only", "devices[3]", "allow_device_transit", topology=RAIL_ONLY, set=(("cluster.nodes", "2"),)),
    Case("explicit-no-route", "devices[2]", "no route between", topology=ISLANDS, set=(("cluster.nodes", "2"),)),
    Case("explicit-transit-not-bool", "allow_device_transit", "", topology=RAIL_ONLY, set=(("cluster.nodes", "2"),),
         topo=(("allow_device_transit", "maybe"),)),
    # device memory: capacity override and the reserve held back
    Case("memory-capacity-bare-number", "cluster.memory_capacity", "unit", set=(("cluster.memory_capacity", "80"),)),
    Case("memory-capacity-negative", "cluster.memory_capacity", ">= 0", set=(("cluster.memory_capacity", '"-80 GiB"'),)),
    Case("memory-capacity-nan", "cluster.memory_capacity", "cannot read", set=(("cluster.memory_capacity", '"nan GiB"'),)),
    Case("memory-capacity-absurd", "cluster.memory_capacity", "out of range", set=(("cluster.memory_capacity", '"5 PiB"'),)),
    Case("memory-capacity-tiny", "cluster.memory_capacity", "out of range", set=(("cluster.memory_capacity", '"12 B"'),)),
    Case("memory-reserve-over-capacity", "cluster.memory_reserve", "leaves nothing", set=(("cluster.memory_reserve", '"80 GiB"'),)),
    Case("memory-reserve-over-override", "cluster.memory_reserve", "leaves nothing",
         set=(("cluster.memory_capacity", '"16 GiB"'), ("cluster.memory_reserve", '"20 GiB"'))),
    Case("memory-reserve-fraction-one", "cluster.memory_reserve", "< 1", set=(("cluster.memory_reserve", "1.0"),)),
    Case("memory-reserve-negative", "cluster.memory_reserve", ">= 0", set=(("cluster.memory_reserve", "-0.1"),)),
    Case("memory-reserve-nan", "cluster.memory_reserve", "fraction", set=(("cluster.memory_reserve", ".nan"),)),
    Case("memory-reserve-percent-over", "cluster.memory_reserve", "< 100", set=(("cluster.memory_reserve", '"150%"'),)),
    Case("memory-reserve-percent-negative", "cluster.memory_reserve", ">= 0", set=(("cluster.memory_reserve", '"-5%"'),)),
    Case("memory-reserve-percent-text", "cluster.memory_reserve", "as a percentage", set=(("cluster.memory_reserve", '"lots%"'),)),
    Case("memory-reserve-text", "cluster.memory_reserve", "0.05", set=(("cluster.memory_reserve", '"abc"'),)),
    Case("memory-reserve-negative-size", "cluster.memory_reserve", ">= 0", set=(("cluster.memory_reserve", '"-2 GiB"'),)),
    Case("memory-reserve-absurd-size", "cluster.memory_reserve", "finite", set=(("cluster.memory_reserve", '"1e30 B"'),)),
    Case("memory-reserve-text", "cluster.memory_reserve", "cannot read", set=(("cluster.memory_reserve", "lots"),)),
    Case("memory-reserve-list", "cluster.memory_reserve", "size or a fraction", set=(("cluster.memory_reserve", "[1, 2]"),)),
]


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_case(case: Case, d: Path, root: Path = ROOT) -> tuple[str, str]:
    """(outcome, stderr): clean | traceback | hang | accepted | wrong-message."""
    argv, target = build(case, d)
    env = {**os.environ, "PYTHONPATH": str(root)}
    try:
        p = subprocess.run([sys.executable, "-m", "simtrain", *argv], cwd=d, env=env, capture_output=True, text=True,
                           timeout=TIMEOUT_S, preexec_fn=_limit_memory)
    except subprocess.TimeoutExpired:
        return "hang", ""
    err = p.stderr
    if "Traceback" in err or p.returncode not in (0, 2):
        return "traceback", err[-2000:]
    if p.returncode == 0:
        return "accepted", p.stdout[-500:]
    lines = err.strip().splitlines()
    # every line `<file>: <key.path>: <problem>; <fix>`, of a bounded length; the case's key among them
    ok = (f": {case.key}:" in err if case.key else True) and case.words.lower() in err.lower() \
        and all(len(line) <= 600 and ": " in line and "; " in line for line in lines) and lines[0].startswith((str(target), str(d), "--set "))
    return ("clean" if ok else "wrong-message"), err[-2000:]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, tmp_path: Path) -> None:
    outcome, err = run_case(case, tmp_path)
    assert outcome == "clean", f"{outcome}: {err}"


if __name__ == "__main__":
    # python tests/test_bad_inputs.py [ROOT]: the outcome of every case against the code at ROOT
    import collections
    import tempfile
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    counts: collections.Counter = collections.Counter()
    for c in CASES:
        with tempfile.TemporaryDirectory() as t:
            outcome, err = run_case(c, Path(t), root)
        counts[outcome] += 1
        print(f"{c.id:36s} {outcome:14s} {err.strip().splitlines()[-1][:150] if err.strip() else ''}", flush=True)
    print(f"tried {len(CASES)}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
