"""Scoring an image classifier on its held-out test images, beside simple baselines fitted on
the same training images: accuracy and the confusion matrix (rows: the true class, columns:
the predicted one).  The baselines are scikit-learn's multinomial logistic regression on the
raw pixels and a one-hidden-layer MLP (128 units) -- what a Vision Transformer has to beat to
have earned its attention."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from aiayn.data.images import ImageSplit
from aiayn.models.vision import VisionTransformer


def confusion(true: np.ndarray, predicted: np.ndarray, classes: int) -> np.ndarray:
    """(classes, classes) counts: row = true class, column = predicted class."""
    m = np.zeros((classes, classes), dtype=np.int64)
    np.add.at(m, (true, predicted), 1)
    return m


@torch.no_grad()
def predict(model: VisionTransformer, images: torch.Tensor, batch: int = 256) -> np.ndarray:
    model.eval()
    device = next(model.parameters()).device
    out = [
        model(images[i : i + batch].to(device)).argmax(-1).cpu()
        for i in range(0, len(images), batch)
    ]
    return torch.cat(out).numpy()


def score_classifier(model: VisionTransformer, split: ImageSplit) -> dict[str, Any]:
    """Test accuracy and confusion matrix of ``model``."""
    x, y = split.test
    predicted = predict(model, x)
    true = y.numpy()
    return {
        "accuracy": float((predicted == true).mean()),
        "confusion": confusion(true, predicted, len(split.labels)).tolist(),
        "test_images": len(true),
    }


def baselines(split: ImageSplit, seed: int = 0) -> dict[str, float]:
    """Test accuracy of a logistic regression and an MLP on the raw pixels, trained on the
    same training images as the model."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier

    def flat(t: torch.Tensor) -> np.ndarray:
        return t.reshape(len(t), -1).numpy()

    (x, y), (xt, yt) = split.train, split.test
    models = {
        "logistic regression": LogisticRegression(max_iter=5000),
        "MLP (128 hidden units)": MLPClassifier(
            hidden_layer_sizes=(128,), max_iter=2000, random_state=seed
        ),
    }
    return {
        name: float(m.fit(flat(x), y.numpy()).score(flat(xt), yt.numpy()))
        for name, m in models.items()
    }
