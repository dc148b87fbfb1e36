"""The image path of run_ddp.py: models and their input, image folders decoded on the CPU or on the
device (here the CPU stands in for the GPU: the same code, torchvision's decoder), loader workers
from the node's CPUs, data in memory fitted to the model, bf16 and channels-last."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from images import default_workers, image_transform, processes_on_node
from make_image_folder import write_split
from neural_network import InputShape, build_model, input_shape
from operations import (
    DataError,
    StepOptions,
    fit_to,
    load_image_folder,
    make_loaders,
    resident_tensors,
    train_one_epoch,
)

SMALL = InputShape(3, 32)
CPU = torch.device("cpu")
ONE_RANK = {"rank": 0, "world_size": 1, "num_workers": 0, "seed": 0, "pin_memory": False}


@pytest.fixture(scope="module")
def jpeg_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("jpegs")
    write_split(root / "train", 3, 6, 48, seed=0)
    write_split(root / "val", 3, 2, 48, seed=1)
    return root


# --- models --------------------------------------------------------------------------------------


def test_models_take_their_input_shape_and_give_one_logit_per_class() -> None:
    assert input_shape("mlp") == InputShape(1, 28)
    assert input_shape("resnet50") == InputShape(3, 224)
    assert input_shape("resnet18", 64) == InputShape(3, 64)
    for name, shape in (("mlp", InputShape(1, 28)), ("resnet18", SMALL)):
        torch.manual_seed(0)
        model = build_model(name, 7, shape).eval()
        assert model(torch.rand(2, *shape.dims)).shape == (2, 7)
    with pytest.raises(ValueError, match="unknown model 'vgg'"):
        build_model("vgg", 7, SMALL)


# --- image folders ---------------------------------------------------------------------------------


def test_device_decode_gives_the_cpu_path_s_tensors(jpeg_folder: Path) -> None:
    """Only where the JPEG is decoded differs: PIL in the workers, or torchvision's decoder on the
    device; the evaluation transform (deterministic) then gives the same inputs within a grey level."""
    on_cpu = load_image_folder(jpeg_folder, SMALL, "cpu")
    encoded = load_image_folder(jpeg_folder, SMALL, "device")
    assert encoded.device_transforms is not None
    cpu = make_loaders(on_cpu, batch_size=4, **ONE_RANK)
    device = make_loaders(encoded, batch_size=4, device=CPU, **ONE_RANK)
    pairs = list(zip(cpu.test, device.test, strict=True))
    assert len(pairs) == 2  # 6 val images, batches of 4
    for (cpu_images, cpu_labels), (device_images, device_labels) in pairs:
        assert device_images.shape == cpu_images.shape == (len(cpu_labels), *SMALL.dims)
        assert torch.equal(device_labels, cpu_labels)
        # Normalised units: a grey level is 1/255/std, at most ~0.0175; allow two.
        assert (device_images - cpu_images).abs().max().item() < 0.04


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_decode_gives_the_cpu_path_s_tensors_within_tolerance(jpeg_folder: Path) -> None:
    """nvJPEG decodes differently from libjpeg-turbo (likely its chroma upsampling: the random images'
    colour edges): measured on an H200 (torch 2.11+cu130, torchvision 0.26, 2026-11-27), a mean of 0.074
    in normalised units (about 5 grey levels), 99 % within 0.33, at most 0.63. A wrong transform (channel
    order, normalisation, size) is off by several units on average: the bound is that, with room."""
    on_cpu = load_image_folder(jpeg_folder, SMALL, "cpu")
    encoded = load_image_folder(jpeg_folder, SMALL, "device")
    cpu = make_loaders(on_cpu, batch_size=4, **ONE_RANK)
    gpu = make_loaders(encoded, batch_size=4, device=torch.device("cuda", 0), **ONE_RANK)
    for (cpu_images, cpu_labels), (gpu_images, gpu_labels) in zip(cpu.test, gpu.test, strict=True):
        assert gpu_images.is_cuda and torch.equal(gpu_labels.cpu(), cpu_labels)
        difference = (gpu_images.cpu() - cpu_images).abs()
        assert difference.mean().item() < 0.12 and difference.max().item() < 1.0


def test_device_decode_trains_in_the_sampler_s_order(jpeg_folder: Path) -> None:
    data = load_image_folder(jpeg_folder, SMALL, "device")
    ranks = [
        make_loaders(
            data,
            rank=rank,
            world_size=2,
            batch_size=3,
            num_workers=1,
            seed=5,
            pin_memory=False,
            device=torch.device("cpu"),
            prefetch=2,
        )
        for rank in (0, 1)
    ]
    labels = []
    for loaders in ranks:
        loaders.train_sampler.set_epoch(1)
        batches = list(loaders.train)
        assert all(images.shape[1:] == SMALL.dims and images.dtype == torch.float32 for images, _ in batches)
        labels.append(torch.cat([batch_labels for _, batch_labels in batches]).tolist())
    sampler_order = [list(loaders.train_sampler) for loaders in ranks]  # the DistributedSampler's
    assert labels == [[data.train.targets[i] for i in order] for order in sampler_order]


def test_device_decode_refuses_other_images_in_one_line(tiny_image_folder: Path) -> None:
    with pytest.raises(DataError, match=r"--decode device reads JPEG files only, .* use --decode cpu"):
        load_image_folder(tiny_image_folder, SMALL, "device")


def test_grey_models_get_grey_images_of_their_size(jpeg_folder: Path) -> None:
    transform = image_transform(InputShape(1, 28), train=True)
    image = torch.randint(0, 256, (3, 60, 45), dtype=torch.uint8)
    out = transform(image)
    assert out.shape == (1, 28, 28) and out.min() >= 0 and out.max() <= 1


def test_workers_share_the_node_s_cpus_among_its_processes() -> None:
    assert processes_on_node({}) == 1
    assert processes_on_node({"LOCAL_WORLD_SIZE": "4"}) == 4
    # run --local: every local node's processes share this machine
    assert processes_on_node({"LOCAL_WORLD_SIZE": "2", "HPCJOB_PROCESSES_ON_HOST": "8"}) == 8
    assert processes_on_node({"HPCJOB_PROCESSES_ON_HOST": "x", "LOCAL_WORLD_SIZE": "2"}) == 2
    assert [default_workers(cpus, procs) for cpus, procs in ((16, 1), (16, 4), (16, 8), (2, 1), (2, 4))] == [
        15,
        3,
        1,
        1,
        1,
    ]


# --- data in memory, fitted to the model ----------------------------------------------------------


def test_data_in_memory_is_fitted_to_an_image_model_on_the_device(tiny_fashion_mnist: Path) -> None:
    from operations import load_fashion_mnist

    data = load_fashion_mnist(tiny_fashion_mnist)
    loaders = make_loaders(data, batch_size=5, device=CPU, shape=SMALL, **ONE_RANK)
    images, _ = next(iter(loaders.test))
    assert images.shape == (5, *SMALL.dims)
    grey = resident_tensors(data.test)
    assert grey is not None
    assert torch.allclose(images[:, 0], images[:, 2])  # grey repeated into the three channels
    assert torch.allclose(fit_to(SMALL)(grey[0][:5]), images)
    mlp = make_loaders(data, batch_size=5, device=CPU, shape=InputShape(1, 28), **ONE_RANK)
    assert mlp.test.transform is None  # type: ignore[attr-defined]  # already the MLP's shape: no copy


# --- bf16 and channels-last -----------------------------------------------------------------------


def _one_step_loss(options: StepOptions) -> float:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 30 * 30, 4))
    if options.channels_last:
        model = model.to(memory_format=torch.channels_last)
    batches = [(torch.rand(8, *SMALL.dims), torch.randint(0, 4, (8,)))]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    stats = train_one_epoch(model, batches, optimizer, torch.device("cpu"), options=options)
    return stats.loss_sum / stats.samples


def test_channels_last_keeps_the_numbers_and_bf16_changes_only_the_last_digits() -> None:
    plain = _one_step_loss(StepOptions())
    assert _one_step_loss(StepOptions(channels_last=True)) == pytest.approx(plain, rel=1e-5)
    bf16 = _one_step_loss(StepOptions(bf16=True))
    assert bf16 != plain and bf16 == pytest.approx(plain, rel=0.02)
    assert (
        StepOptions(channels_last=True)
        .layout(torch.rand(2, 3, 4, 4))
        .is_contiguous(memory_format=torch.channels_last)
    )


# --- end to end -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_resnet_trains_on_jpegs_decoded_on_the_device(
    training_dir: Path, jpeg_folder: Path, tmp_path: Path
) -> None:
    """One process, the CPU standing in for the GPU: the real program, its flags and its metrics."""
    done = subprocess.run(
        [
            sys.executable,
            str(training_dir / "run_ddp.py"),
            "--data",
            "image-folder",
            "--data-root",
            str(jpeg_folder),
            "--model",
            "resnet18",
            "--image-size",
            "32",
            "--decode",
            "device",
            "--num-workers",
            "1",
            "--batch-size",
            "6",
            "--epochs",
            "1",
            "--channels-last",
            "--checkpoint-dir",
            str(tmp_path / "checkpoints"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    start = next(line for line in done.stdout.splitlines() if line.startswith("start "))
    assert (
        "model=resnet18 input=3x32x32" in start and "decode=device" in start and "loader_workers=1" in start
    )
    metrics = json.loads(done.stdout.splitlines()[-1].removeprefix("HPCJOB_METRICS "))
    assert (metrics["model"], metrics["channels_last"], metrics["bf16"]) == ("resnet18", True, False)
    assert "gpus" not in metrics  # no GPU watched: no field at all, not zeros
