"""The teaching views compute Eq. (1) and §3.5 exactly, and show what the lessons claim."""

import math

import pytest
import torch

from aiayn.inspect.teaching import (
    PRONOUN,
    SENTENCE,
    positional_similarity,
    query_walkthrough,
    soft_lookup,
)
from aiayn.nn.positions import sinusoidal_table


def test_the_pronoun_finds_the_living_noun():
    r = query_walkthrough()
    assert r["query_token"] == "it" and r["query_index"] == PRONOUN
    weights = r["weights"]
    assert r["tokens"][max(range(len(weights)), key=weights.__getitem__)] == "cat"
    # rounded() keeps 4 decimals: 1e-4 is one unit of the last; 10 weights lose <= 10 x 5e-5
    assert weights[1] == pytest.approx(0.5072, abs=1e-4)  # about half lands on "cat"
    assert sum(weights) == pytest.approx(1.0, abs=1e-3)  # 2 x (10 x 5e-5); seen 3e-4
    # every step by hand: q.k, / sqrt(4), softmax, weighted sum of the values
    q = torch.tensor(r["query"])
    keys = torch.tensor([k for _, k, _ in SENTENCE], dtype=torch.float32)
    scores = keys @ q
    # r's values are rounded to 4 decimals (<= 5e-5 off): 1e-4 is twice that; seen <= 4.7e-5
    assert r["scores"] == pytest.approx(scores.tolist(), abs=1e-4)
    assert r["scaled"] == pytest.approx((scores / 2).tolist(), abs=1e-4)
    expected = torch.softmax(scores / 2, -1)
    assert weights == pytest.approx(expected.tolist(), abs=1e-4)
    assert r["output"] == pytest.approx((expected @ keys).tolist(), abs=1e-4)
    assert r["output"][r["features"].index("animate")] > 0.5  # "it" now carries "animate" (0.55)


def test_without_the_scale_every_row_is_peakier():
    scaled, raw = query_walkthrough(scale=True), query_walkthrough(scale=False)
    assert raw["divisor"] == 1 and scaled["divisor"] == 2
    assert max(raw["weights"]) > max(scaled["weights"])
    with pytest.raises(ValueError, match="out of range"):
        query_walkthrough(len(SENTENCE))


def test_soft_lookup_blends_and_sharpens():
    # rounded to 4 decimals (<= 5e-5 off), each side rounded on its own: 1e-4; seen <= 4.8e-5
    assert soft_lookup(0.5, 3.0)["weights"] == pytest.approx([0.5, 0.5], abs=1e-4)
    r = soft_lookup(0.3, 1.0)
    w = r["weights"]
    assert w[0] > w[1] > 0 and r["output"] == pytest.approx(w, abs=1e-4)  # values are one-hot
    angle = 0.3 * math.pi / 2
    assert w[0] == pytest.approx(1 / (1 + math.exp(math.sin(angle) - math.cos(angle))), abs=1e-4)
    entropies = [soft_lookup(0.3, length)["entropy"] for length in (0.5, 1, 3, 8)]
    assert entropies == sorted(entropies, reverse=True)  # longer query, sharper softmax
    assert soft_lookup(0.3, 8.0)["weights"][0] > 0.95  # 1 / (1 + e^(8 (sin - cos))) ~ 0.971
    with pytest.raises(ValueError, match="between"):
        soft_lookup(1.5, 1.0)


def test_positional_similarity_peaks_and_slides():
    a = positional_similarity(100, 128, 20)
    b = positional_similarity(100, 128, 50)
    # fp32 angles up to 100 rad (~6e-6 off each): 128 terms, ~8e-4 at worst, + 4-decimal rounding
    assert max(range(100), key=a.__getitem__) == 20 and a[20] == pytest.approx(64.0, abs=1e-3)
    assert a[20 + 7] == pytest.approx(b[50 + 7], abs=1e-3)  # depends on the offset only
    assert a[20 - 5] == pytest.approx(b[50 - 5], abs=1e-3)
    table = sinusoidal_table(100, 128)
    assert a == pytest.approx((table @ table[20]).tolist(), abs=1e-3)
    with pytest.raises(ValueError, match="out of range"):
        positional_similarity(100, 128, 100)


# ----- Nadaraya-Watson --------------------------------------------------------------------


def _kernel_by_hand(xs: list[float], ys: list[float], x: float, sigma: float) -> float:
    k = [math.exp(-((x - xi) ** 2) / (2 * sigma**2)) for xi in xs]
    return sum(ki * yi for ki, yi in zip(k, ys, strict=True)) / sum(k)


@pytest.mark.parametrize("sigma", [0.05, 0.3, 1.0, 3.0])
def test_kernel_regression_is_unscaled_dot_product_attention(sigma: float) -> None:
    from aiayn.inspect.teaching import kernel_as_attention, nadaraya_watson

    r = nadaraya_watson(sigma)
    # float64 (eps 2.2e-16) both ways, values O(1): 1e-9 is loose; seen <= 1.8e-13
    assert r["max_difference_formula_vs_attention"] < 1e-9
    xs, ys = r["x_train"], r["y_train"]  # (rounded to 4 digits: the check uses them as given)
    x = torch.tensor(xs, dtype=torch.float64)
    y = torch.tensor(ys, dtype=torch.float64)
    out, weights = kernel_as_attention(x, y, torch.tensor([1.0, 4.0], dtype=torch.float64), sigma)
    for i, q in enumerate((1.0, 4.0)):
        # float64 in Python and in torch: seen 2.6e-15 relative (~12 ulps); 1e-9 is loose
        assert float(out[i]) == pytest.approx(_kernel_by_hand(xs, ys, q, sigma), rel=1e-9)
    assert torch.allclose(weights.sum(-1), torch.ones(2, dtype=torch.float64))


def test_the_bandwidth_is_the_sharpness() -> None:
    """A wide kernel flattens towards the mean of the samples (a flat softmax); a narrow one
    puts nearly all weight on the nearest sample (a one-hot softmax)."""
    from aiayn.inspect.teaching import nadaraya_watson

    wide, narrow = nadaraya_watson(10.0), nadaraya_watson(0.01)
    mean = sum(wide["y_train"]) / len(wide["y_train"])
    assert max(abs(e - mean) for e in wide["estimate"]) < 0.15  # measured 0.031: ~5x margin
    assert max(narrow["query_weights"]) > 0.99  # measured 1.0 (to 4 decimals)
    entropies = [nadaraya_watson(s)["query_entropy"] for s in (0.05, 0.3, 1.0, 3.0)]
    assert entropies == sorted(entropies)
    with pytest.raises(ValueError, match="sigma=0 is out of range"):
        nadaraya_watson(0)


def test_a_narrow_kernel_stays_finite() -> None:
    from aiayn.inspect.teaching import nadaraya_watson

    r = nadaraya_watson(0.01)  # exp(-(x - x_i)^2 / 2s^2) underflows for every sample
    assert r["max_difference_formula_vs_attention"] < 1e-9  # float64 as above; seen 2.5e-12
    assert all(math.isfinite(e) for e in r["estimate"])
