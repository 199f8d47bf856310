"""Progress bars: drawn on a terminal once work has taken two seconds, never under --json, never
when standard error is not a terminal."""
import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios

from simtrain import progress


def test_off_when_stderr_is_not_a_terminal(capsys):
    # pytest captures stderr into a file: not a terminal, so no bar whatever the delay
    progress.set_enabled(True)
    assert not progress.enabled()
    with progress.bar(3, "x") as b:
        b.update(3)
    assert capsys.readouterr().err == ""


def test_env_and_switch_turn_it_off(monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    progress.set_enabled(True)
    assert progress.enabled()
    monkeypatch.setenv("SIMTRAIN_PROGRESS", "0")
    assert not progress.enabled()
    monkeypatch.delenv("SIMTRAIN_PROGRESS")
    progress.set_enabled(False)
    assert not progress.enabled()
    progress.set_enabled(True)


_SLOW = ("import time, sys\nfrom simtrain import progress\n"
         "progress.set_enabled(sys.argv[1] == 'on')\n"
         "for _ in progress.track(range(5), 5, 'work', 'point'):\n    time.sleep(0.6)\n")


def _on_a_terminal(flag: str) -> str:
    """Run the slow loop with stderr on a pseudo-terminal; what the terminal received."""
    master, slave = pty.openpty()
    # a terminal of 24 x 100: tqdm draws nothing on a terminal of zero columns
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    p = subprocess.Popen([sys.executable, "-c", _SLOW, flag], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    p.wait(timeout=30)
    os.close(master)
    return out.decode(errors="replace")


def test_bar_on_a_terminal_after_the_delay():
    # five items of 0.6 s: 3 s in all, past the 2 s delay, so the bar shows its count of 5
    assert "/5" in _on_a_terminal("on")


def test_no_bar_when_switched_off_on_a_terminal():
    assert _on_a_terminal("off") == ""
