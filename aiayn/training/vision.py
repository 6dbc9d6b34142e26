"""Training the Vision Transformer on an image set a package ships, on the shared loop.

The split (aiayn/data/images.py) holds out ``data.test_fraction`` of the images as the test
set, which training never sees -- not even for validation: the loop's validation loss is on
a part carved from the training images.  Batches are shuffled epochs of ``batch_size``
images; the data position (epoch, batch) is checkpointed, so a resumed run sees the same
batches as an uninterrupted one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from aiayn.config.run import RunConfig
from aiayn.data.images import ImageSplit, load_split
from aiayn.data.tokenizer import LabelTokenizer, Tokenizer
from aiayn.errors import UserError
from aiayn.models import TransformerModel, build_model
from aiayn.models.vision import VisionTransformer
from aiayn.nn.context import Record
from aiayn.training.loop import FitResult
from aiayn.training.run import train_run


def split_for(run: RunConfig) -> ImageSplit:
    d = run.data
    return load_split(d.images, test_fraction=d.test_fraction, seed=d.seed)


class ImageTask:
    """Shuffled epochs of labelled images; validation cross entropy on the validation part."""

    def __init__(
        self, split: ImageSplit, *, batch_size: int, seed: int, label_smoothing: float
    ) -> None:
        self.split, self.batch_size, self.seed = split, batch_size, seed
        self.label_smoothing = label_smoothing
        self.epoch, self.index = 0, 0
        self.order = self._order(0)

    def _order(self, epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        return torch.randperm(len(self.split.train[1]), generator=g)

    @property
    def linear_rows(self) -> None:
        return None  # the last batch of an epoch is smaller

    def _next(self) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(self.order)
        if self.index >= n:
            self.epoch, self.index = self.epoch + 1, 0
            self.order = self._order(self.epoch)
        rows = self.order[self.index : self.index + self.batch_size]
        self.index += self.batch_size
        x, y = self.split.train
        return x[rows], y[rows]

    def next_batches(self, n: int, rank: int, world: int) -> list[Any]:
        every = [self._next() for _ in range(n * world)]
        return every[rank * n : (rank + 1) * n]

    def loss(self, model: torch.nn.Module, batch: Any, record: Record) -> tuple[torch.Tensor, int]:
        x, y = batch
        device = next(model.parameters()).device
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        return model(x, record=record, targets=y, label_smoothing=self.label_smoothing), len(y)

    @torch.no_grad()
    def evaluate(self, model: TransformerModel) -> float:
        """Validation cross entropy in nats per image."""
        was = model.training
        model.eval()
        x, y = self.split.val
        device = next(model.parameters()).device
        logits = torch.cat([model(x[i : i + 256].to(device)) for i in range(0, len(y), 256)])
        model.train(was)
        return float(F.cross_entropy(logits.float().cpu(), y))

    def data_state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index}

    def load_data_state(self, state: dict[str, Any]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self.order = self._order(self.epoch)


def train_vision(
    run: RunConfig,
    out_dir: str | Path,
    data_root: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    stop_after: int | None = None,
    progress: bool = True,
) -> FitResult:
    """Train (or resume) an image classifier (``data_root`` is unused: the images ship with a
    package)."""
    split = split_for(run)
    c, h, w = split.image_shape
    if h != w:
        raise UserError(f"{run.data.images} images are {h} x {w}: square images only")

    def build() -> tuple[TransformerModel, Tokenizer]:
        images = {"image_size": h, "channels": c, "n_classes": len(split.labels)}
        config = run.model.replace(vision=images)
        return build_model(config), LabelTokenizer(split.labels)

    def make_task(model: TransformerModel, tokenizer: Tokenizer) -> ImageTask:
        v = model.config.vision
        if v.image_size != h or v.channels != c:
            raise UserError(
                f"the model reads {v.channels} x {v.image_size}² images;"
                f" {run.data.images} has {c} x {h}²"
            )
        return ImageTask(
            split,
            batch_size=run.train.batch_size,
            seed=run.train.seed,
            label_smoothing=run.train.label_smoothing,
        )

    result, _ = train_run(
        run,
        out_dir,
        resume=resume,
        overwrite=overwrite,
        build=build,
        make_task=make_task,
        model_type=VisionTransformer,
        stop_after=stop_after,
        progress=progress,
    )
    return result
