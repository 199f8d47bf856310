"""`python -m simtrain` entry point (same as the `simtrain` console script)."""
import sys

from simtrain.cli.main import main

sys.exit(main())
