"""How close the training program comes to what the device can do, measured in one run on one device.

(a) training/run_ddp.py's samples/s and data-wait share (its last epoch's, after a warm-up epoch) on
    synthetic data and on FashionMNIST-shaped data (idx files of random images), with the MLP;
(b) the limit: the same model, batch and optimiser in a plain loop over data already on the device;
(c) ImageFolder (generated JPEGs, training/make_image_folder.py) with an image model: the program's
    images/s with --decode cpu and --decode device, beside the model's resident-data limit and the
    node's decode ceilings: PIL in one process per CPU, and torchvision's decoder on the device
    (batched nvJPEG on a GPU).
Prints each figure and each ratio as a table, with the targets of issue 11 (on one H100/H200: at
least 80 % of the limit with under 5 % data wait on synthetic data; at least 90 % of min(model limit,
best decode ceiling) on ImageFolder). Without CUDA it runs on the CPU with smaller sizes and says so.

    .venv/bin/python benchmarks/bench_gpu.py [--device cpu] [--image-model resnet50] [--images 4096]
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parent.parent
TRAINING = REPO / "training"
sys.path[:0] = [str(REPO), str(TRAINING)]

from images import cpu_transform, image_transform  # noqa: E402
from make_image_folder import write_split  # noqa: E402
from neural_network import InputShape, build_model, input_shape  # noqa: E402

from hpcjob.cli.tables import table  # noqa: E402


@dataclass(frozen=True)
class Sizes:
    samples: int  # synthetic and FashionMNIST-shaped train sets
    batch: int
    image_model: str
    image_size: int
    images: int  # JPEGs in the generated train folder
    image_batch: int


GPU_SIZES = Sizes(200_000, 256, "resnet50", 224, 8192, 128)
CPU_SIZES = Sizes(20_000, 256, "resnet18", 64, 512, 32)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def resident_limit(
    model_name: str, shape: InputShape, batch: int, device: torch.device, seconds: float, fast: bool
) -> float:
    """Samples/s of forward, backward and SGD step on one batch already on the device, after warm-up:
    nothing to wait for but the model (`fast`: bf16 autocast and channels-last, as the image job)."""
    torch.manual_seed(0)
    model = build_model(model_name, 10, shape).to(device)
    if fast:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    images = torch.rand(batch, *shape.dims, device=device)
    if fast:
        images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 10, (batch,), device=device)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=fast):
            loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()

    for _ in range(5):
        step()
    sync(device)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        steps += 1
        if steps % 10 == 0:
            sync(device)
    sync(device)
    return steps * batch / (time.perf_counter() - start)


def _decode_files(paths: Sequence[str], size: int) -> int:
    from PIL import Image

    transform = cpu_transform(InputShape(3, size), train=True)
    for path in paths:
        with Image.open(path) as image:
            transform(image.convert("RGB"))
    return len(paths)


def cpu_decode_ceiling(paths: list[str], size: int, workers: int) -> float:
    """Images/s of PIL decode plus the train transform in `workers` processes (the CPU path's most)."""
    chunks = [paths[i::workers] for i in range(workers)]
    with ProcessPoolExecutor(workers) as pool:
        list(pool.map(_decode_files, [c[:4] for c in chunks], [size] * workers))  # start-up, imports
        start = time.perf_counter()
        done = sum(pool.map(_decode_files, chunks, [size] * workers))
    return done / (time.perf_counter() - start)


def device_decode_ceiling(paths: list[str], size: int, batch: int, device: torch.device) -> float:
    """Images/s of torchvision's decoder on the device (batched nvJPEG on CUDA) plus the train
    transform there, the files already read into memory (the device path's most)."""
    from torchvision.io import ImageReadMode, decode_jpeg  # type: ignore[import-untyped]

    transform = image_transform(InputShape(3, size), train=True)
    encoded = [torch.frombuffer(bytearray(Path(p).read_bytes()), dtype=torch.uint8) for p in paths]

    def run(files: list[torch.Tensor]) -> None:
        for i in range(0, len(files), batch):
            images = decode_jpeg(files[i : i + batch], mode=ImageReadMode.RGB, device=device)
            torch.stack([transform(image) for image in images])

    run(encoded[:batch])  # warm-up: nvJPEG's handles, kernels
    sync(device)
    start = time.perf_counter()
    run(encoded)
    sync(device)
    return len(encoded) / (time.perf_counter() - start)


def write_fashion_shaped(root: Path, samples: int) -> None:
    """FashionMNIST's idx files with `samples` random 28x28 train images (the layout torchvision reads)."""
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    generator = torch.Generator().manual_seed(0)
    for split, count in (("train", samples), ("t10k", max(1000, samples // 6))):
        pixels = torch.randint(0, 256, (count * 28 * 28,), dtype=torch.uint8, generator=generator)
        labels = torch.randint(0, 10, (count,), dtype=torch.uint8, generator=generator)
        (raw / f"{split}-images-idx3-ubyte").write_bytes(
            struct.pack(">IIII", 0x0803, count, 28, 28) + bytes(pixels.numpy())
        )
        (raw / f"{split}-labels-idx1-ubyte").write_bytes(
            struct.pack(">II", 0x0801, count) + bytes(labels.numpy())
        )


@dataclass(frozen=True)
class JobFigures:
    samples_per_sec: float
    data_wait: float
    gpu_util: str


def run_job(args: list[str], device: torch.device, workdir: Path) -> JobFigures:
    """training/run_ddp.py in one process, 2 epochs: the figures of the second (the first warms up)."""
    command = [sys.executable, str(TRAINING / "run_ddp.py"), "--epochs", "2", "--no-resume"]
    command += ["--device", device.type, "--checkpoint-dir", str(workdir / "checkpoints"), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, cwd=workdir)
    if done.returncode != 0:
        raise SystemExit(f"bench_gpu: the job failed: {' '.join(done.stderr.split()[-40:])}")
    epoch = [line for line in done.stdout.splitlines() if line.startswith("epoch 2/2")][-1]
    fields = dict(part.split("=", 1) for part in epoch.split()[2:])
    metrics = json.loads(done.stdout.splitlines()[-1].removeprefix("HPCJOB_METRICS "))
    gpus = metrics.get("gpus") or []
    util = f"{sum(g['util_mean_pct'] for g in gpus) / len(gpus):.0f}%" if gpus else "-"
    return JobFigures(float(fields["samples/s"]), float(fields["data_wait"].rstrip("%")) / 100, util)


Row = tuple[object, ...]


def row(name: str, job: JobFigures, limit: float, target: str) -> Row:
    """One workload's figures, said at once too: a run stopped part way still shows what it measured."""
    ratio = job.samples_per_sec / limit
    figures = (f"{job.samples_per_sec:.0f}", f"{limit:.0f}", f"{ratio:.0%}", f"{job.data_wait:.1%}")
    print(
        f"bench_gpu: {name}: {figures[0]}/s of {figures[1]} ({figures[2]}), data wait {figures[3]}",
        flush=True,
    )
    return (name, *figures, job.gpu_util, target)


def memory_workloads(sizes: Sizes, device: torch.device, seconds: float, work: Path) -> list[Row]:
    """(a) and (b): the MLP on synthetic and FashionMNIST-shaped data, and its resident-data limit."""
    print("bench_gpu: the MLP's limit, then the job on synthetic and FashionMNIST-shaped data", flush=True)
    limit = resident_limit("mlp", input_shape("mlp"), sizes.batch, device, seconds, fast=False)
    print(f"bench_gpu: the MLP's limit, data on the device: {limit:.0f} samples/s", flush=True)
    batch = ["--batch-size", str(sizes.batch)]
    synthetic = ["--data", "synthetic", "--train-samples", str(sizes.samples), "--test-samples", "1000"]
    write_fashion_shaped(work / "fashion", sizes.samples)
    fashion = ["--data", "fashion-mnist", "--data-root", str(work / "fashion")]
    target = ">= 80%, wait < 5%"
    return [
        row("synthetic, mlp", run_job([*synthetic, *batch], device, work), limit, target),
        row("FashionMNIST-shaped, mlp", run_job([*fashion, *batch], device, work), limit, target),
        ("(limit: mlp, data on the device)", "", f"{limit:.0f}", "", "", "", ""),
    ]


def image_workloads(sizes: Sizes, device: torch.device, seconds: float, work: Path) -> list[Row]:
    """(c): ImageFolder with the image model, decoded on the CPU and on the device, against
    min(model limit, best decode ceiling)."""
    print(f"bench_gpu: {sizes.images} JPEGs, {sizes.image_model} at {sizes.image_size} px", flush=True)
    folder = work / "images"
    side = round(sizes.image_size * 256 / 224)
    write_split(folder / "train", 10, sizes.images // 10, side, seed=0)
    write_split(folder / "val", 10, max(2, sizes.images // 100), side, seed=1)
    paths = sorted(str(p) for p in (folder / "train").rglob("*.jpg"))
    shape = input_shape(sizes.image_model, sizes.image_size)
    model_limit = resident_limit(sizes.image_model, shape, sizes.image_batch, device, seconds, fast=True)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    cpu_ceiling = cpu_decode_ceiling(paths, sizes.image_size, cpus)
    device_ceiling = device_decode_ceiling(paths, sizes.image_size, sizes.image_batch, device)
    bound = min(model_limit, max(cpu_ceiling, device_ceiling))
    print(
        f"bench_gpu: limit {model_limit:.0f} images/s; decode ceilings: PIL {cpu_ceiling:.0f}, device "
        f"{device_ceiling:.0f}",
        flush=True,
    )
    image = ["--data", "image-folder", "--data-root", str(folder), "--model", sizes.image_model]
    image += ["--image-size", str(sizes.image_size), "--batch-size", str(sizes.image_batch)]
    image += ["--bf16", "--channels-last"]
    rows: list[Row] = []
    for decode in ("cpu", "device"):
        job = run_job([*image, "--decode", decode], device, work)
        rows.append(row(f"ImageFolder, {sizes.image_model}, decode {decode}", job, bound, ">= 90%"))
    limits = (
        (f"(limit: {sizes.image_model}, data on the device, bf16, channels-last)", model_limit),
        (f"(ceiling: PIL decode in {cpus} processes)", cpu_ceiling),
        (f"(ceiling: decode on the device, {device.type})", device_ceiling),
    )
    return rows + [(name, "", f"{value:.0f}", "", "", "", "") for name, value in limits]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when there is one")
    parser.add_argument("--image-model", help="default: resnet50 on a GPU, resnet18 on the CPU")
    parser.add_argument("--image-size", type=int, help="default: 224 on a GPU, 64 on the CPU")
    parser.add_argument("--images", type=int, help="train JPEGs (default: 8192 on a GPU, 512 on the CPU)")
    parser.add_argument("--samples", type=int, help="synthetic train samples (default: 200000 / 20000)")
    parser.add_argument("--seconds", type=float, default=10.0, help="each limit's measuring time")
    args = parser.parse_args()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    base = GPU_SIZES if device.type == "cuda" else CPU_SIZES
    sizes = Sizes(
        args.samples or base.samples,
        base.batch,
        args.image_model or base.image_model,
        args.image_size or base.image_size,
        args.images or base.images,
        base.image_batch,
    )
    what = torch.cuda.get_device_name(device) if device.type == "cuda" else "the CPU: no CUDA, smaller sizes"
    print(f"bench_gpu: on {what}; torch {torch.__version__}; {sizes}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        rows = memory_workloads(sizes, device, args.seconds, Path(tmp))
        rows += image_workloads(sizes, device, args.seconds, Path(tmp))
    print()
    for line in table(("WORKLOAD", "JOB /S", "LIMIT /S", "RATIO", "DATA WAIT", "GPU UTIL", "TARGET"), rows):
        print(line)


if __name__ == "__main__":
    main()
