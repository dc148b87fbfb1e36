"""Shared plumbing: command helpers, process killing, the cross-process lock and the leftover sweeper.

Everything a test bed creates is named ``hpcjt-<owner pid>-<id>...`` (namespaces, temp dirs) or
``hpcjt-<id>`` (the one interface in the root namespace), so a later run can tell its own objects
from those of a crashed run, and never touches anything else.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Self

PREFIX = "hpcjt-"
_LOCK_FILE = Path(tempfile.gettempdir()) / "hpcjt.lock"


def sh(*argv: str, check: bool = True, input: str | None = None) -> str:
    """Run a command in the root namespace; raise with its stderr on failure."""
    done = subprocess.run(argv, input=input, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


@contextlib.contextmanager
def machine_lock() -> Iterator[None]:
    """Serialise subnet choice and sweeping between concurrent test beds (pytest-xdist, benchmarks)."""
    with open(_LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def netns_pids(netns: str) -> list[int]:
    return [int(pid) for pid in sh("ip", "netns", "pids", netns, check=False).split()]


def kill_all(pids_of: Callable[[], list[int]], grace: float = 3.0) -> None:
    """SIGTERM what pids_of() lists, then SIGKILL whatever is still there after `grace` seconds."""
    deadline = time.monotonic() + grace
    sig = signal.SIGTERM
    while pids := pids_of():
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        if time.monotonic() > deadline + 5:
            raise RuntimeError(f"processes {pids} survived SIGKILL")
        time.sleep(0.05)


def pids_with_arg(text: str) -> list[int]:
    """Processes whose command line contains `text` (a unique temp path): smbd and its helpers."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            with contextlib.suppress(OSError):
                if text.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _owner(name: str) -> int | None:
    """The owner pid in `hpcjt-<pid>-<id>...`, or None for a name that is not ours."""
    parts = name.removeprefix(PREFIX).split("-")
    return int(parts[0]) if name.startswith(PREFIX) and len(parts) >= 2 and parts[0].isdigit() else None


def sweep_leftovers() -> list[str]:
    """Remove namespaces, interfaces, processes and temp dirs of test beds whose process has died."""
    removed = []
    with machine_lock():
        for line in sh("ip", "netns", "list", check=False).splitlines():
            netns = line.split()[0] if line.split() else ""
            owner = _owner(netns)
            if owner is None or _alive(owner):
                continue
            kill_all(functools.partial(netns_pids, netns))
            bed_id = netns.removeprefix(PREFIX).split("-")[1]
            sh("ip", "link", "del", f"{PREFIX}{bed_id}", check=False)  # already gone with its namespace
            sh("ip", "netns", "del", netns, check=False)
            removed.append(netns)
        for path in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
            owner = _owner(path.name)
            if owner is not None and not _alive(owner):
                kill_all(functools.partial(pids_with_arg, str(path)))
                shutil.rmtree(path, ignore_errors=True)
                removed.append(str(path))
    return removed


# Backstop for a bed whose `with` block never finished (an interpreter exit without unwinding).
_open: dict[int, Callable[[], None]] = {}


def on_exit(obj: object, close: Callable[[], None]) -> None:
    _open[id(obj)] = close


def closed(obj: object) -> None:
    _open.pop(id(obj), None)


@atexit.register
def _close_all() -> None:
    for close in reversed(list(_open.values())):
        with contextlib.suppress(Exception):
            close()


class Service:
    """A context manager over `start()` and `close()`: a failed start is undone before it raises."""

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
