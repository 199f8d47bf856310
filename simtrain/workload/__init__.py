"""Stage 2: the model and training setup turned into per-layer operator templates (FLOP, bytes, activation bytes, forward / backward split, tp/cp/ep communication sizes) and their memory.

Entry point `build.build_workload`; the parts: `ir` (Op, Comm, Ring, LayerProgram, StageWork),
`base` (per-rank dimensions, operator factories), `transformer` (dense layer, embedding, head,
`LayerBuilder`), `attention` (incl. context parallelism), `mla`, `moe`, `encoder`, `memory`,
`flops`. This package imports nothing itself, so a module can take the IR without the builders.
"""
