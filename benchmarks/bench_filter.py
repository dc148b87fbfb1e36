"""What hpcjob's execution filter costs each task start on a node, and how long a start can take at most.

The node agent runs the filter at every task start of every job on the node, hpcjob's or not, and the
head node gives up on a start after 40 s. This installs the filter into a folder standing for a node
(its own files under HPCJOB_NODE_ROOT, `mount`/`mountpoint` stand-ins on PATH that answer at once, or
hang), runs it as the agent does (PATH alone, stdout and stderr together, from /dev/shm) and prints the
median time of each kind of start, per Python found (the node's own python3 may be as old as 3.6), and
the time a start takes when the share's server never answers.

    .venv/bin/python benchmarks/bench_filter.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpcjob.job.plan import AllowedShare, user_mount_point
from hpcjob.job.render.text import filter_install_command
from hpcjob.node import mount_filter

SHARE = "//HEADNODE/CcpSpoolDir/app"
OWNER = "HPC\\" + pwd.getpwuid(os.geteuid()).pw_name
STUBS = {
    "mount": '#!/bin/bash\n[ -e "$STATE/hang" ] && sleep 120\ntouch "$STATE/m$(echo "$4" | tr / _)"\n',
    "mountpoint": '#!/bin/bash\n[ -e "$STATE/m$(echo "$2" | tr / _)" ]\n',
}


def start(env: dict[str, str], first: bool = True) -> bytes:
    request: dict[str, object] = {
        "m_Item1": {"JobId": 1, "TaskId": 1},
        "m_Item2": {"commandLine": "hostname", "environmentVariables": env, "workingDirectory": "/tmp"},
    }
    if first:
        request.update(m_Item3=OWNER, m_Item4="pw", m_Item5=None, m_Item6=None)
    return json.dumps(request).encode()


def pythons() -> list[tuple[str, str]]:
    """(label, path) of each python3 to try: this one, and a 3.6 if the machine has one."""
    found = [("python " + sys.version.split()[0], sys.executable)]
    pyenv = Path.home() / ".pyenv" / "versions"
    for candidate in [shutil.which("python3.6"), *map(str, sorted(pyenv.glob("3.6*/bin/python3.6")))]:
        if candidate and subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return [*found, ("python 3.6", candidate)]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    repeats = parser.parse_args().repeats
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        node, state, stubs, py = base / "node", base / "state", base / "bin", base / "py"
        for folder in (node, state, stubs, py):
            folder.mkdir()
        for name, text in STUBS.items():
            (stubs / name).write_text(text.replace("$STATE", str(state)))
            (stubs / name).chmod(0o755)
        allowed = AllowedShare.checked(SHARE, str(base / "app"), "vers=3.0")
        point = user_mount_point(allowed.mount_root, OWNER)
        env = {"PATH": f"{py}:{stubs}:{os.environ['PATH']}", mount_filter.NODE_ROOT_VAR: str(node)}
        subprocess.run(
            ["bash", "-c", filter_install_command([allowed])], env=env, check=True, capture_output=True
        )
        filters = node / mount_filter.FILTERS_DIR.lstrip("/")
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None

        def run(event: str, data: bytes) -> float:
            began = time.perf_counter()
            done = subprocess.run(
                ["/bin/bash", "-c", str(filters / f"{event}.sh")],
                input=data,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=shm,
                timeout=60,
            )
            took = time.perf_counter() - began
            json.loads(done.stdout)  # the agent's parse: the whole output is the JSON
            return took

        asking = {mount_filter.REQUEST_VAR: f"{SHARE}|{point}"}
        cases = [
            ("a job that names no share (passed through)", "OnJobTaskStart", start({"A": "1"})),
            ("first task, share already mounted", "OnJobTaskStart", start(asking)),
            ("later task (OnTaskStart), mounted", "OnTaskStart", start(asking, first=False)),
        ]
        for label, python in pythons():
            (py / "python3").unlink(missing_ok=True)
            (py / "python3").symlink_to(python)
            run("OnJobTaskStart", start(asking))  # mounts once: the cases below find it mounted
            for case, event, data in cases:
                times = [run(event, data) for _ in range(repeats)]
                rows.append((label, case, f"{statistics.median(times) * 1000:.0f} ms"))
        (state / "hang").touch()
        for mark in state.glob("m*"):
            mark.unlink()
        hung = run("OnJobTaskStart", start(asking))
        rows.append(
            ("", f"a mount that never answers (bound {mount_filter.BUDGET_S:.0f} s)", f"{hung:.1f} s")
        )
    width = max(len(r[1]) for r in rows)
    print(f"{'python':<16} {'task start':<{width}} {'median':>8}")
    for label, case, figure in rows:
        print(f"{label:<16} {case:<{width}} {figure:>8}")


if __name__ == "__main__":
    main()
