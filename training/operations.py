"""Data sets, the training and evaluation loops, metrics and checkpoints for ``run_ddp.py``.

Everything here works in a single process without ``torch.distributed``: the functions return
per-process numbers and ``run_ddp.py`` reduces them across ranks. That keeps them unit-testable.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from images import (
    JPEG_SUFFIXES,
    DeviceDecoded,
    Transform,
    collate_encoded,
    cpu_transform,
    image_transform,
    read_encoded,
)
from neural_network import InputShape, input_shape

DATA_KINDS = ("synthetic", "fashion-mnist", "image-folder")
DECODERS = ("cpu", "device")
MLP_INPUT = input_shape("mlp")
SYNTHETIC_CLASSES = 10
# Per-pixel noise well above the spread of the class means: an MLP gets to ~95% within an epoch
# on the default sizes, so progress is visible, yet a broken training loop stays near 10%.
SYNTHETIC_NOISE = 2.0


class DataError(Exception):
    """The requested data set is missing or unreadable (reported as one line, exit code 1)."""


def one_line(text: object) -> str:
    """Collapse a (possibly multi-line) message into one line for the job log."""
    return " ".join(str(text).split())


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


@dataclass
class DataBundle:
    """Train and evaluation sets plus what the model and the logs need to know about them."""

    train: Dataset[Any]
    test: Dataset[Any]
    num_classes: int
    description: str
    # For sets of encoded JPEGs (--decode device): the train and evaluation transforms, run on the device.
    device_transforms: tuple[Transform, Transform] | None = None
    train_size: int = field(init=False)
    test_size: int = field(init=False)

    def __post_init__(self) -> None:
        # Dataset itself is not Sized in the type stubs, but all the sets used here are.
        self.train_size = len(cast(Sized, self.train))
        self.test_size = len(cast(Sized, self.test))


def _synthetic_split(means: Tensor, count: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, means.shape[0], (count,), generator=generator)
    noise = torch.randn((count, *means.shape[1:]), generator=generator) * SYNTHETIC_NOISE
    return TensorDataset(means[labels] + noise, labels)


def make_synthetic(
    train_samples: int, test_samples: int, seed: int, shape: InputShape = MLP_INPUT
) -> DataBundle:
    """Gaussian blobs around one fixed random pattern per class, of the model's input shape.

    Each piece uses its own generator derived from ``seed`` so the test set does not depend on
    the size of the train set, and the global torch RNG is left alone.
    """
    means = torch.rand((SYNTHETIC_CLASSES, *shape.dims), generator=torch.Generator().manual_seed(3 * seed))
    train = _synthetic_split(means, train_samples, 3 * seed + 1)
    test = _synthetic_split(means, test_samples, 3 * seed + 2)
    return DataBundle(train, test, SYNTHETIC_CLASSES, f"synthetic(seed={seed})")


FASHION_MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def fashion_mnist_raw_folder(root: Path) -> Path:
    """Where torchvision looks for the uncompressed idx-ubyte files."""
    return root / "FashionMNIST" / "raw"


def download_fashion_mnist(root: Path) -> None:
    """Fetch FashionMNIST into ``root`` (a no-op when the files are already there)."""
    from torchvision import datasets  # type: ignore[import-untyped]  # lazy: torchvision is slow to import

    try:
        datasets.FashionMNIST(str(root), train=True, download=True)
        datasets.FashionMNIST(str(root), train=False, download=True)
    except Exception as exc:  # network errors come in many types; all of them end the run
        raise DataError(f"downloading FashionMNIST into {root} failed: {one_line(exc)}") from exc


def load_fashion_mnist(root: Path) -> DataBundle:
    """FashionMNIST from ``<root>/FashionMNIST/raw`` as 1x28x28 float tensors in [0, 1]."""
    from torchvision import datasets, transforms

    raw = fashion_mnist_raw_folder(root)
    try:
        train = datasets.FashionMNIST(str(root), train=True, download=False, transform=transforms.ToTensor())
        test = datasets.FashionMNIST(str(root), train=False, download=False, transform=transforms.ToTensor())
    except (RuntimeError, OSError, ValueError, TypeError, AssertionError) as exc:
        # torchvision reports missing and corrupt files alike as RuntimeError; tell them apart.
        missing = [name for name in FASHION_MNIST_FILES if not (raw / name).is_file()]
        if missing:
            raise DataError(
                f"FashionMNIST not found in {raw} (missing {', '.join(missing)}; "
                "copy the files there or use --download on a node with internet)"
            ) from exc
        raise DataError(f"FashionMNIST files in {raw} are unreadable: {one_line(exc)}") from exc
    return DataBundle(train, test, len(train.classes), f"fashion-mnist({root})")


def pick_eval_folder(root: Path) -> tuple[Path, str]:
    """The evaluation split of an image folder: ``val``, else ``test``, else ``train`` itself."""
    for name in ("val", "test"):
        if (root / name).is_dir():
            return root / name, name
    return root / "train", "train"


def load_image_folder(root: Path, shape: InputShape = MLP_INPUT, decode: str = "cpu") -> DataBundle:
    """``ImageFolder`` data from ``<root>/train`` and ``<root>/val`` (or ``test``) as the model's input
    (images.image_transform). `decode` "cpu": PIL decodes and transforms in the loader workers;
    "device": the workers only read the files (JPEG only) and the training device decodes them."""
    from torchvision import datasets

    train_dir = root / "train"
    if not train_dir.is_dir():
        raise DataError(
            f"image folder {train_dir} does not exist (expected <data-root>/train/<class>/<image>)"
        )
    eval_dir, eval_name = pick_eval_folder(root)
    sets: list[dict[str, Any]]
    if decode == "device":
        sets = [{"loader": read_encoded}, {"loader": read_encoded}]
    else:
        sets = [{"transform": cpu_transform(shape, train)} for train in (True, False)]
    try:
        train = datasets.ImageFolder(str(train_dir), **sets[0])
        # Evaluating on the train folder (no val/test) still needs the evaluation transform.
        test = datasets.ImageFolder(str(eval_dir), allow_empty=True, **sets[1])
    except (FileNotFoundError, ValueError) as exc:
        raise DataError(f"image folder {root} is unusable: {one_line(exc)}") from exc
    if eval_dir != train_dir:
        _align_classes(test, train.class_to_idx, eval_dir)
    if len(train.classes) < 2:
        raise DataError(
            f"image folder {train_dir} needs at least 2 class folders, found {len(train.classes)}"
        )
    transforms = None
    if decode == "device":
        _only_jpeg(train.samples + test.samples, root)
        transforms = (image_transform(shape, True), image_transform(shape, False))
    description = f"image-folder({root}, eval={eval_name}, decode={decode})"
    return DataBundle(train, test, len(train.classes), description, transforms)


def _only_jpeg(samples: list[tuple[str, int]], root: Path) -> None:
    others = [path for path, _ in samples if not path.lower().endswith(JPEG_SUFFIXES)]
    if others:
        raise DataError(
            f"--decode device reads JPEG files only, and {root} has {len(others)} other image(s), "
            f"such as {others[0]}: use --decode cpu"
        )


def _align_classes(dataset: Any, class_to_idx: dict[str, int], folder: Path) -> None:
    """Relabel an evaluation ImageFolder with the train folder's class indices.

    ImageFolder numbers the classes it finds, so a val folder missing one class would otherwise
    shift every later label by one.
    """
    unknown = sorted(set(dataset.classes) - set(class_to_idx))
    if unknown:
        raise DataError(f"classes {', '.join(unknown)} in {folder} are not in the train folder")
    own = {index: name for name, index in dataset.class_to_idx.items()}
    dataset.samples = [(path, class_to_idx[own[index]]) for path, index in dataset.samples]
    dataset.imgs = dataset.samples
    dataset.targets = [index for _, index in dataset.samples]
    dataset.classes = sorted(class_to_idx, key=class_to_idx.__getitem__)
    dataset.class_to_idx = dict(class_to_idx)


def load_data(
    kind: str,
    root: Path | None,
    train_samples: int,
    test_samples: int,
    seed: int,
    shape: InputShape = MLP_INPUT,
    decode: str = "cpu",
) -> DataBundle:
    """Build the data set chosen with ``--data``; torchvision is only imported for real data."""
    if kind == "synthetic":
        return make_synthetic(train_samples, test_samples, seed, shape)
    if root is None:
        raise DataError(f"--data {kind} needs --data-root")
    if kind == "fashion-mnist":
        return load_fashion_mnist(root)
    if kind == "image-folder":
        return load_image_folder(root, shape, decode)
    raise DataError(f"unknown data kind {kind!r} (choose from {', '.join(DATA_KINDS)})")


class EvalShardSampler(DistributedSampler[int]):
    """A non-shuffling DistributedSampler that gives every sample to exactly one rank.

    The stock sampler pads the index list so all ranks get equally many samples; for
    evaluation that would count the padded samples twice. Evaluation has no collectives inside
    the loop, so uneven shards are fine.
    """

    def __init__(self, dataset: Dataset[Any], num_replicas: int, rank: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, len(cast(Sized, self.dataset)), self.num_replicas))

    def __len__(self) -> int:
        return len(range(self.rank, len(cast(Sized, self.dataset)), self.num_replicas))


def resident_tensors(dataset: Dataset[Any]) -> tuple[Tensor, Tensor] | None:
    """The whole set as (inputs, labels) when it is held in memory: a TensorDataset, or FashionMNIST
    (uint8 images, made what its ToTensor transform makes: float in [0, 1], one channel). None for
    data read from files (ImageFolder)."""
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2:
        return dataset.tensors[0], dataset.tensors[1]
    data, targets = getattr(dataset, "data", None), getattr(dataset, "targets", None)
    if (
        isinstance(data, Tensor)
        and isinstance(targets, Tensor)
        and data.dtype == torch.uint8
        and data.dim() == 3
    ):
        return data.unsqueeze(1).float().div(255), targets
    return None


def fit_to(shape: InputShape) -> Transform:
    """Batches of other images made the model's input on the device: channels repeated or averaged,
    then resized (FashionMNIST's 1x28x28 for a 3x224x224 ResNet)."""

    def fit(batch: Tensor) -> Tensor:
        if batch.shape[1] != shape.channels:
            grey = batch.mean(dim=1, keepdim=True)
            batch = grey.expand(-1, shape.channels, -1, -1) if shape.channels > 1 else grey
        if tuple(batch.shape[2:]) != (shape.size, shape.size):
            batch = nn.functional.interpolate(batch, size=(shape.size, shape.size), mode="bilinear")
        return batch

    return fit


class ResidentBatches:
    """A rank's batches of a data set that lives on the device for the whole run: no DataLoader, no
    host-to-device copy per step. Each epoch's shard is DistributedSampler's (the same permutation of
    seed + epoch, the same padding to equal shards, the same stride), or, for evaluation, every
    world_size-th sample from `rank`; it goes to the device once per epoch, and batches are slices
    (through `transform` when the samples are not the model's input shape)."""

    def __init__(
        self,
        inputs: Tensor,
        labels: Tensor,
        *,
        device: torch.device,
        rank: int,
        world_size: int,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        transform: Transform | None = None,
    ) -> None:
        self.inputs = inputs.to(device)
        self.transform = transform
        self.labels = labels.to(device)
        self.rank, self.world_size, self.batch_size = rank, world_size, batch_size
        self.seed, self.shuffle = seed, shuffle
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def indices(self) -> list[int]:
        """This rank's sample indices for the current epoch, in order."""
        count = len(self.inputs)
        if not self.shuffle:  # evaluation: every sample on exactly one rank
            return list(range(self.rank, count, self.world_size))
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        order = torch.randperm(count, generator=generator).tolist()
        total = math.ceil(count / self.world_size) * self.world_size
        order += (order * math.ceil(total / count))[: total - count]  # pad to equal shards
        return order[self.rank : total : self.world_size]

    def __len__(self) -> int:
        return math.ceil(len(self.indices()) / self.batch_size)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        shard = torch.tensor(self.indices(), dtype=torch.int64, device=self.inputs.device)
        for start in range(0, len(shard), self.batch_size):
            batch = shard[start : start + self.batch_size]
            inputs = self.inputs.index_select(0, batch)
            yield self.transform(inputs) if self.transform else inputs, self.labels.index_select(0, batch)


@dataclass
class Loaders:
    train: Iterable[tuple[Tensor, Tensor]]
    train_sampler: DistributedSampler[Any] | ResidentBatches  # set_epoch before each epoch
    test: Iterable[tuple[Tensor, Tensor]]


def make_loaders(
    data: DataBundle,
    *,
    rank: int,
    world_size: int,
    batch_size: int,
    num_workers: int,
    seed: int,
    pin_memory: bool,
    device: torch.device | None = None,
    shape: InputShape | None = None,
    prefetch: int = 2,
) -> Loaders:
    """Per-rank loaders: a shuffled, epoch-seeded shard of train and a disjoint shard of test. Data
    held in memory lives on `device` for the whole run (ResidentBatches, fitted to the model's input
    `shape`); data from files goes through DataLoaders (`prefetch` batches ahead per worker), decoded
    on `device` when the set holds encoded JPEGs."""
    train_tensors, test_tensors = resident_tensors(data.train), resident_tensors(data.test)
    if device is not None and train_tensors is not None and test_tensors is not None:
        fit = fit_to(shape) if shape and tuple(train_tensors[0].shape[1:]) != shape.dims else None
        where: dict[str, Any] = {
            "device": device,
            "rank": rank,
            "world_size": world_size,
            "batch_size": batch_size,
        }
        resident = ResidentBatches(*train_tensors, seed=seed, transform=fit, **where)
        resident_test = ResidentBatches(*test_tensors, shuffle=False, transform=fit, **where)
        return Loaders(train=resident, train_sampler=resident, test=resident_test)
    train_sampler: DistributedSampler[Any] = DistributedSampler(
        data.train, num_replicas=world_size, rank=rank, shuffle=True, seed=seed
    )
    test_sampler = EvalShardSampler(data.test, num_replicas=world_size, rank=rank)
    common: dict[str, Any] = {
        "batch_size": batch_size,
        "num_workers": num_workers,
        "pin_memory": pin_memory,
        # Keeping workers alive saves their start-up cost every epoch.
        "persistent_workers": num_workers > 0,
        "prefetch_factor": prefetch if num_workers > 0 else None,
    }
    if data.device_transforms is not None:
        common["collate_fn"] = collate_encoded
    train: Iterable[tuple[Tensor, Tensor]] = DataLoader(data.train, sampler=train_sampler, **common)
    test: Iterable[tuple[Tensor, Tensor]] = DataLoader(data.test, sampler=test_sampler, **common)
    if data.device_transforms is not None:
        if device is None:
            raise DataError("decoding on the device needs the device")
        train = DeviceDecoded(cast(Any, train), device, data.device_transforms[0])
        test = DeviceDecoded(cast(Any, test), device, data.device_transforms[1])
    return Loaders(train=train, train_sampler=train_sampler, test=test)


# --------------------------------------------------------------------------------------------
# Training and evaluation
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepOptions:
    """How a step computes. bf16 autocast changes the numbers a little (losses and accuracy differ in
    the last digits); channels-last only changes the memory layout (faster convolutions on GPUs)."""

    bf16: bool = False
    channels_last: bool = False

    def autocast(self, device: torch.device) -> torch.autocast:
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.bf16)

    def layout(self, images: Tensor) -> Tensor:
        if self.channels_last and images.dim() == 4:
            return images.contiguous(memory_format=torch.channels_last)
        return images


@dataclass
class TrainStats:
    """One rank's numbers for one training epoch."""

    loss_sum: float  # sum over samples of the per-sample loss
    samples: int
    steps: int
    data_wait_s: float  # time blocked in next(iterator)
    loop_s: float  # wall time of the whole loop, data wait included


@dataclass
class EvalStats:
    """One rank's numbers for one evaluation pass over its shard."""

    loss_sum: float
    correct: int
    samples: int


def train_one_epoch(
    model: nn.Module,
    loader: Iterable[tuple[Tensor, Tensor]],
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    *,
    max_steps: int | None = None,
    step_sleep: float = 0.0,
    on_first_step: Callable[[], None] | None = None,
    options: StepOptions = StepOptions(),
    on_step: Callable[[int, Tensor, float], None] | None = None,
) -> TrainStats:
    """Run one epoch (or ``max_steps`` steps) and time how long the loop waits for data. After each
    step ``on_step(samples, loss, data wait s)`` hears that step's figures (the loss a tensor on the
    device: reading it would make the step wait for the device)."""
    model.train()
    loss_fn = nn.CrossEntropyLoss()
    non_blocking = device.type == "cuda"
    # Accumulate on the device so there is no host sync per step; one .item() at the end.
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    samples = steps = 0
    data_wait = 0.0
    start = time.perf_counter()
    batches = iter(loader)
    while max_steps is None or steps < max_steps:
        wait_start = time.perf_counter()
        try:
            images, labels = next(batches)
        except StopIteration:
            break
        waited = time.perf_counter() - wait_start
        data_wait += waited
        images = options.layout(images.to(device, non_blocking=non_blocking))
        labels = labels.to(device, non_blocking=non_blocking)
        optimizer.zero_grad(set_to_none=True)
        with options.autocast(device):
            loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        count = int(labels.shape[0])
        loss_sum += loss.detach().double() * count
        samples += count
        steps += 1
        if steps == 1 and on_first_step is not None:
            on_first_step()
        if on_step is not None:
            on_step(count, loss.detach(), waited)
        if step_sleep > 0:
            time.sleep(step_sleep)
    total_loss = float(loss_sum.item())  # waits for queued GPU work, so the loop time is honest
    return TrainStats(total_loss, samples, steps, data_wait, time.perf_counter() - start)


@torch.inference_mode()
def evaluate(
    model: nn.Module,
    loader: Iterable[tuple[Tensor, Tensor]],
    device: torch.device,
    options: StepOptions = StepOptions(),
) -> EvalStats:
    """Summed loss and correct predictions over this rank's evaluation shard.

    Pass the unwrapped model: evaluating through DDP could trigger collectives that ranks with
    different shard sizes would not match.
    """
    model.eval()
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    samples = 0
    for images, labels in loader:
        images = options.layout(images.to(device))
        labels = labels.to(device)
        with options.autocast(device):
            logits = model(images).float()
        loss_sum += loss_fn(logits, labels).double()
        correct += (logits.argmax(dim=1) == labels).sum()
        samples += int(labels.shape[0])
    return EvalStats(float(loss_sum.item()), int(correct.item()), samples)


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else 0.0


@dataclass
class Totals:
    """Throughput counters summed over all epochs so far (kept in the checkpoint across resumes)."""

    samples: float = 0.0  # training samples processed by all ranks
    train_time_s: float = 0.0  # sum over epochs of the slowest rank's loop time
    data_wait_s: float = 0.0  # summed over ranks
    loop_s: float = 0.0  # summed over ranks

    @property
    def samples_per_sec(self) -> float:
        return _ratio(self.samples, self.train_time_s)

    @property
    def data_wait_fraction(self) -> float:
        return _ratio(self.data_wait_s, self.loop_s)

    def add(self, other: Totals) -> Totals:
        return Totals(
            self.samples + other.samples,
            self.train_time_s + other.train_time_s,
            self.data_wait_s + other.data_wait_s,
            self.loop_s + other.loop_s,
        )


@dataclass
class EpochMetrics:
    """Global (all ranks) results of one epoch."""

    epoch: int
    train_loss: float
    test_loss: float
    accuracy: float  # fraction in [0, 1]
    samples_per_sec: float
    data_wait_fraction: float


# The order in which run_ddp.py packs the per-rank sums into one all-reduce.
SUM_FIELDS = (
    "train_loss_sum",
    "train_samples",
    "data_wait_s",
    "loop_s",
    "test_loss_sum",
    "correct",
    "test_samples",
)


def local_sums(train: TrainStats, evaluation: EvalStats) -> list[float]:
    """This rank's contribution to the summed metrics, in ``SUM_FIELDS`` order."""
    return [
        train.loss_sum,
        float(train.samples),
        train.data_wait_s,
        train.loop_s,
        evaluation.loss_sum,
        float(evaluation.correct),
        float(evaluation.samples),
    ]


def epoch_metrics(epoch: int, sums: list[float], slowest_loop_s: float) -> tuple[EpochMetrics, Totals]:
    """Turn all-reduced sums (``SUM_FIELDS`` order) into the epoch's metrics and counters.

    Throughput uses the slowest rank's loop time: the epoch is not over until every rank is done.
    """
    named = dict(zip(SUM_FIELDS, sums, strict=True))
    totals = Totals(named["train_samples"], slowest_loop_s, named["data_wait_s"], named["loop_s"])
    metrics = EpochMetrics(
        epoch=epoch,
        train_loss=_ratio(named["train_loss_sum"], named["train_samples"]),
        test_loss=_ratio(named["test_loss_sum"], named["test_samples"]),
        accuracy=_ratio(named["correct"], named["test_samples"]),
        samples_per_sec=totals.samples_per_sec,
        data_wait_fraction=totals.data_wait_fraction,
    )
    return metrics, totals


def format_epoch_line(metrics: EpochMetrics, epochs: int) -> str:
    return (
        f"epoch {metrics.epoch}/{epochs} train_loss={metrics.train_loss:.4f} "
        f"test_loss={metrics.test_loss:.4f} "
        f"accuracy={metrics.accuracy * 100:.2f}% samples/s={metrics.samples_per_sec:.1f} "
        f"data_wait={metrics.data_wait_fraction * 100:.1f}%"
    )


# --------------------------------------------------------------------------------------------
# Epochs
# --------------------------------------------------------------------------------------------


def epochs_to_run(completed: int, epochs: int) -> range:
    """The 1-based epochs still to train after ``completed`` finished ones (empty when done)."""
    return range(completed + 1, epochs + 1)
