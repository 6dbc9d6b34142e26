"""The flat decoding step equals the module path, logit for logit."""

import pytest
import torch

from aiayn.config import get_preset
from aiayn.generate.decode_step import FlatDecoder
from aiayn.models import build_model
from aiayn.nn.linear import packed_for_inference

VARIANTS = {
    "gpt2": ("gpt2-small", {}),
    "gpt2-nobias": ("gpt2-small", {"bias": False}),
    "llama-gqa": ("llama-style-small", {"n_kv_heads": 2}),
    "post-ln-sinusoidal-relu": (
        "gpt2-small",
        {"norm_position": "post", "positional": "sinusoidal", "activation": "relu"},
    ),
}


def small(name: str):
    preset, extra = VARIANTS[name]
    torch.manual_seed(0)
    fields = dict(n_layers=3, d_model=32, n_heads=4, d_ff=64, vocab_size=40, max_len=48)
    return build_model(get_preset(preset, **fields, dropout=0.0, **extra)).eval()


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("padded", [False, True])
def test_flat_step_equals_the_module_path(name, rows, padded):
    model = small(name)
    prompt = torch.randint(1, 40, (rows, 6))
    mask = None
    if padded and rows > 1:  # left padding: rows start 0, 2, 4 tokens late
        mask = torch.ones_like(prompt, dtype=torch.bool)
        for i in range(rows):
            mask[i, : 2 * i] = False
    with torch.no_grad(), packed_for_inference(model, rows=rows):
        caches = [model.new_cache(rows, 20), model.new_cache(rows, 20)]
        for cache in caches:
            model(prompt, attention_mask=mask, cache=cache)
        flat = FlatDecoder(model, rows)
        tokens = torch.randint(1, 40, (8, rows, 1))
        for tok in tokens:
            expected = model(tok, cache=caches[0])[:, -1]
            got = flat.step(tok, caches[1])
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert caches[1].length == caches[0].length == 14


def test_unsupported_models_are_named():
    model = small("gpt2")
    assert FlatDecoder.unsupported(model) is None
    windowed = build_model(
        get_preset(
            "gpt2-small",
            n_layers=1,
            d_model=32,
            n_heads=4,
            d_ff=64,
            vocab_size=40,
            max_len=48,
            sliding_window=8,
        )
    ).eval()
    assert "sliding window" in FlatDecoder.unsupported(windowed)
    with pytest.raises(ValueError, match="training mode"):
        FlatDecoder(model.train(), 1)
    flat = FlatDecoder(model.eval(), 2)
    with pytest.raises(ValueError, match=r"\(2, 1\) ids"):
        flat.step(torch.zeros(1, 1, dtype=torch.long), model.new_cache(1, 4))
