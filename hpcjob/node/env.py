"""hpcjob's job environment: the job's own Python packages, built once per content, used by every task.

Each task of a job with a requirements file runs this before torchrun, as the job's owner, in the job
folder, with the node's Python:

    HPCJOB_PYTHON=$(python3 .hpcjob/env.py) && "$HPCJOB_PYTHON" -m torch.distributed.run ...

It prints the environment's Python. The environment is a virtual environment in the share's envs folder,
`$HPCJOB_ENVS/<user>/<key>/`: the key hashes the requirements file's text, this node's Python (its path,
version and build) and platform, and the format below, so nodes with another Python get their own. The
first task to take the lock (a folder, made atomically on any file system, SMB included) builds it; the
others wait; it is marked complete only when pip succeeded, so a build that was killed is started again
(its lock stops beating: taken over after HPCJOB_ENV_STALE_S seconds without a beat). A later job with the
same requirements finds it complete and installs nothing. The base Python's own packages (torch, most
often) stay visible below the environment's (a .pth file), so a requirements file adds to the node's
Python instead of reinstalling it; pin a package there to get another version.

A failed install fails the task before training starts: pip's reason on the last line of its stderr
(hpcjob reports it as the job's root cause) and pip's whole log in the run's log folder. The other
tasks of the same run fail with the same line instead of building again; a later run tries again.
Environments of different users never mix (one folder each, made readable by its owner only). Reads
HPCJOB_REQUIREMENTS, HPCJOB_ENVS, and HPCJOB_LOG_DIR, HPCJOB_NODE (set by node.sh). Runs with any
Python 3.6+ on the node; imports nothing from hpcjob.
"""

import contextlib
import hashlib
import json
import os
import platform
import pwd
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import NoReturn, Optional, Tuple

FORMAT = "hpcjob-env-1"  # change it when what an environment holds changes: every key changes with it
COMPLETE = ".hpcjob-complete"
BEAT_S = 5.0


def say(line: str) -> None:
    sys.stderr.write("hpcjob: " + line + "\n")
    sys.stderr.flush()


def fail(line: str) -> NoReturn:
    say("error: " + line)
    sys.exit(1)


def environment_key(requirements: bytes) -> str:
    """What the environment depends on: the requirements and this node's Python and platform."""
    parts = [
        FORMAT.encode(),
        requirements,
        os.path.realpath(sys.executable).encode(),
        sys.version.encode(),
        platform.machine().encode(),
        " ".join(platform.libc_ver()).encode(),
        sys.platform.encode(),
    ]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def owner_folder(root: str) -> str:
    """This user's own folder of environments: nobody else's packages run in their jobs."""
    name = pwd.getpwuid(os.getuid()).pw_name
    if not re.match(r"^[A-Za-z0-9._-]+$", name):
        name = "u" + hashlib.sha256(name.encode()).hexdigest()[:12]
    folder = os.path.join(root, name)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return folder


class Lock:
    """A folder made with mkdir (atomic, also on SMB), with a beat: a file touched while it is held."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.beat = os.path.join(path, "beat")
        self.stop = threading.Event()

    def take(self) -> bool:
        try:
            os.mkdir(self.path)
        except OSError:  # FileExistsError, or what SMB answers for it
            if not os.path.isdir(self.path):
                raise
            return False
        with open(os.path.join(self.path, "owner"), "w") as owner:
            owner.write(
                "%s %d %s\n" % (os.environ.get("HPCJOB_NODE", platform.node()), os.getpid(), time.time())
            )
        open(self.beat, "w").close()
        threading.Thread(target=self._beat, daemon=True).start()
        return True

    def _beat(self) -> None:
        while not self.stop.wait(BEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.beat, None)

    def release(self) -> None:
        self.stop.set()
        shutil.rmtree(self.path, ignore_errors=True)

    def last_beat(self) -> Optional[float]:
        """What the holder last touched (None: the lock is gone), compared with itself only: the nodes'
        clocks need not agree."""
        try:
            return os.stat(self.beat).st_mtime
        except OSError:
            return None if not os.path.isdir(self.path) else -1.0

    def take_over(self) -> None:
        """The holder is gone: one waiter moves the lock aside (rename is atomic), and tries again."""
        aside = "%s.stale-%d" % (self.path, os.getpid())
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


def build(env: str, requirements_path: str, log_path: str) -> Tuple[Optional[str], str]:
    """Build the environment at `env`: its Python, or None and the reason it could not be built."""
    if os.path.isdir(env):
        shutil.rmtree(env)  # what a killed build left: never marked complete
    with open(log_path, "w") as log:
        log.write("$ %s -m venv %s\n" % (sys.executable, env))
        log.flush()
        if subprocess.call([sys.executable, "-m", "venv", env], stdout=log, stderr=subprocess.STDOUT) != 0:
            reason = pip_reason(log_path)
            return None, "%s -m venv failed (on Debian and Ubuntu: install python3-venv): %s" % (
                sys.executable,
                reason,
            )
        python = os.path.join(env, "bin", "python")
        # The base Python's packages, after the environment's own: requirements add to what the node has.
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
            return None, pip_reason(log_path)
    return python, ""


def main() -> str:
    requirements_path = os.environ.get("HPCJOB_REQUIREMENTS", "")
    root = os.environ.get("HPCJOB_ENVS", "")
    if not requirements_path or not root:
        fail("env.py needs HPCJOB_REQUIREMENTS and HPCJOB_ENVS (the job's environment)")
    with open(requirements_path, "rb") as requirements:
        key = environment_key(requirements.read())
    node = os.environ.get("HPCJOB_NODE", platform.node())
    log_dir = os.environ.get("HPCJOB_LOG_DIR", ".")
    run = os.path.basename(log_dir.rstrip("/"))
    folder = owner_folder(root)
    env = os.path.join(folder, key)
    python = os.path.join(env, "bin", "python")
    failed = os.path.join(folder, key + ".failed")
    lock = Lock(os.path.join(folder, key + ".lock"))
    stale_s = float(os.environ.get("HPCJOB_ENV_STALE_S", "60"))
    started = time.time()
    waited = False
    seen: Optional[float] = None
    seen_at = time.monotonic()
    while True:
        if os.path.exists(os.path.join(env, COMPLETE)):
            said = "ready in %.1f s" % (time.time() - started) if waited else "built before"
            say("environment %s (%s): %s" % (key, os.path.basename(requirements_path), said))
            return python
        try:
            with open(failed) as record:
                failed_run, reason = record.read().split("\n", 1)
            if failed_run == run:
                fail("the job's environment did not build: " + reason.strip())
        except (OSError, ValueError):
            pass
        if lock.take():
            try:
                if os.path.exists(os.path.join(env, COMPLETE)):
                    continue
                log_path = os.path.join(log_dir, "%s.env.log" % node)
                say(
                    "building environment %s on %s: pip install -r %s (log: %s)"
                    % (key, node, requirements_path, log_path)
                )
                try:
                    built, reason = build(env, requirements_path, log_path)
                except OSError as exc:  # a folder or file the task may not write: one line, no traceback
                    built, reason = None, "%s: %s" % (exc.strerror, exc.filename)
                if built is None:
                    shutil.rmtree(env, ignore_errors=True)
                    with open(failed, "w") as record:
                        record.write("%s\n%s (%s's whole log: %s)" % (run, reason, node, log_path))
                    fail("the job's environment did not build: %s (whole log: %s)" % (reason, log_path))
                with open(os.path.join(env, COMPLETE + ".tmp"), "w") as marker:
                    json.dump({"requirements": requirements_path, "python": sys.executable, "node": node,
                               "run": run, "seconds": round(time.time() - started, 1)}, marker)  # fmt: skip
                os.rename(os.path.join(env, COMPLETE + ".tmp"), os.path.join(env, COMPLETE))
                if os.path.exists(failed):
                    os.remove(failed)
                waited = True
            finally:
                lock.release()
            continue
        if not waited:
            say("waiting for environment %s, being built by another task" % key)
            waited = True
        beat = lock.last_beat()
        if beat != seen:
            seen, seen_at = beat, time.monotonic()
        elif beat is not None and time.monotonic() - seen_at > stale_s:
            say("the task building environment %s stopped beating: taking over" % key)
            lock.take_over()
            seen, seen_at = None, time.monotonic()
        time.sleep(0.5)


if __name__ == "__main__":
    for stop in (signal.SIGTERM, signal.SIGHUP):  # as Ctrl-C: the lock is released on the way out
        signal.signal(stop, signal.default_int_handler)
    try:
        print(main())
    except KeyboardInterrupt:  # the job canceled while waiting or building: the lock is released
        sys.exit(130)
