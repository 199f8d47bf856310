"""The network seam: what collectives and point-to-point transfers cost on a topology, in closed form (NCCL-style algorithms) or with flow-level max-min sharing."""
