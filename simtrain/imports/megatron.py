"""Megatron-LM arguments -> a scenario tree.

Input: a launch script (bash; the `torchrun ... pretrain_gpt.py ARGS` line is found and its
variables, arrays and continuations are evaluated by simtrain.imports.shell) or a plain argument
string. The world size is torchrun's `--nnodes` x `--nproc-per-node` (or `--world-size`).

Derived as Megatron derives them (megatron/training/arguments.py):
- dp = world / (tp x pp x cp);
- microbatches per step = global batch / (micro batch x dp); without --global-batch-size
  the global batch is micro batch x dp;
- --num-layers-per-virtual-pipeline-stage n: model chunks per rank = num_layers / (pp x n);
- --ffn-hidden-size defaults to 4 x hidden (with --swiglu: int(8 x hidden / 3 / 64) x 64);
- --num-query-groups counts only with --group-query-attention;
- the expert tensor-parallel size defaults to the tensor-parallel size;
- the input and output embeddings are tied unless --untie-embeddings-and-output-weights;
- gradient reduction and parameter gathering are overlapped only when asked
  (--overlap-grad-reduce, --overlap-param-gather).
"""
from __future__ import annotations

import difflib
import re
import shlex
import warnings
from pathlib import Path
from typing import Any

from simtrain.errors import Collector
from simtrain.imports.common import SHOWN_NAMES, Fields, Options, cluster_section, drop_none, model_section
from simtrain.imports.megatron_args import NAMES as MEGATRON_ARGS
from simtrain.imports.shell import Script, ShellError, Word, run_script
from simtrain.spec.files import TreeError, parse_yaml, read_text
from simtrain.spec.loading import ub_cfg_problems
from simtrain.spec.scenario import UB_GEMMS

# flags that take no value (store_true / store_false in Megatron's argument parser); every
# other `--name` takes the words up to the next `--name`
_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch", "deepspeed")
# GPT-2's BPE vocabulary (openai/gpt-2 encoder.json: 50,257 tokens)
GPT2_VOCAB = 50257

# arguments whose effect simtrain cannot express: importing without them changes the answer
_REFUSED = {
    "--cpu-offloading": "activation offloading to the host is not modelled",
    "--optimizer-cpu-offload": "optimizer offloading to the host is not modelled",
    "--mtp-num-layers": "multi-token prediction layers are not modelled",
    "--hybrid-override-pattern": "hybrid (Mamba) layer stacks are not modelled",
    "--encoder-num-layers": "encoder-decoder models are not modelled",
    "--recompute-modules": "recomputation of a chosen set of modules is not modelled (selective recomputes attention)",
}

# arguments simtrain ignores that change the simulated answer: each gets its own warning saying how
# (the others are listed together in one "ignored" warning)
_DIFFERS = {
    "--fp8-param-gather": "the run keeps its compute weights in fp8 and all-gathers them in fp8 with block scales, which "
                          "simtrain models for the per-tensor recipes only: its weights and their all-gather are counted "
                          "in 16 bits (weight memory comes out 2 bytes per FP8 weight higher, the gather twice the run's)",
    "--first-last-layers-bf16": "the run keeps its first and last transformer layers (--num-layers-at-start-in-bf16, "
                                "--num-layers-at-end-in-bf16) in bf16, but simtrain runs every layer's linears in FP8: "
                                "those layers come out faster than the run's",
    "--fp8-dot-product-attention": "the run computes the attention core in FP8, but simtrain keeps it in bf16: attention "
                                   "comes out slower than the run's",
}
# Megatron-LM --fp8-recipe -> training.fp8_recipe (tensorwise is TE's Float8CurrentScaling)
_FP8_RECIPES = {"delayed": "delayed", "tensorwise": "current", "blockwise": "blockwise", "mxfp8": "mxfp8"}
# read by this importer under names Megatron-LM's parser no longer spells out
_OLD_NAMES = {"--no-overlap-grad-reduce", "--no-overlap-param-gather"}


def known_arg(name: str) -> bool:
    """Whether `name` (dashes for underscores) is an argument of Megatron-LM's training parser."""
    return name in MEGATRON_ARGS or name in _OLD_NAMES


def _edits(a: str, b: str) -> int:
    """Levenshtein distance: letters inserted, dropped or changed to turn `a` into `b`."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def check_names(f: Fields) -> None:
    """Megatron-LM refuses an argument it does not define, so one a letter or two (two edits) away from a
    real name is refused as a misspelling (read as written it would silently change the answer), with the
    real name as the fix. One far from every name is more likely a fork's or an extra_args_provider's
    (Megatron-DeepSpeed's --deepspeed, Pai-Megatron-Patch's own): it gets one warning naming them all
    and is otherwise ignored."""
    foreign = []
    names = sorted(MEGATRON_ARGS | _OLD_NAMES)
    for name in f.values:
        if known_arg(name):
            continue
        close = [c for c in difflib.get_close_matches(name, names, n=3, cutoff=0.8) if _edits(name, c) <= 2]
        if close:
            f.refuse(name, "not a Megatron-LM argument (Megatron-LM itself would refuse it)", f"did you mean {close[0]}?")
        else:
            foreign.append(name)
    if foreign:
        f.use(*foreign)
        shown = ", ".join(foreign[:SHOWN_NAMES]) + (f" and {len(foreign) - SHOWN_NAMES} more" if len(foreign) > SHOWN_NAMES else "")
        warnings.warn(f"{f.file}: ignored {len(foreign)} argument{'s' if len(foreign) > 1 else ''} that Megatron-LM's own "
                      f"parser does not define (a fork's or an extra_args_provider's?): {shown}", stacklevel=3)


def is_launch(words: list[Word]) -> bool:
    """A command that starts training: a launcher, or python running a *.py with arguments."""
    texts = [w.text for w in words]
    if not texts:
        return False
    if Path(texts[0]).name in _LAUNCHERS or any(t in _LAUNCHERS for t in texts[:4]):
        return any(t.endswith(".py") for t in texts)
    return Path(texts[0]).name.startswith("python") and any(t.endswith(".py") for t in texts[1:3])


def split_launch(words: list[Word]) -> tuple[dict[str, Word | None], list[Word]]:
    """(launcher options, the training script's arguments)."""
    at = next(i for i, w in enumerate(words) if w.text.endswith(".py"))
    launcher = _options(words[:at])
    return launcher, words[at + 1:]


def _options(words: list[Word]) -> dict[str, Word | None]:
    """`--name value` / `--name=value` / `--flag` pairs (names with `_` read as `-`)."""
    out: dict[str, Word | None] = {}
    i = 0
    while i < len(words):
        t = words[i].text
        if t.startswith("--"):
            name, eq, val = t.partition("=")
            name = name.replace("_", "-")
            if eq:
                out[name] = Word(val, words[i].unset)
                i += 1
                continue
            vals = []
            j = i + 1
            while j < len(words) and not (words[j].text.startswith("--") and len(words[j].text) > 2):
                vals.append(words[j])
                j += 1
            out[name] = None if not vals else Word(" ".join(v.text for v in vals),
                                                  frozenset().union(*(v.unset for v in vals)))
            i = j
        else:
            i += 1
    return out


def read_args(file: str, text: str, opts: Options, errs: Collector) -> tuple[dict[str, Any], int | None, list[str]]:
    """(the training arguments by name, the launcher's world size, notes) of a script or argument string."""
    notes: list[str] = []
    script: Script | None = None
    try:
        if re.search(r"(^|\s)--[a-z]", text) and not re.search(r"(?<![-\w])(torchrun|python|deepspeed)\b|\.py\b", text):
            words = [Word(t) for t in shlex.split(text, comments=True)]
            launcher, args = {}, words
        else:
            script = run_script(text, is_launch, opts.env)
            if script is None:
                errs.add("(script)", "no launch command found (torchrun / python -m torch.distributed.run / python ... .py)",
                         "point at the script that starts training, or give the arguments alone")
                return {}, None, notes
            launcher, args = split_launch(script.words)
            notes += script.notes
    except (ShellError, ValueError) as e:
        errs.add("(script)", f"cannot follow the script: {e}", "give the training arguments as a plain argument string")
        return {}, None, notes
    parsed = _options(args)
    values: dict[str, Any] = {}
    for k, w in parsed.items():
        if w is not None and w.unset:
            names = ", ".join(sorted(n if n.startswith("$") else "$" + n for n in w.unset))
            values[k] = _Unset(names)
        else:
            values[k] = True if w is None else w.text
    world = None
    if launcher:
        nn, npn = launcher.get("--nnodes"), launcher.get("--nproc-per-node")
        if nn is None and npn is None:                  # the deepspeed launcher's spelling
            nn, npn = launcher.get("--num-nodes"), launcher.get("--num-gpus")
        if nn is not None and npn is not None and not nn.unset and not npn.unset:
            try:
                lo = int(nn.text.split(":")[-1])
                world = lo * int(npn.text)
            except ValueError:
                notes.append(f"torchrun's --nnodes {nn.text} / --nproc-per-node {npn.text} are not numbers")
    return values, world, notes


class _Unset(str):
    """A value built from shell variables the script never sets."""


def _value(f: Fields, name: str) -> Any:
    v = f.values.get(name)
    if isinstance(v, _Unset):
        f.refuse(name, f"the script leaves {v} unset", f"assign it in the script or pass --env {str(v).split(',')[0].lstrip('$')}=VALUE")
        f.values[name] = None
    return f.values.get(name)


def _int(f: Fields, name: str, default: int | None = None, lo: int = 1) -> int | None:
    if _value(f, name) is None:
        f.use(name)
        return default
    return f.integer(name, default, lo)


def _flag(f: Fields, name: str) -> bool:
    v = f.take(name)
    return v is not None and v is not False


def layout_stages(layout: str, file: str, errs: Collector) -> list[int] | None:
    """--pipeline-model-parallel-layout (`Et*3|(tt|)*29,m|L`): transformer layers of each stage.
    `E` (embedding) and `L` (loss) hold no transformer layer; `t` is one; `m` (an MTP layer) is refused."""
    s = layout.replace(" ", "").replace(",", "")
    try:
        for _ in range(50):          # expand innermost (...)*n and x*n
            new = re.sub(r"\(([^()]*)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
            new = re.sub(r"([A-Za-z])\*(\d+)", lambda m: m.group(1) * int(m.group(2)), new)
            if new == s:
                break
            s = new
    except (OverflowError, MemoryError):
        errs.add("--pipeline-model-parallel-layout", "the layout expands too far", "give a layout of at most a few thousand layers")
        return None
    if "m" in s:
        errs.add("--pipeline-model-parallel-layout", "multi-token prediction layers (m) are not modelled", "remove the m entries")
        return None
    bad = set(s) - set("EtL|")
    if bad:
        errs.add("--pipeline-model-parallel-layout", f"cannot read {''.join(sorted(bad))!r} in {layout!r}",
                 "use t (a transformer layer), E, L and | between stages")
        return None
    return [st.count("t") for st in s.split("|")]


def ub_cfg(file: str, cfg_path: str, errs: Collector) -> dict[str, Any] | None:
    """--tp-comm-overlap-cfg: Transformer Engine's userbuffers YAML (one entry per GEMM, qkv_fprop
    to fc2_dgrad, with method, num_sm, num_splits and settings simtrain does not time: cga_size,
    set_sm_margin, aggregate, atomic_gemm, fp8_buf) -> parallel.tp_comm_overlap_cfg. The path is
    taken from the script's directory, then the current one; a file that is not there is
    reported, and TE's defaults are timed."""
    where = [Path(cfg_path)] if Path(cfg_path).is_absolute() else list(dict.fromkeys([Path(file).parent / cfg_path,
                                                                                     Path(cfg_path)]))
    found = next((q for q in where if q.is_file()), None)
    if found is None:
        warnings.warn(f"{file}: --tp-comm-overlap-cfg {cfg_path}: no such file here (looked in "
                      f"{', '.join(str(q) for q in where)}); Transformer Engine's default overlap is timed "
                      "(give the file, or write parallel.tp_comm_overlap_cfg into the scenario)", stacklevel=3)
        return None
    try:
        doc = parse_yaml(read_text(found))
    except (OSError, ValueError, TreeError) as e:
        errs.add("--tp-comm-overlap-cfg", f"{found}: cannot read it: {e}", "give Transformer Engine's userbuffers YAML")
        return None
    if not isinstance(doc, dict):
        errs.add("--tp-comm-overlap-cfg", f"{found}: expected a mapping of GEMM names", "write e.g. `proj_fprop: {method: pipeline}`")
        return None
    out: dict[str, Any] = {}
    untimed = set()
    for te, entry in doc.items():
        if te not in UB_GEMMS:
            errs.add("--tp-comm-overlap-cfg", f"{found}: {te!r} is not a GEMM Transformer Engine overlaps",
                     f"use the names {', '.join(UB_GEMMS)}")
            continue
        if not isinstance(entry, dict):
            errs.add("--tp-comm-overlap-cfg", f"{found}: {te} is not a mapping", "write e.g. `{method: bulk, num_sm: 4}`")
            continue
        out[te] = {k: entry[k] for k in ("method", "num_sm", "num_splits") if k in entry}
        untimed |= set(entry) - {"method", "num_sm", "num_splits"}
    for key, problem, fix in ub_cfg_problems(out):
        errs.add("--tp-comm-overlap-cfg", f"{found}: {key}: {problem}", fix)
    if untimed:
        warnings.warn(f"{file}: --tp-comm-overlap-cfg {found}: {', '.join(sorted(untimed))} are not timed (method, "
                      "num_sm and num_splits are)", stacklevel=3)
    return out


def to_tree(file: str, text: str, opts: Options, errs: Collector, out_dir: Path) -> dict[str, Any]:
    values, launcher_world, notes = read_args(file, text, opts, errs)
    f = Fields(file, values, errs)
    if not values:
        return {}
    check_names(f)
    world = opts.world_size or launcher_world
    world_from = "--world-size" if opts.world_size else "--nnodes"

    tp = _int(f, "--tensor-model-parallel-size", 1)
    pp = _int(f, "--pipeline-model-parallel-size", 1)
    cp = _int(f, "--context-parallel-size", 1)
    ep = _int(f, "--expert-model-parallel-size", 1)
    etp = _int(f, "--expert-tensor-parallel-size", None)
    L = _int(f, "--num-layers")
    h = _int(f, "--hidden-size")
    heads = _int(f, "--num-attention-heads")
    swiglu = _flag(f, "--swiglu")
    seq = opts.seq_length or _int(f, "--seq-length")
    mb = opts.micro_batch_size or _int(f, "--micro-batch-size", 1)
    gb = opts.global_batch_size or _int(f, "--global-batch-size")

    # -- parallel ------------------------------------------------------------------------
    par: dict[str, Any] = {"tp": tp, "pp": pp, "cp": cp}
    dp = None
    if world is not None and tp and pp and cp:
        if world % (tp * pp * cp):
            errs.add("--pipeline-model-parallel-size" if pp > 1 else "--tensor-model-parallel-size",
                     f"tp x pp x cp = {tp} x {pp} x {cp} = {tp * pp * cp} does not divide the world size {world}"
                     + ("" if opts.world_size else " (torchrun --nnodes x --nproc-per-node)"),
                     f"pass --world-size N (a multiple of {tp * pp * cp}; simtrain run: --set cluster.nodes=N) or change the script's node count")
        else:
            dp = world // (tp * pp * cp)
            par["dp"] = dp
    elif world is None:
        errs.add("--world-size", "the world size is not given (no torchrun --nnodes / --nproc-per-node)",
                 "pass --world-size N (all devices of the job)")
    if _flag(f, "--sequence-parallel") and (tp or 1) > 1:
        par["sequence_parallel"] = True         # at tp 1 Megatron-LM switches it off, so the file leaves it out
    if _flag(f, "--tp-comm-overlap"):
        par["tp_comm_overlap"] = "userbuffers"
        if f.has("--tp-comm-overlap-cfg"):
            cfg = ub_cfg(file, str(f.take("--tp-comm-overlap-cfg")), errs)
            if cfg:
                par["tp_comm_overlap_cfg"] = cfg
        for name in ("--disable-tp-comm-overlap-ag", "--disable-tp-comm-overlap-rs", "--disable-tp-comm-bulk-dgrad",
                     "--disable-tp-comm-bulk-wgrad", "--disable-tp-comm-split-ag", "--disable-tp-comm-split-rs",
                     "--tp-comm-overlap-disable-qkv", "--tp-comm-overlap-disable-fc1", "--tp-comm-overlap-rs-dgrad",
                     "--no-tp-comm-overlap-ag", "--no-tp-comm-overlap-rs", "--no-tp-comm-bulk-dgrad", "--no-tp-comm-bulk-wgrad",
                     "--no-tp-comm-split-ag", "--no-tp-comm-split-rs"):
            if f.has(name) and f.values[name] not in (False, "0"):
                f.refuse(name, "changing which overlap a GEMM uses is not modelled (simtrain times Transformer Engine's "
                         "default set)", f"remove {name}, or --tp-comm-overlap")
    vchunk = _int(f, "--num-layers-per-virtual-pipeline-stage")
    vstages = _int(f, "--num-virtual-stages-per-pipeline-rank")
    vpp = None
    if vchunk and L and pp:
        if L % (pp * vchunk):
            errs.add("--num-layers-per-virtual-pipeline-stage", f"num_layers {L} is not divisible by pp x {vchunk} = {pp * vchunk}",
                     "give a layer count per virtual stage that divides num_layers / pp")
        else:
            vpp = L // (pp * vchunk)
    elif vstages:
        vpp = vstages
    if vpp and vpp > 1:
        par["schedule"] = "interleaved_1f1b"
        par["vpp"] = vpp
    else:
        par["schedule"] = "1f1b"
    layout = _value(f, "--pipeline-model-parallel-layout")
    if layout is not None:
        f.take("--pipeline-model-parallel-layout")
        stages = layout_stages(str(layout), file, errs)
        if stages is not None and pp:
            if 0 in stages:
                errs.add("--pipeline-model-parallel-layout", f"stage {stages.index(0)} holds no transformer layer "
                         "(simtrain's stages hold at least one)", "give every stage at least one t")
            elif len(stages) % pp or (vpp and len(stages) != pp * vpp):
                errs.add("--pipeline-model-parallel-layout", f"{len(stages)} stages for pp {pp}"
                         + (f" x vpp {vpp}" if vpp else ""), "give pp x (virtual stages per rank) stages")
            else:
                par["layers_per_stage"] = stages
                if len(stages) > pp:                 # the layout sets the virtual stages per rank
                    par["schedule"], par["vpp"] = "interleaved_1f1b", len(stages) // pp
    for flag in ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"):
        if _flag(f, flag):
            par[flag[2:].replace("-", "_")] = True
    first = _int(f, "--decoder-first-pipeline-num-layers")
    last = _int(f, "--decoder-last-pipeline-num-layers")
    if first is not None:
        par["first_stage_layers"] = first
    if last is not None:
        par["last_stage_layers"] = last
    par["zero_stage"] = 1 if _flag(f, "--use-distributed-optimizer") else 0
    par["overlap_grad_reduce"] = _flag(f, "--overlap-grad-reduce")
    par["overlap_param_gather"] = _flag(f, "--overlap-param-gather")
    f.use("--no-overlap-grad-reduce", "--no-overlap-param-gather")

    # -- model ---------------------------------------------------------------------------
    model = model_section(opts, seq, errs, out_dir)
    experts = _int(f, "--num-experts")
    if model is None:
        ffn = _int(f, "--ffn-hidden-size")
        if ffn is None and h:
            ffn = int(8 * h / 3 / 64) * 64 if swiglu else 4 * h
        gqa = _flag(f, "--group-query-attention")
        groups = _int(f, "--num-query-groups")
        kv = groups if gqa and groups else heads
        vocab = opts.vocab_size or _int(f, "--vocab-size")
        tok = _value(f, "--tokenizer-type")
        if vocab is None and (tok == "GPT2BPETokenizer" or (tok is None and f.has("--merge-file"))):
            vocab = GPT2_VOCAB
            f.use("--tokenizer-type", "--merge-file", "--vocab-file")
        if vocab is None:
            errs.add("--vocab-size", "the vocabulary size is not in the arguments (Megatron reads it from the tokenizer at run time)",
                     "pass --vocab-size N to simtrain import, or --set model.vocab_size=N to simtrain run "
                     "(GPT-2's BPE: 50257; Llama 3: 128256)")
        for need, v in (("--num-layers", L), ("--hidden-size", h), ("--num-attention-heads", heads), ("--seq-length", seq)):
            if v is None:
                errs.add(need, "missing", f"add {need} to the arguments (or pass --model PRESET / --hf-config FILE)")
        model = {"architecture": "llama" if swiglu else "gpt", "num_layers": L, "hidden_size": h, "num_attention_heads": heads,
                 "num_key_value_heads": kv, "ffn_hidden_size": ffn, "vocab_size": vocab, "seq_length": seq,
                 "tie_embeddings": not _flag(f, "--untie-embeddings-and-output-weights"),
                 "make_vocab_size_divisible_by": _int(f, "--make-vocab-size-divisible-by")}
        if _flag(f, "--qk-layernorm"):
            model["qk_norm"] = True
        kvc = _int(f, "--kv-channels")
        if kvc is not None and (not h or not heads or kvc != h // heads):
            model["head_dim"] = kvc
        # folded into `architecture` (gpt: learned positions, GeLU, LayerNorm; llama: RoPE, SwiGLU, RMSNorm)
        f.use("--position-embedding-type", "--normalization", "--no-position-embedding", "--group-query-attention",
              "--use-rotary-position-embeddings", "--tokenizer-type", "--vocab-file", "--merge-file", "--tokenizer-model")
        if _flag(f, "--multi-latent-attention"):
            mla = {"kv_lora_rank": _int(f, "--kv-lora-rank"), "q_lora_rank": _int(f, "--q-lora-rank"),
                   "qk_nope_head_dim": _int(f, "--qk-head-dim"), "qk_rope_head_dim": _int(f, "--qk-pos-emb-head-dim"),
                   "v_head_dim": _int(f, "--v-head-dim")}
            model["mla"] = mla
        if experts:
            topk = _int(f, "--moe-router-topk", 2)
            moe: dict[str, Any] = {"num_experts": experts, "top_k": topk,
                                   "expert_ffn_hidden_size": _int(f, "--moe-ffn-hidden-size", ffn)}
            shared = _int(f, "--moe-shared-expert-intermediate-size")
            if shared:
                moe["num_shared_experts"] = 1
                moe["shared_expert_ffn_hidden_size"] = shared
            freq = _value(f, "--moe-layer-freq")
            if freq is not None:
                f.take("--moe-layer-freq")
                if str(freq).isdigit():
                    moe["layer_freq"] = int(freq)
                else:
                    errs.add("--moe-layer-freq", f"a per-layer pattern {str(freq)[:40]!r} is not modelled", "give a whole number (every n-th layer)")
            cap = _value(f, "--moe-expert-capacity-factor")
            if cap is not None:
                f.take("--moe-expert-capacity-factor")
                try:
                    moe["capacity_factor"] = float(cap)
                except ValueError:
                    errs.add("--moe-expert-capacity-factor", f"expected a number, got {cap!r}", "write e.g. 1.25")
            disp = f.take("--moe-token-dispatcher-type")
            if disp is not None:
                if disp in ("alltoall", "allgather"):
                    moe["dispatcher"] = disp
                else:
                    errs.add("--moe-token-dispatcher-type", f"dispatcher {disp!r} is not modelled", "use alltoall or allgather")
            model["moe"] = moe
    elif experts is not None:
        f.use("--moe-router-topk", "--moe-ffn-hidden-size", "--moe-token-dispatcher-type")
    if experts or (model.get("moe") if isinstance(model, dict) else None):
        par["ep"] = ep
        par["etp"] = etp if etp is not None else tp         # Megatron: expert tp defaults to tp
    else:
        if ep and ep > 1:
            errs.add("--expert-model-parallel-size", f"ep {ep} without --num-experts", "remove it or add --num-experts")

    # -- training ------------------------------------------------------------------------
    if gb is None and mb and dp:
        gb = mb * dp                                          # Megatron's default global batch
    if gb and mb and dp and gb % (mb * dp):
        errs.add("--global-batch-size", f"{gb} is not divisible by micro batch x dp = {mb} x {dp} = {mb * dp}",
                 f"use a multiple of {mb * dp}")
    prec = opts.precision
    if prec is None:
        fp8 = _value(f, "--fp8-format")
        bf16, fp16 = _flag(f, "--bf16"), _flag(f, "--fp16")
        if fp8 is not None:
            f.take("--fp8-format")
            prec = "fp8"
            if str(fp8) not in ("e4m3", "hybrid"):
                near = difflib.get_close_matches(str(fp8), ["e4m3", "hybrid"], 1, 0.6)
                f.refuse("--fp8-format", f"{fp8!r} is not a Megatron-LM FP8 format",
                         f"did you mean {near[0]}?" if near else "use e4m3 or hybrid")
            elif not (bf16 or fp16):
                f.refuse("--fp8-format", "FP8 without --bf16 or --fp16: the run's 16-bit parts would be fp32, "
                         "which simtrain does not model", "add --bf16 (Megatron's FP8 recipes run with it)")
        elif bf16:
            prec = "bf16"
        elif fp16:
            prec = "fp16"
        else:
            errs.add("--bf16", "neither --bf16 nor --fp16 given: Megatron trains in fp32, which simtrain does not model",
                     "add --bf16 (or --fp16) to the arguments, or pass --precision bf16")
    f.use("--bf16", "--fp16")
    gran = _value(f, "--recompute-granularity")
    f.take("--recompute-granularity")
    method = _value(f, "--recompute-method")
    f.take("--recompute-method")
    nrec = _int(f, "--recompute-num-layers")
    recompute = "none"
    if _flag(f, "--recompute-activations") or gran == "selective":
        recompute = "selective"
    elif gran == "full":
        recompute = "full"
        per_stage = L // (pp * (vpp or 1)) if L and pp else None
        if method == "block" and nrec is not None and per_stage and nrec < per_stage:
            errs.add("--recompute-num-layers", f"block recomputation of {nrec} of {per_stage} layers per stage is not modelled "
                     "(simtrain recomputes all layers or none)",
                     f"set --recompute-num-layers {per_stage} (all layers) or drop full recomputation")
    elif gran is not None:
        errs.add("--recompute-granularity", f"unknown granularity {gran!r}", "use full or selective")
    f.use("--use-flash-attn")                 # flash attention is also the default (--attention-backend auto)
    flash = True
    backend = _value(f, "--attention-backend")
    if backend is not None:
        f.take("--attention-backend")
        flash = str(backend) in ("flash", "fused", "auto")
    training = {"micro_batch_size": mb, "global_batch_size": gb, "precision": prec, "recompute": recompute,
                "flash_attention": flash}
    recipe = _value(f, "--fp8-recipe")
    if recipe is not None:
        f.take("--fp8-recipe")
        if str(recipe) not in _FP8_RECIPES:
            f.refuse("--fp8-recipe", f"{recipe!r} is not a recipe simtrain models (Megatron-LM's: "
                     f"{', '.join(_FP8_RECIPES)}, custom)", f"use one of: {', '.join(_FP8_RECIPES)}")
        elif prec == "fp8":
            training["fp8_recipe"] = _FP8_RECIPES[str(recipe)]
        else:
            warnings.warn(f"{file}: --fp8-recipe {recipe}: without --fp8-format the run is not FP8 (Megatron-LM "
                          f"reads the recipe only with it); simulated in {prec}", stacklevel=2)
    if _flag(f, "--grad-reduce-in-bf16") and prec != "fp16":
        training["grad_reduce_in_bf16"] = True   # fp16 training's gradients are 16-bit already
    if prec == "fp8" and training.get("fp8_recipe", "delayed") in ("delayed", "current") and _flag(f, "--fp8-param-gather"):
        training["fp8_param_gather"] = True      # weights kept and all-gathered in FP8 (training.fp8_param_gather)
    fusions = {key: False for flag, key in _FUSION_OFF_FLAGS.items() if _flag(f, flag)}
    if _flag(f, "--cross-entropy-loss-fusion"):
        fusions["cross_entropy"] = True
    if fusions:
        training["fusions"] = fusions

    for name, why in _DIFFERS.items():
        if name == "--fp8-param-gather" and (training.get("fp8_param_gather") or prec != "fp8"):
            if prec != "fp8" and _flag(f, name):
                warnings.warn(f"{file}: --fp8-param-gather: without --fp8-format the run is not FP8 and has no FP8 "
                              f"weights to gather (its weights stay {prec}, and are gathered so); simulated in {prec}", stacklevel=2)
            f.use(name)                      # read above
        elif _flag(f, name):
            warnings.warn(f"{file}: {name}: {why}", stacklevel=2)
    if isinstance(model, dict) and model.get("architecture") in ("gpt", "llama"):
        _dropout(f, file, model["architecture"], flash)
        if _flag(f, "--disable-bias-linear") and model["architecture"] == "gpt":
            warnings.warn(f"{file}: --disable-bias-linear: the run's linears have no biases, but simtrain's gpt "
                          "architecture counts them (parameters and the bias-add kernels)", stacklevel=2)
        f.use("--disable-bias-linear")          # llama: simtrain's has none either
    f.use("--moe-grouped-gemm")               # simtrain's local experts run as grouped GEMMs
    for name, why in _REFUSED.items():
        if f.has(name) and name not in f.used and f.values[name] not in (None, False, "0"):
            f.refuse(name, why, f"remove {name} (simtrain cannot simulate it)")
    cluster = cluster_section(opts, world, errs, world_from)
    for n in notes:
        errs_note(file, n)
    f.warn_ignored("arguments")
    name = opts.name or ("megatron-args" if file == "--args" else Path(file).stem)
    return drop_none({"name": name, "model": model, "training": training, "parallel": par, "cluster": cluster})


def _dropout(f: Fields, file: str, arch: str, flash: bool) -> None:
    """--attention-dropout / --hidden-dropout against the architecture's dropout: simtrain's gpt
    has dropout (the hidden dropout's masks stored; without flash attention the attention
    dropout's masks stored and its kernels timed), its llama none. A value that contradicts that
    gets a warning; one that agrees, or attention dropout under flash attention (which keeps no
    mask), is folded into the architecture."""
    for name, what in (("--hidden-dropout", "hidden dropout"), ("--attention-dropout", "attention dropout")):
        v = f.values.get(name)
        if v is None or isinstance(v, _Unset):
            continue
        try:
            p = float(str(v))
        except ValueError:
            continue
        f.use(name)
        if name == "--attention-dropout" and flash:
            continue
        cost = ("its masks in activation memory" if name == "--hidden-dropout"
                else "its masks in activation memory and its kernels in the step time")
        if arch == "gpt" and p == 0:
            warnings.warn(f"{file}: {name}: the run has no {what}, but simtrain's gpt architecture counts it: {cost}",
                          stacklevel=3)
        elif arch == "llama" and p > 0:
            warnings.warn(f"{file}: {name}: the run applies {what} {p:g}, but simtrain's llama architecture has none: "
                          f"{cost} are left out", stacklevel=3)


_FUSION_OFF_FLAGS = {"--no-bias-gelu-fusion": "bias_gelu", "--no-bias-swiglu-fusion": "bias_swiglu",
                     "--no-bias-dropout-fusion": "bias_dropout_add", "--no-masked-softmax-fusion": "masked_softmax",
                     "--no-rope-fusion": "rope"}
"""Megatron-LM's switches that turn a kernel fusion off (megatron/training/arguments.py), by training.fusions key."""


def errs_note(file: str, note: str) -> None:
    warnings.warn(f"{file}: {note}", stacklevel=2)


def to_args(tree: dict[str, Any]) -> list[str]:
    """A resolved scenario tree (`Scenario.resolved()`) as Megatron arguments (the exporter):
    importing them with the same cluster gives the same scenario back."""
    m, t, p = tree["model"], tree["training"], tree["parallel"]
    a: list[str] = []

    def add(flag: str, v: Any = None) -> None:
        a.append(flag)
        if v is not None:
            a.append(str(v))

    add("--num-layers", m["num_layers"])
    add("--hidden-size", m["hidden_size"])
    add("--num-attention-heads", m["num_attention_heads"])
    if m.get("num_key_value_heads") and m["num_key_value_heads"] != m["num_attention_heads"]:
        add("--group-query-attention")
        add("--num-query-groups", m["num_key_value_heads"])
    add("--ffn-hidden-size", m["ffn_hidden_size"])
    add("--seq-length", m["seq_length"])
    add("--vocab-size", m["vocab_size"])
    add("--make-vocab-size-divisible-by", m.get("make_vocab_size_divisible_by", 128))
    if m.get("head_dim") and m["head_dim"] != m["hidden_size"] // m["num_attention_heads"]:
        add("--kv-channels", m["head_dim"])
    if m.get("architecture") == "llama":
        add("--swiglu")
        add("--position-embedding-type", "rope")
        add("--normalization", "RMSNorm")
        # simtrain's llama has no linear biases and no dropout; Megatron-LM's defaults have both
        add("--disable-bias-linear")
        add("--attention-dropout", 0.0)
        add("--hidden-dropout", 0.0)
    if m.get("qk_norm"):
        add("--qk-layernorm")
    if not m.get("tie_embeddings"):
        add("--untie-embeddings-and-output-weights")
    moe = m.get("moe")
    if moe:
        add("--num-experts", moe["num_experts"])
        add("--moe-router-topk", moe["top_k"])
        add("--moe-ffn-hidden-size", moe["expert_ffn_hidden_size"])
        if moe.get("layer_freq", 1) != 1:
            add("--moe-layer-freq", moe["layer_freq"])
        if moe.get("capacity_factor") is not None:
            add("--moe-expert-capacity-factor", moe["capacity_factor"])
        add("--moe-token-dispatcher-type", moe.get("dispatcher", "alltoall"))
        add("--expert-model-parallel-size", p.get("ep", 1))
        add("--expert-tensor-parallel-size", p.get("etp", 1))
    add("--tensor-model-parallel-size", p["tp"])
    add("--pipeline-model-parallel-size", p["pp"])
    add("--context-parallel-size", p.get("cp", 1))
    if p.get("sequence_parallel"):
        add("--sequence-parallel")
    if p.get("tp_comm_overlap") == "userbuffers":
        add("--tp-comm-overlap")
        if p.get("tp_comm_overlap_cfg"):
            warnings.warn("parallel.tp_comm_overlap_cfg: Megatron-LM reads per-GEMM settings from a YAML file "
                          "(--tp-comm-overlap-cfg FILE); write the scenario's entries into one and pass it", stacklevel=2)
    elif p.get("tp_comm_overlap") == "async_tp":
        warnings.warn("parallel.tp_comm_overlap: async_tp is PyTorch's (torchtitan); Megatron-LM has no such flag, and "
                      "its counterpart --tp-comm-overlap (Transformer Engine userbuffers) is not written", stacklevel=2)
    vpp = p.get("vpp") or 1
    if p.get("schedule") == "interleaved_1f1b" and vpp > 1:
        if p.get("account_for_embedding_in_pipeline_split") or p.get("account_for_loss_in_pipeline_split"):
            add("--num-virtual-stages-per-pipeline-rank", vpp)      # stages are not all the same size
        else:
            add("--num-layers-per-virtual-pipeline-stage", m["num_layers"] // (p["pp"] * vpp))
    for key in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
        if p.get(key):
            add("--" + key.replace("_", "-"))
    if p.get("first_stage_layers"):
        add("--decoder-first-pipeline-num-layers", p["first_stage_layers"])
    if p.get("last_stage_layers"):
        add("--decoder-last-pipeline-num-layers", p["last_stage_layers"])
    if p.get("zero_stage", 0) >= 1:
        add("--use-distributed-optimizer")
    if p.get("overlap_grad_reduce"):
        add("--overlap-grad-reduce")
    if t.get("grad_reduce_in_bf16"):
        add("--grad-reduce-in-bf16")
    if p.get("overlap_param_gather"):
        add("--overlap-param-gather")
    add("--micro-batch-size", t["micro_batch_size"])
    add("--global-batch-size", t["global_batch_size"])
    prec = t.get("precision", "bf16")
    add("--bf16") if prec in ("bf16", "fp8") else add("--fp16")
    if prec == "fp8":
        add("--fp8-format", "hybrid")
        recipe = t.get("fp8_recipe", "delayed")
        if recipe.startswith("torchao_"):
            # torchao's float8 is not Transformer Engine's: its nearest TE recipe is written
            warnings.warn(f"training.fp8_recipe: {recipe} is torchao's (torchtitan); Megatron-LM runs Transformer "
                          "Engine's FP8, so --fp8-recipe tensorwise (current scaling) is written: the exported run "
                          "keeps FP8 activations and casts less than the scenario", stacklevel=2)
            recipe = "current"
        add("--fp8-recipe", {v: k for k, v in _FP8_RECIPES.items()}[recipe])
        if t.get("fp8_param_gather"):
            add("--fp8-param-gather")
    if t.get("recompute") == "op":
        warnings.warn("training.recompute: op is torchtitan's op-level checkpointing; Megatron-LM has no such policy, "
                      "so --recompute-granularity selective (the attention core) is written", stacklevel=2)
        add("--recompute-granularity", "selective")
    if t.get("recompute") in ("full", "selective"):
        add("--recompute-granularity", t["recompute"])
        if t["recompute"] == "full":
            add("--recompute-method", "uniform")
            add("--recompute-num-layers", 1)
    add("--attention-backend", "flash" if t.get("flash_attention", True) else "unfused")
    fus = t.get("fusions") or {}
    for flag, key in _FUSION_OFF_FLAGS.items():
        if fus.get(key) is False:
            add(flag)
    if fus.get("cross_entropy"):
        add("--cross-entropy-loss-fusion")
    return a
