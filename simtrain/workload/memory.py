"""Memory of a layer on one rank: parameters held and activation bytes stored per microbatch.

Takes the per-rank dimensions (`base.LayerDims`); returns parameter counts (attention with GQA or
MLA, MLP, dense layer, MoE layer split into its dense and expert parts) and stored activation
bytes per layer, for the embedding and for the LM head.

Activation memory follows Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models" (MLSys'23, arXiv:2205.05198), §4, generalised per stored tensor so GQA and
SwiGLU fit; for GPT it reproduces the paper: s·b·h·(34 + 5·a·s/h) bytes per layer without
parallelism, s·b·h·(10 + 24/t + 5·a·s/(h·t)) with TP, s·b·h/t·(34 + 5·a·s/h) with TP+SP, the
score term dropped by selective recompute (or flash attention), 2·s·b·h (/t with SP) for full
recompute.
"""
from __future__ import annotations

from simtrain.spec.scenario import Scenario
from simtrain.workload import fp8
from simtrain.workload.base import LayerDims


def recompute_modes(sc: Scenario, layers: int) -> tuple[tuple[str, ...], int]:
    """What each of a model stage's `layers` (in forward order) recomputes, and how many layers
    one recompute rematerialises at once (the working set of the backward; 0: none recomputed).

    A layer's mode is `none`, `selective`, `full` (recomputed; its input kept) or `inner`
    (recomputed as part of a group whose first layer keeps the group's input: nothing kept).
    recompute: full follows Megatron-LM's --recompute-method (megatron/core/transformer/
    transformer_block.py, _checkpointed_forward), per model stage (each virtual chunk):
      uniform  the layers in consecutive groups of N = recompute_num_layers, each group one
               checkpoint: every layer recomputed, ceil(L/N) inputs kept, N layers alive at once
      block    the first N layers each checkpointed alone, the other L - N keep everything

    >>> from types import SimpleNamespace as N
    >>> t = lambda m, n: N(training=N(recompute="full", recompute_method=m, recompute_num_layers=n))
    >>> recompute_modes(t("uniform", 3), 7)
    (('full', 'inner', 'inner', 'full', 'inner', 'inner', 'full'), 3)
    >>> recompute_modes(t("block", 2), 4)
    (('full', 'full', 'none', 'none'), 1)
    """
    t = sc.training
    if t.recompute != "full":
        return (t.recompute,) * layers, 0
    n = t.recompute_num_layers
    if t.recompute_method == "block":
        return tuple("full" if i < n else "none" for i in range(layers)), (1 if layers and n else 0)
    return tuple("full" if i % n == 0 else "inner" for i in range(layers)), min(n, layers)


def recompute_working(layers: list, group: int) -> float:
    """The transient bytes of a full recompute: the largest run of `group` consecutive recomputed
    layers' whole activations (each (mode, bytes with nothing recomputed), in forward order; a
    group starts at a `full` layer and takes the `inner` ones after it). 0 when nothing is
    recomputed. Example: uniform groups of 2 over layers of 3, 5, 4 bytes -> max(3 + 5, 4) = 8.

    >>> recompute_working([("full", 3.0), ("inner", 5.0), ("full", 4.0)], 2)
    8.0
    """
    best, cur = 0.0, 0.0
    for mode, nbytes in layers:
        if mode == "full":
            cur = nbytes
        elif mode == "inner":
            cur += nbytes
        else:
            cur = 0.0
        best = max(best, cur)
    return best if group else 0.0


class Memory(LayerDims):
    """Parameter and activation counts of one rank's layers."""

    def attention_params(self) -> float:
        """Attention parameters on one tensor-parallel rank (with the layer's norms)."""
        h, t = self.h, self.tp
        if self.mla is not None:
            m, a = self.mla, self.a
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            rep = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank      # kv_down + kv norm
            sh = m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim) + a * m.v_head_dim * h
            if m.q_lora_rank:
                rep += h * m.q_lora_rank + m.q_lora_rank
                sh += m.q_lora_rank * a * qk
            else:
                sh += h * a * qk
            return sh / t + rep + 2 * h                                             # + 2 RMSNorm weights
        kv, q = self.g * self.d, self.a * self.d                # q = h unless head_dim is given
        attn = h * (q + 2 * kv) + q * h                        # QKV, output projection
        if self.gpt:
            return attn / t + (q + 2 * kv) / t + 4 * h + h     # QKV bias; 2 LayerNorms; row bias (attn out)
        return attn / t + 2 * h + (2 * self.d if self.qk_norm else 0)    # + Qwen3's per-head q and k norm weights

    def mlp_params(self, width: float) -> float:
        h, t = self.h, self.tp
        if self.gpt:
            return 2 * h * width / t + width / t + h          # column bias (fc1) and row bias (fc2)
        return 3 * h * width / t

    def layer_params(self) -> float:
        """A dense layer on one tensor-parallel rank."""
        return self.attention_params() + self.mlp_params(self.f)

    def moe_params(self) -> tuple:
        """(dense part, expert part) of an MoE layer on one rank: attention, router and shared
        experts are reduced over dp; the E/ep local experts, each split over etp, over edp."""
        moe, h = self.moe, self.h
        dense = self.attention_params() + moe.num_experts * h
        if moe.shared_expert_ffn_hidden_size:
            dense += self.mlp_params(moe.shared_expert_ffn_hidden_size)
            if moe.shared_expert_gate:
                dense += h
        per_expert = (2 * h * moe.expert_ffn_hidden_size + moe.expert_ffn_hidden_size + h) if self.gpt else 3 * h * moe.expert_ffn_hidden_size
        expert = moe.num_experts / self.ep * per_expert / self.etp
        return dense, expert

    def act_per_layer(self, recompute: str, kind: str = "dense", rows: float = 0.0, send: float = 0.0) -> float:
        """Stored bytes per layer per microbatch (see module docstring for the derivation). For an
        MoE layer, `rows` are `moe_tokens`' grouped-GEMM rows (`send`, the dispatched assignments, keeps nothing).
        With recompute `selective`, training.recompute_modules says what is not kept (Megatron-core
        names): core_attn the attention scores (already none with flash attention), layernorm the
        norm outputs, mla_up_proj MLA's Q, K and V (rebuilt from the kept latents), moe_act the
        experts' activation output (rebuilt from its kept input)."""
        s, b, h, t, f, a = self.s // self.cp, self.b, self.h, self.tp, self.f, self.a
        seq_div = t if self.sp else 1
        if recompute == "inner":
            return 0.0                                   # inside a checkpointed group: nothing kept
        if recompute == "full":
            return 2 * s * b * h / seq_div
        if recompute == "op":
            return s * b * self.op_kept()
        mods = set(self.sc.training.recompute_modules) if recompute == "selective" else set()
        drop = 1 if self.gpt else 0
        norm_out = 0 if "layernorm" in mods else 1
        # FP8 (Transformer Engine): a TE linear keeps its input for the weight gradient as the
        # quantized columnwise copy, `fp8.stored_bytes` per value instead of 2
        xb = fp8.stored_bytes(self.fp8_recipe) if self.fp8 else 2
        # the MLP input of an MoE layer also feeds the 16-bit router, so it stays 16-bit
        mlp_in = 2 if kind == "moe" else xb
        # sequence-region tensors: norm inputs (2x 2h), their outputs (the QKV input 2h, the MLP
        # input 2h), dropout masks (2x h)
        seq = (2 * h + 2 * h + norm_out * (xb * h + mlp_in * h) + 2 * drop * h) / seq_div
        # MLP: the activation's input (fc1 output: f wide for GeLU, gate and up 2f for SwiGLU), in
        # FP8 with activation_fp8_input_store, and its output (fc2's input, 2f)
        fc1_b = 1 if self.sc.training.activation_fp8_input_store else 2
        width = self.moe.shared_expert_ffn_hidden_size if kind == "moe" else f
        mlp = fc1_b * (1 if self.gpt else 2) * width + xb * width
        if self.mla is None:
            # tensor-parallel region: Q (2·a·d, i.e. 2h unless head_dim is given), K and V
            # (2·g·d each), attention output 2·a·d, MLP internals
            q, kv = a * self.d, self.g * self.d
            tpr = (2 * q + 4 * kv + xb * q + mlp) / t
            if self.qk_norm:
                tpr += 2 * (q + kv) / t                        # Q and K before their norms (the norms' inputs)
        else:
            # MLA (DeepSeek-V2 §2.1.2) as the flash kernel sees it: per head Q and K of
            # qk_nope + qk_rope, V and the output of v_head_dim (the output is also attn_out's
            # input); the latents on every tp rank: the q_down output (q_norm's input, 2·q_lora),
            # the kv_down output (kv_norm's input and the shared rotary key, 2·(kv_lora + rope))
            # and the norms' outputs (the up-projections' inputs)
            m = self.mla
            qk, v = a * (m.qk_nope_head_dim + m.qk_rope_head_dim), a * m.v_head_dim
            qkv = 0 if "mla_up_proj" in mods else 2 * qk + 2 * qk + 2 * v
            ql = m.q_lora_rank or 0
            tpr = (qkv + xb * v + mlp) / t + 2 * ql + 2 * (m.kv_lora_rank + m.qk_rope_head_dim) + norm_out * (xb * ql + xb * m.kv_lora_rank)
        if self.flash:
            scores = 4 * a / t                                 # fp32 log-sum-exp per (head, query): 4·a·s·b/t bytes
        elif recompute == "selective" and "core_attn" in mods:
            scores = 0.0
        else:
            scores = (5 if drop else 2) * a * s / t           # s·b·5·a·s = 5·a·s²·b bytes (Korthikanti)
        out = s * b * (seq + tpr + scores)
        if kind == "moe":
            moe = self.moe
            width = moe.expert_ffn_hidden_size / self.etp
            # routed experts per row: gathered input (2h; with FP8 dispatch the FP8 tokens as they
            # arrive, 1 byte + one fp32 scale per 128 values, DeepSeek-V3 §3.3.2), fc1 output
            # (the activation's input), the activation's output and its fp32 routing weight:
            # Megatron-core applies the routing weights inside the experts' activation
            # (TEGroupedMLP: weighted_bias_swiglu_impl with permuted_probs), so the combine is a
            # plain sum that keeps nothing; and the fp32 router probabilities per token
            xin = h * (1 + 4 / 128) if moe.dispatch_precision == "fp8" else xb * h
            act_out = 0 if "moe_act" in mods else xb * width
            fc1_out = fc1_b * (1 if self.gpt else 2) * width
            out += rows * (xin + fc1_out + act_out + 4) + 4 * (s * b / seq_div) * moe.num_experts
        return out

    def op_kept(self) -> float:
        """Bytes per token one layer keeps under torchtitan's op-level selective checkpointing
        (`LayerBuilder.op_recompute`): the layer's input (the checkpoint's own), the outputs of
        the kept matmuls, 16-bit: wq (a·d/t), wv (g·d/t), w1 or GeLU's fc1 (f/t) and the down
        projection (h: a row-parallel matmul's output is the full partial sum before its
        reduce-scatter), the attention kernel's output (a·d/t) with its fp32 log-sum-exp (one
        per head), and with sequence parallelism the two reduce-scatters' outputs (h/t each);
        with FP8 also wk, wo and w3, whose scaled matmuls are kept too.

        >>> from types import SimpleNamespace as N
        >>> d = N(h=4096, tp=1, sp=False, a=32, g=8, d=128, f=14336, fp8=False)      # Llama 3 8B, no TP
        >>> Memory.op_kept(d)        # 2·4096 + 2·(4096 + 1024 + 4096 + 14336) + 4·32 + 2·4096
        63616.0
        """
        h, t, a = self.h, self.tp, self.a
        q, kv = a * self.d, self.g * self.d
        seq_div = t if self.sp else 1
        rs = 2 * (2 * h / t) if self.sp else 0.0
        # FP8: every linear is a scaled matmul and kept (wk, wo and w3 as well)
        extra = 2 * (kv + self.f) / t + 2 * h if self.fp8 else 0.0
        return 2 * h / seq_div + 2 * (q + kv + q + self.f) / t + 4 * a / t + 2 * h + rs + extra

    def act_pre(self) -> float:
        return (self.T * self.h / (self.tp if self.sp else 1)) if self.gpt else 0.0   # embedding dropout mask

    def act_post(self) -> float:
        return 4.0 * self.T * self.V / self.tp      # Korthikanti §4.1: output layer + loss, 4sbv/t

    def loss_working(self) -> float:
        """Bytes the loss's backward holds beside the kept fp32 logits (4 per logit, `act_post`).
        megatron: Megatron-core's _VocabParallelCrossEntropy turns the kept softmax into the
        gradient in place; the cast back to the 16-bit logits' dtype adds 2 bytes per logit.
        torch: F.cross_entropy(logits.float()) is log_softmax then nll_loss (ATen); the backward
        holds the kept log-probabilities (fp32), nll_loss's gradient (a new fp32 tensor of the
        logits' shape) and log_softmax's gradient (another): 8 bytes per logit more. Logits: this
        rank's tokens x vocabulary / tp."""
        per = 8.0 if self.sc.training.loss_kernel == "torch" else 2.0
        return per * self.T * self.V / self.tp
