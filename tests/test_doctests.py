"""The worked examples in the docstrings of simtrain.workload, simtrain.plan, simtrain.spec,
simtrain.hardware and simtrain.units run as doctests."""
import doctest
import importlib
import pkgutil

import pytest

import simtrain.hardware
import simtrain.hardware.topology
import simtrain.plan
import simtrain.spec
import simtrain.workload

MODULES = sorted(m.name for pkg in (simtrain.workload, simtrain.plan, simtrain.spec, simtrain.hardware, simtrain.hardware.topology)
                 for m in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."))
MODULES += ["simtrain.hardware.topology", "simtrain.units"]

# modules whose index maths is written as doctests (guards against a module silently losing them)
WITH_EXAMPLES = {"simtrain.workload.base", "simtrain.workload.moe", "simtrain.plan.grid", "simtrain.plan.layers",
                 "simtrain.units", "simtrain.spec.reliability", "simtrain.hardware.devices", "simtrain.hardware.topology",
                 "simtrain.hardware.topology.fattree", "simtrain.hardware.topology.torus", "simtrain.hardware.topology.dragonfly"}


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    res = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS, report=True)
    assert res.failed == 0, f"{res.failed} of {res.attempted} doctests failed in {name}"
    if name in WITH_EXAMPLES:
        assert res.attempted > 0, f"{name} lost its doctests"
