"""Small, fully readable attention computations for teaching (the explorer's lessons).

Every number comes from the library's own functions -- :func:`scaled_dot_product_attention`,
:func:`sinusoidal_table` -- so what a reader sees in the browser is what the model computes.

* :func:`query_walkthrough`: one query on a ten-word sentence whose query/key/value vectors are
  set by hand in four named feature dimensions, step by step: score -> scale by sqrt(d) ->
  softmax -> mix values (Eq. 1).  The pronoun "it" asks for a living noun and finds "cat".
* :func:`soft_lookup`: attention as a dictionary lookup with partial matches: a query between
  two keys returns a blend of their values, and a longer query sharpens the softmax.
* :func:`positional_similarity`: PE(p) . PE(q) over all q for one p (§3.5).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

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
        raise ValueError(f"need max_len >= 2 and d_model >= 2, got {max_len} and {d_model}")


def query_walkthrough(query: int = PRONOUN, *, scale: bool = True) -> dict[str, Any]:
    """The four steps of Eq. (1) for one query token of :data:`SENTENCE`.

    Returns the tokens, feature names, every key (= value) vector, the query, and each step:
    ``scores`` q.k, ``scaled`` q.k / sqrt(d) (or unscaled when ``scale`` is False),
    ``weights`` softmax of those, and ``output`` the weighted sum of the values -- the last two
    straight from :func:`scaled_dot_product_attention`.
    """
    n = len(SENTENCE)
    if isinstance(query, bool) or not isinstance(query, int) or not 0 <= query < n:
        raise ValueError(
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
            raise ValueError(
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


def positional_similarity(max_len: int, d_model: int, position: int) -> list[float]:
    """PE(position) . PE(p) for p = 0..max_len-1 (§3.5): peaks at ``position``, falls off with
    distance, and has the same shape wherever ``position`` is."""
    check_sizes(max_len, d_model)
    if not 0 <= position < max_len:
        raise ValueError(f"position {position} is out of range 0..{max_len - 1}")
    table = sinusoidal_table(max_len, d_model)  # (P, C)
    return rounded(table @ table[position])
