"""Writing results: byte-stable JSON, atomic file writes and output directories.

Every writer goes through here, so an output path is checked once, the same way, before a
command simulates anything, and a bad one is reported as `<path>: <what is wrong>; <fix>`:

    check_out_dir(p, "--out", names)   p is (or can become) a writable directory, none of `names`
                                       inside it is a directory
    check_out_file(p, "-o")            p is (or can become) a regular file in a writable directory
    write_atomic(p, data)              temporary file beside p, then rename
    with staged_dir(p) as tmp:         a command's files are written into `tmp` beside p and moved
        ...                            into p together, under a lock on p (see `publish`)

Temporaries are named `.<name>.<pid>.<random>.tmp`; one whose process is gone (a run killed with
SIGKILL leaves one behind) is removed by the next write into the same directory.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:           # not on POSIX: publishing works, without the lock
    fcntl = None

from simtrain.errors import ConfigError, Problem
from simtrain.results.step import Section

TMP_SUFFIX = ".tmp"
_TMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[^.]+\.tmp$")
STALE_AFTER_S = 86400.0       # a temporary this old is stale even when its pid is alive (reused)


def _err(path, problem: str, fix: str) -> ConfigError:
    return ConfigError([Problem(str(path), "", problem, fix)])


def _why(e: OSError) -> str:
    return e.strerror or type(e).__name__


def _tmp_prefix(name: str) -> str:
    return f".{name}.{os.getpid()}."


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:           # exists, owned by someone else
        return True
    return True


def remove_stale_temporaries(directory: Path, name: str | None = None) -> list:
    """Removes temporaries (of `name` only, when given) left in `directory` by a process that is
    gone; returns the paths removed. Never raises: a stale file is untidy, not an error."""
    removed = []
    try:
        entries = list(Path(directory).iterdir())
    except OSError:
        return removed
    now = time.time()
    for f in entries:
        m = _TMP.match(f.name)
        if not m or (name is not None and m["name"] != name):
            continue
        try:
            old = now - f.lstat().st_mtime > STALE_AFTER_S
            if int(m["pid"]) == os.getpid() or (_pid_alive(int(m["pid"])) and not old):
                continue
            if f.is_dir() and not f.is_symlink():
                shutil.rmtree(f)
            else:
                f.unlink()
            removed.append(f)
        except OSError:
            pass
    return removed


def _existing_ancestor(p: Path) -> Path:
    a = p
    while not (a.exists() or a.is_symlink()):
        if a.parent == a:
            break
        a = a.parent
    return a


def _probe_writable(d: Path, target: Path, flag: str) -> None:
    """Creates and removes an empty directory in `d`: the one test that also holds for root, read-only
    mounts and /proc, where permission bits alone say nothing."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=_tmp_prefix("probe"), suffix=TMP_SUFFIX, dir=d))
    except OSError as e:
        where = "" if d == target else f" ({d} is where it would be created)"
        raise _err(target, f"{flag} cannot be written: {_why(e)}{where}",
                   "choose a directory you can write to, or fix its permissions")


def check_out_dir(path: str | Path, flag: str = "--out", names: Sequence[str] = ()) -> Path:
    """Raises a ConfigError unless `path` is a writable directory, or can be created as one, and none
    of `names` inside it is a directory. Creates nothing."""
    p = Path(path)
    if p.exists() or p.is_symlink():
        if not p.is_dir():
            what = "a file" if p.is_file() else "not a directory (a device, a pipe or a broken link)"
            raise _err(p, f"{flag} expects a directory, but this is {what}",
                       "give a directory (it is created if missing), or move the file away")
        for n in names:
            if (p / n).is_dir():
                raise _err(p / n, f"{flag} would write the file {n} here, but this is a directory",
                           "remove or rename that directory, or give another directory")
        _probe_writable(p, p, flag)
        return p
    a = _existing_ancestor(p)
    if not a.is_dir():
        raise _err(p, f"{flag} cannot be created: {a} is a file, not a directory",
                   "give a path that is not under a file")
    _probe_writable(a, p, flag)
    return p


def check_out_file(path: str | Path, flag: str = "-o") -> Path:
    """Raises a ConfigError unless `path` is a regular file, or can be created as one, in a writable
    directory. Creates nothing."""
    p = Path(path)
    if p.is_dir():
        raise _err(p, f"{flag} expects a file, but this is a directory", f"give a file name, e.g. {p / 'out'}")
    if (p.exists() or p.is_symlink()) and not p.is_file():
        raise _err(p, f"{flag} is not a regular file (a device, a pipe or a broken link); simtrain writes a "
                   "temporary file beside it and renames it, which would replace it",
                   "give the path of a regular file")
    parent = p.parent
    if parent.exists() and not parent.is_dir():
        raise _err(p, f"{flag} cannot be created: {parent} is a file, not a directory", "give a path that is not under a file")
    a = _existing_ancestor(parent)
    if not a.is_dir():
        raise _err(p, f"{flag} cannot be created: {a} is a file, not a directory", "give a path that is not under a file")
    _probe_writable(a, p, flag)
    return p


def write_atomic(path: Path, data: bytes) -> None:
    """Writes to a temporary file beside `path`, then renames: a reader never sees half a file. A
    path that cannot be written raises a ConfigError naming it (also when the disk fills up)."""
    path = Path(path)
    if path.is_dir():
        raise _err(path, "cannot write this file: it is a directory", "remove or rename the directory")
    if path.exists() and not path.is_file():
        raise _err(path, "cannot write this file: it is not a regular file (a device or a pipe)", "give a regular file path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _err(path, f"cannot create its directory: {_why(e)}", "give a path under a writable directory, not under a file")
    remove_stale_temporaries(path.parent, path.name)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(path.name), suffix=TMP_SUFFIX, dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise _err(path, f"cannot write it: {_why(e)}", "check the directory's permissions and free space, or write elsewhere")
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def publish(staging: Path, target: Path) -> list:
    """Moves the files of `staging` into the directory `target` (created if missing) and returns
    their names. Concurrent publishers into one directory take turns (an exclusive lock on the
    directory), so the directory holds one run's files, never a mix of two."""
    try:
        target.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_RDONLY)
    except OSError as e:
        raise _err(target, f"cannot create the output directory: {_why(e)}", "choose a directory you can write to")
    names = []
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        remove_stale_temporaries(target)
        for f in sorted(staging.iterdir()):
            dest = target / f.name
            if dest.is_dir() and not f.is_dir():
                raise _err(dest, "cannot write this file: it is a directory", "remove or rename the directory")
            try:
                os.replace(f, dest)
            except OSError as e:
                raise _err(dest, f"cannot write it: {_why(e)}", "check the directory's permissions and free space")
            names.append(f.name)
    finally:
        os.close(fd)              # releases the lock
    return names


@contextmanager
def staged_dir(path: str | Path, flag: str = "--out") -> Iterator[Path]:
    """A temporary directory beside `path` to write a command's files into; when the block ends
    without an error they are moved into `path` together (`publish`). The temporary directory is
    removed either way, so a failure leaves `path` as it was."""
    p = Path(path)
    check_out_dir(p, flag)
    parent = p.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(parent, p.name)
        tmp = Path(tempfile.mkdtemp(prefix=_tmp_prefix(p.name), suffix=TMP_SUFFIX, dir=parent))
    except OSError as e:
        raise _err(p, f"{flag} cannot be written: {_why(e)}", "choose a directory you can write to")
    try:
        yield tmp
        publish(tmp, p)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def to_json(result: dict | Section) -> str:
    """The JSON text of a result dict, or of a result dataclass (its `to_dict()`, in field order)."""
    d = result.to_dict() if isinstance(result, Section) else result
    return json.dumps(d, indent=2, sort_keys=False) + "\n"
