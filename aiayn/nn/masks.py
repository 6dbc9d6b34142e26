"""Every attention mask is built here.

Convention (PyTorch's): a boolean mask is True where a query *may* attend to a key.  Masks
broadcast against scores of shape (B, H, T, S): T queries, S keys.

* causal (§3.2.3, "prevent leftward information flow"): query i may see keys j <= i.  With a
  KV cache the T queries are the *last* T positions of the S keys, so the triangle is aligned
  bottom-right: query i sits at absolute position S - T + i.
* padding: keys that are padding are hidden from every query.
* sliding window (Beltagy et al., 2020; Mistral, Jiang et al., 2023): causal, and a query sees
  only the last ``window`` keys including itself.

Shapes: B batch, T queries, S keys.
"""

from __future__ import annotations

import torch
from torch import Tensor

from aiayn.errors import UserError


def causal_mask(t: int, s: int | None = None, *, device: torch.device | None = None) -> Tensor:
    """(T, S) bool: query i (absolute position S - T + i) sees keys j <= S - T + i."""
    s = t if s is None else s
    if s < t:
        raise UserError(f"causal mask needs at least as many keys as queries, got T={t}, S={s}")
    q_pos = torch.arange(s - t, s, device=device)[:, None]  # (T, 1)
    k_pos = torch.arange(s, device=device)[None, :]  # (1, S)
    return k_pos <= q_pos


def sliding_window_mask(
    t: int, s: int | None = None, *, window: int, device: torch.device | None = None
) -> Tensor:
    """(T, S) bool: causal, and query at position p sees keys in (p - window, p]."""
    if window < 1:
        raise UserError(f"sliding window must be >= 1, got window={window}")
    s = t if s is None else s
    q_pos = torch.arange(s - t, s, device=device)[:, None]  # (T, 1)
    k_pos = torch.arange(s, device=device)[None, :]  # (1, S)
    return (k_pos <= q_pos) & (k_pos > q_pos - window)


def structural_mask(
    t: int, s: int, is_causal: bool, window: int | None, device: torch.device | None = None
) -> Tensor | None:
    """The (T, S) mask a causal or sliding-window (which implies causal) attention applies
    whatever the input: None when there is none."""
    if window is not None:
        return sliding_window_mask(t, s, window=window, device=device)
    if is_causal:
        return causal_mask(t, s, device=device)
    return None


def padding_mask(
    *,
    lengths: Tensor | None = None,
    ids: Tensor | None = None,
    pad_id: int | None = None,
    max_len: int | None = None,
) -> Tensor:
    """(B, S) bool, True at real tokens, from ``lengths`` (right padding) or ``ids == pad_id``."""
    if (lengths is None) == (ids is None):
        raise UserError("padding_mask needs exactly one of lengths= or ids=")
    if ids is not None:
        if pad_id is None:
            raise UserError("padding_mask(ids=...) needs pad_id")
        return ids != pad_id
    assert lengths is not None
    if lengths.dim() != 1:
        raise UserError(f"lengths must be 1-D (B,), got shape {tuple(lengths.shape)}")
    s = int(lengths.max()) if max_len is None else max_len
    if int(lengths.max()) > s:
        raise UserError(f"a length {int(lengths.max())} exceeds max_len={s}")
    return torch.arange(s, device=lengths.device)[None, :] < lengths[:, None]


def key_padding_to_attention(keep: Tensor) -> Tensor:
    """(B, S) key mask -> (B, 1, 1, S), broadcastable against (B, H, T, S) scores."""
    if keep.dim() != 2 or keep.dtype != torch.bool:
        raise UserError(
            f"key padding mask must be bool (B, S), got {keep.dtype} {tuple(keep.shape)}"
        )
    return keep[:, None, None, :]


def combine(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of boolean masks (None means "no constraint"); broadcasts their shapes."""
    out: Tensor | None = None
    for m in masks:
        if m is None:
            continue
        if m.dtype != torch.bool:
            raise UserError(f"combine() takes boolean masks, got {m.dtype}")
        out = m if out is None else out & m
    return out


def add_bias(mask: Tensor | None, bias: Tensor | None) -> Tensor | None:
    """A boolean mask and an additive score bias (ALiBi's) as one additive float mask: the bias
    where attention is allowed, -inf where it is not.  Either may be None."""
    if bias is None:
        return mask
    if mask is None:
        return bias
    if mask.dtype != torch.bool:
        return mask + bias
    return bias.masked_fill(~mask, float("-inf"))
