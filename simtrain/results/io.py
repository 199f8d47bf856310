"""Writing results: byte-stable JSON and atomic file writes."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from simtrain.results.step import Section


def write_atomic(path: Path, data: bytes) -> None:
    """Writes to a temporary file beside `path`, then renames: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def to_json(result: dict | Section) -> str:
    """The JSON text of a result dict, or of a result dataclass (its `to_dict()`, in field order)."""
    d = result.to_dict() if isinstance(result, Section) else result
    return json.dumps(d, indent=2, sort_keys=False) + "\n"
