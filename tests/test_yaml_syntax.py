"""A YAML syntax error names the line and column where the parser stopped (1-based, as editors
count) and what was left open, in one line with a fix that fits a syntax error."""
import subprocess
import sys


def _check(tmp_path, text):
    f = tmp_path / "s.yaml"
    f.write_text(text)
    return subprocess.run([sys.executable, "-m", "simtrain", "check", str(f)], capture_output=True, text=True, timeout=60)


def test_unclosed_brace_names_where_it_opened(tmp_path):
    # the brace opens on line 2 at column 8 ("model: {"), the file ends on line 3 column 1
    p = _check(tmp_path, "name: x\nmodel: {a: 1\n")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert "line 3, column 1" in p.stderr and "opened at line 2, column 8" in p.stderr
    assert "fix the syntax there" in p.stderr and "<unicode string>" not in p.stderr


def test_tab_indentation(tmp_path):
    p = _check(tmp_path, "name: x\nmodel:\n\t a: 1\n")
    assert p.returncode == 2 and "line 3, column 1" in p.stderr and "tab" in p.stderr
