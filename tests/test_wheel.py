"""The wheel carries everything the editable checkout finds: the shipped topologies (top-level
`topologies/` in the checkout, `simtrain/_topologies` in the wheel), the device presets, profiles
and model presets (`simtrain/data`) and the validation data (`simtrain/_validation`). The wheel is
built from a clean copy of the sources and unpacked outside the checkout, where the package must
find its data through resources.py alone. `.ci/run` also installs it in a fresh environment."""
import importlib.util
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT

# a build without isolation needs a setuptools that builds wheels itself (70.1 and later);
# otherwise pip fetches the build backend from the package index, which takes longer
_LOCAL_BACKEND = importlib.util.find_spec("setuptools") is not None and \
    importlib.util.find_spec("setuptools.command.bdist_wheel") is not None
pytestmark = [] if _LOCAL_BACKEND else [pytest.mark.slow]

_SKIP = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", ".venv*", "__pycache__", ".pytest_cache",
                               ".ruff_cache", "runs", "out")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=_SKIP)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q", "-w", str(tmp / "dist"), str(src)]
    if _LOCAL_BACKEND:
        cmd[4:4] = ["--no-build-isolation", "--no-index"]
    subprocess.run(cmd, check=True, cwd=tmp, capture_output=True, timeout=600)
    (whl,) = (tmp / "dist").glob("simtrain-*.whl")
    return whl


def test_the_wheel_contains_the_package_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    topologies = sorted(p.name for p in (ROOT / "topologies").glob("*.yaml"))
    assert topologies and {f"simtrain/_topologies/{t}" for t in topologies} <= names
    data = [p.relative_to(ROOT).as_posix() for p in (ROOT / "simtrain" / "data").rglob("*.yaml")]
    assert data and set(data) <= names
    validation = [p.relative_to(ROOT / "validation" / "data").as_posix()
                  for p in (ROOT / "validation" / "data").rglob("*") if p.is_file()]
    assert "vtrain/LICENSE" in validation and {f"simtrain/_validation/{v}" for v in validation} <= names


def test_the_unpacked_wheel_finds_its_data_outside_the_checkout(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import simtrain; "
        "from simtrain import resources; "
        "from simtrain.hardware.topology import shipped_topologies; from simtrain.spec.loading import load_scenario; "
        "sc, topo = load_scenario(sys.argv[2]); "
        "print(json.dumps({'package': simtrain.__file__, 'topologies': str(resources.TOPOLOGIES), "
        "'validation': str(resources.VALIDATION), 'shipped': [p.name for p in shipped_topologies()], "
        "'topology': topo.file}))"
    )
    run = tmp_path / "elsewhere"
    run.mkdir()
    scenario = ROOT / "scenarios" / "gpt3-175b-a100-1024.yaml"
    out = subprocess.run([sys.executable, "-c", probe, str(site), str(scenario)], cwd=run, check=True,
                         capture_output=True, text=True, timeout=120).stdout
    got = json.loads(out.splitlines()[-1])
    assert Path(got["package"]).is_relative_to(site)
    assert Path(got["topologies"]) == site / "simtrain" / "_topologies"
    assert Path(got["validation"]) == site / "simtrain" / "_validation"
    assert got["shipped"] == sorted(p.name for p in (ROOT / "topologies").glob("*.yaml"))
    assert Path(got["topology"]).is_relative_to(site)
