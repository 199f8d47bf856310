"""Schema checking shared by every topology builder (and the scenario loader).

A builder's schema maps each key to a `simtrain.spec.fields.Key` (kind, default, doc), or to the
older `(kind, required, default)` tuple; both are read by `validate_map`, which collects every
problem into a `Collector` with its key path, never raising one at a time. The same declarations
give the key reference and the JSON Schema of topology files (`simtrain.spec.schemas`).
"""
from __future__ import annotations

from simtrain.spec.fields import parse_value, validate_map

__all__ = ["parse_value", "validate_map"]
