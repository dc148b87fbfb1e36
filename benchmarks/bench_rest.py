"""What a submission over the REST API costs: HTTP requests and wall time, by node count.

Against the local head node (hpcjob.emulator) with 130 GPU nodes: `hpcjob submit -n N` (node choice
from the group, job creation from the XML, submission; no upload, no mount step) for N = 2, 16 and
128, then the requests one status poll of the 128-node job takes. The jobs are canceled at once: the
tasks' command is `/bin/true`, since only the submission is measured.

    .venv/bin/python benchmarks/bench_rest.py [--repeats 3]
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hpcjob.backends.rest import RestClient  # noqa: E402
from hpcjob.emulator import HeadNode, NodeSpec  # noqa: E402

PASSWORD = "bench-Pw-1"
GPU = ("ComputeNodes", "LinuxNodes", "GPUNodes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    nodes = [NodeSpec("LOCALHOST", groups=GPU)] + [NodeSpec(f"GPU{i:03d}", groups=GPU) for i in range(2, 131)]
    with (
        HeadNode(nodes, users={"alice": PASSWORD}, grace_period=0.0) as head,
        tempfile.TemporaryDirectory() as tmp,
    ):
        script = Path(tmp) / "train.py"
        script.write_text("print('never run')\n")
        env = {
            **os.environ,
            "HPCJOB_CONFIG": str(Path(tmp) / "clusters.toml"),
            "BENCH_PW": PASSWORD,
            "XDG_STATE_HOME": tmp,
        }
        subprocess.run(
            [
                sys.executable,
                "-m",
                "hpcjob.cli",
                "cluster",
                "add",
                "emu",
                "--url",
                head.url,
                "--user",
                "alice",
                "--password-env",
                "BENCH_PW",
                "--ca-bundle",
                head.ca_file,
                "--node-group",
                "GPUNodes",
            ],
            env=env,
            check=True,
            capture_output=True,
        )
        client = RestClient(head.url, "alice", PASSWORD, verify=head.ca_file)
        last_job = 0
        for count in (2, 16, 128):
            times, requests = [], []
            for _ in range(args.repeats):
                before = len(head.requests)
                start = time.perf_counter()
                done = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "hpcjob.cli",
                        "submit",
                        "--no-mount-step",
                        "--python",
                        "/bin/true",
                        "--command-limit",
                        "2000",
                        "-n",
                        str(count),
                        str(script),
                    ],
                    env=env,
                    capture_output=True,
                    text=True,
                )
                times.append(time.perf_counter() - start)
                requests.append(len(head.requests) - before)
                if done.returncode:
                    raise SystemExit(done.stderr)
                last_job = int(done.stdout.split("submitted job ")[1].split()[0])
                client.cancel(last_job, "benchmark", forced=True)
                head.wait_job(last_job, timeout=60)
            print(
                f"{count:>3} nodes: {statistics.median(requests):.0f} HTTP requests, median wall time "
                f"{statistics.median(times):.2f} s (the CLI's start included)",
                flush=True,
            )
        before = len(head.requests)
        info = client.job_with_tasks(last_job)
        print(f"one status poll of a {len(info.tasks)}-task job: {len(head.requests) - before} HTTP requests")


if __name__ == "__main__":
    main()
