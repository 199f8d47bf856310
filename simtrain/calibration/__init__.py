"""Calibration: importers for measurements (nccl-tests logs, PyTorch profiler traces), the
microbenchmark suite (`simtrain bench`), and fitting measurements into device profiles."""
