"""How long a run takes to go on after it loses a node, and how much training it does again.

Against the local head node (hpcjob.emulator, its nodes' tasks run here) with 3 GPU nodes:
`hpcjob submit --wait --retries 1 -n 2` of training/run_ddp.py (an epoch of about 2 s: a sleep in each
step), its second node evicted --into-epoch seconds after attempt 1's first checkpoint, in its second
epoch (its processes SIGKILLed; the head node notices
after the detection delay: HPC Pack's is 30 s x 3 heartbeats, here --detection-delay). Measured per
run, from the eviction: when the head node noticed (the delay), when attempt 2's job was submitted, and
when attempt 2 did its first training step; and the training lost: from attempt 1's last checkpoint (its
last epoch's end) to the eviction. Prints min / median / max of each.

    .venv/bin/python benchmarks/bench_retry.py [--repeats 3] [--detection-delay 2] [--into-epoch 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hpcjob.backends.local import free_port  # noqa: E402
from hpcjob.cli.tables import table  # noqa: E402
from hpcjob.emulator import HeadNode, NodeSpec  # noqa: E402

PASSWORD = "bench-Pw-1"
GPU = ("ComputeNodes", "LinuxNodes", "GPUNodes")
TRAIN = REPO / "training" / "run_ddp.py"
# 512 samples, batches of 32 on 2 ranks: 8 steps an epoch, each 0.25 s: an epoch of about 2 s.
SMALL = ["--train-samples", "512", "--test-samples", "256", "--batch-size", "32", "--step-sleep", "0.25"]


def events(folder: Path) -> list[dict[str, object]]:
    """Rank 0's timeline in a log folder (hpctorch.Metrics's lines)."""
    found: list[dict[str, object]] = []
    for path in (folder / "metrics").glob("*.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            event = json.loads(line)
            if event.get("rank") == 0:
                found.append(event)
    return sorted(found, key=lambda e: float(str(e["t"])))


def one_run(head: HeadNode, env: dict[str, str], share: Path, args: argparse.Namespace) -> dict[str, float]:
    command = [
        sys.executable, "-m", "hpcjob.cli", "submit", "--wait", "--json", "--no-mount-step", "-n", "2",
        "--retries", "1", "--node-wait", "60", "--python", sys.executable, "--rdzv-port", str(free_port()),
        "--env", "HPCJOB_IFNAME=lo", str(TRAIN), "--epochs", "4", *SMALL,
    ]  # fmt: skip
    submit = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    said: list[tuple[float, str]] = []
    assert submit.stderr is not None
    reader = threading.Thread(target=lambda: said.extend((time.time(), line) for line in submit.stderr))
    reader.start()
    checkpoints = share / "hpcjob" / "alice" / "run_ddp" / "checkpoints"
    deadline = time.monotonic() + 300
    while not list(checkpoints.glob("*/step-*/.hpcjob-complete")) and time.monotonic() < deadline:
        time.sleep(0.05)  # attempt 1's first checkpoint: it is in its second epoch
    time.sleep(args.into_epoch)
    lost = time.time()
    head.lose_node("NODE002", "evicted")
    assert submit.stdout is not None
    out = submit.stdout.read()  # stderr is the reader's alone: each line with when it came
    submit.wait(timeout=600)
    reader.join()
    summary = json.loads(out)
    if summary["state"] != "Finished" or not any("was lost" in e for e in summary["events"]):
        raise SystemExit(f"bench_retry: the run did not go on as expected: {summary.get('events')}")
    logs = share / "hpcjob" / "alice" / "run_ddp" / "logs" / summary["run_id"]
    first = [e for e in events(logs) if e["event"] == "epoch" and float(str(e["t"])) <= lost]
    second = [e for e in events(logs / "2") if e["event"] == "first_step"]
    began = [e for e in events(logs / "2") if e["event"] == "start"]  # the program's start, torch imported
    resumed = [e for e in events(logs / "2") if e["event"] == "resume"]
    submitted = next(t for t, line in said if line.startswith("attempt 2 of 2: job "))
    last_checkpoint = float(str(first[-1]["t"])) if first else lost
    return {
        "noticed": args.detection_delay,
        "submitted": submitted - lost,
        "program started": float(str(began[0]["t"])) - lost,
        "resumed": float(str(resumed[0]["t"])) - lost if resumed else float("nan"),
        "first step": float(str(second[0]["t"])) - lost,
        "training lost": lost - last_checkpoint,
        "resumed at epoch": float(summary["metrics"].get("resumed_from_epoch", 0)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--detection-delay", type=float, default=2.0, help="seconds (HPC Pack's: 90)")
    parser.add_argument("--into-epoch", type=float, default=1.0, help="seconds after the first checkpoint")
    args = parser.parse_args()
    figures: list[dict[str, float]] = []
    for repeat in range(args.repeats):
        nodes = [
            NodeSpec("LOCALHOST", groups=GPU),
            NodeSpec("NODE002", groups=GPU),
            NodeSpec("NODE003", groups=GPU),
        ]
        with (
            HeadNode(
                nodes, users={"alice": PASSWORD}, grace_period=1.0, detection_delay_s=args.detection_delay
            ) as head,
            tempfile.TemporaryDirectory() as tmp,
        ):
            share = Path(tmp) / "share"
            share.mkdir()
            env = {
                **os.environ,
                "HPCJOB_CONFIG": str(Path(tmp) / "clusters.toml"),
                "BENCH_PW": PASSWORD,
                "XDG_STATE_HOME": tmp,
                "XDG_DATA_HOME": tmp,
            }
            add = [sys.executable, "-m", "hpcjob.cli", "cluster", "add", "emu", "--url", head.url, "--user"]
            add += ["alice", "--password-env", "BENCH_PW", "--ca-bundle", head.ca_file, "--share"]
            add += ["//HEADNODE/CcpSpoolDir", "--local-share", str(share), "--mount-point", str(share)]
            add += ["--node-group", "GPUNodes", "--poll-interval", "0.5"]
            subprocess.run(add, env=env, check=True, capture_output=True)
            figures.append(one_run(head, env, share, args))
            print(
                f"bench_retry: run {repeat + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in figures[-1].items())
            )
    rows = []
    for key in figures[0]:
        values = [f[key] for f in figures]
        unit = "" if key == "resumed at epoch" else " s"
        rows.append((key, *(f"{v:.1f}{unit}" for v in (min(values), statistics.median(values), max(values)))))
    print()
    for line in table(("FROM THE EVICTION TO", "MIN", "MEDIAN", "MAX"), rows):
        print(line)


if __name__ == "__main__":
    main()
