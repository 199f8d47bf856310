"""`python -m simtrain` entry point (same as the `simtrain` console script)."""
import sys

from simtrain.cli import main

sys.exit(main())
