"""simtrain: a discrete-event simulator of large-model training clusters.

The package reads as its pipeline:

    spec/loading   scenario + topology YAML -> frozen Scenario (SI units)
    workload       per-layer operators (FLOP, bytes, activations) and the memory model
    parallel       rank grid, process groups, placement, equivalence classes
    schedules      per-stage ordered pipeline actions (data, validated)
    program        lowering to per-rank programs (ops on streams with dependencies)
    engine         SimPy execution of the programs against cost models and a network backend
    results        StepResult, JSON, Chrome trace, plots
"""

__version__ = "0.1.0"
