"""Where a Vision Transformer looks: the attention of its [CLS] token over the patches, drawn
on the image (``aiayn inspect attention --checkpoint DIR --image N``).

For each layer, the [CLS] query's weights over the patch keys (averaged over the heads, or one
head), laid out on the patch grid and drawn beside and over the image -- one panel a layer.
Every number is the model's own (the reference attention backend returns the weights).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch

from aiayn.checkpoint import load
from aiayn.config.run import DataConfig
from aiayn.data.images import load_split
from aiayn.errors import UserError
from aiayn.models.vision import VisionTransformer


def cls_attention(
    model: VisionTransformer, image: torch.Tensor, head: int | None = None
) -> tuple[np.ndarray, int]:
    """(layers, H/P, W/P) weights of [CLS] over the patches, and the predicted class."""
    if model.cls is None:
        raise UserError(
            "this model pools by the mean of its patches: it has no [CLS] token to follow"
        )
    model.eval()
    with torch.no_grad():
        logits, weights = model.forward_with_weights(image[None])
    grid = model.config.vision.image_size // model.config.vision.patch_size  # type: ignore[operator]
    maps = []
    for w in weights:  # (1, H, 1+N, 1+N)
        if head is not None and not 0 <= head < w.shape[1]:
            raise UserError(f"head={head} is out of range: the model has {w.shape[1]} heads")
        row = w[0, :, 0, 1:] if head is None else w[0, head : head + 1, 0, 1:]  # (H|1, N)
        maps.append(row.mean(0).reshape(grid, grid).numpy())
    return np.stack(maps), int(logits.argmax(-1))


def image_attention(
    checkpoint: str | Path, index: int, out_dir: str | Path, *, head: int | None = None
) -> tuple[Path, dict[str, Any]]:
    """Draw test image ``index`` of the checkpoint's dataset with its [CLS] attention."""
    bundle = load(checkpoint)
    model = bundle.model
    if not isinstance(model, VisionTransformer):
        raise UserError(f"{checkpoint} holds a {type(model).__name__}, not an image model")
    d = DataConfig(**bundle.run.get("data", {}))
    split = load_split(d.images, test_fraction=d.test_fraction, seed=d.seed)
    images, labels = split.test
    if not 0 <= index < len(labels):
        raise UserError(f"--image {index} is out of range: the test set has {len(labels)} images")
    maps, predicted = cls_attention(model, images[index], head)
    picture = images[index].permute(1, 2, 0).squeeze(-1).numpy()
    n = len(maps)
    fig, axes = plt.subplots(1, n + 1, figsize=(2.4 * (n + 1), 2.7))
    axes[0].imshow(picture, cmap="gray_r")
    axes[0].set_title(
        f"true {split.labels[int(labels[index])]}, predicted {split.labels[predicted]}", fontsize=8
    )
    size = picture.shape[0]
    for i, (ax, m) in enumerate(zip(axes[1:], maps, strict=True)):
        ax.imshow(picture, cmap="gray_r", extent=(0, size, size, 0))
        ax.imshow(m, cmap="inferno", alpha=0.6, extent=(0, size, size, 0))
        ax.set_title(f"layer {i}: [CLS] → patches", fontsize=8)
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    who = "mean over heads" if head is None else f"head {head}"
    fig.suptitle(f"where the [CLS] token attends ({who})", fontsize=9)
    fig.tight_layout()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"image_attention_{index}.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path, {
        "true": split.labels[int(labels[index])],
        "predicted": split.labels[predicted],
        "cls_attention": maps.round(4).tolist(),
    }
