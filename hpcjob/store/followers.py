"""One follower a run (issue 33): whoever follows a run (`submit --wait`, `hpcjob wait`, `Run.wait()`)
holds its lock, so that two followers never both start an attempt. A lock file a run in the state
folder beside the run history (`followers/RUN.lock`), locked with flock (on Windows, msvcrt.locking);
the system lets go of it when its process ends however it ends, so a follower that was killed leaves no
lock behind. The holder writes who it is into the file; a second follower reads that, says so in one
line and starts nothing. The history, and so the lock, is this machine's alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from hpcjob.job.spec import HpcjobError, check_run_id

# Where a Windows byte-range lock sits: past anything the file holds, so that the holder's words stay
# readable to the others (a locked range is unreadable there).
_WINDOWS_LOCK_OFFSET = 1 << 30


class FollowedElsewhere(HpcjobError):
    """Another follower holds the run's lock: this one starts nothing."""


def lock_file(run_id: str) -> Path:
    from hpcjob.store.runs import history_file

    return history_file().with_name("followers") / f"{check_run_id(run_id)}.lock"


@contextlib.contextmanager
def follower_lock(run_id: str, command: str) -> Iterator[None]:
    """Hold run `run_id`'s follower lock while the block runs (`command`: how this follower was asked
    for, which a second one is told); FollowedElsewhere, with who holds it, when another follower does."""
    path = lock_file(run_id)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise HpcjobError(f"cannot make the follower lock {path}: {exc.strerror}") from None
    try:
        if not _try_lock(fd):
            raise FollowedElsewhere(_held_by(run_id, path))
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(), "command": command}
        with contextlib.suppress(OSError):  # who holds it is for the others' message: not needed
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, json.dumps(me).encode())
        yield
    finally:
        os.close(fd)  # lets go of the lock


def _try_lock(fd: int) -> bool:
    """Whether this process now holds the file's lock (False: another does)."""
    if sys.platform == "win32":
        import msvcrt

        os.lseek(fd, _WINDOWS_LOCK_OFFSET, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
    else:
        import fcntl  # here: Windows has none

        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
    return True


def _held_by(run_id: str, path: Path) -> str:
    """The line a second follower says: who follows the run, as its lock file tells."""
    try:
        holder = json.loads(path.read_text(encoding="utf-8"))
        pid, host, since, command = holder["pid"], holder["host"], holder["since"], holder["command"]
        who = (
            f"process {int(pid)} on {host}, since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))}"
            f": {command}"
        )
    except (OSError, ValueError, TypeError, KeyError):
        who = f"its lock file {path} names no process yet"
    return (
        f"run {run_id} is followed by another hpcjob ({who}); it starts the run's attempts, and this one "
        f"starts none: watch it with `hpcjob status {run_id}` or `hpcjob logs {run_id} --follow`"
    )
