"""How much `hpcjob run --local` costs over starting the same two torchrun commands by hand.

Runs the same short training (training/run_ddp.py, synthetic data) both ways, alternating, and prints
the median wall times and their ratio (target: at most 1.05). Then the median time of `hpcjob --help`
and the heavy modules it imports (none should be).

    .venv/bin/python benchmarks/bench_local.py [--repeats 5]
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


def time_help(repeats: int) -> tuple[float, list[str]]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "hpcjob.cli", "--help"], check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    probe = (
        "import sys; from hpcjob.cli import cli\n"
        "try:\n    cli.main(['--help'], standalone_mode=False)\nexcept SystemExit: pass\n"
        "print('HEAVY', *sorted({'torch', 'requests', 'winrm', 'jinja2'} & set(sys.modules)))"
    )
    heavy = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return statistics.median(times), heavy.stdout.splitlines()[-1].split()[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--help-repeats", type=int, default=20)
    args = parser.parse_args()
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
    print(f"ratio hpcjob / by hand: {ours / hand:.3f} (target <= 1.05)")
    help_time, heavy = time_help(args.help_repeats)
    print(
        f"median time of hpcjob --help: {help_time * 1000:.0f} ms; heavy modules imported: {heavy or 'none'}"
    )


if __name__ == "__main__":
    main()
