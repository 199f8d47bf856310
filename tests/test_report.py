"""report.html of `run`, `compare`, `search` and RL `run --out`: the page parsed with the standard
library's html.parser. The expected values are the command's own files in the same directory
(result.json, compare.csv, search.csv, the PNGs): the page shows those numbers, not others, embeds
those figures byte for byte, loads nothing from elsewhere, escapes user strings and is byte-identical
for the same input."""
import base64
import csv
import json
from html.parser import HTMLParser

import pytest
import yaml
from conftest import small_scenario
from test_rl_iteration import BASE
from test_search import _big

from simtrain.cli.main import main
from simtrain.errors import ConfigError
from simtrain.results.report import build_report, csv_table

EVIL = "<script>alert(1)</script>"


class Page(HTMLParser):
    """Tables (by class: rows of (data-value or None, text) cells), img srcs, every tag and every
    attribute value that could load something."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tables: dict = {}
        self.imgs: list = []
        self.tags: list = []
        self.links: list = []
        self.text: list = []
        self._table = None
        self._cell = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        for k in ("src", "href", "data"):
            if k in a:
                self.links.append(a[k])
        if tag == "img":
            self.imgs.append(a["src"])
        elif tag == "table":
            self._table = self.tables.setdefault(a.get("class", ""), [])
        elif tag == "tr" and self._table is not None:
            self._table.append([])
        elif tag in ("td", "th") and self._table is not None:
            self._cell = [a.get("data-value"), ""]

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._table[-1].append((self._cell[0], self._cell[1].strip()))
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell[1] += data


def _page(path):
    raw = path.read_text()
    return raw, Page(raw)


def _self_contained(p: Page, raw: str, figures: dict):
    """No script, no stylesheet link, no frame; every image a data: URI equal to the PNG file."""
    assert not {"script", "link", "iframe", "object", "embed"} & set(p.tags)
    assert all(s.startswith("data:") for s in p.links), p.links
    assert "http://" not in raw and "https://" not in raw
    assert len(p.imgs) == len(figures)
    for src, path in zip(p.imgs, figures.values()):
        head, data = src.split(",", 1)
        assert head == "data:image/png;base64"
        assert base64.b64decode(data) == path.read_bytes()


def _by_label(rows):
    return {r[0][1]: r[1:] for r in rows if r}


def test_run_report_shows_result_json_numbers(tmp_path, fast_topology):
    path = small_scenario(tmp_path, fast_topology, name=f"gpt {EVIL} & co")
    out = tmp_path / "o"
    assert main(["run", str(path), "--out", str(out), "--set", "training.global_batch_size=16"]) == 0
    raw, p = _page(out / "report.html")
    r = json.loads((out / "result.json").read_text())
    summ = _by_label(p.tables["summary"])
    # the exact JSON numbers behind the rounded text
    for label, key in (("step time", "step_time_s"), ("tokens/s", "tokens_per_s"), ("MFU", "mfu"),
                       ("peak memory", "peak_memory_bytes"), ("pipeline bubble (share of device time)", "bubble_fraction"),
                       ("usable memory (capacity - reserve)", "usable_memory_bytes")):
        assert float(summ[label][0][0]) == r[key], label
    assert summ["microbatches per step"][0] == ("16", "16")          # global batch 16 / micro batch 1 / dp 1
    assert summ["scenario"][0] == (None, r["scenario"]) and EVIL in r["scenario"]
    # the time breakdown: every part the JSON has, its share of the step
    bd = _by_label(p.tables["breakdown"][1:])
    assert float(bd["compute"][0][0]) == r["breakdown"]["compute_s"]
    assert float(bd["pipeline bubble"][0][0]) == r["breakdown"]["bubble_s"]
    for k in ("tp", "pp", "dp"):
        assert float(bd[f"exposed {k} comm"][0][0]) == r["breakdown"]["exposed_comm_s"][k]
    assert float(bd["compute"][1][0]) == r["breakdown"]["compute_s"] / r["step_time_s"]
    # memory per stage: one row per pipeline rank (pp 4), every kind in bytes
    mem = p.tables["memory"][1:]
    assert len(mem) == 4 == len(r["memory"])
    for row, m in zip(mem, r["memory"]):
        vals = [float(v) for v, _ in row[:7]]
        assert vals == [m["stage"], m["weights"], m["gradients"], m["optimizer"], m["activations"],
                        m["communication_buffers"], m["total"]]
    # user strings escaped: the scenario name is text, never a tag
    assert EVIL not in raw and "&lt;script&gt;alert(1)&lt;/script&gt;" in raw
    _self_contained(p, raw, {"timeline": out / "timeline.png"})
    # same input, same bytes
    again = tmp_path / "again"
    assert main(["run", str(path), "--out", str(again), "--set", "training.global_batch_size=16"]) == 0
    assert (again / "report.html").read_bytes() == (out / "report.html").read_bytes()


def _csv_rows(path):
    return list(csv.reader(path.open()))


def _check_csv_table(rows, table):
    """Every CSV cell in the page's table: numbers as data-value (the CSV text), text as text."""
    assert [c[1] for c in table[0]] == rows[0]
    assert len(table) == len(rows)
    for want, got in zip(rows[1:], table[1:]):
        assert len(got) == len(want)
        for w, (value, text) in zip(want, got):
            try:
                float(w)
                assert value == w
            except ValueError:
                assert value is None and text == w


def test_compare_report_equals_compare_csv(tmp_path, fast_topology):
    path = small_scenario(tmp_path, fast_topology)
    out = tmp_path / "c"
    args = ["compare", str(path), "--set", "parallel.schedule=1f1b,zb_h1", "--set", f"name={json.dumps(EVIL)}"]
    assert main(args + ["--out", str(out)]) == 0
    raw, p = _page(out / "report.html")
    rows = _csv_rows(out / "compare.csv")
    assert len(rows) == 3                       # header + two variants
    _check_csv_table(rows, p.tables["compare"])
    assert EVIL not in raw and "&lt;script&gt;" in raw          # the --set argument, shown under the title
    _self_contained(p, raw, {"compare": out / "compare.png"})
    assert main(args + ["--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "report.html").read_bytes() == (out / "report.html").read_bytes()


def test_search_report_equals_search_csv(tmp_path, plain_topology):
    path = _big(tmp_path, plain_topology)
    args = ["search", str(path), "--max-candidates", "2", "--top", "2"]
    out = tmp_path / "s"
    assert main(args + ["--out", str(out)]) == 0
    raw, p = _page(out / "report.html")
    rows = _csv_rows(out / "search.csv")
    _check_csv_table(rows, p.tables["search"])
    head = rows[0]
    best = dict(zip(head, rows[1]))
    first = dict(zip(head, [v for v, _ in p.tables["search"][1]]))
    assert float(first["step_time_s"]) == float(best["step_time_s"])
    assert "the scenario with the best plan applied" in raw
    assert yaml.safe_load((out / "best.yaml").read_text())["name"] in "".join(p.text)
    _self_contained(p, raw, {"search": out / "search.png"})
    assert main(args + ["--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "report.html").read_bytes() == (out / "report.html").read_bytes()


def test_rl_run_report_shows_phases_and_memory(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump({**BASE, "name": EVIL}))
    out = tmp_path / "o"
    assert main(["run", str(f), "--out", str(out)]) == 0
    raw, p = _page(out / "report.html")
    r = json.loads((out / "result.json").read_text())
    summ = _by_label(p.tables["summary"])
    assert float(summ["step time (steady state)"][0][0]) == r["timing_s/step"]
    assert float(summ["throughput (tokens/s per device, prompt + response)"][0][0]) == r["perf/throughput"]
    phases = _by_label(p.tables["breakdown"][1:])
    assert {"gen", "update_actor", "update_weights"} <= set(phases)
    for ph, cells in phases.items():
        assert float(cells[0][0]) == r[f"timing_s/{ph}"]
    mem = _by_label(p.tables["memory"][1:])
    assert set(mem) == set(r["memory"])
    for ph, cells in mem.items():
        assert float(cells[0][0]) == r["memory"][ph]
    assert EVIL not in raw and "&lt;script&gt;" in raw
    _self_contained(p, raw, {"timeline": out / "timeline.png"})
    assert main(["run", str(f), "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "report.html").read_bytes() == (out / "report.html").read_bytes()


def test_csv_error_rows_are_shaded_and_escaped(tmp_path):
    """An invalid variant's row (its `error` cell filled) is shaded; its message is text."""
    f = tmp_path / "compare.csv"
    f.write_text(f"variant,step_time_s,error\na,0.5,\n{EVIL},,bad {EVIL}\n")
    text = csv_table(f, "compare")
    assert EVIL not in text
    assert text.count('<tr class="bad">') == 1
    assert '<td class="n" data-value="0.5">500.00 ms</td>' in text      # 0.5 s shown by units.fmt_time


def test_unknown_kind_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="unknown report kind"):
        build_report(tmp_path, "sweep", "x")


def test_rl_compare_report_equals_compare_csv(tmp_path):
    """compare on a job file: the page's table is compare.csv (verl's metric names as columns); an
    invalid variant's row is shaded; RL compare draws no figure, so the page embeds none."""
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(BASE))
    out = tmp_path / "cmp"
    assert main(["compare", str(f), "--set", "placement.kind+placement.rollout_devices=split+8,split+7",
                 "--out", str(out)]) == 2                      # split+7 does not load: exit 2, its row says why
    raw, p = _page(out / "report.html")
    rows = _csv_rows(out / "compare.csv")
    _check_csv_table(rows, p.tables["compare"])
    assert raw.count('<tr class="bad">') == 1
    _self_contained(p, raw, {})


def test_csv_cells_shown_by_their_column_unit(tmp_path):
    """Seconds by units.fmt_time (0.25 s -> 250.00 ms), a rate is no time (tokens_per_s), bytes by
    units.fmt_bytes (2^31 B -> 2.00 GiB), fractions as % (0.5 -> 50.0 %); the exact text stays in data-value."""
    f = tmp_path / "search.csv"
    f.write_text("step_time_s,tokens_per_s,peak_memory_bytes,mfu,tp\n0.25,4572017.375,2147483648.0,0.5,8\n")
    rows = Page(csv_table(f, "search")).tables["search"]
    assert rows[1] == [("0.25", "250.00 ms"), ("4572017.375", "4,572,017"), ("2147483648.0", "2.00 GiB"),
                       ("0.5", "50.0 %"), ("8", "8")]


def test_run_report_shows_the_optional_sections(tmp_path, fast_topology):
    """MoE, context-parallel and straggler numbers, when result.json has those sections, are rows of
    the summary with their JSON values, and a plan that does not fit says by how much (the values
    here are written into a real run's result.json)."""
    path = small_scenario(tmp_path, fast_topology)
    out = tmp_path / "o"
    assert main(["run", str(path), "--out", str(out)]) == 0
    r = json.loads((out / "result.json").read_text())
    assert "moe" not in r and "stragglers" not in r
    r["moe"] = {"num_experts": 8, "top_k": 2, "ep": 4, "routing": "balanced", "imbalance_max": 1.25, "dropped_fraction_mean": 0.03}
    r["context_parallel"] = {"cp": 2, "cp_kind": "ring", "tokens_per_rank": 64.0}
    r["stragglers"] = {"count": 1, "step_time_without_s": 0.001, "slowdown": 1.5}
    r["fits_in_memory"], r["memory_shortfall_bytes"] = False, 2.0**30
    (out / "result.json").write_text(json.dumps(r))
    summ = _by_label(Page(build_report(out, "run", "x")).tables["summary"])
    assert summ["experts"][0][1] == "8 (top-2) over ep 4, routing balanced"
    assert summ["busiest ep rank (x the mean)"][0] == ("1.25", "1.25")
    assert summ["assignments dropped"][0] == ("0.03", "3.0 %")
    assert summ["tokens per cp rank"][0] == ("64.0", "64")
    assert summ["step time without stragglers"][0] == ("0.001", "1.00 ms")
    assert summ["slowdown by stragglers"][0] == ("1.5", "1.500")
    assert summ["fits in memory"][0] == (None, "NO (1.00 GiB short)")
