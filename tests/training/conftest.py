"""Fixtures for the tests of the training scripts in ``training/``.

The scripts are a plain folder, not a package, and import each other as top-level modules, so
the folder goes on ``sys.path`` here, as it does when torchrun runs ``run_ddp.py``.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

TRAINING_DIR = Path(__file__).resolve().parents[2] / "training"
if str(TRAINING_DIR) not in sys.path:
    sys.path.insert(0, str(TRAINING_DIR))


def pytest_configure(config: pytest.Config) -> None:
    # Also registered in pyproject.toml; registering twice is harmless.
    config.addinivalue_line("markers", "slow: end-to-end runs of real torchrun processes")


def write_idx_images(path: Path, images: list[bytes], rows: int = 28, cols: int = 28) -> None:
    """An idx3-ubyte file: big-endian magic 0x00000803 (uint8, 3 dims), the dims, then pixels."""
    path.write_bytes(struct.pack(">IIII", 0x0803, len(images), rows, cols) + b"".join(images))


def write_idx_labels(path: Path, labels: list[int]) -> None:
    """An idx1-ubyte file: big-endian magic 0x00000801 (uint8, 1 dim), the count, then labels."""
    path.write_bytes(struct.pack(">II", 0x0801, len(labels)) + bytes(labels))


def fashion_image(label: int) -> bytes:
    # Distinct per label so a test can tell that images and labels stay paired.
    return bytes([label * 25]) * (28 * 28)


FASHION_TRAIN_LABELS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 3, 7]
FASHION_TEST_LABELS = [9, 0, 4, 4, 1]


@pytest.fixture
def training_dir() -> Path:
    return TRAINING_DIR


@pytest.fixture
def fashion_labels() -> dict[str, list[int]]:
    """Labels of the tiny FashionMNIST per split (helpers are shared as fixtures, not imports,
    because another conftest.py may own the module name ``conftest``)."""
    return {"train": list(FASHION_TRAIN_LABELS), "test": list(FASHION_TEST_LABELS)}


@pytest.fixture
def png_writer() -> Callable[..., None]:
    return write_png


@pytest.fixture
def tiny_fashion_mnist(tmp_path: Path) -> Path:
    """A data root with a 12/5-image FashionMNIST in the uncompressed files torchvision reads.

    torchvision 0.29 looks in ``<root>/FashionMNIST/raw`` for the four files without ``.gz``
    and only checks that they exist (no checksum) when ``download=False``.
    """
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for split, labels in (("train", FASHION_TRAIN_LABELS), ("t10k", FASHION_TEST_LABELS)):
        write_idx_images(raw / f"{split}-images-idx3-ubyte", [fashion_image(label) for label in labels])
        write_idx_labels(raw / f"{split}-labels-idx1-ubyte", labels)
    return tmp_path


def write_png(path: Path, size: tuple[int, int], color: tuple[int, int, int], mode: str = "RGB") -> None:
    """A solid-colour PNG (created folders included)."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, color if mode == "RGB" else color[0]).save(path)


@pytest.fixture
def tiny_image_folder(tmp_path: Path) -> Path:
    """Three classes in train (sizes and colour modes vary); val lacks class ``bird``."""
    root = tmp_path / "images"
    colors = {"bird": (250, 0, 0), "cat": (0, 250, 0), "dog": (0, 0, 250)}
    for index, (name, color) in enumerate(colors.items()):
        write_png(root / "train" / name / "a.png", (32 + index, 40), color)
        write_png(root / "train" / name / "b.png", (28, 28), color, mode="L")
    write_png(root / "val" / "cat" / "c.png", (50, 50), colors["cat"])
    write_png(root / "val" / "dog" / "d.png", (20, 30), colors["dog"])
    return root
