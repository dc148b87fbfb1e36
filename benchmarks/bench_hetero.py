"""A preprocessing-heavy training with and without a CPU data node (issue 34), on this machine.

The same training (training/run_ddp.py on a folder of JPEGs, decoded, cropped and augmented on the CPU,
feeding a model whose step is cheaper than that work), the trainer limited to one CPU:

- homogeneous: `hpcjob run --local -n 1`, its own DataLoader worker on that same CPU;
- heterogeneous: `hpcjob run --local -n 1 --data-nodes 1`, the data work on a data node with the other
  CPUs (HPCJOB_LOCAL_TRAINER_CPUS=1: the local backend pins each role to its own CPUs).

Prints, per mode, the step time (one rank's batch over its samples a second), the trainer's data wait,
the share of the step the model computes, and their ratio; then what a step costs at the prices of a
GPU node and a CPU node (the prices cache, else hpcjob's own table: `hpcjob prices --size S`). With C
CPUs here the ceiling is about C x (the trainer keeps one): said beside the figure.

With `--testbed`, the same on the test bed's separate hosts (network namespaces, the share over the
bed's mount, each task's CPUs pinned as on a host of its own size): the job as hpcjob renders it, each
task started as HPC Pack's agent starts it, the data node serving on its own host's address.

    .venv/bin/python benchmarks/bench_hetero.py [--repeats 3] [--epochs 3] [--testbed]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "training" / "run_ddp.py"
MAKE_IMAGES = REPO / "training" / "make_image_folder.py"


def run(mode: str, images: Path, share: Path, args: argparse.Namespace) -> dict[str, float]:
    """One run of `mode`; its trainer's metrics."""
    cpus = sorted(os.sched_getaffinity(0))
    command = [sys.executable, "-m", "hpcjob.cli", "run", "--local", "-n", "1", "--json", "--quiet"]
    command += ["--mount-point", str(share)]
    env = dict(os.environ)
    if mode == "heterogeneous":
        command += ["--data-nodes", "1"]
        env["HPCJOB_LOCAL_TRAINER_CPUS"] = "1"
    command += [str(TRAIN), "--data", "image-folder", "--data-root", str(images), "--no-resume"]
    command += ["--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--num-workers", "1"]
    command += ["--model", args.model, "--image-size", str(args.image_size)]

    def one_cpu() -> None:  # the homogeneous trainer and its loader worker: one CPU, as the other's trainer
        os.sched_setaffinity(0, {cpus[0]})

    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
        preexec_fn=one_cpu if mode == "homogeneous" else None,
    )
    if done.returncode != 0:
        raise SystemExit(f"bench_hetero: the {mode} run failed:\n{done.stderr[-3000:]}")
    return figures_of(json.loads(done.stdout)["metrics"], args)


def run_on_hosts(
    mode: str, bed: Any, index: int, scratch: Path, args: argparse.Namespace
) -> dict[str, float]:
    """One run of `mode` on the test bed: NODE1 trains on one CPU; in the heterogeneous mode NODE2 is its
    data node on the others. The images are on each host's own disk (this machine's, which the hosts
    share), not on the share: a data set lives on the node that decodes it. Its trainer's metrics."""
    import xml.etree.ElementTree as ET

    from hpcjob.job.plan import make_plan
    from hpcjob.job.render import job_xml
    from hpcjob.job.spec import JobSpec
    from hpcjob.store.share import LocalFolder
    from hpcjob.store.staging import upload
    from tests.testbed.agent import start_job

    cpus = sorted(os.sched_getaffinity(0))
    run_id = f"bench-hetero-{mode[:6]}-{index}"
    hetero = mode == "heterogeneous"
    spec = JobSpec(
        script=str(TRAIN),
        script_args=(
            *("--data", "image-folder", "--data-root", str(scratch / "images"), "--no-resume"),
            *("--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--num-workers", "1"),
            *("--model", args.model, "--image-size", str(args.image_size)),
        ),
        node_names=("NODE1",),
        data_nodes=1 if hetero else 0,
        data_node_names=("NODE2",) if hetero else (),
    )
    plan = make_plan(spec, spec.node_names, run_id, data_node_names=spec.data_node_names)
    upload(TRAIN.parent, LocalFolder(bed.share_folder), spec.job_folder)
    logs = bed.share_folder / spec.job_folder / "logs" / run_id
    logs.mkdir(parents=True)
    pinned = {"NODE1": str(cpus[0]), "NODE2": ",".join(map(str, cpus[1:]))}
    processes = start_job(bed, ET.fromstring(job_xml(plan).encode()), str(index), scratch / run_id, pinned)
    if any(process.wait(timeout=1200) for process in processes):
        said = {f.name: f.read_text()[-1500:] for f in sorted(logs.glob("*.*")) if f.is_file()}
        raise SystemExit(f"bench_hetero: the {mode} job failed on the test bed: {said}")
    lines = (logs / "NODE1.out").read_text().splitlines()
    metrics = json.loads(next(line for line in reversed(lines) if line.startswith("HPCJOB_METRICS "))[15:])
    return figures_of(metrics, args)


def figures_of(metrics: dict[str, Any], args: argparse.Namespace) -> dict[str, float]:
    speed = float(metrics["samples_per_sec"])
    wait = float(metrics["data_wait_fraction"])
    return {
        "step_ms": 1000 * args.batch_size / speed,
        "data_wait": wait,
        "model_share": 1 - wait,
        "samples_per_sec": speed,
        "data_samples_per_sec": float(metrics.get("data_samples_per_sec") or 0.0),
    }


def price(size: str, region: str) -> float | None:
    """A size's Linux price an hour: the prices cache, else hpcjob's table; None where neither has it."""
    from hpcjob.store.power import _known_price

    found, _ = _known_price(size, region)
    return None if found is None else found.linux


def spread(values: Sequence[float], fmt: str) -> list[str]:
    return [fmt.format(min(values)), fmt.format(statistics.median(values)), fmt.format(max(values))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--per-class", type=int, default=300, help="training JPEGs per class (4 classes)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--gpu-size", default="Standard_NC24ads_A100_v4")
    parser.add_argument("--cpu-size", default="Standard_F16s_v2")
    parser.add_argument("--region", default="eastus")
    parser.add_argument("--testbed", action="store_true", help="on the test bed's separate hosts (root)")
    args = parser.parse_args()
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        raise SystemExit("bench_hetero: needs at least 2 CPUs (the trainer's and the data node's)")
    with contextlib.ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-hetero-")))
        images, share = scratch / "images", scratch / "share"
        bed = None
        if args.testbed:
            sys.path.insert(0, str(REPO))
            from tests.testbed import TestBed, require_testbed

            require_testbed()
            bed = stack.enter_context(TestBed(("node1", "node2")))
        print(f"bench_hetero: writing {4 * args.per_class} JPEGs to {images} ...", file=sys.stderr)
        subprocess.run(
            [sys.executable, str(MAKE_IMAGES), str(images), "--classes", "4", "--train-per-class",
             str(args.per_class), "--val-per-class", "10"],
            check=True, capture_output=True,
        )  # fmt: skip
        results: dict[str, list[dict[str, float]]] = {"homogeneous": [], "heterogeneous": []}
        for repeat in range(1, args.repeats + 1):
            for mode in results:  # alternating, so that a slow moment of the machine hits both
                if bed is not None:
                    figures = run_on_hosts(mode, bed, repeat, scratch, args)
                else:
                    figures = run(mode, images, share, args)
                results[mode].append(figures)
                print(
                    f"bench_hetero: run {repeat} {mode}: step {figures['step_ms']:.1f} ms, data wait "
                    f"{figures['data_wait']:.0%}, {figures['samples_per_sec']:.0f} samples/s",
                    file=sys.stderr,
                )
    print()
    header = f"{'MODE':<14}  {'STEP MS (min / median / max)':<28}  {'DATA WAIT':>9}  {'MODEL SHARE':>11}"
    print(f"{header}  SAMPLES/S")
    for mode, runs in results.items():
        steps = spread([r["step_ms"] for r in runs], "{:.1f}")
        wait = statistics.median(r["data_wait"] for r in runs)
        share_ = statistics.median(r["model_share"] for r in runs)
        speed = statistics.median(r["samples_per_sec"] for r in runs)
        print(f"{mode:<14}  {' / '.join(steps):<28}  {wait:>9.0%}  {share_:>11.0%}  {speed:.0f}")
    print(
        "(homogeneous: its loader worker shares the trainer's CPU, so most of the data work shows as a "
        "slower step rather than as data wait)"
    )
    homo = statistics.median(r["step_ms"] for r in results["homogeneous"])
    hetero = statistics.median(r["step_ms"] for r in results["heterogeneous"])
    print(
        f"\nstep time: {homo / hetero:.2f}x faster with the data node (median); this machine has {cpus} "
        f"CPUs, the trainer keeping one: the ceiling here is about {cpus}x"
    )
    gpu, cpu = price(args.gpu_size, args.region), price(args.cpu_size, args.region)
    if gpu is None or cpu is None:
        missing = args.gpu_size if gpu is None else args.cpu_size
        print(f"cost per step: no price for {missing} here (`hpcjob prices --size {missing}` caches it)")
        return
    homo_cost = gpu / 3600 * homo / 1000
    hetero_cost = (gpu + cpu) / 3600 * hetero / 1000
    change = hetero_cost / homo_cost - 1
    print(
        f"cost per 1,000 steps at these step times and list prices ({args.region}): homogeneous 1 x "
        f"{args.gpu_size} ${1000 * homo_cost:.4f}, heterogeneous + 1 x {args.cpu_size} "
        f"${1000 * hetero_cost:.4f} ({abs(change):.0%} {'less' if change < 0 else 'more'})"
    )


if __name__ == "__main__":
    main()
