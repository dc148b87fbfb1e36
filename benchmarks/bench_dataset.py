"""How fast `--dataset` fills the nodes' disks: 1 GB of files of mixed sizes copied onto two nodes by the
node helper (hpcjob/node/datasets.py, as each task runs it), from a share folder and from Azure Blob
Storage (Azurite), against this machine's own limits measured in the same run: the local disk's write
speed and the source's read speed (the SDK's download, 8 threads; the share folder's read). Then the same
copy again: the bytes a second run reads from the source (0) and its seconds.

Here the two "nodes" are two processes of this machine, each with a local folder of its own, copying at
once: they share this machine's disk and the source, as the limits are this machine's. The share is a local
folder standing in for it (on a cluster, the head node's SMB share).

    .venv/bin/python benchmarks/bench_dataset.py [--mb 1000] [--sources share,blob]

Goal: the copies at least half of the slower of the two limits (the two nodes' together: they share this
machine's disk and source, whose limits are measured alone).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpcjob.cli.tables import table  # noqa: E402
from hpcjob.job.datasets import parse_datasets, size_text, sources_value  # noqa: E402
from tests.azurite import AZURITE  # noqa: E402

HELPER = ROOT / "hpcjob" / "node" / "datasets.py"
NODES = ("NODE1", "NODE2")
GOAL = 0.5
CHUNK = 1 << 20


def mixed_files(total_mb: int) -> dict[str, int]:
    """Half the bytes in 64 MB files, a quarter in 2 MB files, a quarter in 64 KB files."""
    files: dict[str, int] = {}
    big, medium, small = total_mb * 2**19, total_mb * 2**18, total_mb * 2**18
    for prefix, share, size in (
        ("big", big, 64 << 20),
        ("medium", medium, 2 << 20),
        ("small", small, 64 << 10),
    ):
        for i in range(max(1, share // size)):
            files[f"{prefix}/{i:05d}.bin"] = size
    return files


def write_files(root: Path, files: dict[str, int]) -> float:
    """Write the files (random bytes) with 8 threads: seconds."""
    block = os.urandom(CHUNK)

    def one(name: str) -> None:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as out:
            left = files[name]
            while left > 0:
                out.write(block[: min(left, CHUNK)])
                left -= CHUNK

    began = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, files))
    return time.perf_counter() - began


def read_folder(root: Path) -> float:
    began = time.perf_counter()

    def one(path: Path) -> None:
        with path.open("rb") as source:
            while source.read(CHUNK):
                pass

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, [p for p in root.rglob("*") if p.is_file()]))
    return time.perf_counter() - began


def read_blobs(connection: str, container: str) -> float:
    from azure.storage.blob import BlobServiceClient

    client = BlobServiceClient.from_connection_string(connection).get_container_client(container)
    names = [blob.name for blob in client.list_blobs()]
    began = time.perf_counter()

    def one(name: str) -> None:
        for _ in client.download_blob(name, max_concurrency=1).chunks():
            pass

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, names))
    return time.perf_counter() - began


def copy_on_nodes(work: Path, source: str, share_root: Path, env: dict[str, str], run: str) -> list[dict]:
    """Both nodes' helpers at once, as two tasks of one job: each one's figures."""
    value = sources_value(parse_datasets([source]), str(share_root), len(NODES), 3600.0)
    log_dir = work / "logs" / run
    log_dir.mkdir(parents=True, exist_ok=True)
    started = []
    for node in NODES:
        node_env = {
            **env,
            "HPCJOB_DATASET_SOURCES": value,
            "HPCJOB_LOCAL_DIR": str(work / "nodes" / node),
            "HPCJOB_NODE": node,
            "HPCJOB_LOG_DIR": str(log_dir),
        }
        command = [sys.executable, str(HELPER)]
        started.append(
            subprocess.Popen(command, env=node_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        )
    for process in started:
        _, err = process.communicate(timeout=1800)
        if process.returncode != 0:
            raise SystemExit(f"bench_dataset: a node's copy failed: {err.decode()[-2000:]}")
    figures = []
    for node in NODES:
        said = json.loads((log_dir / ".hpcjob-datasets" / f"{node}.json").read_text())
        figures += [{**one, "node": node} for one in said["datasets"]]
    return figures


def upload(container: Any, data: Path, name: str) -> None:
    with (data / name).open("rb") as body:
        container.upload_blob(f"mixed/{name}", body, max_concurrency=1)


def blob_runs(
    work: Path, data: Path, files: dict[str, int], share_root: Path
) -> tuple[float, list[list[dict]]]:
    """The dataset in Azurite: the SDK's read speed, and the two nodes' copies, twice."""
    from azure.storage.blob import BlobServiceClient

    from tests.azurite import azurite

    with azurite() as service:
        container = BlobServiceClient.from_connection_string(service.connection_string).create_container(
            "bench"
        )
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda name: upload(container, data, name), files))
        read_s = read_blobs(service.connection_string, "bench")
        env = {**os.environ, "AZURE_STORAGE_CONNECTION_STRING": service.connection_string}
        source = f"{service.endpoint}/bench/mixed"
        return read_s, [copy_on_nodes(work / "blob-run", source, share_root, env, run) for run in ("1", "2")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=1000, help="the dataset's size in MB (default: 1000)")
    parser.add_argument("--sources", default="share,blob", help="share, blob or both (default)")
    args = parser.parse_args()
    files = mixed_files(args.mb)
    total = sum(files.values())
    print(f"bench_dataset: {len(files)} files, {size_text(total)}, onto {len(NODES)} nodes", flush=True)
    rows, lines = [], []
    with tempfile.TemporaryDirectory(prefix="bench-dataset-") as tmp:
        work = Path(tmp)
        share_root = work / "share"
        data = share_root / "datasets" / "mixed"
        disk = total / write_files(data, files)  # the disk's own write speed: the limit of a node's copy
        for kind in args.sources.split(","):
            if kind == "share":
                read_s = read_folder(data)
                env = dict(os.environ)
                figures = [
                    copy_on_nodes(work / "share-run", "datasets/mixed", share_root, env, r) for r in "12"
                ]
            elif not AZURITE.is_file():
                print("bench_dataset: no Azurite (scripts/bootstrap.sh --test installs it): no blob figures")
                continue
            else:
                read_s, figures = blob_runs(work, data, files, share_root)
            read = total / read_s
            first, second = figures
            slowest = max(one["seconds"] for one in first)
            each = total / slowest  # each node copies the whole set, both at once
            # The two nodes share this machine's disk and source, whose limits are measured alone: their
            # copies together against the slower limit.
            ratio = each * len(NODES) / min(disk, read)
            again = max(one["seconds"] for one in second)
            read_again = sum(one["bytes_source"] for one in second)
            rows.append(
                (kind, f"{disk / 1e6:.0f} MB/s", f"{read / 1e6:.0f} MB/s", f"{each / 1e6:.0f} MB/s",
                 f"{each * len(NODES) / 1e6:.0f} MB/s", f"{ratio:.2f}", f"{slowest:.1f} s",
                 f"{read_again} bytes, {again:.2f} s")
            )  # fmt: skip
            lines.append(
                {
                    "source": kind,
                    "bytes": total,
                    "files": len(files),
                    "nodes": len(NODES),
                    "disk_write_mb_s": round(disk / 1e6, 1),
                    "source_read_mb_s": round(read / 1e6, 1),
                    "copy_mb_s_each_node": round(each / 1e6, 1),
                    "copy_mb_s_all_nodes": round(each * len(NODES) / 1e6, 1),
                    "ratio_to_slower_limit": round(ratio, 3),
                    "goal_met": ratio >= GOAL,
                    "second_run_bytes_from_source": read_again,
                    "second_run_s": round(again, 3),
                }
            )
    print()
    headers = ("SOURCE", "DISK WRITE", "SOURCE READ", "EACH NODE", "BOTH", "RATIO", "FIRST RUN", "SECOND RUN")
    for line in table(headers, rows):
        print(line)
    for line in lines:
        print(json.dumps(line))


if __name__ == "__main__":
    main()
