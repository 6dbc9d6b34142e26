"""Small, fully readable attention computations for teaching (the explorer's lessons).

Every number comes from the library's own functions -- ``scaled_dot_product_attention``,
``sinusoidal_table`` -- so what a reader sees in the browser is what the model computes.

* ``query_walkthrough``: one query on a ten-word sentence whose query/key/value vectors are
  set by hand in four named feature dimensions, step by step: score -> scale by sqrt(d) ->
  softmax -> mix values (Eq. 1).  The pronoun "it" asks for a living noun and finds "cat".
* ``soft_lookup``: attention as a dictionary lookup with partial matches: a query between
  two keys returns a blend of their values, and a longer query sharpens the softmax.
* ``nadaraya_watson``: attention is the kernel smoother of Nadaraya and Watson (1964):
  Gaussian-kernel regression on noisy samples, computed once by its formula and once as
  dot-product attention with the query and keys below; the bandwidth is the sharpness.
* ``positional_similarity``: PE(p) . PE(q) over all q for one p (§3.5).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from aiayn.errors import UserError
from aiayn.nn.attention import scaled_dot_product_attention
from aiayn.nn.positions import sinusoidal_table

FEATURES = ("noun", "animate", "action", "object")

# (token, key = what the token offers, query = what the token looks for).  Values equal keys:
# a token hands over the features it advertises.
SENTENCE: tuple[tuple[str, tuple[float, ...], tuple[float, ...]], ...] = (
    ("the", (0, 0, 0, 0), (0, 0, 0, 0)),
    ("cat", (1, 1, 0, 0), (0, 0, 2, 0)),  # a living noun; looks for what it does
    ("sat", (0, 0, 1, 0), (2, 2, 0, 0)),  # an action; looks for who did it
    ("on", (0, 0, 0, 0), (1, 0, 0, 2)),  # looks for the object it relates
    ("the", (0, 0, 0, 0), (0, 0, 0, 0)),
    ("mat", (1, 0, 0, 1), (0, 0, 2, 0)),  # a lifeless noun, an object
    ("because", (0, 0, 0, 0), (0, 0, 1, 0)),
    ("it", (0, 0, 0, 0), (2, 3, 0, 0)),  # the pronoun: looks for a living noun
    ("was", (0, 0, 0.5, 0), (2, 2, 0, 0)),
    ("tired", (0, 0.5, 0, 0), (1, 2, 0, 0)),  # a state of something living
)
PRONOUN = 7  # index of "it"


def rounded(x: torch.Tensor, digits: int = 4) -> Any:
    """A tensor as nested lists of floats rounded to ``digits`` (for printing and JSON)."""
    return np.round(x.detach().double().numpy(), digits).tolist()


def check_sizes(max_len: int, d_model: int) -> None:
    if max_len < 2 or d_model < 2:
        raise UserError(f"need max_len >= 2 and d_model >= 2, got {max_len} and {d_model}")


def query_walkthrough(query: int = PRONOUN, *, scale: bool = True) -> dict[str, Any]:
    """The four steps of Eq. (1) for one query token of ``SENTENCE``.

    Returns the tokens, feature names, every key (= value) vector, the query, and each step:
    ``scores`` q.k, ``scaled`` q.k / sqrt(d) (or unscaled when ``scale`` is False),
    ``weights`` softmax of those, and ``output`` the weighted sum of the values -- the last two
    straight from ``scaled_dot_product_attention``.
    """
    n = len(SENTENCE)
    if isinstance(query, bool) or not isinstance(query, int) or not 0 <= query < n:
        raise UserError(
            f"query={query!r} is out of range: the sentence has {n} tokens (0..{n - 1})"
        )
    keys = torch.tensor([k for _, k, _ in SENTENCE], dtype=torch.float32)  # (T, d)
    q = torch.tensor([SENTENCE[query][2]], dtype=torch.float32)  # (1, d)
    d = keys.shape[-1]
    out, weights = scaled_dot_product_attention(
        q, keys, keys, scale=scale, return_weights=True, backend="reference"
    )
    scores = (q @ keys.T)[0]  # (T,)
    divisor = math.sqrt(d) if scale else 1.0
    return {
        "tokens": [t for t, _, _ in SENTENCE],
        "features": list(FEATURES),
        "query_index": query,
        "query_token": SENTENCE[query][0],
        "query": rounded(q[0]),
        "keys": rounded(keys),
        "values": rounded(keys),
        "d": d,
        "divisor": round(divisor, 4),
        "scores": rounded(scores),
        "scaled": rounded(scores / divisor),
        "weights": rounded(weights[0]),
        "output": rounded(out[0]),
    }


def soft_lookup(between: float = 0.5, length: float = 1.0) -> dict[str, Any]:
    """A query at angle ``between`` x 90 degrees, of the given ``length``, against two unit keys
    at 0 and 90 degrees whose values are (1, 0) and (0, 1).

    ``between`` = 0 points at the first key, 1 at the second, 0.5 halfway; the weights (and so
    the output, a blend of the two values) move smoothly between them, and a longer query makes
    the softmax sharper (lower entropy) without changing which key wins.
    """
    for name, value, low, high in (("between", between, 0.0, 1.0), ("length", length, 0.0, 20.0)):
        if not isinstance(value, int | float) or not low <= value <= high:
            raise UserError(
                f"{name}={value!r} is out of range: expected a number in [{low}, {high}]"
            )
    angle = between * math.pi / 2
    q = torch.tensor([[length * math.cos(angle), length * math.sin(angle)]])  # (1, 2)
    keys = torch.eye(2)  # (2, 2): first key along x, second along y
    values = torch.eye(2)
    out, weights = scaled_dot_product_attention(
        q, keys, values, scale=False, return_weights=True, backend="reference"
    )
    w = weights[0]
    entropy = float(-(w * w.clamp_min(1e-12).log()).sum())
    return {
        "keys": rounded(keys),
        "values": rounded(values),
        "query": rounded(q[0]),
        "scores": rounded((q @ keys.T)[0]),
        "weights": rounded(w),
        "output": rounded(out[0]),
        "entropy": round(entropy, 4),
    }


def kernel_regression(
    x_train: torch.Tensor, y_train: torch.Tensor, x: torch.Tensor, sigma: float
) -> torch.Tensor:
    """Nadaraya-Watson: f(x) = sum_i K(x - x_i) y_i / sum_j K(x - x_j), K(u) = exp(-u^2/2s^2),
    written as the formula: (N,) samples, (M,) queries -> (M,) estimates."""
    exponent = -((x[:, None] - x_train[None, :]) ** 2) / (2 * sigma**2)  # (M, N)
    # K(u) / K(u_min): the same ratios, without underflow to 0/0 for a narrow kernel
    kernel = torch.exp(exponent - exponent.amax(-1, keepdim=True))
    return (kernel @ y_train) / kernel.sum(-1)


def kernel_as_attention(
    x_train: torch.Tensor, y_train: torch.Tensor, x: torch.Tensor, sigma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same estimate as unscaled dot-product attention (Eq. 1 without 1/sqrt(d_k)):

        -(x - x_i)^2 / 2s^2 = x x_i / s^2 - x_i^2 / 2s^2 - x^2 / 2s^2

    The last term is the same for every key of a query, and softmax ignores a constant, so
    with the query q = (x / s^2, 1) and the key k_i = (x_i, -x_i^2 / 2s^2) the softmax of
    q . k_i is exactly the normalised Gaussian kernel, and the values are the samples y_i.
    Returns the (M,) estimates and the (M, N) attention weights."""
    q = torch.stack([x / sigma**2, torch.ones_like(x)], dim=-1)  # (M, 2)
    k = torch.stack([x_train, -(x_train**2) / (2 * sigma**2)], dim=-1)  # (N, 2)
    out, weights = scaled_dot_product_attention(
        q, k, y_train[:, None], scale=False, return_weights=True, backend="reference"
    )
    return out[:, 0], weights


def nadaraya_watson(
    sigma: float = 0.3, *, n: int = 40, noise: float = 0.3, seed: int = 0, query: float = 2.0
) -> dict[str, Any]:
    """Kernel regression of noisy samples of sin(x) on [0, 2 pi] at bandwidth ``sigma``, by
    the formula and as attention (``kernel_as_attention``): the curve, the fit's error
    against sin, the largest difference between the two computations, and the weights one
    query at ``query`` gives the samples.  A small sigma is a sharp softmax (the curve chases
    the noise); a large one a flat softmax (the curve flattens towards the mean)."""
    if not isinstance(sigma, int | float) or not 0.01 <= sigma <= 10.0:
        raise UserError(f"sigma={sigma!r} is out of range: expected a number in [0.01, 10]")
    gen = torch.Generator().manual_seed(seed)
    x_train = torch.sort(torch.rand(n, generator=gen, dtype=torch.float64) * 2 * math.pi).values
    y_train = torch.sin(x_train) + noise * torch.randn(n, generator=gen, dtype=torch.float64)
    grid = torch.linspace(0, 2 * math.pi, 100, dtype=torch.float64)
    formula = kernel_regression(x_train, y_train, grid, sigma)
    attention, _ = kernel_as_attention(x_train, y_train, grid, sigma)
    _, weights = kernel_as_attention(
        x_train, y_train, torch.tensor([query], dtype=torch.float64), sigma
    )
    w = weights[0]
    return {
        "sigma": sigma,
        "x_train": rounded(x_train),
        "y_train": rounded(y_train),
        "grid": rounded(grid),
        "estimate": rounded(attention),
        "truth": rounded(torch.sin(grid)),
        "mse_vs_truth": round(float(((attention - torch.sin(grid)) ** 2).mean()), 4),
        "max_difference_formula_vs_attention": float((formula - attention).abs().max()),
        "query": query,
        "query_weights": rounded(w),
        "query_entropy": round(float(-(w * w.clamp_min(1e-300).log()).sum()), 4),
    }


def positional_similarity(max_len: int, d_model: int, position: int) -> list[float]:
    """PE(position) . PE(p) for p = 0..max_len-1 (§3.5): peaks at ``position``, falls off with
    distance, and has the same shape wherever ``position`` is."""
    check_sizes(max_len, d_model)
    if not 0 <= position < max_len:
        raise UserError(f"position {position} is out of range 0..{max_len - 1}")
    table = sinusoidal_table(max_len, d_model)  # (P, C)
    return rounded(table @ table[position])
