"""Failures, checkpoints, restarts and goodput of long runs (the job model of the pipeline).

    config.py      the scenario's `reliability:` section + shipped defaults -> ReliabilitySpec
    model.py       failure, checkpoint and recovery models for one job -> JobParams (SI units)
    job.py         SimPy job model of one trial (train, checkpoint, fail, recover)
    montecarlo.py  trials in parallel processes, resumable per chunk; statistics
    optimize.py    Young / Daly closed forms, interval grid, optimum refinement
    study.py       `simtrain reliability`: the study, result.json, CSVs, summary
    plots.py       goodput vs interval, timeline of one trial
    instep.py      a failure inside one step: what happens to in-flight work (trace)

The step simulation is used as is (step time, per-rank memory); a scenario without the section
runs exactly as before.
"""
