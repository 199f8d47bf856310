"""Stage 5: the lowering of workload, plan and schedule into per-rank-class programs: ops on streams with dependencies, gradient buckets, ZeRO/FSDP traffic and the optimizer step."""
