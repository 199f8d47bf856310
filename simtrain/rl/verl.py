"""Reading a verl trainer configuration into the ``job: rl`` scenario tree.

Three entry points:

- :func:`overrides_to_cfg` turns Hydra ``a.b.c=value`` arguments into a nested dict;
- :func:`verl_from_script` pulls those arguments out of a verl launch shell script
  (``python3 -m verl.trainer.main_ppo ...``), resolving plain shell variables and ``$(( ))``
  integer arithmetic on the way;
- :func:`tree_from_verl` maps the nested verl config (``ppo_trainer.yaml`` key names, see
  docs/reference/verl-config.md) onto the ``job: rl`` tree.

Keys that would change the simulated answer but have no counterpart are errors naming them; keys
that do not affect timing (learning rate, logging, file paths, clip ratios...) are listed in one
warning.
"""

from __future__ import annotations

import re
import shlex
import warnings
from pathlib import Path
from typing import Any

from simtrain.errors import Collector

# verl model paths (HF ids or local directories) whose last component names a preset in
# simtrain/data/models.yaml. Matched case-insensitively on the last path component.
_HF_TO_PRESET: dict[str, str] = {
    "qwen2.5-7b": "qwen2.5-7b",
    "qwen2.5-7b-instruct": "qwen2.5-7b",
    "qwen2.5-math-7b": "qwen2.5-math-7b",
    "qwen2.5-math-1.5b": "qwen2.5-math-1.5b",
    "qwen2.5-32b": "qwen2.5-32b",
    "qwen2.5-32b-instruct": "qwen2.5-32b",
    "qwen3-8b": "qwen3-8b",
    "qwen3-8b-base": "qwen3-8b",
    "qwen3-30b-a3b": "qwen3-30b-a3b",
    "qwen3-30b-a3b-base": "qwen3-30b-a3b",
    "deepseek-v3": "deepseek-v3",
    "deepseek-v3-base": "deepseek-v3",
    "deepseek-v3-0324": "deepseek-v3",
    "meta-llama-3-8b": "llama3-8b",
    "meta-llama-3-70b": "llama3-70b",
    "llama-3.1-8b": "llama3-8b",
    "llama-3.1-70b": "llama3-70b",
}

# Keys (dotted, as in ppo_trainer.yaml) whose value does not change iteration timing in the
# simulator: optimiser hyper-parameters, sampling temperatures, paths, logging, loss shapes.
# Prefix match on whole path components.
_IGNORED_PREFIXES: tuple[str, ...] = (
    "data.train_files", "data.val_files", "data.prompt_key", "data.truncation",
    "data.filter_overlong_prompts", "data.return_raw_chat", "data.shuffle", "data.val_batch_size",
    "data.gen_batch_size", "data.dataloader_num_workers", "data.tokenizer",
    "actor_rollout_ref.model.override_config",
    "actor_rollout_ref.model.trust_remote_code", "actor_rollout_ref.model.use_shm",
    "actor_rollout_ref.model.use_fused_kernels", "actor_rollout_ref.model.external_lib",
    "actor_rollout_ref.hybrid_engine",
    "actor_rollout_ref.actor.optim", "actor_rollout_ref.actor.clip_ratio",
    "actor_rollout_ref.actor.clip_ratio_low", "actor_rollout_ref.actor.clip_ratio_high",
    "actor_rollout_ref.actor.clip_ratio_c", "actor_rollout_ref.actor.entropy_coeff",
    "actor_rollout_ref.actor.grad_clip", "actor_rollout_ref.actor.loss_agg_mode",
    "actor_rollout_ref.actor.kl_loss_coef", "actor_rollout_ref.actor.kl_loss_type",
    "actor_rollout_ref.actor.shuffle", "actor_rollout_ref.actor.checkpoint",
    "actor_rollout_ref.actor.fsdp_config.wrap_policy",
    "actor_rollout_ref.actor.policy_loss", "actor_rollout_ref.actor.use_torch_compile",
    "actor_rollout_ref.rollout.temperature", "actor_rollout_ref.rollout.top_p",
    "actor_rollout_ref.rollout.top_k", "actor_rollout_ref.rollout.val_kwargs",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
    "actor_rollout_ref.rollout.do_sample", "actor_rollout_ref.rollout.dtype",
    "actor_rollout_ref.rollout.load_format", "actor_rollout_ref.rollout.mode",
    "actor_rollout_ref.rollout.disable_log_stats", "actor_rollout_ref.rollout.calculate_log_probs",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz",
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size",
    "actor_rollout_ref.ref.fsdp_config.wrap_policy",
    "critic.optim", "critic.cliprange_value", "critic.grad_clip", "critic.checkpoint",
    "critic.model.path", "critic.model.trust_remote_code",
    "critic.model.enable_gradient_checkpointing", "critic.model.override_config",
    "critic.model.tokenizer_path", "critic.loss_agg_mode", "critic.shuffle",
    "algorithm.kl_ctrl", "algorithm.gamma", "algorithm.lam", "algorithm.norm_adv_by_std_in_grpo",
    "reward_model.reward_manager", "reward_model.reward_kwargs", "reward_model.enable",
    "custom_reward_function", "trainer", "ray_init", "ray_kwargs", "global_profiler",
)

# cluster keys handled explicitly; other trainer.* are ignored
_TRAINER_MAPPED = ("trainer.n_gpus_per_node", "trainer.nnodes")

_ESTIMATOR_MAP: dict[str, str] = {
    "grpo": "grpo", "dapo": "dapo", "rloo": "rloo", "reinforce_plus_plus": "reinforce_plus_plus",
    "gae": "ppo",
}

_INTERP = re.compile(r"\$\{([A-Za-z0-9_.]+)\}")


def _flatten(cfg: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in cfg.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _resolve(flat: dict[str, Any], key: str, value: Any, errs: Collector, depth: int = 0) -> Any:
    """Resolve ``${a.b}`` interpolations (whole-value or embedded) against the flat config."""
    if not isinstance(value, str) or "${" not in value:
        return value
    if depth > 10:
        errs.add(key, f"interpolation {value!r} does not terminate", "remove the reference cycle")
        return None
    m = _INTERP.fullmatch(value.strip())
    if m:
        ref = m.group(1)
        if ref not in flat:
            errs.add(key, f"interpolation ${{{ref}}} names no key of the config",
                      "give the value directly or define the referenced key")
            return None
        return _resolve(flat, ref, flat[ref], errs, depth + 1)

    def sub(mm: re.Match[str]) -> str:
        ref = mm.group(1)
        if ref not in flat:
            errs.add(key, f"interpolation ${{{ref}}} names no key of the config",
                     "give the value directly or define the referenced key")
            return ""
        return str(_resolve(flat, ref, flat[ref], errs, depth + 1))

    return _INTERP.sub(sub, value)


def _ignored(key: str) -> bool:
    return any(key == p or key.startswith(p + ".") for p in _IGNORED_PREFIXES)


def _as_bool(v: Any) -> Any:
    if isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    return v


def tree_from_verl(cfg: dict[str, Any], file: str, errs: Collector) -> dict[str, Any]:
    """Map a verl trainer config (nested dict, ppo_trainer.yaml key names) onto a ``job: rl`` tree.

    Values of ``???`` (Hydra's "mandatory, unset") and null are treated as not given. ``cluster``
    receives only ``nodes`` (from ``trainer.nnodes``); device and topology come from the job file.
    """
    raw = _flatten(cfg)
    flat: dict[str, Any] = {}
    for k, v in raw.items():
        v = _resolve(raw, k, v, errs)
        if v is None or v == "???":
            continue
        flat[k] = _as_bool(v)
    used: set[str] = set()
    tree: dict[str, Any] = {"job": "rl"}

    def take(key: str) -> Any:
        if key in flat:
            used.add(key)
            return flat[key]
        return None

    def put(section: dict[str, Any], name: str, key: str, fn: Any = None) -> None:
        v = take(key)
        if v is not None:
            section[name] = fn(v) if fn else v

    # data
    data: dict[str, Any] = {}
    for name in ("train_batch_size", "max_prompt_length", "max_response_length"):
        put(data, name, f"data.{name}")
    put(data, "n", "actor_rollout_ref.rollout.n")
    if data:
        tree["data"] = data

    # algorithm
    alg: dict[str, Any] = {}
    est = take("algorithm.adv_estimator")
    if est is not None:
        if est not in _ESTIMATOR_MAP:
            errs.add("algorithm.adv_estimator", f"estimator {est!r} is not modelled",
                     f"use one of {sorted(_ESTIMATOR_MAP)}")
        else:
            alg["estimator"] = _ESTIMATOR_MAP[est]
    put(alg, "use_kl_loss", "actor_rollout_ref.actor.use_kl_loss")
    put(alg, "kl_in_reward", "algorithm.use_kl_in_reward")
    if alg:
        tree["algorithm"] = alg

    # rollout
    ro: dict[str, Any] = {}
    r = "actor_rollout_ref.rollout."
    put(ro, "engine", r + "name")
    put(ro, "tp", r + "tensor_model_parallel_size")
    put(ro, "ep", r + "expert_parallel_size")
    for name in ("gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens",
                 "free_cache_engine"):
        put(ro, name, r + name)
    put(ro, "chunked_prefill", r + "enable_chunked_prefill")
    put(ro, "cuda_graphs", r + "enforce_eager", lambda v: not v)
    if ro.get("engine") not in (None, "vllm", "sglang"):
        errs.add(r + "name", f"rollout engine {ro['engine']!r} is not modelled", "use vllm or sglang")
    if ro:
        tree["rollout"] = ro

    # cluster
    nodes = take("trainer.nnodes")
    per_node = take("trainer.n_gpus_per_node")
    if nodes is not None:
        tree["cluster"] = {"nodes": nodes}
    # devices per node come from the job's topology; verl's count is read so it is not reported as
    # unsupported, and the spec checks it against the topology where it is given
    del per_node

    # model
    path = take("actor_rollout_ref.model.path")
    if path is not None:
        last = Path(str(path).rstrip("/")).name.lower()
        if last in _HF_TO_PRESET:
            tree["model"] = {"preset": _HF_TO_PRESET[last]}
        else:
            errs.add("actor_rollout_ref.model.path",
                     f"model path {path!r} names no known model preset",
                     "add `model: {preset: ...}` (see `simtrain presets`) or a full model: "
                     "section to the job file")
    put(tree.setdefault("_train", {}), "recompute",
        "actor_rollout_ref.model.enable_gradient_checkpointing")
    rec = tree.pop("_train")

    # actor / critic / reference
    actor = _role(flat, take, "actor_rollout_ref.actor.", errs, critic=False)
    _fsdp_size(take, "actor_rollout_ref.actor.", file)
    _fsdp_size(take, "actor_rollout_ref.ref.", file)
    rmpad = take("actor_rollout_ref.model.use_remove_padding")
    if rmpad is not None:
        actor["use_remove_padding"] = rmpad          # the reference shares the actor's model config
    lp_micro = take(r + "log_prob_micro_batch_size_per_gpu")     # verl's old_log_prob micro batch
    if lp_micro is not None:
        actor["log_prob_micro_batch_size_per_gpu"] = lp_micro
    if "recompute" in rec:
        actor.setdefault("training", {})["recompute"] = "full" if rec["recompute"] else "none"
    lp = take(r + "log_prob_max_token_len_per_gpu")
    lp_ref = take("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu")
    if lp is not None and lp_ref is not None and lp != lp_ref:
        errs.add("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
                 f"{lp_ref} differs from rollout.log_prob_max_token_len_per_gpu ({lp}); simtrain uses "
                 "one budget for the old_log_prob and reference forwards",
                 "give both the same value")
    if lp is None:
        lp = lp_ref
    if lp is not None:
        actor["log_prob_max_token_len_per_gpu"] = lp
    if actor:
        tree["actor"] = actor
    ref: dict[str, Any] = {}
    off = take("actor_rollout_ref.ref.fsdp_config.param_offload")
    if off is None:
        off = take("actor_rollout_ref.ref.megatron.param_offload")
    if off is not None:
        ref["offload"] = {"params": off}
    par = _megatron(take, "actor_rollout_ref.ref.megatron.")
    if par:
        ref["parallel"] = par
    ref_micro = take("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu")
    if ref_micro is not None:
        ref["log_prob_micro_batch_size_per_gpu"] = ref_micro
    if ref:
        tree["reference"] = ref
    if alg.get("estimator") == "ppo":
        critic = _role(flat, take, "critic.", errs, critic=True)
        _fsdp_size(take, "critic.model.", file)
        crm = take("critic.model.use_remove_padding")
        if crm is not None:
            critic["use_remove_padding"] = crm
        if critic:
            tree["critic"] = critic
    else:
        for k in list(flat):
            if k.startswith("critic."):
                used.add(k)  # verl builds no critic without GAE; its keys are inert

    # everything else: ignored (warning) or unsupported (error)
    ignored = sorted(k for k in flat if k not in used and _ignored(k))
    unknown = sorted(k for k in flat if k not in used and not _ignored(k))
    for k in unknown:
        errs.add(k, "this verl key changes iteration timing but has no simtrain counterpart",
                 "remove it from the verl config or express the run in the job file's own keys")
    if ignored:
        warnings.warn(ignored_warning(file, ignored), stacklevel=2)
    return tree


SHOWN_IGNORED = 5     # ignored keys named in the warning; the rest are counted


def ignored_warning(file: str, ignored: list[str]) -> str:
    """One short line: how many verl keys were ignored, the first few, and where the full list is."""
    shown = ", ".join(ignored[:SHOWN_IGNORED])
    more = f" and {len(ignored) - SHOWN_IGNORED} more" if len(ignored) > SHOWN_IGNORED else ""
    return (f"{file}: {len(ignored)} verl key{'s' if len(ignored) != 1 else ''} without effect on the simulated timing "
            f"ignored ({shown}{more}); every ignored key: docs/reference/verl-config.md, 'Keys read but ignored'")


def _fsdp_size(take: Any, prefix: str, file: str) -> None:
    """fsdp_config.fsdp_size: read and, unless -1 (verl's default, shard over every rank), warned about."""
    v = take(prefix + "fsdp_config.fsdp_size")
    if v is None or v == -1:
        return
    warnings.warn(f"{file}: {prefix}fsdp_config.fsdp_size {v}: hybrid sharding (shards of {v} devices, replicated "
                  "across them) is not modelled: simtrain's FSDP plan shards weights, gradients and optimizer state "
                  "over the role's whole data-parallel group (ZeRO-3), so the simulation all-gathers over more devices "
                  "and holds less state per device than the run", stacklevel=3)


def _megatron(take: Any, prefix: str) -> dict[str, Any]:
    par: dict[str, Any] = {}
    for name, key in (("tp", "tensor_model_parallel_size"), ("pp", "pipeline_model_parallel_size"),
                      ("ep", "expert_model_parallel_size"), ("cp", "context_parallel_size")):
        v = take(prefix + key)
        if v is not None:
            par[name] = v
    return par


def _role(flat: dict[str, Any], take: Any, p: str, errs: Collector, critic: bool) -> dict[str, Any]:
    role: dict[str, Any] = {}
    strategy = take(p + "strategy")
    if strategy is not None:
        if strategy in ("fsdp", "fsdp2"):
            role["strategy"] = "fsdp"
        elif strategy == "megatron":
            role["strategy"] = "megatron"
        else:
            errs.add(p + "strategy", f"strategy {strategy!r} is not modelled",
                     "use fsdp, fsdp2 or megatron")
    mb = "ppo_mini_batch_size"
    for name in (mb, "ppo_epochs", "ppo_micro_batch_size_per_gpu", "use_dynamic_bsz",
                 "ppo_max_token_len_per_gpu"):
        v = take(p + name)
        if v is not None:
            role[name] = v
    par = _megatron(take, p + "megatron.")
    sp = take(p + "ulysses_sequence_parallel_size")
    if sp is not None and sp != 1:
        par["cp"] = sp
        par["cp_kind"] = "ulysses"
    if par:
        role["parallel"] = par
    off: dict[str, Any] = {}
    for name, key in (("params", "param_offload"), ("optimizer", "optimizer_offload"),
                      ("grads", "grad_offload")):
        for section in ("fsdp_config.", "megatron."):
            v = take(p + section + key)
            if v is not None:
                off[name] = v
    if off:
        role["offload"] = off
    return role


# ---------------------------------------------------------------------------------------------
# Hydra overrides and launch scripts
# ---------------------------------------------------------------------------------------------

def _scalar(text: str) -> Any:
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        return t[1:-1]
    low = t.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none", "~"):
        return None
    if re.fullmatch(r"[+-]?\d+", t):
        return int(t)
    if re.fullmatch(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?", t):
        return float(t)
    return t


def overrides_to_cfg(args: list[str]) -> dict[str, Any]:
    """Nest Hydra ``a.b.c=value`` arguments; ``+``/``++`` prefixes are dropped, ``~key`` skipped.

    Arguments without ``=`` are not overrides and are skipped.
    """
    cfg: dict[str, Any] = {}
    for arg in args:
        if "=" not in arg or arg.startswith("~"):
            continue
        key, _, value = arg.partition("=")
        key = key.lstrip("+")
        parts = key.split(".")
        node = cfg
        for part in parts[:-1]:
            nxt = node.get(part)
            if not isinstance(nxt, dict):
                nxt = {}
                node[part] = nxt
            node = nxt
        node[parts[-1]] = _scalar(value)
    return cfg


_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_VAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
_MAINS = re.compile(r"(^|\s)-m\s+(verl\.trainer\.main_ppo|[A-Za-z0-9_.]*main[A-Za-z0-9_]*)(\s|$)")


class _Unresolved(Exception):
    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


def _closing(text: str, start: int, open_ch: str, close_ch: str) -> int:
    """Index of the `close_ch` that closes the `open_ch` at `start`, or len(text) when unclosed."""
    depth, j = 0, start
    while j < len(text):
        if text[j] == open_ch:
            depth += 1
        elif text[j] == close_ch:
            depth -= 1
            if depth == 0:
                break
        j += 1
    return j


def _expand(text: str, env: dict[str, str], missing: set[str],
            taint: dict[str, set[str]]) -> str:
    """Expand ``$((...))`` arithmetic and ``${v}``/``${v:-d}``/``$v`` references.

    An unknown variable is recorded in ``missing`` and expands to an empty string.
    """
    out = []
    i = 0
    while i < len(text):
        if text.startswith("$((", i):
            j = _closing(text, i + 1, "(", ")")
            inner = text[i + 3:j - 1]
            out.append(str(_arith(inner, env, missing, taint)))
            i = j + 1
            continue
        if text.startswith("${", i):
            j = _closing(text, i + 1, "{", "}")
            body = text[i + 2:j]
            name, sep, default = body.partition(":-")
            if name in env:
                out.append(env[name])
                missing.update(taint.get(name, ()))
            elif sep:
                if len(default) >= 2 and default[0] == default[-1] and default[0] in "'\"":
                    default = default[1:-1]
                out.append(_expand(default, env, missing, taint))
            else:
                missing.add(name)
            i = j + 1
            continue
        m = _VAR.match(text, i)
        if m:
            name = m.group(1)
            if name in env:
                out.append(env[name])
                missing.update(taint.get(name, ()))
            else:
                missing.add(name)
            i = m.end()
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def _arith(expr: str, env: dict[str, str], missing: set[str],
           taint: dict[str, set[str]]) -> int:
    """Evaluate shell integer arithmetic: + - * / % and parentheses over integers and variables."""
    expanded = _expand(expr, env, missing, taint)

    def bare(m: re.Match[str]) -> str:
        name = m.group(0)
        if name in env:
            missing.update(taint.get(name, ()))
            return env[name]
        missing.add(name)
        return "0"

    expanded = re.sub(r"[A-Za-z_][A-Za-z0-9_]*", bare, expanded)
    if not re.fullmatch(r"[\d\s+\-*/%()]*", expanded):
        raise _Unresolved(expr)
    tokens = re.findall(r"\d+|[+\-*/%()]", expanded)
    pos = 0

    def atom() -> int:
        nonlocal pos
        t = tokens[pos]
        pos += 1
        if t == "(":
            v = add()
            pos += 1
            return v
        if t == "-":
            return -atom()
        return int(t)

    def mul() -> int:
        nonlocal pos
        v = atom()
        while pos < len(tokens) and tokens[pos] in "*/%":
            op = tokens[pos]
            pos += 1
            w = atom()
            if op == "*":
                v *= w
            elif w == 0:
                raise _Unresolved(expr)
            else:
                v = int(v / w) if op == "/" else v - w * int(v / w)
        return v

    def add() -> int:
        nonlocal pos
        v = mul()
        while pos < len(tokens) and tokens[pos] in "+-":
            op = tokens[pos]
            pos += 1
            w = mul()
            v = v + w if op == "+" else v - w
        return v

    if not tokens:
        return 0
    return add()


def _arith_only(text: str, env: dict[str, str], taint: dict[str, set[str]]) -> str:
    """Evaluate the ``$(( ))`` groups of a line (they may hold spaces that would split words)."""
    out = []
    i = 0
    while True:
        k = text.find("$((", i)
        if k < 0:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:k])
        depth, j = 0, k + 1
        while j < len(text):
            if text[j] == "(":
                depth += 1
            elif text[j] == ")":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        missing: set[str] = set()
        try:
            out.append(str(_arith(text[k + 3:j - 1], env, missing, taint)))
        except _Unresolved:
            out.append(text[k:j + 1])
        if missing:
            out.append("${" + sorted(missing)[0] + "}")
        i = j + 1


def _logical_lines(text: str) -> list[str]:
    joined = re.sub(r"\\\r?\n", " ", text)
    lines = []
    for line in joined.splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        lines.append(s)
    return lines


def verl_from_script(text: str, file: str, errs: Collector) -> dict[str, Any]:
    """Extract the verl config a launch script passes to ``main_ppo`` (or a recipe main module).

    Plain ``NAME=value`` assignments before the launch line are evaluated in order (``${V:-d}``
    takes the default ``d``; the environment is not consulted). A variable that stays unresolved in
    a key that matters is an error naming it; in ignored keys (paths, logging) it is harmless.
    """
    env: dict[str, str] = {}
    taint: dict[str, set[str]] = {}
    for line in _logical_lines(text):
        m = _MAINS.search(line)
        if m:
            rest = _arith_only(line[m.end():], env, taint)
            try:
                words = shlex.split(rest, posix=False)
            except ValueError as exc:
                errs.add("(launch line)", f"cannot split the launch command: {exc}",
                         "balance the quotes on the launch line")
                return {}
            args: list[str] = []
            for w in words:
                if "=" not in w or w.startswith("$") or w.startswith("-"):
                    continue
                key, _, value = w.partition("=")
                missing: set[str] = set()
                try:
                    value = _expand(value, env, missing, taint)
                except _Unresolved as exc:
                    errs.add(key.lstrip("+"), f"cannot evaluate shell arithmetic {exc.name!r}",
                             "write the value as a number")
                    continue
                if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                    value = value[1:-1]
                k = key.lstrip("+")
                if missing and not _ignored(k) and not _path_ok(k, value):
                    errs.add(k, "the script leaves shell variable(s) "
                             + ", ".join(sorted(missing)) + " unset",
                             "assign them in the script or give the key in the job file")
                    continue
                args.append(f"{key}={value}")
            return overrides_to_cfg(args)
        am = _ASSIGN.match(line)
        if am:
            name, value = am.group(1), am.group(2).strip()
            missing = set()
            try:
                if len(value) >= 2 and value[0] == "'" and value[-1] == "'":
                    env[name] = value[1:-1]
                else:
                    if len(value) >= 2 and value[0] == '"' and value[-1] == '"':
                        value = value[1:-1]
                    env[name] = _expand(value, env, missing, taint)
            except _Unresolved:
                continue
            # a value built from unknown variables carries them along
            taint[name] = missing
    errs.add("(script)", "no `-m verl.trainer.main_ppo` (or recipe main module) launch line found",
             "point at the script that launches verl, or give the verl config as YAML")
    return {}


def _path_ok(key: str, value: str) -> bool:
    """A model path with an unset prefix is usable when its last component is known."""
    return key == "actor_rollout_ref.model.path" and Path(value.rstrip("/")).name.lower() in _HF_TO_PRESET
