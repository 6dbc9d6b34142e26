"""``aiayn.registry``: a part registered from one's own code is what a model then runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import aiayn
from aiayn import registry
from aiayn.errors import ConfigError
from aiayn.nn.attention import backend


@pytest.fixture
def counting_backend() -> Iterator[list[int]]:
    """The reference backend under a new name, counting its calls."""
    calls: list[int] = []
    reference = backend("reference")

    def counting(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return reference(*args, **kwargs)

    registry.register("attention_backend", "counting", counting)
    yield calls
    del registry.REGISTRY["attention_backend"]["counting"]


def test_a_registered_attention_backend_runs_in_a_model(counting_backend: list[int]) -> None:
    small = {"n_layers": 2, "d_model": 32, "vocab_size": 50, "max_len": 16, "dropout": 0.0}
    torch.manual_seed(0)
    ours = aiayn.build_model(
        "gpt2-small", attention={"backend": "counting", "n_heads": 4}, **small
    ).eval()
    torch.manual_seed(0)
    ref = aiayn.build_model(
        "gpt2-small", attention={"backend": "reference", "n_heads": 4}, **small
    ).eval()
    ids = torch.randint(0, 50, (2, 7))
    # the same function on the same weights: bit for bit
    torch.testing.assert_close(ours(ids), ref(ids), atol=0, rtol=0)
    assert len(counting_backend) == 2  # once per layer


def test_an_unknown_part_or_kind_is_named() -> None:
    with pytest.raises(ConfigError, match="AttentionConfig.backend='nope'"):
        aiayn.build_model("gpt2-small", attention={"backend": "nope"})
    with pytest.raises(ConfigError, match="unknown kind of part 'mixer'"):
        registry.register("mixer", "x", object())
