"""The model trained by ``run_ddp.py``: a small multilayer perceptron for 28x28 images.

It keeps the layout of the Microsoft FashionMNIST sample (Flatten -> 784 -> 512 -> 512 -> classes)
but takes the number of classes as a parameter so that ImageFolder data sets with any number of
classes fit.
"""

from __future__ import annotations

from torch import Tensor, nn

IMAGE_SIZE = 28
HIDDEN_UNITS = 512


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
