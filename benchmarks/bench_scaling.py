"""How training throughput scales with the number of nodes: `hpcjob run --local` with 1, 2 and 4 nodes.

The same training (training/run_ddp.py, synthetic data, a fixed batch per rank and a fixed number of
steps per epoch, so each rank does the same work at every size: weak scaling), its second epoch's
samples/s from the job's metrics. Efficiency is samples/s at N nodes over N times samples/s at 1. Prints
a table and draws it (--plot, with matplotlib). On a machine with fewer cores than nodes, the local nodes
share the cores and efficiency falls: that is the machine, not hpcjob; on a GPU machine each local node
gets its own GPUs (hpcjob.backends.local.gpus) and the figures mean more.

    .venv/bin/python benchmarks/bench_scaling.py [--nodes 1 2 4] [--repeats 1] [--plot scaling.png]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "training" / "run_ddp.py"


def throughput(nodes: int, share: Path, index: int, steps: int, batch: int) -> float:
    """samples/s of all ranks in the run's last epoch (the first one pays for the start)."""
    command = [
        sys.executable, "-m", "hpcjob.cli", "run", "--local", "--json", "--quiet", "-n", str(nodes),
        "--mount-point", str(share), "--run-id", f"scaling-{nodes}-{index}", str(TRAIN),
        "--epochs", "2", "--batch-size", str(batch), "--max-steps-per-epoch", str(steps),
        "--train-samples", str(steps * batch * nodes), "--test-samples", "256", "--no-resume",
    ]  # fmt: skip
    # The runs' history goes beside the share, not into the user's.
    env = {**os.environ, "XDG_STATE_HOME": str(share / ".state"), "LOCALAPPDATA": str(share / ".state")}
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    if done.returncode != 0:
        raise SystemExit(f"bench_scaling: {nodes} node(s) failed:\n{done.stderr[-2000:]}")
    metrics = json.loads(done.stdout)["metrics"]
    return float(metrics["samples_per_sec"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=1, help="runs per size; the median is shown")
    parser.add_argument("--steps", type=int, default=60, help="training steps per epoch and rank")
    parser.add_argument("--batch-size", type=int, default=128, help="batch per rank")
    parser.add_argument("--plot", type=Path, help="also draw the table into this PNG (matplotlib)")
    args = parser.parse_args()
    cores = os.cpu_count()
    print(f"bench_scaling: {cores} CPU core(s); weak scaling, batch {args.batch_size} a rank", flush=True)
    figures: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as share:
        for nodes in args.nodes:
            runs = [
                throughput(nodes, Path(share), i, args.steps, args.batch_size) for i in range(args.repeats)
            ]
            figures[nodes] = statistics.median(runs)
            print(f"  {nodes} node(s): {figures[nodes]:.0f} samples/s", flush=True)
    base = figures.get(1) or figures[min(figures)] / min(figures)
    print(f"{'NODES':>5}  {'SAMPLES/S':>10}  {'SPEED-UP':>8}  {'EFFICIENCY':>10}")
    for nodes, value in figures.items():
        print(f"{nodes:>5}  {value:>10.0f}  {value / base:>8.2f}  {value / (nodes * base):>10.0%}")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        sizes = list(figures)
        figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
        left.plot(sizes, [figures[n] for n in sizes], "o-", label="measured")
        left.plot(sizes, [n * base for n in sizes], "--", label="linear")
        left.set(title="samples/s", xlabel="nodes", xticks=sizes)
        left.legend()
        right.plot(sizes, [figures[n] / (n * base) * 100 for n in sizes], "o-")
        right.set(title="efficiency (%)", xlabel="nodes", xticks=sizes, ylim=(0, 110))
        figure.suptitle(f"hpcjob run --local, weak scaling, {cores} CPU core(s)")
        figure.tight_layout()
        figure.savefig(args.plot, dpi=100)
        print(f"bench_scaling: plot in {args.plot}")


if __name__ == "__main__":
    main()
