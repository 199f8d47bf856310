"""The package layout pyproject.toml cannot state: the shipped topologies stay in the top-level
`topologies/` folder and the validation data in `validation/data/`, yet a wheel installs both
with the package, as `simtrain/_topologies` and `simtrain/_validation` (where
simtrain/resources.py finds them). Everything else is in pyproject.toml."""
from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["simtrain", "simtrain.*"]) + ["simtrain._topologies", "simtrain._validation"],
    include_package_data=False,             # the package data is exactly package_data below
    package_dir={"simtrain._topologies": "topologies", "simtrain._validation": "validation/data"},
    package_data={
        "simtrain": ["data/*.yaml", "data/**/*.yaml"],
        "simtrain._topologies": ["*.yaml"],
        "simtrain._validation": ["*/*.csv", "*/*.yaml", "*/*/*.yaml", "*/LICENSE", "*/README.md"],
    },
)
