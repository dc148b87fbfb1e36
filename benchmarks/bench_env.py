"""What the job's environment (`--requirements`) costs a job: the first job's set-up, and a later one's.

Each task runs `.hpcjob/env.py` before torchrun. The first job with a requirements file builds the
environment (a virtual environment, then pip install); every later job with the same requirements finds
it complete and installs nothing. This times env.py as a task runs it, on a fresh folder of environments
(the first job) and again (a second job), with a real pip install of two small wheels from a local
wheelhouse (no index is reachable), and two tasks at once as the two nodes of one job start: one builds,
one waits. Figures: min / median / max of each over the repeats.

Then where the environment lives (`--env-on`): the time to import torch and torchvision on a test-bed host
(its own network namespace) from the share, served by a real smbd on the head host's address, against
from the host's local disk. The share is read through smbnetfs (libsmbclient under FUSE: this kernel
cannot mount CIFS), a copy of this checkout's site-packages (hard links) in the share folder. Needs root,
samba and smbnetfs (`apt-get install smbnetfs`); skipped, and said, without them.

    .venv/bin/python benchmarks/bench_env.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpcjob.job.plan import ENVS_VAR, REQUIREMENTS_VAR, requirements_file
from tests.test_env import make_wheel, requirements
from tests.testbed import TestBed
from tests.testbed.bed import smbnetfs_share

BUILDER = Path(__file__).resolve().parents[1] / "hpcjob" / "node" / "env.py"


def tasks(job_dir: Path, envs: Path, text: str, count: int) -> float:
    """Seconds until `count` tasks that start together all have the environment."""
    variables = {
        "PATH": os.environ["PATH"],
        REQUIREMENTS_VAR: requirements_file(text),
        ENVS_VAR: str(envs),
        "HPCJOB_LOG_DIR": str(job_dir / "logs"),
    }
    started = time.perf_counter()
    running = [
        subprocess.Popen(
            [sys.executable, str(BUILDER)],
            cwd=job_dir,
            env={**variables, "HPCJOB_NODE": f"N{n}"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(count)
    ]
    for process in running:
        _, err = process.communicate(timeout=300)
        if process.returncode != 0:
            raise SystemExit(f"env.py failed: {err}")
    return time.perf_counter() - started


IMPORT = (
    "import sys, time; sys.path.insert(0, sys.argv[1]); started = time.perf_counter(); "
    "import torch, torchvision; print(time.perf_counter() - started)"
)


def import_times(repeats: int) -> tuple[list[float], list[float]] | None:
    """Seconds to import torch and torchvision on a test-bed host: from its local disk, from the share."""
    if os.geteuid() != 0 or not all(map(shutil.which, ("smbd", "smbnetfs", "fusermount"))):
        print("import times skipped: they need root, samba and smbnetfs (apt-get install smbnetfs)")
        return None
    import site

    packages = Path(site.getsitepackages()[0])
    with TestBed(("node1",)) as bed:
        copy = bed.share_folder / "site-packages"
        subprocess.run(["cp", "-al", str(packages), str(copy)], check=True)  # hard links: same bytes
        host = bed["node1"]
        local: list[float] = []
        share: list[float] = []
        with smbnetfs_share(bed, "node1") as mounted:
            over_smb = f"{mounted}/site-packages"
            for repeat in range(repeats):
                for where, times in ((str(packages), local), (over_smb, share)):
                    out = host.check_output([sys.executable, "-S", "-c", IMPORT, where], timeout=600)
                    times.append(float(out))
                print(f"import {repeat + 1}/{repeats}: local {local[-1]:.2f} s, share {share[-1]:.2f} s",
                      file=sys.stderr)  # fmt: skip
    return local, share


def row(name: str, times: list[float]) -> str:
    return f"| {name} | {min(times):.2f} s | {statistics.median(times):.2f} s | {max(times):.2f} s |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    first: list[float] = []
    second: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder)
        wheels = base / "wheels"
        wheels.mkdir()
        make_wheel(wheels, "tinya", "1.0", "VALUE = 1\n")
        make_wheel(wheels, "tinyb", "2.0", "VALUE = 2\n")
        text = requirements(wheels, "tinya==1.0", "tinyb==2.0")
        job_dir = base / "job"
        (job_dir / "logs").mkdir(parents=True)
        (job_dir / requirements_file(text)).parent.mkdir()
        (job_dir / requirements_file(text)).write_text(text)
        for repeat in range(args.repeats):
            envs = base / f"envs-{repeat}"
            first.append(tasks(job_dir, envs, text, 2))
            second.append(tasks(job_dir, envs, text, 2))
            print(
                f"repeat {repeat + 1}/{args.repeats}: {first[-1]:.2f} s, then {second[-1]:.2f} s",
                file=sys.stderr,
            )
    print(f"environment set-up of a 2-node job, {args.repeats} repeats, Python {sys.version.split()[0]}")
    print("| job | min | median | max |")
    print("|---|---|---|---|")
    print(row("first (venv and pip install of 2 wheels; one task builds, one waits)", first))
    print(row("second, same requirements (found complete: nothing installed)", second))
    imports = import_times(args.repeats)
    if imports is not None:
        local, share = imports
        print(f"\nimport torch, torchvision on a test-bed host, {args.repeats} repeats")
        print("| environment on | min | median | max |")
        print("|---|---|---|---|")
        print(row("the node's local disk (--env-on node-local)", local))
        print(row("the share, over SMB from smbd on the head host (--env-on share)", share))
        print(f"share / local (medians): {statistics.median(share) / statistics.median(local):.1f}x")


if __name__ == "__main__":
    main()
