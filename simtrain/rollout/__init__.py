"""Rollout-engine simulator: continuous batching of generation requests, as vLLM (V1) and SGLang
run it, costed iteration by iteration.

Takes a model (`ModelSpec`), a device, a topology (for the engine's tensor-parallel
collectives), an `EngineConfig` (tp, ep, dp replicas, max_num_seqs, max_num_batched_tokens,
chunked prefill, gpu_memory_utilization, paged-KV block size, CUDA graphs, CPU overhead) and a
list of `Request`s (prompt length, response length, arrival time); returns a `GenerationResult`:
the per-iteration timeline, per-request first-token and finish times, makespan, tokens/s and
the KV-cache peak. Entry point `engine.simulate_generation`; `cost.IterationCost` prices one
iteration from the operators of `simtrain.workload.generation` through the compute seam
(`cost.roofline`) and the closed-form collectives (`network.collectives`).
"""
