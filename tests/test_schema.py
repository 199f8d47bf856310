"""The key declarations: committed JSON Schema files, shipped files against them, the resolved
dump, the key reference, and the errors the declarations give."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import training_scenarios

from simtrain.errors import ConfigError
from simtrain.hardware.devices import PROFILE, REPO_PROFILES, load_profile
from simtrain.hardware.topology import BUILDERS, load_topology, shipped_topologies
from simtrain.spec import schemas
from simtrain.spec.fields import Key, Section, rows, section_of
from simtrain.spec.loading import SCENARIO, load_scenario
from simtrain.spec.scenario import Scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = training_scenarios()
PROFILES = sorted(REPO_PROFILES.glob("*.yaml"))


def _errors(value, s: dict, path: str = "") -> list[str]:
    """The subset of JSON Schema (2020-12) the generated files use; jsonschema is not a dependency."""
    out: list[str] = []
    types = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list,
             "null": type(None)}
    t = s.get("type")
    if t is not None:
        ok = isinstance(value, types[t]) and not (t in ("integer", "number") and isinstance(value, bool))
        if not ok:
            return [f"{path}: expected {t}, got {value!r}"]
    if "enum" in s and value not in s["enum"]:
        out.append(f"{path}: {value!r} not in {s['enum']}")
    if "const" in s and value != s["const"]:
        out.append(f"{path}: {value!r} != {s['const']!r}")
    if "pattern" in s and isinstance(value, str) and not re.search(s["pattern"], value):
        out.append(f"{path}: {value!r} does not match {s['pattern']}")
    if "minimum" in s and isinstance(value, (int, float)) and value < s["minimum"]:
        out.append(f"{path}: {value} < {s['minimum']}")
    if "exclusiveMinimum" in s and isinstance(value, (int, float)) and value <= s["exclusiveMinimum"]:
        out.append(f"{path}: {value} <= {s['exclusiveMinimum']}")
    if "minItems" in s and isinstance(value, list) and len(value) < s["minItems"]:
        out.append(f"{path}: fewer than {s['minItems']} items")
    if isinstance(value, dict):
        props = s.get("properties", {})
        for k in s.get("required", ()):
            if k not in value:
                out.append(f"{path}.{k}: required")
        for k, v in value.items():
            if k in props:
                out += _errors(v, props[k], f"{path}.{k}")
            elif any(re.search(p, k) for p in s.get("patternProperties", {})):
                continue
            elif s.get("additionalProperties", True) is False:
                out.append(f"{path}.{k}: not allowed")
            elif isinstance(s.get("additionalProperties"), dict):
                out += _errors(v, s["additionalProperties"], f"{path}.{k}")
    if isinstance(value, list) and "items" in s:
        for i, v in enumerate(value):
            out += _errors(v, s["items"], f"{path}[{i}]")
    if "anyOf" in s and all(_errors(value, b, path) for b in s["anyOf"]):
        out.append(f"{path}: matches none of anyOf")
    for b in s.get("allOf", ()):
        if "if" in b:
            if not _errors(value, b["if"], path):
                out += _errors(value, b["then"], path)
        else:
            out += _errors(value, b, path)
    return out


def _yaml(p: Path):
    return yaml.safe_load(p.read_text())


def test_committed_schema_files_are_what_the_declarations_give():
    for name, s in schemas.schemas().items():
        f = ROOT / "schemas" / f"{name}.schema.json"
        assert f.read_text(encoding="utf-8") == schemas.render(s), f"{f} is stale: run `simtrain schema --write schemas/`"


def test_schema_files_are_json_schema_with_the_top_level_keys():
    for name in schemas.FILES:
        s = json.loads((ROOT / "schemas" / f"{name}.schema.json").read_text())
        assert s["$schema"].startswith("https://json-schema.org/") and s["type"] == "object"
        assert s["$id"].endswith(f"{name}.schema.json")
    sc = json.loads((ROOT / "schemas" / "scenario.schema.json").read_text())
    assert set(sc["properties"]) == {"name", "seed", "model", "training", "parallel", "cluster", "network", "cost", "reliability"}
    assert sc["required"] == ["name", "model", "training", "parallel", "cluster"]
    assert set(sc["properties"]["parallel"]["properties"]) >= {"tp", "pp", "dp", "cp", "ep", "schedule", "vpp"}
    topo = json.loads((ROOT / "schemas" / "topology.schema.json").read_text())
    assert {"name", "kind", "collectives"} <= set(topo["properties"]) and len(topo["allOf"]) == 4
    prof = json.loads((ROOT / "schemas" / "profile.schema.json").read_text())
    assert prof["properties"]["schema"]["enum"] == ["simtrain-profile/1"] and prof["required"] == ["schema", "base"]


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_shipped_scenarios_validate_and_load(path):
    assert _errors(_yaml(path), schemas.scenario_schema()) == []
    load_scenario(path)


def test_shipped_topologies_and_profiles_validate_and_load():
    ts, ps = schemas.topology_schema(), schemas.profile_schema()
    for t in shipped_topologies():
        assert _errors(_yaml(t), ts) == [], t
        load_topology(t, 2)
    for p in PROFILES:
        assert _errors(_yaml(p), ps) == [], p
        load_profile(str(p))


def test_schemas_reject_what_the_loaders_reject():
    sc = _yaml(SCENARIOS[0])
    sc["training"]["precisoin"] = "bf16"
    sc["parallel"]["tp"] = 0
    sc["network"] = {"all_reduce": "nope"}
    errs = _errors(sc, schemas.scenario_schema())
    assert any("training.precisoin: not allowed" in e for e in errs)
    assert any(e.startswith(".parallel.tp:") for e in errs) and any(e.startswith(".network.all_reduce:") for e in errs)
    t = _yaml(ROOT / "topologies" / "dgx-a100.yaml")
    t["scale_up"]["bandwidth"] = 300
    t["scale_out"]["nic_bandwith"] = "25 GB/s"
    errs = _errors(t, schemas.topology_schema())
    assert any(e.startswith(".scale_up.bandwidth") for e in errs) and any("nic_bandwith: not allowed" in e for e in errs)


def test_resolved_dump_reloads_to_the_same_scenario(tmp_path):
    """The dump is derived from the declarations; loading it gives back the same spec."""
    for path in SCENARIOS:
        sc, _ = load_scenario(path)
        f = tmp_path / path.name
        f.write_text(yaml.safe_dump(sc.resolved(), sort_keys=False))
        again, _ = load_scenario(f)
        assert again.resolved() == sc.resolved(), path.name


def test_resolved_dump_of_stragglers_mixed_and_csv(tmp_path):
    base = _yaml(ROOT / "scenarios" / "llama3-8b-h200-64.yaml")
    base["cluster"]["stragglers"] = [{"devices": [3], "compute": 1.3}, {"fraction": 0.05, "link": 2.0}]
    base["cluster"]["jitter"] = {"sigma": 0.02}
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(base))
    sc, _ = load_scenario(f)
    d = sc.resolved()
    assert d["cluster"]["stragglers"] == [{"devices": [3], "compute": 1.3, "memory": 1.0, "link": 1.0},
                                          {"fraction": 0.05, "compute": 1.0, "memory": 1.0, "link": 2.0}]
    assert d["cluster"]["jitter"] == {"distribution": "normal", "sigma": 0.02}
    assert d["cluster"]["straggler_model"] == "lockstep"
    g = tmp_path / "again.yaml"
    g.write_text(yaml.safe_dump(d))
    assert load_scenario(g)[0].resolved() == d


def test_every_declared_key_is_in_the_reference():
    md = schemas.markdown()
    for p, *_ in rows(section_of(Scenario)):
        assert f"| `{p}` |" in md
    assert "| `scale_out.nic_bandwidth` |" in md and "| `collectives.nvls_efficiency` |" in md
    assert "| `gemm[].points[].tflops` |" in md
    assert set(SCENARIO) == {"name", "model", "training", "parallel", "cluster", "network", "seed", "cost", "reliability"}
    assert "schema" in PROFILE


def test_declared_errors_are_all_reported_in_todays_form(tmp_path):
    raw = _yaml(SCENARIOS[0])
    raw["training"]["precisoin"] = "bf16"
    raw["parallel"]["tp"] = "four"
    raw["network"] = {"protocl": "LL"}
    raw["cluster"]["jitter"] = {"sigma": "big"}
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as e:
        load_scenario(f)
    text = str(e.value)
    assert f"{f}: training.precisoin: unknown key; did you mean `precision`?" in text
    assert f"{f}: parallel.tp: expected a whole number >= 1, got 'four'; write e.g. `8`" in text
    assert f"{f}: network.protocl: unknown key; did you mean `protocol`?" in text
    assert f"{f}: cluster.jitter.sigma: expected a number, got 'big'; write e.g. `0.8`" in text


def test_every_topology_and_profile_key_is_declared_with_a_doc():
    """Every builder declares its keys as `Key`s (none of the older tuples), each with a doc."""
    for b in BUILDERS.values():
        assert all(isinstance(k, Key) for k in b.schema.values()), b.kind
        for p, _, _, _, doc in rows(Section(b.schema)):
            assert doc, f"{b.kind}: {p} has no doc"
    for p, _, _, _, doc in rows(PROFILE):
        assert doc, f"profile: {p} has no doc"
    md = schemas.markdown()
    assert "| `switches[].kind` |" in md and "| `links[].flow_bandwidth` |" in md and "| `global_links.latency` |" in md


def test_reliability_section_is_declared_and_always_checked(tmp_path):
    """`reliability:` is in the key reference and the JSON Schema, and load_scenario checks it even
    where nothing imported the reliability study."""
    md = schemas.markdown()
    for p in ("reliability.horizon", "reliability.checkpoint.in_memory.replicas", "reliability.failures.categories.<name>.per"):
        assert f"| `{p}` |" in md, p
    raw = _yaml(ROOT / "scenarios" / "llama3-405b-h100-16384-goodput.yaml")
    raw["reliability"]["spares"]["hot_nodez"] = 3
    raw["reliability"]["failures"]["categories"] = {"faulty_gpu": {"count": 1, "per": "rack"}, "ssd": None}
    errs = _errors(raw, schemas.scenario_schema())
    assert any(e.startswith(".reliability.spares.hot_nodez: not allowed") for e in errs), errs
    assert any(e.startswith(".reliability.failures.categories.faulty_gpu") for e in errs), errs
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(raw))
    code = ("import sys\nfrom simtrain.errors import ConfigError\nfrom simtrain.spec.loading import load_scenario\n"
            f"try:\n    load_scenario({str(f)!r})\nexcept ConfigError as e:\n    print(e)\n"
            "print(any(m.startswith('simtrain.studies') for m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True).stdout
    assert "reliability.spares.hot_nodez: unknown key; did you mean `hot_nodes`?" in out
    assert "reliability.failures.categories.faulty_gpu.per: 'rack' is not one of gpu, host, nic, job" in out
    assert out.strip().endswith("False")


def test_committed_key_reference_is_what_the_declarations_give():
    f = ROOT / "docs" / "reference" / "keys.md"
    assert f.read_text(encoding="utf-8") == schemas.markdown(), f"{f} is stale: run `simtrain schema --markdown > {f.relative_to(ROOT)}`"


def test_schema_check_says_the_committed_schemas_are_current(capsys):
    """`simtrain schema --check schemas/` on the committed files: exit 0 and one line saying so (a
    silent success reads as if nothing was checked)."""
    from simtrain.cli.main import main
    assert main(["schema", "--check", str(ROOT / "schemas")]) == 0
    assert "3 schemas up to date" in capsys.readouterr().out
