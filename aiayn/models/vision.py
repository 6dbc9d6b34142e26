"""The Vision Transformer (Dosovitskiy et al., 2020): an image cut into P × P patches, each
patch a token, read by the same encoder blocks as text.

    patches (B, N, C·P²) --Linear--> (B, N, d) [+ a learned [CLS] token] + positions
    --> encoder blocks (aiayn/nn/blocks.py, bidirectional) --> [CLS] or the mean of the
    patches --> Linear --> class logits

Positions are learned (the paper's choice) or sinusoidal over the patch index, or none.  With
no positions and mean pooling the classifier cannot tell where a patch was: its output is the
same for any permutation of the patches (tested).

Shapes: B batch, C channels, H × W image, P patch size, N = (H/P)(W/P) patches, d = d_model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.errors import UserError
from aiayn.models.base import Stack, TransformerModel
from aiayn.nn.context import Context, Record
from aiayn.nn.linear import Linear
from aiayn.nn.positions import sinusoidal_table


def patchify(images: Tensor, patch: int) -> Tensor:
    """(B, C, H, W) -> (B, N, C·P²), patches in row-major order, each flattened (c, y, x)."""
    b, c, h, w = images.shape
    x = images.unfold(2, patch, patch).unfold(3, patch, patch)  # (B, C, H/P, W/P, P, P)
    return x.permute(0, 2, 3, 1, 4, 5).reshape(b, (h // patch) * (w // patch), c * patch * patch)


class VisionTransformer(TransformerModel):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        c, v = config, config.vision
        if v.image_size is None or v.n_classes is None:
            raise UserError(
                "VisionTransformer needs config.vision.image_size and config.vision.n_classes"
            )
        self.patches = (v.image_size // v.patch_size) ** 2
        self.patch_embed = Linear(v.channels * v.patch_size**2, c.d_model)
        self.cls = nn.Parameter(torch.zeros(1, 1, c.d_model)) if v.pool == "cls" else None
        tokens = self.patches + (1 if self.cls is not None else 0)
        self.positions: nn.Parameter | None = None
        if c.positions.scheme == "learned":
            self.positions = nn.Parameter(torch.zeros(1, tokens, c.d_model))
        elif c.positions.scheme == "sinusoidal":
            self.register_buffer(
                "table", sinusoidal_table(tokens, c.d_model)[None], persistent=False
            )
        self.encoder = Stack(c, c.n_layers, stream="encoder")
        self.head = Linear(c.d_model, v.n_classes)
        self.init_weights()
        with torch.no_grad():
            if self.cls is not None:
                nn.init.normal_(self.cls, 0.0, c.init_std)
            if self.positions is not None:
                nn.init.normal_(self.positions, 0.0, c.init_std)

    def _check(self, images: Tensor) -> None:
        v = self.config.vision
        want = (v.channels, v.image_size, v.image_size)
        if images.dim() != 4 or tuple(images.shape[1:]) != want:
            raise UserError(
                f"images must be (B, {want[0]}, {want[1]}, {want[2]}), got {tuple(images.shape)}"
            )

    def features(self, images: Tensor, *, record: Record | None = None) -> Tensor:
        """(B, C, H, W) -> the (B, d) pooled representation."""
        self._check(images)
        c = self.config
        x = self.patch_embed(patchify(images, c.vision.patch_size))  # (B, N, d)
        if self.cls is not None:
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)  # (B, 1+N, d)
        if self.positions is not None:
            x = x + self.positions
        elif c.positions.scheme == "sinusoidal":
            x = x + self.table
        x = F.dropout(x, c.dropout, self.training)
        x = self.encoder(x, Context(causal=False, record=record))  # (B, T, d)
        return x[:, 0] if self.cls is not None else x.mean(1)

    def forward(
        self,
        images: Tensor,
        *,
        record: Record | None = None,
        targets: Tensor | None = None,
        label_smoothing: float = 0.0,
    ) -> Tensor:
        """(B, C, H, W) images -> (B, n_classes) logits; with ``targets`` (B,) class ids, the
        mean cross entropy instead."""
        logits = self.head(self.features(images, record=record))
        if targets is None:
            return logits
        return F.cross_entropy(logits, targets, label_smoothing=label_smoothing)

    def forward_with_weights(self, images: Tensor) -> tuple[Tensor, list[Tensor]]:
        """Logits and each layer's (B, H, T, T) attention weights over [CLS] and the patches."""
        record = Record(weights=True)
        logits = self(images, record=record)
        return logits, [a.weights for a in record.attention if a.weights is not None]
