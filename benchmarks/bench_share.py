"""The share and the hosts: upload cost, and start-up across hosts against loopback.

1. Upload of a 50 MB training folder to a real smbd over SMB: the first upload, then an unchanged
   re-upload, with the time and the bytes sent each time.
2. The time from the tasks' start to the first training step of a 2-node job: on two test-bed hosts
   (network namespaces, code on the share) against the same job on loopback (the local backend).

Needs root and samba (scripts/bootstrap.sh --test).

    .venv/bin/python benchmarks/bench_share.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hpcjob.backends.local import LOOPBACK, LocalBackend, free_port  # noqa: E402
from hpcjob.job.plan import make_plan  # noqa: E402
from hpcjob.job.render import job_xml  # noqa: E402
from hpcjob.job.spec import JobSpec, parse_share  # noqa: E402
from hpcjob.store.share import LocalFolder, SmbFolder  # noqa: E402
from hpcjob.store.staging import upload  # noqa: E402
from tests.testbed import SmbServer, TestBed  # noqa: E402
from tests.testbed.agent import start_job  # noqa: E402

TRAIN = REPO / "training"
TRAIN_ARGS = ("--epochs", "1", "--max-steps-per-epoch", "5", "--train-samples", "1024", "--no-resume")


def make_code_folder(root: Path, megabytes: int) -> Path:
    code = root / "code"
    code.mkdir()
    for source in TRAIN.glob("*.py"):
        (code / source.name).write_bytes(source.read_bytes())
    assets = code / "assets"
    assets.mkdir()
    for index in range(megabytes // 10):
        (assets / f"part{index}.bin").write_bytes(os.urandom(10 << 20))  # not compressible
    return code


def bench_upload(megabytes: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        code = make_code_folder(Path(tmp), megabytes)
        share_dir = Path(tmp) / "CcpSpoolDir" / "app"
        share_dir.mkdir(parents=True)
        with SmbServer(share_dir) as server:
            folder = SmbFolder(
                parse_share("//HEADNODE/CcpSpoolDir/app"),
                server.username,
                server.password,
                server=server.address,
                port=server.port,
            )
            for label in ("first upload", "unchanged re-upload"):
                start = time.perf_counter()
                report = upload(code, folder, "hpcjob/bench")
                took = time.perf_counter() - start
                sent = f"{report.files_sent} file(s), {report.bytes_sent / 1e6:.1f} MB"
                print(f"{label}: {took:.2f} s, {sent} sent, {report.files_unchanged} unchanged", flush=True)
            folder.close()
            arrived = sum(f.stat().st_size for f in (share_dir / "hpcjob" / "bench" / "assets").iterdir())
            assert arrived == megabytes // 10 * (10 << 20), "the share does not hold what was sent"


def first_step(log_dir: Path) -> float:
    """When rank 0 was done with its first training step (Unix time): the `first_step` line of its
    metrics over time (hpctorch.Metrics), not the log's line, which is for people."""
    for path in (log_dir / "metrics").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event.get("event") == "first_step" and event.get("rank") == 0:
                return float(event["t"])
    raise SystemExit(f"no first step in {log_dir}/metrics")


def across_hosts(index: int) -> float:
    spec = JobSpec(script=str(TRAIN / "run_ddp.py"), script_args=TRAIN_ARGS, node_names=("NODE1", "NODE2"))
    plan = make_plan(spec, spec.node_names, f"bench-hosts-{index}")
    with TestBed(("node1", "node2")) as bed, tempfile.TemporaryDirectory() as tmp:
        upload(TRAIN, LocalFolder(bed.share_folder), spec.job_folder)
        (bed.share_folder / spec.job_folder / "logs" / plan.run_id).mkdir(parents=True)
        job = ET.fromstring(job_xml(plan).encode())
        start = time.time()
        processes = start_job(bed, job, str(index), Path(tmp))
        if any(p.wait(timeout=300) for p in processes):
            raise SystemExit("a task failed across hosts")
        return first_step(bed.share_folder / spec.job_folder / "logs" / plan.run_id) - start


def on_loopback(index: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        spec = JobSpec(
            script=str(TRAIN / "run_ddp.py"), script_args=TRAIN_ARGS, nodes=2, rdzv_port=free_port()
        )
        plan = make_plan(
            spec, ("LOCAL1", "LOCAL2"), f"bench-loop-{index}", rdzv_host=LOOPBACK, mount_point=tmp
        )
        upload(TRAIN, LocalFolder(Path(tmp)), spec.job_folder)
        start = time.time()
        summary = LocalBackend().run(plan, progress=lambda line: None, echo_output=False)
        if summary.exit_code:
            raise SystemExit("the loopback job failed")
        return first_step(Path(plan.log_dir)) - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--megabytes", type=int, default=50)
    args = parser.parse_args()
    print(f"upload of a {args.megabytes} MB training folder over SMB (smbd on loopback):")
    bench_upload(args.megabytes)
    hosts, loop = [], []
    for index in range(args.repeats):
        loop.append(on_loopback(index))
        hosts.append(across_hosts(index))
        print(f"run {index + 1}: start to first step: loopback {loop[-1]:.2f} s, 2 hosts {hosts[-1]:.2f} s")
    print(
        f"median tasks' start to first training step: loopback {statistics.median(loop):.2f} s, "
        f"2 hosts {statistics.median(hosts):.2f} s"
    )


if __name__ == "__main__":
    main()
