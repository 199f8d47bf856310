"""The phases of one RL iteration, each costed by the simulator of its kind.

    gen             simtrain.rollout.engine.simulate_generation on the rollout pool (replicas = pool / tp)
    reward          rule: seconds_per_response x responses / workers; model: a forward-only pass
    old_log_prob    forward-only passes of the actor's plan over every sequence (training.forward_only)
    ref / values    the same with the reference's / critic's plan
    adv             a driver cost per response token (algorithm.adv_seconds_per_token, assumed)
    update_critic   ppo_epochs x (train_batch_size / ppo_mini_batch_size) optimiser steps, each a
    update_actor    training step of the role's scenario with that mini batch
    update_weights  simtrain.rl.sync: reshard (colocated) or transfer (split pools), plus host swaps

Batching as verl does it (verl/utils/seqlen_balancing.py, docs/reference/verl-config.md): with
use_dynamic_bsz a dp rank's sequences are packed into micro batches of at most max_token_len
tokens: ceil(tokens per rank / max_token_len) of them; without it, ceil(sequences per rank /
micro_batch_size) micro batches: with use_remove_padding (verl's default) of real tokens only, costed as
micro_batch_size sequences of the pass's mean length; without it of sequences padded to
max_prompt_length + max_response_length (verl pads the batch to those). A pass over m micro batches of L tokens is one
training-step simulation with m micro batches per dp rank; a packed micro batch of s sequences is
costed as s sequences of its mean length (tokens exact up to rounding, attention per sequence,
so the spread of lengths inside a micro batch is not seen by the quadratic term); L is rounded up to a multiple of QUANTUM tokens so that passes of
nearby shapes share one simulation (the cache below), which keeps 100 iterations fast.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from simtrain.errors import SimtrainError
from simtrain.rl.spec import RLJob, Role
from simtrain.simulate import simulate

QUANTUM = 64     # tokens: shapes rounded up to a multiple of this (a cache key, about 1 % of a 4K sequence)
VERL_ORDER = ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "update_weights")


@dataclass(frozen=True)
class PassCost:
    seconds: float
    peak_bytes: float          # per device, the busiest rank
    static_bytes: float        # weights + gradients + optimizer state per device (offloadable state)
    weight_bytes: float
    grad_bytes: float
    optimizer_bytes: float
    micro_batches: int


def _ceil_to(x: float, q: int) -> int:
    return int(max(q, q * math.ceil(x / q)))


class PassCache:
    """Training-step simulations of a role, keyed by (role, forward_only, seq_length, micro batch, micro batches)."""

    def __init__(self) -> None:
        self._c: dict = {}
        self.simulations = 0

    def run(self, role: Role, forward_only: bool, seq_len: int, micro: int, per_rank: int) -> PassCost:
        key = (role.name, forward_only, seq_len, micro, per_rank)
        hit = self._c.get(key)
        if hit is not None:
            return hit
        sc = role.scenario
        dp = sc.parallel.dp
        try:
            tr = dataclasses.replace(sc.training, micro_batch_size=micro, global_batch_size=micro * per_rank * dp,
                                     forward_only=forward_only)
        except TypeError as e:
            raise SimtrainError("rl: forward-only passes need training.forward_only (simtrain.workload); "
                                "this build lacks it; update simtrain") from e
        s = dataclasses.replace(sc, model=dataclasses.replace(sc.model, seq_length=seq_len), training=tr)
        r = simulate(s, role.topology).result
        self.simulations += 1
        m = max(r.memory, key=lambda e: e.total)
        out = PassCost(r.step_time_s, r.peak_memory_bytes, m.weights + m.gradients + m.optimizer, m.weights,
                       m.gradients, m.optimizer, per_rank)
        self._c[key] = out
        return out


def pass_over(cache: PassCache, role: Role, seq_tokens: np.ndarray, forward_only: bool) -> PassCost:
    """One pass of `role` over sequences of `seq_tokens` tokens (prompt + response), spread evenly
    over its dp ranks (verl balances sequence lengths over dp ranks, seqlen_balancing.py)."""
    dp = role.scenario.parallel.dp
    n = len(seq_tokens)
    cp = role.scenario.parallel.cp
    if role.dynamic_bsz:
        budget = (role.log_prob_max_token_len if forward_only else role.max_token_len) * cp
        per_rank_tokens = float(seq_tokens.sum()) / dp
        m = max(1, math.ceil(per_rank_tokens / budget))
        spm = max(1, math.ceil(n / dp / m))            # sequences per packed micro batch
        return cache.run(role, forward_only, _ceil_to(per_rank_tokens / (m * spm), QUANTUM), spm, m)
    micro = role.log_prob_micro_batch_size if forward_only else role.micro_batch_size
    m = max(1, math.ceil(n / dp / micro))
    if role.remove_padding:
        # pad tokens removed (verl's use_remove_padding): a micro batch computes its real tokens only,
        # costed as `micro` sequences of the pass's mean length (as a packed one)
        length = float(seq_tokens.sum()) / n
    else:
        # every sequence padded to max_prompt_length + max_response_length (verl's rollout pads the
        # responses to data.max_response_length, the prompts to data.max_prompt_length)
        length = float(max(role.padded_length, int(seq_tokens.max())))
    return cache.run(role, forward_only, _ceil_to(length, QUANTUM), micro, m)


def update(cache: PassCache, role: Role, seq_tokens: np.ndarray, n: int) -> tuple[float, PassCost]:
    """ppo_epochs x mini batches optimiser steps; mini batch i holds prompts [i·mb, (i+1)·mb) x n sequences."""
    per = role.mini_batch_size * n
    total, last = 0.0, None
    for i in range(0, len(seq_tokens), per):
        last = pass_over(cache, role, seq_tokens[i:i + per], False)
        total += last.seconds
    assert last is not None
    return role.epochs * total, last


def reward_seconds(job: RLJob, cache: PassCache, seq_tokens: np.ndarray) -> tuple[float, PassCost | None]:
    if job.reward["kind"] == "rule":
        return job.reward["seconds_per_response"] * len(seq_tokens) / job.reward["workers"], None
    c = pass_over(cache, job.roles["reward_model"], seq_tokens, True)
    return c.seconds, c


def adv_seconds(job: RLJob, response_tokens: int) -> float:
    return job.adv_seconds_per_token * response_tokens
