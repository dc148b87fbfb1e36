"""How soon `--hang-timeout` names a hung rank and ends its job, on a real 2-node local job with gloo.

Rank 1 goes to sleep after a few all-reduces; rank 0 waits in the next one. For each run this prints
when hpcjob named the hang, counted from the moment rank 0 began to wait (its flight recorder says when:
the bound, then at most a beat for the next beat and one for the follower's next look), and how long the
cancel took from there (the ranks' dumps, then the nodes' stop); then min / median / max of each.

    .venv/bin/python benchmarks/bench_hang.py [--repeats 3] [--bound 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import hpcjob
from hpcjob.job.hangs import beat_interval

SLEEPER = """\
import time
import torch, torch.distributed as dist

dist.init_process_group("gloo")
tensor = torch.ones(8)
for step in range(10_000):
    if step == 5 and dist.get_rank() == 1:
        time.sleep(600)
    dist.all_reduce(tensor)
    time.sleep(0.05)
"""


def one_run(folder: Path, bound: float) -> tuple[float, float, str]:
    """(seconds from rank 0's wait to the hang named, seconds from then to the job's end, the cause)."""
    script = folder / "sleeper.py"
    script.write_text(SLEEPER)
    said: list[tuple[float, str]] = []
    run = hpcjob.submit(script, nodes=2, hang_timeout_s=bound, python=sys.executable, no_env=True)
    run.wait(progress=lambda line: said.append((time.time(), line)))
    ended = time.time()
    named_at = next(at for at, line in said if " hung: " in line)
    beats = Path(run.record.local_root or "") / run.record.log_folder / ".hpcjob-beats"
    began = float(json.loads((beats / "rank-0.json").read_text())["collectives"]["0"][2])
    cause = run.summary.root_cause.describe() if run.summary and run.summary.root_cause else "none"
    return named_at - began, ended - named_at, cause


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bound", type=float, default=10.0, help="--hang-timeout in seconds")
    args = parser.parse_args()
    named, ended = [], []
    print(f"bound {args.bound:g} s, a beat every {beat_interval(args.bound):g} s")
    print(f"{'run':>3}  {'named after':>11}  {'ended after':>11}  cause")
    for index in range(args.repeats):
        with tempfile.TemporaryDirectory() as folder:
            to_named, to_end, cause = one_run(Path(folder), args.bound)
        named.append(to_named)
        ended.append(to_end)
        print(f"{index + 1:>3}  {to_named:>9.1f} s  {to_end:>9.1f} s  {cause}")
    for label, values in (("named after rank 0 began to wait", named), ("then ended in", ended)):
        print(f"{label}: {min(values):.1f} / {statistics.median(values):.1f} / {max(values):.1f} s")


if __name__ == "__main__":
    main()
