"""hpcjob's job environment: the job's own Python packages, built once per content, used by every task.

Each task of a job with a requirements file runs this before torchrun, as the job's owner, in the job
folder, with the node's Python:

    HPCJOB_PYTHON=$(python3 .hpcjob/env.py) && "$HPCJOB_PYTHON" -m torch.distributed.run ...

It prints the environment's Python. Environments live in HPCJOB_ENVS, one folder per user,
`$HPCJOB_ENVS/<user>/`: a folder on the node's own disk (`~` is the job owner's home), kept between jobs, or
the share's envs folder, which every node uses (`--env-on share`). An environment's key hashes the
requirements file's text, this node's Python (its path, version and build) and platform, and the format
below, so nodes with another Python get their own:

    <key>.lock/           held by the task that builds: `owner` (a random token), `beat` (touched every 5 s)
    <key>-<token>/        one build (a virtual environment), named by its builder's token
    <key>.ready           written last, atomically: the finished build's folder and the digest of what it
                          holds (each file's path, size and time), checked before each use: a build that
                          changed since is built again. Nothing else is used.
    <key>.failed          why the last build failed, and in which run

The first task to take the lock (a folder made with mkdir: atomic on any file system, SMB included) builds;
the others wait: the other nodes' tasks on a share, the tasks of other jobs on the node itself. A builder
whose beat stops (killed, or its node lost) is taken over after HPCJOB_ENV_STALE_S seconds; a builder taken
over while only paused finds its token gone and marks nothing: each build has a folder of its own, so two
builders never write into the same one. A later job with the same requirements finds `<key>.ready` and
installs nothing. The base Python's own packages (torch, most often) stay visible below the environment's (a
.pth file), so a requirements file adds to the node's Python instead of reinstalling it; pin a package there
to get another version.

A failed install fails the task before training starts: pip's reason on the last line of its stderr
(hpcjob reports it as the job's root cause) and pip's whole log in the run's log folder. The other tasks of
the same run fail with the same line instead of building again; a later run tries again.

Nobody else's environment is used: the user's folder must be the user's own and writable by nobody else.
On a share mounted with forceuid and one mode (hpcjob's filter mounts so), every file looks like the
user's: there, what keeps another user out is the share's own permissions, as for the job's code itself.

Reads HPCJOB_REQUIREMENTS, HPCJOB_ENVS, HPCJOB_ENV_ON, and HPCJOB_LOG_DIR, HPCJOB_NODE (set by node.sh).
Runs with any Python 3.6+ on the node; imports nothing from hpcjob.
"""

import binascii
import contextlib
import errno
import hashlib
import json
import os
import platform
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Optional, Set, Tuple

if TYPE_CHECKING:
    from typing import NoReturn  # not in Python 3.6.0 and 3.6.1

FORMAT = "hpcjob-env-2"  # change it when what an environment holds changes: every key changes with it
BEAT_S = 5.0


def say(line: str) -> None:
    sys.stderr.write("hpcjob: " + line + "\n")
    sys.stderr.flush()


def fail(line: str) -> "NoReturn":
    say("error: " + line)
    sys.exit(1)


def environment_key(requirements: bytes) -> str:
    """What the environment depends on: the requirements, this node's Python and platform, the image."""
    parts = [
        FORMAT.encode(),
        requirements,
        os.path.realpath(sys.executable).encode(),
        sys.version.encode(),
        platform.machine().encode(),
        " ".join(platform.libc_ver()).encode(),
        sys.platform.encode(),
        # In a container (--image), its base packages are the image's: another image, another key.
        os.environ.get("CCP_DOCKER_IMAGE", "").encode(),
    ]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def owner_folder(root: str, on_node: bool) -> str:
    """This user's own folder of environments, refused when another user owns it or may write to it:
    nobody else's packages run in this user's jobs. On the node's own disk (`on_node`), the folder above
    it too may be changed by nobody else: the user's own, or root's and, if everyone may write to it,
    sticky (as /tmp), so that no other user can put another folder in place of this user's."""
    name = pwd.getpwuid(os.getuid()).pw_name
    if not re.match(r"^[A-Za-z0-9._-]+$", name):
        name = "u" + hashlib.sha256(name.encode()).hexdigest()[:12]
    folder = os.path.join(root, name)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        above = os.stat(root)
    except OSError as exc:
        fail(
            "cannot make the folder of environments %s: %s (an administrator makes a shared one with "
            "mode 1777, as /tmp)" % (folder, exc.strerror)
        )
    if on_node and (
        above.st_uid not in (0, os.getuid()) or (above.st_mode & 0o002 and not above.st_mode & 0o1000)
    ):
        fail(
            "%s may be changed by other users (it must be yours, or root's and, if everyone may write to "
            "it, sticky: mode 1777): its environments are not used" % root
        )
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        fail(
            "%s is not a folder of yours that only you may write to: its environments are not used "
            "(remove it, or ask the share's administrator)" % folder
        )
    return folder


def write_atomically(path: str, text: str) -> None:
    """Readers see the whole file or none of it (rename replaces in one step, on SMB too)."""
    part = "%s.part-%s" % (path, binascii.hexlify(os.urandom(4)).decode())
    with open(part, "w") as out:
        out.write(text)
    os.rename(part, path)


class Lock:
    """A folder made with mkdir, with the holder's token in it and a beat: a file touched while held."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.token = binascii.hexlify(os.urandom(8)).decode()
        self.stop = threading.Event()
        self.lost = False

    def take(self) -> bool:
        try:
            os.mkdir(self.path)
        except OSError:  # FileExistsError, or what SMB answers for it
            if not os.path.isdir(self.path):
                raise
            return False
        node = os.environ.get("HPCJOB_NODE", platform.node())
        write_atomically(os.path.join(self.path, "owner"), "%s %s %d\n" % (self.token, node, os.getpid()))
        open(os.path.join(self.path, "beat"), "w").close()
        threading.Thread(target=self._beat, daemon=True).start()
        return True

    def _beat(self) -> None:
        while not self.stop.wait(BEAT_S):
            try:
                os.utime(os.path.join(self.path, "beat"), None)
            except OSError:  # moved aside by a task that took over: this holder must mark nothing
                self.lost = True

    def holder(self) -> Optional[str]:
        """The token of whoever holds the lock now (None: nobody, or not said yet)."""
        try:
            with open(os.path.join(self.path, "owner")) as owner:
                return owner.read().split()[0]
        except (OSError, IndexError):
            return None

    def held(self) -> bool:
        return not self.lost and self.holder() == self.token

    def release(self) -> None:
        self.stop.set()
        if self.held():  # never another task's lock
            shutil.rmtree(self.path, ignore_errors=True)

    def last_beat(self) -> Optional[Tuple[Optional[str], float]]:
        """The holder and when it last beat (None: the lock is gone), compared with themselves only:
        the nodes' clocks need not agree."""
        try:
            return self.holder(), os.stat(os.path.join(self.path, "beat")).st_mtime
        except OSError:
            return (self.holder(), -1.0) if os.path.isdir(self.path) else None

    def take_over(self, stale: Optional[str]) -> None:
        """The holder `stale` stopped beating: move its lock aside (rename is atomic: one task does it)
        and try again. A lock held by someone else by then is left alone."""
        if self.holder() != stale:
            return
        node = re.sub(r"[^A-Za-z0-9_-]", "_", os.environ.get("HPCJOB_NODE", platform.node()))
        aside = "%s.stale-%s-%d" % (self.path, node, os.getpid())
        try:
            os.rename(self.path, aside)
        except OSError:
            return
        shutil.rmtree(aside, ignore_errors=True)


def site_packages(python: str) -> str:
    out = subprocess.check_output(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], universal_newlines=True
    )
    return out.strip()


def pip_reason(log_path: str) -> str:
    """pip's own words for why: its last ERROR line, else the log's last line."""
    try:
        with open(log_path, errors="replace") as log:
            lines = [line.strip() for line in log if line.strip()]
    except OSError:
        return "no log"
    errors = [line for line in lines if line.startswith("ERROR:")]
    found = (errors or lines or ["no output"])[-1]
    return found if len(found) <= 300 else found[:297] + "..."


FULL_BELOW = 64 * 1024 * 1024  # bytes free under which a failed build is said to have met a full disk


def full_disk(folder: str) -> str:
    """ "the disk of FOLDER is full (N MB free)" when it nearly is, else "": venv hides ensurepip's own
    ENOSPC behind "returned non-zero exit status 1", and pip's may be one line among many."""
    try:
        info = os.statvfs(folder)
    except OSError:
        return ""
    free = info.f_bavail * info.f_frsize
    if free >= FULL_BELOW:
        return ""
    return "the disk of %s is full (%.1f MB free)" % (folder, free / 1e6)


def build(env: str, requirements_path: str, log_path: str) -> Optional[str]:
    """Build the environment at `env`; None, or the reason it could not be built."""
    with open(log_path, "w") as log:
        log.write("$ %s -m venv %s\n" % (sys.executable, env))
        log.flush()
        if subprocess.call([sys.executable, "-m", "venv", env], stdout=log, stderr=subprocess.STDOUT) != 0:
            reason, full = pip_reason(log_path), full_disk(os.path.dirname(env))
            if full:
                return "%s: %s -m venv said: %s" % (full, sys.executable, reason)
            return "%s -m venv failed (on Debian and Ubuntu: install python3-venv): %s" % (
                sys.executable,
                reason,
            )
        python = os.path.join(env, "bin", "python")
        # The base Python's packages, after the environment's own. Not --system-site-packages: that gives
        # the base interpreter's, and a Python that is itself a virtual environment (a local run's) has its
        # packages (torch) elsewhere.
        base = [
            p
            for p in sys.path
            if os.path.basename(p) in ("site-packages", "dist-packages") and os.path.isdir(p)
        ]
        with open(os.path.join(site_packages(python), "_hpcjob_base.pth"), "w") as pth:
            pth.write("".join(path + "\n" for path in base))
        quiet = ["--disable-pip-version-check", "--no-input", "--no-warn-script-location"]
        command = [python, "-m", "pip", "install", *quiet, "-r", requirements_path]
        log.write("$ %s\n" % " ".join(command))
        log.flush()
        if subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL) != 0:
            full = full_disk(os.path.dirname(env))
            return "%s: pip said: %s" % (full, pip_reason(log_path)) if full else pip_reason(log_path)
    return None


def contents_digest(env: str) -> str:
    """A digest of what the environment holds: every file's path, size and modification time (not its
    bytes: a stat each keeps the check of an environment on the share to a second). The .pyc files that
    imports add later are left out."""
    listing = hashlib.sha256()
    for here, folders, files in os.walk(env):
        folders[:] = sorted(f for f in folders if f != "__pycache__")
        for name in sorted(files):
            path = os.path.join(here, name)
            try:
                info = os.lstat(path)
            except OSError:  # gone meanwhile: not what was built
                return ""
            listing.update(
                ("%s %d %d\n" % (os.path.relpath(path, env), info.st_size, info.st_mtime)).encode()
            )
    return listing.hexdigest()


# Builds found changed: not walked again while their .ready still names them (another task rebuilds).
CHANGED: Set[str] = set()


def ready_python(folder: str, key: str) -> Optional[str]:
    """The Python of the finished build, if there is one and it holds what it held when it was built."""
    try:
        with open(os.path.join(folder, key + ".ready")) as ready:
            record = json.load(ready)
        build_folder, digest = record["build"], record["digest"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    env = os.path.join(folder, os.path.basename(str(build_folder)))
    python = os.path.join(env, "bin", "python")
    if not os.path.exists(python):
        return None
    if env in CHANGED:
        return None
    if contents_digest(env) != digest:
        say("environment %s changed since it was built: building it again" % key)
        CHANGED.add(env)
        return None
    return python


def build_under_lock(lock: Lock, folder: str, key: str, requirements_path: str, run: str) -> Optional[str]:
    """Holding the lock: build in a folder of our own, and mark it ready only if the lock is still ours.
    The Python, or None when another task has it by then (or built it before we could start)."""
    python = ready_python(folder, key)
    if python is not None:
        return python
    for leftover in os.listdir(folder):  # what builders that were taken over left
        if leftover.startswith(key + "-"):
            shutil.rmtree(os.path.join(folder, leftover), ignore_errors=True)
    env = os.path.join(folder, "%s-%s" % (key, lock.token))
    node = os.environ.get("HPCJOB_NODE", platform.node())
    log_path = os.path.join(os.environ.get("HPCJOB_LOG_DIR", "."), "%s.env.log" % node)
    say(
        "building environment %s on %s: pip install -r %s (log: %s)"
        % (key, node, requirements_path, log_path)
    )
    started = time.time()
    try:
        reason = build(env, requirements_path, log_path)
    except OSError as exc:  # a folder or file the task may not write, a full disk: one line, no traceback
        full = full_disk(folder) if exc.errno == errno.ENOSPC else ""
        reason = "%s: %s" % (full or exc.strerror, exc.filename or log_path)
    if not lock.held():
        shutil.rmtree(env, ignore_errors=True)
        say("another task took over building environment %s: waiting for it" % key)
        return None
    if reason is not None:
        shutil.rmtree(env, ignore_errors=True)
        write_atomically(
            os.path.join(folder, key + ".failed"),
            "%s\n%s (%s's whole log: %s)" % (run, reason, node, log_path),
        )
        fail("the job's environment did not build: %s (whole log: %s)" % (reason, log_path))
    record = {"build": os.path.basename(env), "requirements": requirements_path, "python": sys.executable,
              "node": node, "run": run, "seconds": round(time.time() - started, 1),
              "digest": contents_digest(env)}  # fmt: skip
    write_atomically(os.path.join(folder, key + ".ready"), json.dumps(record))
    with contextlib.suppress(OSError):
        os.remove(os.path.join(folder, key + ".failed"))
    return os.path.join(env, "bin", "python")


def main() -> str:
    requirements_path = os.environ.get("HPCJOB_REQUIREMENTS", "")
    root = os.path.expanduser(os.environ.get("HPCJOB_ENVS", ""))
    if not requirements_path or not root:
        fail("env.py needs HPCJOB_REQUIREMENTS and HPCJOB_ENVS (the job's environment)")
    with open(requirements_path, "rb") as requirements:
        key = environment_key(requirements.read())
    run = os.path.basename(os.environ.get("HPCJOB_LOG_DIR", ".").rstrip("/"))
    folder = owner_folder(root, os.environ.get("HPCJOB_ENV_ON") == "node-local")
    lock = Lock(os.path.join(folder, key + ".lock"))
    stale_s = float(os.environ.get("HPCJOB_ENV_STALE_S", "60"))
    started = time.time()
    waited = False
    seen: Optional[Tuple[Optional[str], float]] = None
    seen_at = time.monotonic()
    while True:
        python = ready_python(folder, key)
        if python is not None:
            said = "ready in %.1f s" % (time.time() - started) if waited else "built before"
            say("environment %s (%s): %s" % (key, os.path.basename(requirements_path), said))
            return python
        try:
            with open(os.path.join(folder, key + ".failed")) as record:
                failed_run, reason = record.read().split("\n", 1)
            if failed_run == run:
                fail("the job's environment did not build: " + reason.strip())
        except (OSError, ValueError):
            pass
        if lock.take():
            try:
                built = build_under_lock(lock, folder, key, requirements_path, run)
            finally:
                lock.release()
            waited = True
            if built is not None:
                continue  # says it is ready, from the record
            lock = Lock(lock.path)  # taken over: wait for whoever holds it now, with a new token
            continue
        if not waited:
            say("waiting for environment %s, being built by another task" % key)
            waited = True
        beat = lock.last_beat()
        if beat != seen:
            seen, seen_at = beat, time.monotonic()
        elif beat is not None and time.monotonic() - seen_at > stale_s:
            say("the task building environment %s stopped beating: taking over" % key)
            lock.take_over(beat[0])
            seen, seen_at = None, time.monotonic()
        time.sleep(0.5)


if __name__ == "__main__":
    for stop in (signal.SIGTERM, signal.SIGHUP):  # as Ctrl-C: the lock is released on the way out
        signal.signal(stop, signal.default_int_handler)
    try:
        print(main())
    except KeyboardInterrupt:  # the job canceled while waiting or building
        sys.exit(130)
