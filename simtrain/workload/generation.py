"""Generation workload: one inference-engine iteration (prefill chunks and decode steps of a
running batch) as per-layer operators on one tensor-parallel rank.

Takes a `ModelSpec` (the same model definitions as training: dense, GQA, MLA, MoE), the rollout
engine's tp and ep and the numeric formats of weights and KV cache; returns, for one scheduler
iteration described by a `Batch`, the operator items of each distinct layer kind with their
multiplicity (`GenerationDims.step_items`), in the operator IR of `ir` (`Op`, `Comm`), plus the
memory terms the engine's KV-cache sizing needs (weights per rank, KV bytes per token).

What each operator costs (per rank, T = tokens computed this iteration = decode tokens + prefill
chunk tokens, h hidden, heads_l = a/tp query heads, kv_l = max(g/tp, 1) KV heads, d head dim):

  GEMM       m x n x k with m = T: FLOPs 2·T·n·k; bytes = weight bytes n·k·w (read once per
             iteration for the whole batch: decode GEMMs are memory-bound at small T) + 16-bit
             activations 2·T·(k + n). Prefill chunks make T large, so they are compute-bound.
  attention  decode: every running sequence reads its whole KV cache, per layer
             2·kv_l·d·kvb bytes per cached token (MLA: the latent kv_lora_rank + qk_rope_head_dim,
             replicated on every tp rank); FLOPs 2·heads_l·(qk + v)·ctx per sequence. Prefill of a
             chunk of n tokens after c cached ones: n·c + n(n+1)/2 query-key pairs (causal), FLOPs
             2·heads_l·(qk + v)·pairs.
  MoE        router (replicated), the experts a batch touches: with T tokens picking top_k of E
             experts, E·(1 - (1 - k/E)^T) experts expected to receive a token; their weights are
             read once; FLOPs 2·T·k·3·h·f_e (split over ep ranks, or each expert's width over tp).
  comms      Megatron-style tp: all-reduce of 2·T·h bytes after attention and after the MLP;
             with ep == tp the expert outputs are combined by the same all-reduce (hidden states
             are replicated after attention, so no dispatch is needed); logits all-gathered over
             tp for the S sequences that sample.
Worked example (Llama-2-7B dims, tp 1, bf16, one decode token of one sequence with 1,000 cached
tokens): a layer's GEMM weights are 4h² + 3·h·f = 4·4096² + 3·4096·11008 = 202.4 M parameters
(405 MB), its KV read 2·32·128·2 B x 1,001 tokens = 16.4 MB, so a decode step is dominated by the
32 x 405 MB of weights plus the 131 MB LM head.
"""
from __future__ import annotations

from dataclasses import dataclass

from simtrain.spec.scenario import ModelSpec
from simtrain.workload.ir import ACT_BYTES, Comm, Op

DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5}


@dataclass(frozen=True)
class KernelInventory:
    """How many kernels an engine launches for the small steps of a layer, where it does not fuse
    them into one. `qk_norm`: kernels per q_norm (and per k_norm) of a Qwen3 layer; `cache_write`:
    the new tokens' K and V written into the paged cache by a kernel of its own (vLLM's
    `reshape_and_cache_flash`, `concat_and_cache_mla` for MLA); `router_cast`: the router logits
    cast to fp32 by a kernel before the top-k kernel; `renorm`: kernels after it that renormalize
    the top-k weights (a sum and a divide); `align`: kernels that sort the token-expert pairs by expert
    for the fused-MoE GEMMs (`moe_align_block_size`, with the fills before it). They matter when
    the engine runs eagerly, where the host issues every kernel (`EngineConfig.launch_overhead_s`)."""
    qk_norm: int = 1
    cache_write: bool = False
    router_cast: bool = False
    renorm: int = 0
    align: int = 0


KERNEL_INVENTORIES = {
    # one kernel per operator of this module (the count before any engine's inventory was read)
    "minimal": KernelInventory(),
    # vLLM, counted from the source of the released packages (Qwen3-MoE in eager mode, the Triton
    # fused-MoE path, tp > 1; vllm/model_executor/models/qwen3_moe.py, layers/fused_moe/fused_moe.py,
    # csrc/moe/moe_align_sum_kernels.cu, _custom_ops.py):
    #   0.8.5: q_norm and k_norm are the PyTorch RMSNorm, 8 kernels each (cast to fp32, pow, mean,
    #          add eps, rsqrt, multiply, cast back, multiply by the weight); align = sorted_ids
    #          fill, expert_ids zeros and one align kernel;
    #   0.9.2: ops.rms_norm over a strided view, so a contiguous copy and the norm kernel; align =
    #          the two fills, a cumsum zero, the align kernel and a sort kernel;
    #   0.10.1: the same norms; align = the align and sort kernels (the padding fill moved inside).
    # Every one casts the router logits to fp32 and renormalizes the top-k weights by a separate
    # sum and divide, and writes the KV cache with a kernel of its own.
    "vllm-0.8.5": KernelInventory(qk_norm=8, cache_write=True, router_cast=True, renorm=2, align=3),
    "vllm-0.9.2": KernelInventory(qk_norm=2, cache_write=True, router_cast=True, renorm=2, align=5),
    "vllm-0.10.1": KernelInventory(qk_norm=2, cache_write=True, router_cast=True, renorm=2, align=2),
}


@dataclass(frozen=True)
class Batch:
    """What one iteration computes: `decode` sequences taking one token each with `decode_ctx`
    cached-plus-new tokens in all (sum over sequences of the tokens whose KV is read), prefill
    chunks as (cached tokens before the chunk, chunk tokens), and `sampled` sequences that
    produce a token this iteration (every decode one, and each prefill whose chunk completes it)."""
    decode: int = 0
    decode_ctx: float = 0.0
    prefill: tuple = ()
    sampled: int = 0

    @property
    def tokens(self) -> int:
        return self.decode + sum(n for _, n in self.prefill)

    @property
    def seqs(self) -> int:
        return self.decode + len(self.prefill)


class GenerationDims:
    """One tensor-parallel rank's view of a model served by an inference engine."""

    def __init__(self, model: ModelSpec, tp: int = 1, ep: int = 1, weight_dtype: str = "bf16",
                 kv_dtype: str = "bf16", compute_dtype: str | None = None, kernels: str = "minimal"):
        if ep not in (1, tp):
            raise ValueError(f"ep {ep}: the engine's expert parallelism spans its tp group (ep 1 or ep = tp = {tp})")
        if ep > 1 and model.moe is None:
            raise ValueError("ep > 1 needs a mixture-of-experts model")
        self.model, self.tp, self.ep = model, tp, ep
        self.inv = KERNEL_INVENTORIES[kernels]
        self.wb = DTYPE_BYTES[weight_dtype]
        self.kvb = DTYPE_BYTES[kv_dtype]
        self.compute_dtype = compute_dtype or ("fp8" if weight_dtype == "fp8" else "bf16")
        m = model
        self.L, self.h, self.a, self.g, self.d = m.num_layers, m.hidden_size, m.num_attention_heads, m.num_key_value_heads, m.head_dim
        self.f, self.V = m.ffn_hidden_size, m.vocab_size
        self.gpt = m.architecture == "gpt"
        self.mla, self.moe = m.mla, m.moe
        self.qk_norm = m.qk_norm and m.mla is None
        self.heads = self.a / tp
        self.kv_heads = max(self.g / tp, 1.0)        # a KV head is replicated when tp > g (vLLM, TRT-LLM)
        if self.mla is not None:
            self.qk_dim = self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim
            self.v_dim = self.mla.v_head_dim
        else:
            self.qk_dim = self.v_dim = self.d
        self.kinds = tuple("moe" if self.moe is not None and self.moe.is_moe_layer(i) else "dense" for i in range(self.L))

    # -- memory -------------------------------------------------------------------------------

    def kv_bytes_per_token_layer(self) -> float:
        """KV-cache bytes one token occupies in one layer on one rank (GQA: K and V of kv_l
        heads; MLA: the compressed latent and the shared rotary key, on every tp rank)."""
        if self.mla is not None:
            return (self.mla.kv_lora_rank + self.mla.qk_rope_head_dim) * self.kvb
        return 2.0 * self.kv_heads * self.d * self.kvb

    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes of one token over all layers on one rank."""
        return self.L * self.kv_bytes_per_token_layer()

    def attention_params(self) -> float:
        """Parameters of one layer's attention on one rank (norm excluded)."""
        h = self.h
        if self.mla is None:
            return h * (self.heads + 2 * self.kv_heads) * self.d + self.heads * self.d * h
        m = self.mla
        q = (h * m.q_lora_rank + m.q_lora_rank * self.heads * self.qk_dim) if m.q_lora_rank else h * self.heads * self.qk_dim
        kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * self.heads * (m.qk_nope_head_dim + m.v_head_dim)
        return q + kv + self.heads * self.v_dim * h

    def mlp_params(self, kind: str) -> float:
        """Parameters of one layer's MLP on one rank (dense: gate/up/down split over tp; MoE:
        router, the rank's share of the routed experts and the shared experts)."""
        h = self.h
        per_w = 2 if self.gpt else 3               # fc1, fc2 (GPT) or gate, up, down (SwiGLU)
        if kind == "dense":
            return per_w * h * self.f / self.tp
        moe = self.moe
        experts = moe.num_experts * per_w * h * moe.expert_ffn_hidden_size / self.tp   # ep or expert-tp: 1/tp either way
        shared = per_w * h * moe.shared_expert_ffn_hidden_size / self.tp
        return h * moe.num_experts + experts + shared

    def weight_params(self) -> float:
        """Parameters held by one rank: layers, embedding and LM head (vocabulary split over tp)."""
        layers = sum(self.attention_params() + self.mlp_params(k) for k in self.kinds)
        emb = self.V * self.h / self.tp
        head = 0.0 if self.model.tie_embeddings else self.V * self.h / self.tp
        return layers + emb + head

    def weight_bytes(self) -> float:
        return self.weight_params() * self.wb

    def workspace_bytes(self, max_tokens: int, max_seqs: int) -> float:
        """Transient activation memory of the largest iteration (what vLLM's profile run finds):
        one layer's widest live tensors for `max_tokens` tokens in 16 bits (the hidden state and
        residual, QKV, the MLP's gate/up output and its activation) and the fp32 logits of
        `max_seqs` sampled rows. An estimate, not a measurement."""
        width = self.moe.expert_ffn_hidden_size * self.moe.top_k if self.moe is not None else self.f
        per_token = 2 * self.h + (self.heads + 2 * self.kv_heads) * self.d + 3 * width / self.tp
        return ACT_BYTES * max_tokens * per_token + 4.0 * max_seqs * self.V / self.tp

    # -- operators ----------------------------------------------------------------------------

    def gemm(self, name: str, m: float, n: float, k: float, weights: float | None = None) -> Op:
        """A GEMM of m rows (tokens) against an n x k weight: FLOPs 2mnk; bytes = the weights
        (`weights` elements, default n·k) read once in their format + 16-bit activations in and out."""
        w = n * k if weights is None else weights
        return Op(name, "gemm", "F", 2.0 * m * n * k, self.wb * w + ACT_BYTES * m * (k + n), (m, n, k), 2.0 * m * n * k)

    @staticmethod
    def mem(name: str, nbytes: float) -> Op:
        return Op(name, "memory", "F", 0.0, nbytes)

    def attention_ops(self, b: Batch) -> tuple:
        """The attention kernels of one layer: decode over every running sequence's KV cache (a
        memory-bound Op of kind `memory` carrying its FLOPs) and one causal prefill kernel over
        the chunks (kind `attention`, shape (longest context, causal))."""
        out = []
        per = self.qk_dim + self.v_dim
        if b.decode:
            kv = b.decode_ctx * self.kv_bytes_per_token_layer()
            qo = ACT_BYTES * b.decode * self.heads * per
            if self.mla is not None:       # absorbed MLA decode: queries against the latent (qk: latent + rope, v: latent)
                fl = 2.0 * self.heads * b.decode_ctx * (2 * self.mla.kv_lora_rank + self.mla.qk_rope_head_dim)
            else:
                fl = 2.0 * self.heads * b.decode_ctx * per
            out.append(Op("decode_attn", "memory", "F", fl, kv + qo, (b.decode_ctx / b.decode, False)))
        if b.prefill:
            pairs = sum(n * c + n * (n + 1) / 2 for c, n in b.prefill)
            ctx = max(c + n for c, n in b.prefill)
            fl = 2.0 * self.heads * per * pairs
            io = sum(ACT_BYTES * n * self.heads * per + (c + n) * self.kv_bytes_per_token_layer() for c, n in b.prefill)
            out.append(Op("prefill_attn", "attention", "F", fl, io, (ctx, True), fl))
        return tuple(out)

    def _tp_ar(self, T: float, name: str) -> Comm | None:
        return Comm("tp", "all_reduce", ACT_BYTES * T * self.h, name) if self.tp > 1 else None

    def attention_block(self, b: Batch) -> list:
        T, h = b.tokens, self.h
        act = ACT_BYTES
        norm = self._norm(T, 1)
        if self.mla is None:
            proj = [self.gemm("qkv", T, (self.heads + 2 * self.kv_heads) * self.d, h)]
        else:
            m = self.mla
            proj = []
            if m.q_lora_rank:
                proj += [self.gemm("q_down", T, m.q_lora_rank, h), self.gemm("q_up", T, self.heads * self.qk_dim, m.q_lora_rank)]
            else:
                proj += [self.gemm("q_proj", T, self.heads * self.qk_dim, h)]
            proj += [self.gemm("kv_down", T, m.kv_lora_rank + m.qk_rope_head_dim, h),
                     # absorbed (decode) or expanding (prefill) use of W_UK and W_UV: read once, T rows
                     self.gemm("kv_up", T, self.heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank)]
        rope = () if self.gpt else (self.mem("rotary", 2 * act * T * (self.heads + self.kv_heads) * self.d),)
        if self.qk_norm:
            # Qwen3's q_norm and k_norm: one RMSNorm kernel each over the rank's Q and K heads, or
            # the engine's chain of kernels (each read as moving the tensor once in and once out)
            rope = (*self._chain("q_norm", T * self.heads * self.d), *self._chain("k_norm", T * self.kv_heads * self.d)) + rope
        if self.inv.cache_write:
            # the new tokens' K and V (or MLA latent) read and written into their cache blocks
            rope += (self.mem("kv_cache_write", 2 * T * self.kv_bytes_per_token_layer()),)
        out = self.gemm("o_proj", T, h, self.heads * self.v_dim)
        seg = (norm, *proj, *rope, *self.attention_ops(b), out)
        items: list = [seg]
        ar = self._tp_ar(T, "tp_ar_attn")
        if ar is not None:
            items.append(ar)
        if self.gpt:
            items.append((self.mem("residual_add1", 3 * act * T * h),))
        return items

    def _chain(self, name: str, elems: float) -> tuple:
        """A per-head RMSNorm over `elems` 16-bit elements: one fused kernel, or the inventory's
        `qk_norm` kernels, each moving the tensor in and out once (an approximation: the PyTorch
        chain's fp32 intermediates are wider, its scalar steps narrower)."""
        n = self.inv.qk_norm
        if n == 1:
            return (self.mem(name, 2 * ACT_BYTES * elems),)
        return tuple(self.mem(f"{name}.{j}", 2 * ACT_BYTES * elems) for j in range(n))

    def _norm(self, T: float, i: int) -> Op:
        """The norm opening half `i` of a layer. GPT: a LayerNorm (read and write T·h), its
        residual add a kernel of its own. RMSNorm models: the engines' fused residual add and
        RMSNorm, one kernel reading the hidden state and the residual and writing both (vLLM's
        and SGLang's RMSNorm with a residual call `fused_add_rms_norm`): the residual add closing
        each half is folded into the norm opening the next. The first layer's norm has no residual
        to add and the final norm has one; counting every layer's norms as fused keeps the kernel
        count exact and the bytes within 2·T·h of the real ones over the whole model."""
        if self.gpt:
            return self.mem(f"layernorm{i}", 2 * ACT_BYTES * T * self.h)
        return self.mem(f"add_rmsnorm{i}", 4 * ACT_BYTES * T * self.h)

    def mlp_block(self, b: Batch, kind: str) -> list:
        T, h, act = b.tokens, self.h, ACT_BYTES
        ops = [self._norm(T, 2)]
        if kind == "dense":
            ops += self._ffn(T, self.f / self.tp, "")
        else:
            moe = self.moe
            E, k, fe = moe.num_experts, moe.top_k, moe.expert_ffn_hidden_size
            ops.append(self.gemm("router", T, E, h))
            inv = self.inv
            if inv.router_cast:       # fp32 cast of the logits: read 16-bit, write fp32
                ops.append(self.mem("router_cast", (ACT_BYTES + 4) * T * E))
            ops.append(self.mem("router_topk", 3 * 4 * T * E))
            # the top-k weights renormalized: a sum and a divide over T x k fp32
            ops += [self.mem(f"router_renorm.{j}", 4 * T * (k + 1)) for j in range(inv.renorm)]
            # sorting token-expert pairs by expert: int32 ids in and out, padded per expert
            ops += [self.mem(f"moe_align.{j}", 4 * (2 * T * k + E)) for j in range(inv.align)]
            touched = touched_experts(E, k, T)                 # experts receiving at least one token
            local = touched / self.ep
            width = fe / (self.tp // self.ep)                  # expert-tp when ep = 1; whole experts when ep = tp
            rows = T * k / self.ep                             # token-expert rows on this rank (uniform routing)
            per_w = 2 if self.gpt else 3
            up_n = width * (per_w - 1)
            ops.append(Op("experts.gate_up", "gemm", "F", 2.0 * rows * up_n * h,
                          self.wb * local * up_n * h + ACT_BYTES * rows * (h + up_n), (rows / max(local, 1.0), up_n, h), 2.0 * rows * up_n * h))
            ops.append(self.mem("experts.act", 3 * act * rows * width))
            ops.append(Op("experts.down", "gemm", "F", 2.0 * rows * width * h,
                          self.wb * local * width * h + ACT_BYTES * rows * (h + width), (rows / max(local, 1.0), h, width), 2.0 * rows * width * h))
            ops.append(self.mem("moe_combine", act * (2 * rows * h + T * h)))
            if moe.shared_expert_ffn_hidden_size:
                ops += self._ffn(T, moe.shared_expert_ffn_hidden_size / self.tp, "shared.")
        items: list = [tuple(ops)]
        ar = self._tp_ar(T, "tp_ar_mlp")
        if ar is not None:
            items.append(ar)
        if self.gpt:
            items.append((self.mem("residual_add2", 3 * act * T * h),))
        return items

    def _ffn(self, T: float, width: float, prefix: str) -> list:
        h, act = self.h, ACT_BYTES
        if self.gpt:
            return [self.gemm(prefix + "fc1", T, width, h), self.mem(prefix + "gelu", 2 * act * T * width),
                    self.gemm(prefix + "fc2", T, h, width)]
        return [self.gemm(prefix + "gate_up", T, 2 * width, h), self.mem(prefix + "silu_mul", 3 * act * T * width),
                self.gemm(prefix + "down", T, h, width)]

    def head_items(self, b: Batch) -> list:
        """Embedding lookup, final norm and the LM head for the S sampled rows, logits gathered
        over tp, and the sampler (fp32 softmax over the vocabulary)."""
        T, h, S = b.tokens, self.h, b.sampled
        items: list = [(self.mem("embedding", ACT_BYTES * T * h), self.mem("final_norm", 2 * ACT_BYTES * S * h),
                        self.gemm("lm_head", S, self.V / self.tp, h))]
        if self.tp > 1 and S:
            items.append(Comm("tp", "all_gather", ACT_BYTES * S * self.V, "tp_logits_ag"))
        items.append((self.mem("sampler", 3 * 4 * S * self.V),))
        return items

    def step_items(self, b: Batch) -> tuple:
        """((count, items), ...): the items of each distinct layer kind with how many layers have
        it, then the embedding/head items once."""
        counts: dict = {}
        for k in self.kinds:
            counts[k] = counts.get(k, 0) + 1
        out = []
        for kind in ("dense", "moe"):
            if counts.get(kind):
                out.append((counts[kind], tuple(self.attention_block(b) + self.mlp_block(b, kind))))
        out.append((1, tuple(self.head_items(b))))
        return tuple(out)

    def prefill_flops(self, tokens: int, cached: int = 0) -> float:
        """FLOPs of a prefill chunk (all layers, the LM head on its last token): the GEMMs'
        2·(layer parameters)·tokens, plus attention 2·heads_l·(qk + v)·pairs per layer."""
        b = Batch(prefill=((cached, tokens),), sampled=1)
        tot = 0.0
        for count, items in self.step_items(b):
            for it in items:
                if isinstance(it, tuple):
                    tot += count * sum(o.flops for o in it)
        return tot


def touched_experts(num_experts: int, top_k: int, tokens: float) -> float:
    """Expected experts receiving at least one of `tokens` tokens under uniform top-k routing:
    E·(1 - (1 - k/E)^T). Worked example (E 8, k 2, T 1): 2; T 4: 8·(1 - 0.75^4) = 5.47.

    >>> touched_experts(8, 2, 1)
    2.0
    >>> round(touched_experts(8, 2, 4), 2)
    5.47
    """
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def blocks_for(tokens: int, block_size: int) -> int:
    """Paged-KV blocks holding `tokens` tokens.

    >>> blocks_for(33, 16)
    3
    """
    return -(-tokens // block_size) if tokens > 0 else 0
