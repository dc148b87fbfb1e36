"""The models ``run_ddp.py`` trains (``--model``): a small multilayer perceptron for 28x28 images (the
default, for quick runs), and torchvision's image classifiers for the workloads people run on GPUs.

The MLP keeps the layout of the Microsoft FashionMNIST sample (Flatten -> 784 -> 512 -> 512 -> classes)
but takes the number of classes as a parameter so that ImageFolder data sets with any number of
classes fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

IMAGE_SIZE = 28
HIDDEN_UNITS = 512
# torchvision classifiers that take 3xSxS images, S = 224 as trained on ImageNet.
IMAGE_MODELS = ("resnet18", "resnet50", "resnet101", "mobilenet_v3_large", "efficientnet_b0")
MODELS = ("mlp", *IMAGE_MODELS)
IMAGE_MODEL_SIZE = 224


@dataclass(frozen=True)
class InputShape:
    """What one sample must be for the model: channels x size x size."""

    channels: int
    size: int

    @property
    def dims(self) -> tuple[int, int, int]:
        return (self.channels, self.size, self.size)


def input_shape(model: str, image_size: int | None = None) -> InputShape:
    """The MLP takes grey 28x28 images (or `image_size`); the image models RGB 224x224 (or `image_size`)."""
    if model == "mlp":
        return InputShape(1, image_size or IMAGE_SIZE)
    return InputShape(3, image_size or IMAGE_MODEL_SIZE)


def build_model(model: str, num_classes: int, shape: InputShape) -> nn.Module:
    """A freshly initialised model (the same weights for the same torch seed); no pretrained weights:
    nodes rarely have internet, and the program measures training, not fine-tuning."""
    if model == "mlp":
        return NeuralNetwork(num_classes, image_size=shape.size)
    if model not in IMAGE_MODELS:
        raise ValueError(f"unknown model {model!r} (choose from {', '.join(MODELS)})")
    if num_classes < 2:
        raise ValueError(f"num_classes must be at least 2, got {num_classes}")
    from torchvision import models  # type: ignore[import-untyped]  # lazy: slow to import

    built: nn.Module = getattr(models, model)(weights=None, num_classes=num_classes)
    return built


class NeuralNetwork(nn.Module):
    """Flatten -> Linear -> ReLU -> Linear -> ReLU -> Linear, producing one logit per class."""

    def __init__(
        self, num_classes: int = 10, image_size: int = IMAGE_SIZE, hidden: int = HIDDEN_UNITS
    ) -> None:
        super().__init__()
        if num_classes < 2:
            # One class would make the loss trivially zero and the run meaningless.
            raise ValueError(f"num_classes must be at least 2, got {num_classes}")
        self.num_classes = num_classes
        self.flatten = nn.Flatten()
        self.linear_relu_stack = nn.Sequential(
            nn.Linear(image_size * image_size, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        # Annotated local: nn.Module.__call__ is typed as returning Any.
        logits: Tensor = self.linear_relu_stack(self.flatten(x))
        return logits
