"""What a submission and a status poll cost over the REST API and over WinRM: HTTP requests and wall time.

Against the local head node (hpcjob.emulator, both front doors on one scheduler) with 130 GPU nodes:
`hpcjob submit --backend B -n N` (node choice from the group, the run-id check, job creation from the
XML, submission; no upload, no mount step) for N = 2, 16 and 128, then `hpcjob status` of the 16-node
job: each a whole CLI process, so its start-up, the TLS handshake and (WinRM) the NTLM handshake and
the shell's creation are counted. The jobs are canceled at once: the tasks' command is `/bin/true`,
since only the submission is measured. Prints a table.

    .venv/bin/python benchmarks/bench_backends.py [--repeats 3]
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
from hpcjob.cli.tables import table  # noqa: E402
from hpcjob.emulator import HeadNode, NodeSpec  # noqa: E402

PASSWORD = "bench-Pw-1"
GPU = ("ComputeNodes", "LinuxNodes", "GPUNodes")
COUNTS = (2, 16, 128)
STATUS_OF = 16


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
        hpcjob = [sys.executable, "-m", "hpcjob.cli"]
        profile = ["--user", "HPC\\alice", "--password-env", "BENCH_PW", "--ca-bundle", head.ca_file]
        profile += ["--node-group", "GPUNodes", "--winrm-url", head.wsman_url]
        add = [*hpcjob, "cluster", "add", "emu", "--url", head.url, *profile]
        subprocess.run(add, env=env, check=True, capture_output=True)
        client = RestClient(head.url, "HPC\\alice", PASSWORD, verify=head.ca_file)
        logs = {"rest": head.requests, "winrm": head.wsman_requests}
        rows = []
        for backend in ("rest", "winrm"):
            log = logs[backend]
            status_of = 0
            for count in COUNTS:
                times, requests = [], []
                for _ in range(args.repeats):
                    before = len(log)
                    start = time.perf_counter()
                    submit = [
                        *hpcjob,
                        "submit",
                        "--backend",
                        backend,
                        "--no-mount-step",
                        "--python",
                        "/bin/true",
                    ]
                    submit += ["--command-limit", "2000", "-n", str(count), str(script)]
                    done = subprocess.run(submit, env=env, capture_output=True, text=True)
                    times.append(time.perf_counter() - start)
                    requests.append(len(log) - before)
                    if done.returncode:
                        raise SystemExit(done.stderr)
                    job = int(done.stdout.split("submitted job ")[1].split()[0])
                    client.cancel(job, "benchmark", forced=True)
                    head.wait_job(job, timeout=60)
                    status_of = job if count == STATUS_OF else status_of
                rows.append(
                    (
                        backend,
                        f"submit -n {count}",
                        f"{statistics.median(requests):.0f}",
                        f"{statistics.median(times):.2f}",
                    )
                )
                print(f"{backend} submit -n {count}: done", file=sys.stderr, flush=True)
            times, requests = [], []
            for _ in range(args.repeats):
                before = len(log)
                start = time.perf_counter()
                shown = subprocess.run(
                    [*hpcjob, "status", "--backend", backend, str(status_of)],
                    env=env,
                    capture_output=True,
                    text=True,
                )
                times.append(time.perf_counter() - start)
                requests.append(len(log) - before)
                if shown.returncode:
                    raise SystemExit(shown.stderr)
            rows.append(
                (
                    backend,
                    f"status ({STATUS_OF} tasks)",
                    f"{statistics.median(requests):.0f}",
                    f"{statistics.median(times):.2f}",
                )
            )
        print(f"median of {args.repeats}, each a whole `hpcjob` process (its start included)")
        for line in table(("BACKEND", "OPERATION", "HTTP REQUESTS", "WALL TIME (S)"), rows):
            print(line)


if __name__ == "__main__":
    main()
