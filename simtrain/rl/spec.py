"""The `job: rl` file: an RL post-training job (verl / OpenRLHF style) -> RLJob.

Sections (keys and defaults in docs/reference/verl-config.md for their verl meaning):
  cluster, network, model      as in a training scenario (model.seq_length is derived per pass)
  algorithm   estimator (grpo | dapo | rloo | reinforce_plus_plus | ppo), use_kl_loss, kl_in_reward,
              adv_seconds_per_token
  data        train_batch_size (prompts), n, max_prompt_length, max_response_length,
              prompt_length / response_length (simtrain.rl.lengths specs)
  rollout     engine, tp, ep and any simtrain.rollout.engine.EngineConfig field, free_cache_engine
  actor / reference / critic   strategy, parallel, training, ppo_* batch keys, use_dynamic_bsz,
              token budgets, offload
  reward      {kind: rule, seconds_per_response, workers} or {kind: model, model, parallel}
  placement   kind (colocated | split | one_step_off | fully_async), rollout_devices, staleness,
              partial_rollout, iterations
Every problem is reported as `<file>: <key.path>: <problem>; <fix>`, all of a file together.
Each training role gets a training `Scenario` template of its pool, built by
simtrain.spec.loading.build_scenario so every plan check of a training step applies to it.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from simtrain.errors import Collector, ConfigError
from simtrain.hardware.topology import Topology, find_topology_file, load_topology
from simtrain.rl import verl
from simtrain.rl.lengths import LengthSpec, parse_length_spec
from simtrain.rollout.engine import INT_FIELDS, EngineConfig
from simtrain.spec.fields import integral
from simtrain.spec.files import load_yaml
from simtrain.spec.loading import apply_overrides, attribute_overrides, build_scenario
from simtrain.spec.scenario import Scenario
from simtrain.units import UnitError, parse_bandwidth

ESTIMATORS = ("grpo", "dapo", "rloo", "reinforce_plus_plus", "ppo")
PLACEMENTS = ("colocated", "split", "one_step_off", "fully_async")
TOP = ("job", "name", "seed", "cluster", "network", "model", "algorithm", "data", "rollout", "actor",
       "reference", "critic", "reward", "placement", "verl_config")
ENGINE_FIELDS = {f.name: f for f in dataclasses.fields(EngineConfig) if f.name != "dp"}
ROLE_KEYS = ("strategy", "parallel", "training", "model", "ppo_mini_batch_size", "ppo_epochs", "ppo_micro_batch_size_per_gpu",
             "use_dynamic_bsz", "ppo_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu", "log_prob_micro_batch_size_per_gpu",
             "offload", "use_remove_padding")
# verl's defaults (verl/trainer/config/ppo_trainer.yaml, actor_rollout_ref.actor.*): ppo_epochs 1,
# ppo_max_token_len_per_gpu 16384, use_dynamic_bsz false; simtrain's chosen defaults are marked.
ROLE_DEFAULTS = {
    "strategy": "fsdp", "ppo_mini_batch_size": None, "ppo_epochs": 1, "ppo_micro_batch_size_per_gpu": 1,
    "use_dynamic_bsz": False, "ppo_max_token_len_per_gpu": 16384, "log_prob_max_token_len_per_gpu": None,
    "log_prob_micro_batch_size_per_gpu": None, "use_remove_padding": True,
}
# use_remove_padding: verl's actor_rollout_ref.model.use_remove_padding and the Megatron actor's
# megatron.use_remove_padding are both true (verl/trainer/config/_generated_ppo_trainer.yaml and
# _generated_ppo_megatron_trainer.yaml at verl b178a3cd): sequences are packed without pad tokens.
# assumed: an advantage estimate is a few vector operations per response token on the driver
# (GRPO's group mean / std); 1 ns per token, not a measurement
ADV_SECONDS_PER_TOKEN = 1e-9
# assumed: a rule reward (math answer check) of 0.5 ms per response, run one by one by verl's
# NaiveRewardManager in the driver (workers 1); set it from a profile of the reward function
RULE_SECONDS_PER_RESPONSE = 5e-4


@dataclass(frozen=True)
class Role:
    """A training role of the job (actor, reference, critic, reward_model) and its pool's template."""
    name: str
    strategy: str
    scenario: Scenario            # a training step of the role's plan on its pool (seq_length, batch derived)
    topology: Topology
    mini_batch_size: int          # prompts per optimiser step
    epochs: int
    micro_batch_size: int         # sequences per micro batch (fixed batching)
    log_prob_micro_batch_size: int
    dynamic_bsz: bool
    max_token_len: int            # update passes
    log_prob_max_token_len: int   # forward passes
    offload: dict[str, bool]
    remove_padding: bool = True   # passes compute only real tokens (verl's use_remove_padding)
    padded_length: int = 0        # without it: every sequence max_prompt_length + max_response_length long


@dataclass(frozen=True)
class RLJob:
    name: str
    seed: int
    source_file: str
    raw: dict                     # the resolved tree (for scenario.resolved.yaml)
    estimator: str
    use_kl_loss: bool
    kl_in_reward: bool
    adv_seconds_per_token: float
    train_batch_size: int
    n: int
    max_prompt_length: int
    max_response_length: int
    prompt_length: LengthSpec
    response_length: LengthSpec
    engine: EngineConfig          # one replica (dp = rollout replicas)
    engine_name: str
    free_cache_engine: bool
    placement: str
    rollout_devices: int
    train_devices: int
    total_devices: int
    staleness: int
    partial_rollout: bool
    iterations: int
    reward: dict
    roles: dict[str, Role] = field(default_factory=dict)
    rollout_topology: Topology | None = None
    device_name: str = ""

    @property
    def needs_ref(self) -> bool:
        return self.use_kl_loss or self.kl_in_reward

    @property
    def has_critic(self) -> bool:
        return self.estimator == "ppo"


def is_rl_file(raw: dict) -> bool:
    """True for a `job: rl` file or a verl trainer config (it has `actor_rollout_ref`)."""
    return isinstance(raw, dict) and (raw.get("job") == "rl" or "actor_rollout_ref" in raw)


def _close(k: str, allowed: Iterable[str]) -> str:
    c = difflib.get_close_matches(str(k), sorted(allowed), n=1)
    return f"did you mean `{c[0]}`?" if c else f"allowed: {', '.join(sorted(allowed))}"


def _map(raw: dict, key: str, allowed: Iterable[str], errs: Collector) -> dict:
    v = raw.get(key, {})
    if v is None:
        return {}
    if not isinstance(v, dict):
        errs.add(key, "expected a mapping", f"write `{key}: {{...}}`")
        return {}
    for k in v:
        if k not in allowed:
            errs.add(f"{key}.{k}", "unknown key", _close(k, allowed))
    return v


def _int(d: dict, key: str, path: str, errs: Collector, default: int | None, lo: int = 1, hi: int = 2 ** 24) -> int | None:
    v = d.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        errs.add(f"{path}.{key}", f"{v!r} is not a whole number in {lo}..{hi}", f"give a whole number in {lo}..{hi}")
        return None
    return v


def _num(d: dict, key: str, path: str, errs: Collector, default: float, lo: float, hi: float) -> float | None:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        errs.add(f"{path}.{key}", f"{v!r} is not a finite number in [{lo:g}, {hi:g}]", f"give a number in [{lo:g}, {hi:g}]")
        return None
    return float(v)


def _bool(d: dict, key: str, path: str, errs: Collector, default: bool) -> bool:
    v = d.get(key, default)
    if not isinstance(v, bool):
        errs.add(f"{path}.{key}", f"{v!r} is not true or false", "write true or false")
        return default
    return v


def _choice(d: dict, key: str, path: str, errs: Collector, default: str, choices: tuple) -> str | None:
    v = d.get(key, default)
    if v not in choices:
        errs.add(f"{path}.{key}", f"unknown {v!r}", f"use one of {', '.join(choices)}")
        return None
    return v


def _prefixed(c: Collector, prefix: str, errs: Collector) -> None:
    """Problems of a role's training template, re-rooted at the role's keys of the job file."""
    renames = {"parallel": f"{prefix}.parallel", "training": f"{prefix}.training",
               "model": f"{prefix}.model" if prefix in ("critic", "reward") else "model"}
    for p in c.problems:
        head = p.path.split(".", 1)[0]
        path = p.path if head in ("cluster", "network") or not p.path else renames.get(head, prefix) + p.path[len(head):]
        errs.add(path, p.problem, p.fix)


def _template(name: str, role: dict, model_raw: dict, cluster: dict, network: dict, devices: int, gpn: int,
              path: Path, errs: Collector, per_node: int | None = None) -> tuple[Scenario, Topology] | None:
    """The role's training Scenario on `devices` devices: dp = devices / (tp pp cp). The pool is whole
    nodes of `gpn`, or, with `per_node` < gpn, `per_node` devices of each node (a pool that shares its
    nodes with the rollout pool): its topology is then the cluster's with devices_per_node = per_node."""
    par = dict(role.get("parallel") or {})
    if not isinstance(role.get("parallel", {}) or {}, dict) or not isinstance(role.get("training", {}) or {}, dict):
        errs.add(f"{name}.parallel", "expected a mapping", "write e.g. `parallel: {tp: 1, zero_stage: 3}`")
        return None
    if "dp" in par:
        errs.add(f"{name}.parallel.dp", "dp is derived from the pool size / (tp x pp x cp)", "remove it")
        return None
    if role.get("strategy", "fsdp") == "fsdp":
        par.setdefault("zero_stage", 3)      # FSDP full sharding, verl's default fsdp_config
    else:
        # Megatron's distributed optimizer shards the optimizer state over dp (ZeRO-1): verl's
        # megatron.use_distributed_optimizer default true (_generated_ppo_megatron_trainer.yaml, b178a3cd)
        par.setdefault("zero_stage", 1)
    tp, pp, cp = (par.get(k, 1) for k in ("tp", "pp", "cp"))
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in (tp, pp, cp)):
        errs.add(f"{name}.parallel", "tp, pp and cp must be whole numbers >= 1", "give e.g. `parallel: {tp: 2}`")
        return None
    if devices % (tp * pp * cp):
        errs.add(f"{name}.parallel", f"tp x pp x cp = {tp * pp * cp} does not divide the pool's {devices} devices",
                 "choose tp, pp and cp whose product divides the pool size")
        return None
    per = per_node or gpn
    if devices % per:
        errs.add("placement.rollout_devices", f"the training pool of {devices} devices is not whole nodes of {gpn}",
                 f"make the rollout pool a multiple of {gpn} devices")
        return None
    dp = devices // (tp * pp * cp)
    par["dp"] = dp
    tr = {k: v for k, v in (role.get("training") or {}).items()}
    for k in ("micro_batch_size", "global_batch_size"):
        if k in tr:
            errs.add(f"{name}.training.{k}", "batch sizes are derived from data and the ppo_* keys", "remove it")
            return None
    tr.update(micro_batch_size=1, global_batch_size=dp)
    cl = {**cluster, "nodes": devices // per}
    if per != gpn:
        cl["topology"] = _node_share(cl["topology"], per, path, errs)
    raw = {"name": f"{name}", "model": model_raw, "training": tr, "parallel": par, "cluster": cl, "network": network}
    c = Collector(errs.file)
    try:
        return build_scenario(raw, path, c)
    except ConfigError:
        _prefixed(c, name, errs)
        return None


def _node_share(topology: object, per: int, path: Path, errs: Collector) -> object:
    """The cluster's topology seen by a pool of `per` devices on each node (the rest of the node is the
    rollout pool's): devices_per_node = per, the node's scale-up fabric unchanged per device. The node's
    NICs serve the pool; when they cannot be shared evenly by `per` devices they are re-counted as `per`
    NICs of the same total bandwidth (each device's share of the node's scale-out, as when all train)."""
    t = dict(topology) if isinstance(topology, dict) else {"file": topology}
    t["devices_per_node"] = per
    f = find_topology_file(t["file"], path.parent) if isinstance(t.get("file"), str) else None
    raw = load_yaml(f, Collector(str(f)), "") if f is not None else None
    so = {**((raw or {}).get("scale_out") or {}), **(t.get("scale_out") or {})}
    nics, bw = so.get("nics_per_node"), so.get("nic_bandwidth")
    if isinstance(nics, int) and nics > 0 and per % nics and bw is not None:
        try:
            total = parse_bandwidth(bw) * nics
        except UnitError as e:
            errs.add("cluster.topology.scale_out.nic_bandwidth", str(e), "write e.g. `400 Gb/s`")
            return t
        t["scale_out"] = {**(t.get("scale_out") or {}), "nics_per_node": per, "nic_bandwidth": f"{total / per / 1e9:.9g} GB/s"}
    return t


def _gpn(cluster: dict, network: dict, model_raw: dict, path: Path, errs: Collector) -> tuple[int, Topology] | None:
    """Devices per node and the whole cluster's topology, from a one-node-per-dp-rank template."""
    nodes = cluster.get("nodes")
    tname = cluster.get("topology")
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1 or not tname:
        errs.add("cluster", "a job needs cluster.topology and cluster.nodes", "add e.g. `cluster: {device: h20-96gb, topology: hgx-h20, nodes: 4}`")
        return None
    tfile = find_topology_file(tname, path.parent) if isinstance(tname, str) else None
    if tfile is None:
        errs.add("cluster.topology", f"topology file {tname!r} not found", "give a path to a topology YAML or a shipped name (simtrain list topologies)")
        return None
    try:
        topo = load_topology(tfile, nodes)
    except ConfigError as e:
        errs.problems.extend(e.problems)
        return None
    return topo.num_devices // nodes, topo


def build_rl_job(raw: dict, path: Path, errs: Collector) -> RLJob | None:
    """Parses a `job: rl` tree (overrides already applied); None when a problem was found (in errs)."""
    for k in raw:
        if k not in TOP:
            errs.add(str(k), "unknown key", _close(k, TOP))
    if raw.get("job") != "rl":
        errs.add("job", f"{raw.get('job')!r} is not `rl`", "write `job: rl`")
    for k in ("cluster", "model", "data", "rollout", "actor"):
        if k not in raw:
            errs.add(k, "missing required section", f"add `{k}:`")
    if errs.problems:
        return None
    cluster = dict(raw["cluster"]) if isinstance(raw["cluster"], dict) else {}
    if "topology_file" in cluster:           # the contract's spelling of a training scenario's `topology`
        cluster["topology"] = cluster.pop("topology_file")
    network = raw.get("network") or {}
    model_raw = raw["model"]
    if not isinstance(model_raw, dict):
        errs.add("model", "expected a mapping", "write e.g. `model: {preset: qwen2.5-7b}`")
        return None
    model_raw = {k: v for k, v in model_raw.items() if k != "seq_length"}
    name = raw.get("name", path.stem)
    if not isinstance(name, str):
        errs.add("name", "expected text", "write e.g. `name: my-rl-job`")
    seed = _int(raw, "seed", "", errs, 0, 0, 2 ** 31)

    alg = _map(raw, "algorithm", ("estimator", "use_kl_loss", "kl_in_reward", "adv_seconds_per_token"), errs)
    estimator = _choice(alg, "estimator", "algorithm", errs, "grpo", ESTIMATORS)
    use_kl = _bool(alg, "use_kl_loss", "algorithm", errs, False)
    kl_rew = _bool(alg, "kl_in_reward", "algorithm", errs, False)
    adv_s = _num(alg, "adv_seconds_per_token", "algorithm", errs, ADV_SECONDS_PER_TOKEN, 0.0, 1e-3)

    data = _map(raw, "data", ("train_batch_size", "n", "max_prompt_length", "max_response_length", "prompt_length",
                              "response_length"), errs)
    tbs = _int(data, "train_batch_size", "data", errs, None, 1, 2 ** 20)
    n = _int(data, "n", "data", errs, 1, 1, 4096)
    mpl = _int(data, "max_prompt_length", "data", errs, 512, 1, 2 ** 20)     # verl's data.max_prompt_length default 512
    mrl = _int(data, "max_response_length", "data", errs, 512, 1, 2 ** 20)   # verl's data.max_response_length default 512
    if tbs is None and "train_batch_size" not in data:
        errs.add("data.train_batch_size", "missing", "give the prompts per iteration, e.g. `train_batch_size: 512`")
    plen = rlen = None
    if mpl and mrl:
        for key, dflt, hi in (("prompt_length", {"kind": "fixed", "tokens": mpl}, mpl), ("response_length", None, mrl)):
            tree = data.get(key, dflt)
            if tree is None:
                errs.add(f"data.{key}", "missing", "give a length distribution, e.g. `{kind: lognormal, mean: 3000, sigma: 0.8}`")
                continue
            if isinstance(tree, dict) and "max" not in tree:
                tree = {**tree, "max": hi}
            try:
                spec = parse_length_spec(tree, f"data.{key}", file=errs.file, base_dir=path.parent)
            except ConfigError as e:
                errs.problems.extend(e.problems)
                continue
            if spec.hi > hi:
                errs.add(f"data.{key}.max", f"{spec.hi} is over data.max_{key} {hi}", f"give a max of at most {hi}")
            if key == "prompt_length":
                plen = spec
            else:
                rlen = spec

    ro = _map(raw, "rollout", ("engine", "free_cache_engine", *ENGINE_FIELDS), errs)
    engine_name = _choice(ro, "engine", "rollout", errs, "vllm", ("vllm", "sglang"))
    free_cache = _bool(ro, "free_cache_engine", "rollout", errs, True)   # verl's rollout.free_cache_engine default true
    for k in INT_FIELDS:
        if k in ro:
            ro[k] = integral(ro[k])     # the resolved tree keeps the whole number (`2.5e2` -> 250)
    eng_kw = {k: v for k, v in ro.items() if k in ENGINE_FIELDS}
    if engine_name == "sglang" and "kernels" not in eng_kw:
        eng_kw["kernels"] = "minimal"      # SGLang's kernel inventory has not been read: one kernel per operator
    engine = None
    try:
        engine = EngineConfig(**eng_kw)
    except Exception as e:      # EngineConfig reports `engine: key: problem; fix` lines
        for line in str(e).splitlines():
            head, _, rest = line.partition(": ")
            key, _, rest = rest.partition(": ")
            prob, _, fix = rest.partition("; ")
            errs.add(f"rollout.{key}", prob or line, fix or "give a value in range")

    pl = _map(raw, "placement", ("kind", "rollout_devices", "staleness", "partial_rollout", "iterations"), errs)
    kind = _choice(pl, "kind", "placement", errs, "colocated", PLACEMENTS)
    staleness = _int(pl, "staleness", "placement", errs, 1, 0, 64)
    partial = _bool(pl, "partial_rollout", "placement", errs, True)
    iters = _int(pl, "iterations", "placement", errs, 3, 1, 10_000)

    rew = _map(raw, "reward", ("kind", "seconds_per_response", "workers", "model", "parallel", "training", "strategy"), errs)
    rkind = _choice(rew, "kind", "reward", errs, "rule", ("rule", "model"))
    reward = {"kind": rkind}
    if rkind == "rule":
        for k in ("model", "parallel"):
            if k in rew:
                errs.add(f"reward.{k}", "only a reward model (kind: model) has one", "remove it or set `reward.kind: model`")
        reward["seconds_per_response"] = _num(rew, "seconds_per_response", "reward", errs, RULE_SECONDS_PER_RESPONSE, 0.0, 60.0)
        reward["workers"] = _int(rew, "workers", "reward", errs, 1, 1, 1 << 20)

    roles_raw = {"actor": raw.get("actor")}
    if "reference" in raw:
        roles_raw["reference"] = raw["reference"]
    if "critic" in raw:
        if estimator != "ppo":
            errs.add("critic", f"estimator {estimator} has no critic", "remove `critic:` or use `algorithm.estimator: ppo`")
        roles_raw["critic"] = raw["critic"]
    for rname, r in roles_raw.items():
        if not isinstance(r, dict):
            errs.add(rname, "expected a mapping", f"write `{rname}: {{parallel: {{tp: 1}}}}`")
            continue
        for k in r:
            if k not in ROLE_KEYS or (k == "model" and rname not in ("critic",)):
                errs.add(f"{rname}.{k}", "unknown key", _close(k, [x for x in ROLE_KEYS if x != "model"]))
    if errs.problems or engine is None:
        return None

    g = _gpn(cluster, network, model_raw, path, errs)
    if g is None:
        return None
    gpn, whole_topo = g
    total = whole_topo.num_devices
    if kind == "colocated":
        if pl.get("rollout_devices") is not None:     # null is "not given", so a compare can pair colocated+null
            errs.add("placement.rollout_devices", "a colocated job runs the rollout on every device",
                     "remove it (or give null) or choose a split placement")
            return None
        rdev, tdev = total, total
    else:
        rdev = _int(pl, "rollout_devices", "placement", errs, None, 1, 1 << 20)
        if rdev is None:
            if pl.get("rollout_devices") is None:
                errs.add("placement.rollout_devices", f"missing for placement {kind}", f"give the rollout pool's devices (fewer than {total})")
            return None
        if rdev >= total:
            errs.add("placement.rollout_devices", f"{rdev} leaves none of the cluster's {total} devices to train",
                     f"give fewer than {total}")
            return None
        tdev = total - rdev
    # Pools are whole nodes, or every node is split alike: verl's trainer.nnodes = rollout.nnodes with
    # trainer.n_gpus_per_node + rollout.n_gpus_per_node = the devices of a node (one_step_off.md,
    # "Resource-constrained scenario"), e.g. 4 rollout + 12 training devices as 2 + 6 on each of 2 nodes.
    train_per_node = gpn
    if kind != "colocated" and rdev % gpn:
        nodes = total // gpn
        if rdev % nodes:
            errs.add("placement.rollout_devices",
                     f"{rdev} devices are neither whole nodes of {gpn} nor the same share of each of the {nodes} nodes",
                     f"give a multiple of {gpn} (whole nodes) or of {nodes} (rollout.n_gpus_per_node x {nodes} nodes, the rest of each node trains)")
            return None
        r_per = rdev // nodes
        train_per_node = gpn - r_per
        if engine.tp > r_per or r_per % engine.tp:
            errs.add("rollout.tp", f"{engine.tp} does not fit the rollout pool's {r_per} devices on each node "
                     f"({rdev} devices split over {nodes} nodes)", f"give a divisor of {r_per}, or whole nodes to the rollout pool")
            return None
    if rdev % engine.tp:
        errs.add("placement.rollout_devices" if kind != "colocated" else "rollout.tp",
                 f"the rollout pool's {rdev} devices are not a multiple of rollout.tp {engine.tp}",
                 "make the pool a multiple of the engine's tp")
        return None
    if engine.tp > gpn and engine.tp % gpn:
        # a replica larger than a node takes whole nodes (its tp collectives then cross the
        # scale-out fabric, which the engine's cost prices from the topology)
        errs.add("rollout.tp", f"{engine.tp} spans more than a node of {gpn} devices but not whole nodes",
                 f"give at most {gpn} or a multiple of {gpn}")
        return None
    engine = dataclasses.replace(engine, dp=rdev // engine.tp)

    # batch checks as verl makes them (verl/workers/fsdp_workers.py normalises ppo_mini_batch_size
    # by n and the dp size; verl/trainer/ppo/ray_trainer.py checks the real batch against dp)
    roles: dict[str, Role] = {}
    for rname, r in roles_raw.items():
        base = {**{k: v for k, v in roles_raw["actor"].items() if k in ("strategy", "parallel", "training", "use_remove_padding")}, **r} \
            if rname == "reference" else r
        strategy = _choice(base, "strategy", rname, errs, "fsdp", ("fsdp", "megatron"))
        mini = _int(base, "ppo_mini_batch_size", rname, errs, tbs, 1, 2 ** 20)
        epochs = _int(base, "ppo_epochs", rname, errs, 1, 1, 1000)
        micro = _int(base, "ppo_micro_batch_size_per_gpu", rname, errs, 1, 1, 65536)
        lp_micro = _int(base, "log_prob_micro_batch_size_per_gpu", rname, errs, micro, 1, 65536)
        dyn = _bool(base, "use_dynamic_bsz", rname, errs, False)
        rmpad = _bool(base, "use_remove_padding", rname, errs, True)
        mtl = _int(base, "ppo_max_token_len_per_gpu", rname, errs, 16384, 1, 2 ** 26)
        lpt = _int(base, "log_prob_max_token_len_per_gpu", rname, errs, mtl, 1, 2 ** 26)
        off = base.get("offload") or {}
        if not isinstance(off, dict) or any(k not in ("params", "optimizer", "grads") or not isinstance(v, bool) for k, v in off.items()):
            errs.add(f"{rname}.offload", "expected {params, optimizer, grads} with true or false", "write e.g. `offload: {params: true}`")
            off = {}
        if None in (strategy, mini, epochs, micro, lp_micro, mtl, lpt) or tbs is None:
            continue
        if kind != "colocated" and any(off.get(k) for k in ("params", "optimizer", "grads")):
            # verl's FSDP / Megatron workers still offload after each pass and load before the next;
            # simtrain times host swaps only around generation on a colocated pool
            warnings.warn(f"{errs.file}: {rname}.offload: "
                          f"{', '.join(k for k in ('params', 'optimizer', 'grads') if off.get(k))} offload on a "
                          f"{kind} placement is not timed: the host copies verl makes around each {rname} pass are "
                          "left out (simtrain times host swaps only around generation on a colocated pool)", stacklevel=2)
        if tbs % mini:
            errs.add(f"{rname}.ppo_mini_batch_size", f"{mini} does not divide data.train_batch_size {tbs}",
                     "give a divisor of train_batch_size (both count prompts)")
            continue
        pool = tdev if kind != "colocated" else total
        mdl = base.get("model", model_raw) if rname == "critic" else model_raw
        t = _template(rname, base, mdl, cluster, network, pool, gpn, path, errs,
                      train_per_node if kind != "colocated" else gpn)
        if t is None:
            continue
        sc, topo = t
        dp = sc.parallel.dp
        if (tbs * n) % dp:
            errs.add("data.train_batch_size", f"train_batch_size x n = {tbs * n} sequences do not split over {rname}'s dp {dp}",
                     f"make train_batch_size x n a multiple of {dp}")
            continue
        if (mini * n) % dp:
            errs.add(f"{rname}.ppo_mini_batch_size", f"ppo_mini_batch_size x n = {mini * n} sequences do not split over dp {dp}",
                     f"make ppo_mini_batch_size x n a multiple of {dp}")
            continue
        if not dyn and (mini * n // dp) % micro:
            errs.add(f"{rname}.ppo_micro_batch_size_per_gpu", f"{micro} does not divide the {mini * n // dp} sequences per GPU of a mini batch",
                     "give a divisor of ppo_mini_batch_size x n / dp, or use_dynamic_bsz: true")
            continue
        if dyn and plen and rlen and mtl < plen.hi + rlen.hi:
            errs.add(f"{rname}.ppo_max_token_len_per_gpu", f"{mtl} is below the longest sequence ({plen.hi + rlen.hi} tokens)",
                     "give at least max_prompt_length + max_response_length")
            continue
        roles[rname] = Role(rname, strategy, sc, topo, mini, epochs, micro, lp_micro, dyn, mtl, lpt,
                            {k: bool(off.get(k, False)) for k in ("params", "optimizer", "grads")},
                            bool(rmpad), (mpl or 0) + (mrl or 0))
    if estimator == "ppo" and "critic" not in roles_raw:
        errs.add("critic", "estimator ppo needs a critic", "add `critic: {parallel: {...}}` (same keys as actor)")
    if rkind == "model":
        mdl = rew.get("model")
        if not isinstance(mdl, dict):
            errs.add("reward.model", "a reward model needs its model", "write e.g. `model: {preset: qwen2.5-7b}`")
        elif tbs:
            t = _template("reward", {"parallel": rew.get("parallel") or {}, "training": rew.get("training") or {},
                                     "strategy": rew.get("strategy", "fsdp")},
                          {k: v for k, v in mdl.items() if k != "seq_length"}, cluster, network,
                          tdev if kind != "colocated" else total, gpn, path, errs,
                          train_per_node if kind != "colocated" else gpn)
            if t is not None:
                sc, topo = t
                roles["reward_model"] = Role("reward_model", rew.get("strategy", "fsdp"), sc, topo, tbs, 1, 1, 1, True,
                                             roles["actor"].log_prob_max_token_len if "actor" in roles else 32768,
                                             roles["actor"].log_prob_max_token_len if "actor" in roles else 32768,
                                             {"params": False, "optimizer": False, "grads": False})
    if errs.problems:
        return None
    if "reference" not in roles:
        a = roles["actor"]
        roles["reference"] = dataclasses.replace(a, name="reference", offload={"params": False, "optimizer": False, "grads": False})
    resolved = copy.deepcopy(raw)
    return RLJob(
        name=name, seed=seed or 0, source_file=str(path), raw=resolved, estimator=estimator, use_kl_loss=use_kl,
        kl_in_reward=kl_rew, adv_seconds_per_token=adv_s, train_batch_size=tbs, n=n, max_prompt_length=mpl,
        max_response_length=mrl, prompt_length=plen, response_length=rlen, engine=engine, engine_name=engine_name,
        free_cache_engine=free_cache, placement=kind, rollout_devices=rdev, train_devices=tdev, total_devices=total,
        staleness=staleness, partial_rollout=partial, iterations=iters, reward=reward, roles=roles,
        rollout_topology=whole_topo, device_name=roles["actor"].scenario.cluster.device)


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def expand_verl(raw: dict, path: Path, errs: Collector) -> dict:
    """A job file's `verl_config:` (a verl trainer YAML or a launch `.sh`, relative to the job file)
    or a bare verl config, turned into the `job: rl` tree by simtrain.rl.verl; the keys written in
    the job file win over the ones read from verl."""
    if raw.get("job") != "rl" and "actor_rollout_ref" in raw:       # a verl config handed over as is
        tree = verl.tree_from_verl(raw, str(path), errs)
        return {"job": "rl", "name": path.stem, **tree}
    ref = raw.get("verl_config")
    if ref is None:
        return raw
    if not isinstance(ref, str):
        errs.add("verl_config", f"expected a path, got {type(ref).__name__}", "give the path of a verl YAML or launch script")
        return raw
    f = path.parent / ref
    if not f.is_file():
        errs.add("verl_config", f"file {ref!r} not found beside the job file", "give a path relative to the job file")
        return raw
    if f.suffix in (".sh", ".bash"):
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            errs.add("verl_config", f"cannot read {ref!r}: {e}", "give a readable text file")
            return raw
        cfg = verl.verl_from_script(text, str(f), errs)
    else:
        cfg = load_yaml(f, errs, "give a verl trainer config (YAML)")
        if not isinstance(cfg, dict):
            errs.add("verl_config", f"{ref!r} is not a mapping", "give a verl trainer config (YAML)")
            return raw
    tree = verl.tree_from_verl(cfg, str(f), errs)
    return _deep_merge(tree, {k: v for k, v in raw.items() if k != "verl_config"})


def load_rl_job(path: str | Path, overrides: Iterable[str] = ()) -> RLJob:
    """Reads a `job: rl` file with `--set` overrides; raises ConfigError with every problem found."""
    return load_rl_tree(path, overrides)[1]


def load_rl_tree(path: str | Path, overrides: Iterable[str] = ()) -> tuple[dict, RLJob]:
    """(the job file's tree after its verl config is expanded and the overrides applied, the job
    built from it); raises ConfigError with every problem found."""
    path = Path(path)
    errs = Collector(str(path))
    raw = load_yaml(path, errs, "check the path: give an existing YAML job file")
    if not isinstance(raw, dict):
        errs.add("", "a job file must be a mapping", "start with `job: rl`")
        errs.raise_if_any()
    raw = expand_verl(raw, path, errs)
    errs.raise_if_any()
    raw = apply_overrides(raw, overrides, errs)
    errs.raise_if_any()
    try:
        job = build_rl_job(raw, path, errs)
        errs.raise_if_any()
    except ConfigError as e:     # a wrong value a --set wrote is named after that --set
        raise attribute_overrides(e, str(path), overrides) from None
    assert job is not None
    return raw, job
