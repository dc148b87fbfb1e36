"""Write an ImageNet-layout folder of JPEGs (``OUT/train/<class>/*.jpg``, ``OUT/val/<class>/*.jpg``)
to try ``run_ddp.py --data image-folder`` and its loaders without a real data set.

Each class is a smooth colour pattern of its own under noise, so a model can learn it; the images
have varied sizes around ``--size``, as photos do, so resizing and cropping do real work.

    python3 training/make_image_folder.py /tmp/images --classes 10 --train-per-class 100
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import torch


def class_pattern(
    label: int, classes: int, height: int, width: int, generator: torch.Generator
) -> torch.Tensor:
    """A uint8 3xHxW image: the class's colour gradient, turned by the class's angle, plus noise."""
    angle = torch.tensor(2 * torch.pi * label / classes)
    ys = torch.linspace(-1, 1, height).view(-1, 1)
    xs = torch.linspace(-1, 1, width).view(1, -1)
    ramp = torch.cos(angle) * xs + torch.sin(angle) * ys
    phases = torch.tensor([0.0, 2.1, 4.2]).view(3, 1, 1) + label
    image = 0.5 + 0.4 * torch.sin(3 * ramp.unsqueeze(0) + phases)
    image = image + 0.15 * torch.randn((3, height, width), generator=generator)
    return (image.clamp(0, 1) * 255).to(torch.uint8)


def write_split(folder: Path, classes: int, per_class: int, size: int, seed: int, quality: int = 90) -> int:
    """`per_class` JPEGs for each class under `folder`/<class>; the number written."""
    from torchvision.io import encode_jpeg  # type: ignore[import-untyped]  # lazy: slow to import

    generator = torch.Generator().manual_seed(seed)
    for label in range(classes):
        class_dir = folder / f"class{label:03d}"
        class_dir.mkdir(parents=True, exist_ok=True)
        for index in range(per_class):
            # Photos differ in size and aspect: from 3/4 to 5/4 of `size` on each side.
            height, width = (
                int(size * (0.75 + 0.5 * float(torch.rand((), generator=generator)))) for _ in "hw"
            )
            data = encode_jpeg(class_pattern(label, classes, height, width, generator), quality=quality)
            (class_dir / f"{index:06d}.jpg").write_bytes(bytes(data.numpy()))
    return classes * per_class


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make_image_folder.py", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the data root to write (train/ and val/ under it)")
    parser.add_argument("--classes", type=int, default=10, help="class folders (default: 10)")
    parser.add_argument(
        "--train-per-class", type=int, default=100, help="train images per class (default: 100)"
    )
    parser.add_argument("--val-per-class", type=int, default=20, help="val images per class (default: 20)")
    parser.add_argument("--size", type=int, default=256, help="typical image side in pixels (default: 256)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.classes < 2 or args.train_per_class < 1 or args.val_per_class < 0 or args.size < 8:
        parser.error("need at least 2 classes, 1 train image per class and a size of 8 or more")
    count = write_split(args.out / "train", args.classes, args.train_per_class, args.size, args.seed)
    count += write_split(args.out / "val", args.classes, args.val_per_class, args.size, args.seed + 1)
    print(f"wrote {count} JPEGs under {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
