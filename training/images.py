"""Image folders for ``run_ddp.py``: the transforms a model's input needs, decoding on the CPU (in
DataLoader workers) or on the device (nvJPEG on CUDA, a batch at a time), and how many workers a
process gets.

The CPU and the device path share one transform: only where the JPEG is decoded differs, so the two
give the same tensors up to the decoders' rounding.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from typing import Any, cast

import torch
from torch import Tensor

from neural_network import InputShape

# The ImageNet statistics torchvision's classifiers are trained with.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Evaluation resizes the shorter side to 256/224 of the crop, as torchvision's reference recipe does.
EVAL_RESIZE = 256 / 224
JPEG_SUFFIXES = (".jpg", ".jpeg")
# hpcjob run --local sets it: the processes of all local "nodes" share this machine's CPUs.
PROCESSES_VAR = "HPCJOB_PROCESSES_ON_HOST"

Transform = Callable[[Tensor], Tensor]


def image_transform(shape: InputShape, train: bool) -> Transform:
    """From a decoded uint8 CxHxW image (on any device) to the model's float input. Grey models
    (the MLP): grey, resized to size x size. RGB models: a random resized crop and flip to train,
    resize and centre crop to evaluate, normalised with the ImageNet statistics."""
    from torchvision.transforms import v2  # type: ignore[import-untyped]  # lazy: slow to import

    if shape.channels == 1:
        steps = [v2.Grayscale(1), v2.Resize((shape.size, shape.size), antialias=True)]
        return cast(Transform, v2.Compose([*steps, v2.ToDtype(torch.float32, scale=True)]))
    if train:
        steps = [v2.RandomResizedCrop(shape.size, antialias=True), v2.RandomHorizontalFlip()]
    else:
        steps = [v2.Resize(round(shape.size * EVAL_RESIZE), antialias=True), v2.CenterCrop(shape.size)]
    steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    return cast(Transform, v2.Compose(steps))


def cpu_transform(shape: InputShape, train: bool) -> Callable[[Any], Tensor]:
    """For ImageFolder's PIL images, in the DataLoader workers: to a tensor, then `image_transform`."""
    from torchvision.transforms import v2

    return cast(Callable[[Any], Tensor], v2.Compose([v2.ToImage(), image_transform(shape, train)]))


def read_encoded(path: str) -> Tensor:
    """A file's bytes as a uint8 tensor: what the workers hand over when the device decodes. Not
    torchvision.io.read_file: its file-backed tensor cannot be sent from a worker (EBADF on the fd)."""
    with open(path, "rb") as file:
        return torch.frombuffer(bytearray(file.read()), dtype=torch.uint8)


def collate_encoded(batch: list[tuple[Tensor, int]]) -> tuple[list[Tensor], Tensor]:
    """Encoded images differ in length: a list of them, and the labels as one tensor."""
    return [data for data, _ in batch], torch.tensor([label for _, label in batch], dtype=torch.int64)


class DeviceDecoded:
    """Batches of encoded JPEGs, decoded on `device` (a list in one call: batched nvJPEG on CUDA) and
    transformed there, so that the CPU only reads files."""

    def __init__(
        self, loader: Iterable[tuple[list[Tensor], Tensor]], device: torch.device, transform: Transform
    ) -> None:
        self.loader, self.device, self.transform = loader, device, transform

    def __len__(self) -> int:
        return len(cast(Sized, self.loader))

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        for encoded, labels in self.loader:
            yield self.decode(encoded), labels.to(self.device, non_blocking=True)

    def decode(self, encoded: list[Tensor]) -> Tensor:
        from torchvision.io import ImageReadMode, decode_jpeg

        images = decode_jpeg(encoded, mode=ImageReadMode.RGB, device=self.device)
        return torch.stack([self.transform(image) for image in images])


def node_cpus() -> int:
    """The CPUs this process may run on (its affinity: a container or a job's share, not the machine's)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def processes_on_node(environ: Mapping[str, str]) -> int:
    """The training processes sharing this node's CPUs: all local nodes' on `run --local`, else
    torchrun's processes on this node."""
    for name in (PROCESSES_VAR, "LOCAL_WORLD_SIZE"):
        value = environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def default_workers(cpus: int, processes: int) -> int:
    """Loader workers per process: its share of the CPUs, less one for the process itself, at least 1."""
    return max(1, cpus // max(1, processes) - 1)
