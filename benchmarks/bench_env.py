"""What the job's environment (`--requirements`) costs a job: the first job's set-up, and a later one's.

Each task runs `.hpcjob/env.py` before torchrun. The first job with a requirements file builds the
environment (a virtual environment, then pip install); every later job with the same requirements finds
it complete and installs nothing. This times env.py as a task runs it, on a fresh folder of environments
(the first job) and again (a second job), with a real pip install of two small wheels from a local
wheelhouse (no index is reachable), and two tasks at once as the two nodes of one job start: one builds,
one waits. Figures: min / median / max of each over the repeats.

    .venv/bin/python benchmarks/bench_env.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpcjob.plan import ENVS_VAR, REQUIREMENTS_VAR, requirements_file
from tests.test_env import make_wheel, requirements

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


if __name__ == "__main__":
    main()
