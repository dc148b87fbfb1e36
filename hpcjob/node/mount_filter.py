#!/usr/bin/env python3
"""hpcjob's execution filter for HPC Pack's Linux node agent: mount the share a job names, as root, with
the job owner's own credentials, so that nobody ever writes a password onto a node.

The agent runs filters/OnJobTaskStart.sh as root when a job's task is dispatched to this node and gives
it, on stdin, JSON with the task (`m_Item2`: command line, environment, ...), the owner's user name
(`m_Item3`) and password (`m_Item4`); what the filter prints is what the agent goes on with (Microsoft's
ResolveUserNameAndDoMount.py sample mounts a share this way). This filter acts only on a job whose
environment has HPCJOB_MOUNT = "UNC|MOUNT POINT|OPTIONS": unless the mount point is mounted already, it
mounts the share with a credentials file that only root can read and that is removed right after, and
tells the task what it did in HPCJOB_MOUNT_RESULT: "mounted", "already mounted" or "failed: <why>".
Anything else passes through unchanged. Python 3 standard library only: it runs on the node.
"""

import fcntl
import json
import os
import subprocess
import sys
import tempfile

MOUNT_VAR = "HPCJOB_MOUNT"
RESULT_VAR = "HPCJOB_MOUNT_RESULT"
LOCK = "/tmp/.hpcjob-mount.lock"  # tasks of several jobs may start on this node at once


def main() -> int:
    raw = sys.stdin.read()
    try:
        request = json.loads(raw)
        task = request["m_Item2"]
        env = task.get("environmentVariables") or {}
    except (ValueError, KeyError, TypeError, AttributeError):
        sys.stdout.write(raw)  # not a task start this filter understands: pass it on untouched
        return 0
    wanted = env.get(MOUNT_VAR)
    if wanted:
        env[RESULT_VAR] = mount(
            str(wanted), str(request.get("m_Item3") or ""), str(request.get("m_Item4") or "")
        )
        task["environmentVariables"] = env
        print(
            f"hpcjob mount filter: job {request.get('m_Item1', {}).get('JobId')}: {env[RESULT_VAR]}",
            file=sys.stderr,
        )
    json.dump(request, sys.stdout)
    return 0


def mount(wanted: str, user: str, password: str) -> str:
    parts = wanted.split("|")
    if len(parts) != 3 or not parts[0].startswith("//") or not parts[1].startswith("/"):
        return f"failed: {MOUNT_VAR} must be UNC|MOUNT POINT|OPTIONS"
    share, point, options = parts
    if "\n" in password or "\n" in user:
        return "failed: the user name or password holds a line break, which a credentials file cannot carry"
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if subprocess.run(["mountpoint", "-q", point], check=False).returncode == 0:
            return "already mounted"
        try:
            os.makedirs(point, exist_ok=True)
        except OSError as exc:
            return f"failed: cannot make {point}: {exc.strerror}"
        domain, _, name = user.rpartition("\\")
        fd, path = tempfile.mkstemp(prefix="hpcjob-credentials-")  # mode 0600: root's only
        try:
            with os.fdopen(fd, "w") as f:
                f.write(f"username={name}\npassword={password}\n" + (f"domain={domain}\n" if domain else ""))
            # The password is in the file, never in mount's argv (every process list shows that).
            option = f"credentials={path}" + (f",{options}" if options else "")
            done = subprocess.run(
                ["mount", "-t", "cifs", share, point, "-o", option],
                capture_output=True,
                text=True,
                check=False,
            )
        finally:
            os.unlink(path)
    if done.returncode != 0:
        return "failed: " + (
            " ".join((done.stderr or done.stdout).split())[:300] or f"mount exit code {done.returncode}"
        )
    return "mounted"


if __name__ == "__main__":
    sys.exit(main())
