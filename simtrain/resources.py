"""Where the package's own data lives: device presets, profiles, model and encoder presets and
failure statistics under `simtrain/data`, and the shipped fabric files under `topologies/`."""
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
DATA = PACKAGE / "data"
TOPOLOGIES = PACKAGE.parent / "topologies"
