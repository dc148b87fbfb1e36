"""How much `hpcjob run --local` costs over starting the same two torchrun commands by hand.

Runs the same short training (training/run_ddp.py, synthetic data) both ways, alternating, and prints
the median wall times and their ratio (goal: at most 1.05). Then how long the command line takes to
start: `hpcjob --help` (goal: under 100 ms) and `hpcjob render` of 2 nodes (goal: under 150 ms), each
the venv's own `hpcjob` script (no shim), with its minimum, median and maximum, and the modules each
imports that it does not use (none should be).

    .venv/bin/python benchmarks/bench_local.py [--repeats 5] [--start-repeats 20] [--start-only]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "training" / "run_ddp.py"
TRAIN_ARGS = ["--epochs", "1", "--train-samples", "1024", "--test-samples", "256", "--no-resume"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def time_hpcjob(share: Path, index: int) -> float:
    command = [
        sys.executable,
        "-m",
        "hpcjob.cli",
        "run",
        "--local",
        "--quiet",
        "-n",
        "2",
        "--mount-point",
        str(share),
        "--run-id",
        f"bench-{index}",
        str(TRAIN),
        *TRAIN_ARGS,
    ]
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def time_by_hand(workdir: Path, index: int) -> float:
    port = free_port()
    commands = [
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            "--nproc_per_node=1",
            "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{port}",
            f"--rdzv_id=hand-{index}",
            f"--rdzv_conf=is_host={1 if node == 0 else 0}",
            "--max_restarts=0",
            str(TRAIN),
            *TRAIN_ARGS,
        ]
        for node in range(2)
    ]
    start = time.perf_counter()
    processes = [
        subprocess.Popen(c, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for c in commands
    ]
    if any(p.wait() != 0 for p in processes):
        raise SystemExit("a torchrun started by hand failed")
    return time.perf_counter() - start


# What the command line must not import to parse and render (issue 39): the API, the follower,
# onboarding, and the heavy libraries.
UNUSED = ("hpcjob.api", "hpcjob.runner.attempts", "hpcjob.azure.onboard", "requests", "torch", "winrm")
RENDER = ["render", "-n", "2", "--node", "GPU1", "--node", "GPU2", str(TRAIN)]


def hpcjob_command() -> list[str]:
    """The venv's own `hpcjob` script, as a user runs it; else the module."""
    script = Path(sys.executable).parent / "hpcjob"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "hpcjob.cli"]


def time_start(argv: list[str], repeats: int) -> tuple[list[float], list[str]]:
    """`hpcjob ARGV`'s wall times, and the modules of UNUSED it imports."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(
            [*hpcjob_command(), *argv], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        times.append(time.perf_counter() - start)
    probe = (
        "import sys; from hpcjob.cli import cli\n"
        f"try:\n    cli.main({argv!r}, standalone_mode=False)\nexcept SystemExit: pass\n"
        f"print('UNUSED', *sorted({set(UNUSED)!r} & set(sys.modules)))"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO
    )
    return times, found.stdout.splitlines()[-1].split()[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--start-repeats", type=int, default=20)
    parser.add_argument("--start-only", action="store_true", help="time the start-up alone, no training")
    args = parser.parse_args()
    if not args.start_only:
        hpcjob_times, hand_times = [], []
        with tempfile.TemporaryDirectory() as tmp:
            for index in range(args.repeats):
                # Alternate, so that drift in the machine's load touches both alike.
                hand_times.append(time_by_hand(Path(tmp), index))
                hpcjob_times.append(time_hpcjob(Path(tmp) / "share", index))
                print(
                    f"run {index + 1}: by hand {hand_times[-1]:.2f} s, hpcjob {hpcjob_times[-1]:.2f} s",
                    flush=True,
                )
        hand, ours = statistics.median(hand_times), statistics.median(hpcjob_times)
        print(f"median wall time, 2 nodes x 1 process: by hand {hand:.2f} s, hpcjob run --local {ours:.2f} s")
        spread = sorted(o / h for o, h in zip(hpcjob_times, hand_times, strict=True))
        print(
            f"ratio hpcjob / by hand: {ours / hand:.3f} (goal <= 1.05; run by run {spread[0]:.3f} to "
            f"{spread[-1]:.3f})"
        )
    print(f"{'command':<16} {'min':>7} {'median':>7} {'max':>7}  goal    unused modules imported")
    for name, argv, goal in (("hpcjob --help", ["--help"], 100), ("hpcjob render", RENDER, 150)):
        times, unused = time_start(argv, args.start_repeats)
        ms = [t * 1000 for t in times]
        print(
            f"{name:<16} {min(ms):>5.0f}ms {statistics.median(ms):>5.0f}ms {max(ms):>5.0f}ms  <{goal}ms  "
            f"{' '.join(unused) or 'none'}"
        )


if __name__ == "__main__":
    main()
