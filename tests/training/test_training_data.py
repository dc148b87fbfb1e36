"""Data sets of the training program: synthetic, FashionMNIST and ImageFolder, and their sharding."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset

from neural_network import NeuralNetwork
from operations import (
    DataError,
    EvalShardSampler,
    evaluate,
    load_data,
    make_loaders,
    make_synthetic,
    train_one_epoch,
)


def _all(dataset: TensorDataset) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = dataset.tensors
    return images, labels


def test_synthetic_is_deterministic_and_shaped() -> None:
    first, again, other = (
        make_synthetic(64, 32, seed=5),
        make_synthetic(64, 32, seed=5),
        make_synthetic(64, 32, 6),
    )
    images, labels = _all(first.train)  # type: ignore[arg-type]
    assert images.shape == (64, 1, 28, 28) and images.dtype == torch.float32
    assert labels.dtype == torch.int64 and int(labels.min()) >= 0 and int(labels.max()) < 10
    assert first.num_classes == 10 and (first.train_size, first.test_size) == (64, 32)
    for split in ("train", "test"):
        a, b, c = (_all(getattr(d, split)) for d in (first, again, other))
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert not torch.equal(a[0], c[0])


def test_synthetic_test_set_does_not_depend_on_train_size() -> None:
    small, large = make_synthetic(10, 40, seed=1), make_synthetic(500, 40, seed=1)
    assert torch.equal(_all(small.test)[0], _all(large.test)[0])  # type: ignore[arg-type]


def test_synthetic_leaves_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    make_synthetic(16, 16, seed=0)
    assert torch.equal(torch.rand(3), expected)


def test_synthetic_is_learnable_by_the_mlp() -> None:
    torch.manual_seed(0)
    data = make_synthetic(1024, 256, seed=0)
    model = NeuralNetwork(data.num_classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    device = torch.device("cpu")
    before = evaluate(model, DataLoader(data.test, batch_size=128), device)
    for _ in range(2):
        train_one_epoch(model, DataLoader(data.train, batch_size=32, shuffle=True), optimizer, device)
    after = evaluate(model, DataLoader(data.test, batch_size=128), device)
    assert before.samples == after.samples == 256
    assert before.correct / 256 < 0.3  # an untrained net is near chance (10%)
    assert after.correct / 256 > 0.7
    assert after.loss_sum < before.loss_sum


def test_synthetic_never_imports_torchvision(training_dir: Path) -> None:
    code = (
        f"import sys; sys.path.insert(0, {str(training_dir)!r}); import operations; "
        "operations.load_data('synthetic', None, 8, 8, 0); "
        "assert 'torchvision' not in sys.modules, 'torchvision was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_tiny_fashion_mnist_loads(tiny_fashion_mnist: Path, fashion_labels: dict[str, list[int]]) -> None:
    data = load_data("fashion-mnist", tiny_fashion_mnist, 1, 1, 0)
    assert (data.train_size, data.test_size, data.num_classes) == (12, 5, 10)
    image, label = data.train[3]
    assert image.shape == (1, 28, 28) and image.dtype == torch.float32
    assert label == fashion_labels["train"][3]
    # The writer fills image i with label*25; ToTensor scales to [0, 1].
    assert torch.allclose(image, torch.full((1, 28, 28), label * 25 / 255))
    assert [data.test[i][1] for i in range(5)] == fashion_labels["test"]


def test_missing_fashion_mnist_names_the_folder(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        load_data("fashion-mnist", tmp_path, 1, 1, 0)
    message = str(info.value)
    assert str(tmp_path / "FashionMNIST" / "raw") in message and "\n" not in message


def test_truncated_fashion_mnist_is_a_data_error(tiny_fashion_mnist: Path) -> None:
    labels = tiny_fashion_mnist / "FashionMNIST" / "raw" / "train-images-idx3-ubyte"
    labels.write_bytes(labels.read_bytes()[:100])
    with pytest.raises(DataError, match="unreadable"):
        load_data("fashion-mnist", tiny_fashion_mnist, 1, 1, 0)


def test_tiny_image_folder_loads_with_train_class_numbering(tiny_image_folder: Path) -> None:
    data = load_data("image-folder", tiny_image_folder, 1, 1, 0)
    assert (data.num_classes, data.train_size, data.test_size) == (3, 6, 2)
    assert "eval=val" in data.description
    for dataset in (data.train, data.test):
        image, _ = dataset[0]
        assert image.shape == (1, 28, 28) and image.dtype == torch.float32
    # val has only cat and dog; ImageFolder alone would number them 0 and 1.
    assert sorted(data.test[i][1] for i in range(2)) == [1, 2]
    assert data.train.classes == data.test.classes == ["bird", "cat", "dog"]  # type: ignore[attr-defined]


def test_image_folder_eval_falls_back_to_test_then_train(tiny_image_folder: Path) -> None:
    (tiny_image_folder / "val").rename(tiny_image_folder / "test")
    assert "eval=test" in load_data("image-folder", tiny_image_folder, 1, 1, 0).description
    shutil.rmtree(tiny_image_folder / "test")
    data = load_data("image-folder", tiny_image_folder, 1, 1, 0)
    assert "eval=train" in data.description and data.test_size == data.train_size == 6


def test_image_folder_errors(
    tmp_path: Path, tiny_image_folder: Path, png_writer: Callable[..., None]
) -> None:
    with pytest.raises(DataError, match=str(tmp_path / "nothing" / "train")):
        load_data("image-folder", tmp_path / "nothing", 1, 1, 0)
    png_writer(tiny_image_folder / "val" / "horse" / "h.png", (28, 28), (9, 9, 9))
    with pytest.raises(DataError, match="horse"):
        load_data("image-folder", tiny_image_folder, 1, 1, 0)


def test_real_data_needs_a_root() -> None:
    with pytest.raises(DataError, match="--data-root"):
        load_data("image-folder", None, 1, 1, 0)


@given(size=st.integers(0, 40), world=st.integers(1, 6))
def test_eval_shards_cover_every_sample_once(size: int, world: int) -> None:
    dataset = TensorDataset(torch.arange(size))
    seen = [index for rank in range(world) for index in EvalShardSampler(dataset, world, rank)]
    assert sorted(seen) == list(range(size))
    assert sum(len(EvalShardSampler(dataset, world, rank)) for rank in range(world)) == size


def test_train_shards_are_reshuffled_each_epoch() -> None:
    data = make_synthetic(40, 8, seed=0)
    shards = [
        make_loaders(data, rank=rank, world_size=2, batch_size=4, num_workers=0, seed=0, pin_memory=False)
        for rank in range(2)
    ]
    orders = []
    for epoch in (1, 2):
        for loaders in shards:
            loaders.train_sampler.set_epoch(epoch)
        epoch_indices = [list(loaders.train_sampler) for loaders in shards]
        assert sorted(epoch_indices[0] + epoch_indices[1]) == list(range(40))  # disjoint, complete
        orders.append(epoch_indices[0])
    assert orders[0] != orders[1]


# --- data that lives on the device -----------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    count=st.integers(1, 60),
    world_size=st.integers(1, 7),
    epoch=st.integers(0, 5),
    seed=st.integers(0, 3),
)
def test_resident_shards_are_distributed_samplers_own(
    count: int, world_size: int, epoch: int, seed: int
) -> None:
    """The same indices as DistributedSampler (shuffle, padding, stride) for training, and as the
    evaluation sampler for test: so a run's batches do not change with where its data lives."""
    from torch.utils.data import DistributedSampler

    from operations import EvalShardSampler, ResidentBatches

    data = TensorDataset(torch.arange(count, dtype=torch.float32).unsqueeze(1), torch.arange(count))
    shards = []
    for rank in range(world_size):
        stock = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        stock.set_epoch(epoch)
        resident = ResidentBatches(
            *data.tensors,
            device=torch.device("cpu"),
            rank=rank,
            world_size=world_size,
            batch_size=4,
            seed=seed,
        )
        resident.set_epoch(epoch)
        assert resident.indices() == list(stock)
        shards.append(resident.indices())
        evaluation = ResidentBatches(
            *data.tensors,
            device=torch.device("cpu"),
            rank=rank,
            world_size=world_size,
            batch_size=4,
            shuffle=False,
        )
        assert evaluation.indices() == list(EvalShardSampler(data, num_replicas=world_size, rank=rank))
        # Batches are slices of the shard, in order, labels with their inputs.
        batches = list(resident)
        assert torch.cat([labels for _, labels in batches]).tolist() == resident.indices()
        assert all(torch.equal(inputs[:, 0].long(), labels) for inputs, labels in batches)
    assert {i for shard in shards for i in shard} == set(range(count))  # complete
    if count % world_size == 0:
        assert sum(len(s) for s in shards) == count  # and disjoint when nothing is padded


def test_make_loaders_keeps_in_memory_data_on_the_device_and_files_on_loaders() -> None:
    from operations import ResidentBatches, make_loaders

    data = make_synthetic(32, 8, seed=1)
    on_device = make_loaders(
        data,
        rank=0,
        world_size=2,
        batch_size=4,
        num_workers=0,
        seed=0,
        pin_memory=False,
        device=torch.device("cpu"),
    )
    assert isinstance(on_device.train, ResidentBatches) and on_device.train_sampler is on_device.train
    stock = make_loaders(data, rank=0, world_size=2, batch_size=4, num_workers=0, seed=0, pin_memory=False)
    assert isinstance(stock.train, DataLoader)
    for epoch in (1, 2):
        on_device.train_sampler.set_epoch(epoch)
        stock.train_sampler.set_epoch(epoch)
        for (a, la), (b, lb) in zip(on_device.train, stock.train, strict=True):
            assert torch.equal(a, b) and torch.equal(la, lb)


def test_fashion_mnist_in_memory_is_what_its_to_tensor_transform_makes() -> None:
    from PIL import Image
    from torchvision import transforms

    from operations import resident_tensors

    class FashionLike(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
        """As torchvision's FashionMNIST holds and returns its samples."""

        def __init__(self) -> None:
            self.data = torch.randint(0, 256, (5, 28, 28), dtype=torch.uint8)
            self.targets = torch.tensor([3, 1, 4, 1, 5])

        def __len__(self) -> int:
            return len(self.data)

        def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
            image = Image.fromarray(self.data[index].numpy(), mode="L")
            return transforms.ToTensor()(image), int(self.targets[index])

    dataset = FashionLike()
    found = resident_tensors(dataset)
    assert found is not None
    inputs, labels = found
    for index in range(len(dataset)):
        image, label = dataset[index]
        assert torch.equal(inputs[index], image) and int(labels[index]) == label
