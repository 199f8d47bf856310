"""The worked examples in the docstrings of simtrain.workload and simtrain.plan run as doctests."""
import doctest
import importlib
import pkgutil

import pytest

import simtrain.plan
import simtrain.workload

MODULES = sorted(m.name for pkg in (simtrain.workload, simtrain.plan)
                 for m in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."))

# modules whose index maths is written as doctests (guards against a module silently losing them)
WITH_EXAMPLES = {"simtrain.workload.base", "simtrain.workload.moe", "simtrain.plan.grid", "simtrain.plan.layers"}


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    res = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS, report=True)
    assert res.failed == 0, f"{res.failed} of {res.attempted} doctests failed in {name}"
    if name in WITH_EXAMPLES:
        assert res.attempted > 0, f"{name} lost its doctests"
