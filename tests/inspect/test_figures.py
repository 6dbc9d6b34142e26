"""Figures: every PNG is a real picture (size, not blank) and the worked examples' numbers."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib import image as matplotlib_image

from aiayn.cli import main
from aiayn.inspect import figures, worked_examples
from aiayn.inspect.attention_maps import attention_maps

SMALL = {"n_layers": 2, "d_model": 32, "attention.n_heads": 4, "ffn.d_ff": 64}
SMALL_SET = [f"{k}={v}" for k, v in SMALL.items()]


def assert_picture(path: Path) -> None:
    assert path.is_file(), path
    img = matplotlib_image.imread(path)
    assert img.ndim == 3, img.shape
    assert img.shape[0] > 100 and img.shape[1] > 100, img.shape
    assert float(np.std(img[..., :3])) > 0.0, "the image is one flat colour"


# ----- attention maps ---------------------------------------------------------------------


def test_heatmap_grid_and_layers_render(tmp_path: Path) -> None:
    w = torch.softmax(torch.randn(2, 3, 5, 6, generator=torch.Generator().manual_seed(0)), -1)
    rows, cols = list("abcde"), ["x", " ", "\n", "$", "Ġy", "z"]
    assert_picture(figures.attention_heatmap(w[0, 0], rows, cols, tmp_path / "one.png"))
    assert_picture(figures.attention_grid(w[0], rows, cols, tmp_path / "grid.png"))
    assert_picture(figures.all_layers(list(w), rows, cols, tmp_path / "all.png"))
    avg = figures.all_layers(list(w), None, None, tmp_path / "avg.png", average_heads=True)
    assert_picture(avg)
    with pytest.raises(ValueError, match="3 labels for 5"):
        figures.attention_heatmap(w[0, 0], list("abc"), cols, tmp_path / "bad.png")


@pytest.mark.slow
def test_attention_maps_decoder_all_modes(tmp_path: Path) -> None:
    text = "the cat sat"
    all_ = attention_maps("gpt2-small", text, tmp_path, overrides=SMALL)
    grid = attention_maps("gpt2-small", text, tmp_path, layer=1, overrides=SMALL)
    one = attention_maps("gpt2-small", text, tmp_path, layer=0, head=3, overrides=SMALL)
    assert all_["self"].name == "self_all_layers.png"
    assert grid["self"].name == "self_layer1.png"
    assert one["self"].name == "self_layer0_head3.png"
    for paths in (all_, grid, one):
        assert_picture(paths["self"])


def test_attention_maps_encoder_decoder_has_cross(tmp_path: Path) -> None:
    out = attention_maps(
        "paper-base", "not good", tmp_path, target_text="nicht gut", layer=0, overrides=SMALL
    )
    assert set(out) == {"encoder", "decoder", "cross"}
    for path in out.values():
        assert_picture(path)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"layer": 2}, r"layer 2 is out of range.*2 layers \(0\.\.1\)"),
        ({"layer": -1}, r"layer -1 is out of range"),
        ({"layer": 0, "head": 4}, r"head 4 is out of range.*4 heads \(0\.\.3\)"),
        ({"head": 1}, r"head 1 needs a layer"),
    ],
)
def test_attention_maps_bad_layer_or_head(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        attention_maps("gpt2-small", "abc", tmp_path, overrides=SMALL, **kwargs)


def test_attention_maps_too_long_and_unknown_preset(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"12 tokens long.*max_len=8"):
        attention_maps("gpt2-small", "abcdefghijkl", tmp_path, overrides={**SMALL, "max_len": 8})
    with pytest.raises(ValueError, match="'no-such-model'.*presets: paper-base"):
        attention_maps("no-such-model", "abc", tmp_path)
    with pytest.raises(ValueError, match="too many to build"):
        attention_maps("llama3-70b", "abc", tmp_path)


# ----- positions --------------------------------------------------------------------------


def test_position_figures(tmp_path: Path) -> None:
    assert_picture(figures.positional_encoding_image(64, 32, tmp_path / "pe.png"))
    assert_picture(figures.positional_similarity(64, 32, 10, tmp_path / "sim.png"))
    assert_picture(figures.rope_relative_scores(32, 16, tmp_path / "rope.png"))
    with pytest.raises(ValueError, match="position 64 is out of range 0..63"):
        figures.positional_similarity(64, 32, 64, tmp_path / "x.png")


def test_rope_scores_depend_on_the_offset_only() -> None:
    offsets, scores = figures.rope_scores(32, 16, starts=(0, 7, 40))
    assert offsets.tolist() == list(range(-16, 17))
    # rotations of other angles, the same offset: fp32 rounding of sin/cos of angles up to ~40
    np.testing.assert_allclose(scores[1:], np.broadcast_to(scores[0], scores[1:].shape), atol=1e-4)
    assert scores.std() > 0.1  # and it does change with the offset (1000x the rounding above)


# ----- worked examples --------------------------------------------------------------------


def test_example_trophy(tmp_path: Path) -> None:
    path, n = worked_examples.example_trophy(tmp_path / "trophy.png")
    assert_picture(path)
    assert n["tokens"] == ["trophy", "large", "suitcase", "because"]
    np.testing.assert_allclose(
        n["scores"], [5.2, 0.0, -0.2, 0.0], atol=1e-5
    )  # fp32 of 1-decimal dot products
    np.testing.assert_allclose(n["weights"], [0.874, 0.043, 0.039, 0.043], atol=5e-4)  # 3 decimals
    assert n["weights_unscaled"][0] > n["weights"][0]  # no 1/sqrt(d): peakier


def test_example_not_good(tmp_path: Path) -> None:
    path, n = worked_examples.example_not_good(tmp_path / "ng.png")
    assert_picture(path)
    assert n["scores"] == [[0.0, 1.0], [1.0, 0.0]]
    # the figure's numbers, given to 2 decimals
    np.testing.assert_allclose(n["weights"], [[1.0, 0.0], [0.67, 0.33]], atol=0.01)
    np.testing.assert_allclose(n["output"], [[-2.0, 0.0], [-1.34, 0.66]], atol=0.01)


def test_example_scale_unscaled_softmax_saturates(tmp_path: Path) -> None:
    path, n = worked_examples.example_scale(tmp_path / "scale.png")
    assert_picture(path)
    assert n["d_k"][0] == 4 and n["d_k"][-1] == 1024
    # the claim, with margins: at d_k = 1024 the unscaled softmax is near one-hot (its entropy and
    # gradient a fraction of the scaled one's), the scaled one stays spread
    assert n["entropy_unscaled"][-1] < 0.1 * n["entropy_scaled"][-1]
    assert n["grad_unscaled"][-1] < 0.3 * n["grad_scaled"][-1]
    assert min(n["entropy_scaled"]) > 0.5 * n["max_entropy"]  # the scale keeps it spread


def test_example_paths(tmp_path: Path) -> None:
    path, n = worked_examples.example_paths(tmp_path / "paths.png")
    assert_picture(path)
    assert n["steps"][-1] == 50
    # float64 products of 50 factors: 50 roundings of 2^-53 each
    assert math.isclose(n["recurrent_0.9"][-1], 0.9**50, rel_tol=1e-9)  # about 0.0052
    assert math.isclose(n["recurrent_1.1"][-1], 1.1**50, rel_tol=1e-9)  # about 117
    assert min(n["attention"]) > 0.99  # one step, whatever the distance (the example's sharp keys)


# ----- the command line -------------------------------------------------------------------


def test_cli_inspect_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path)
    assert main(["inspect", "example", "trophy", "--out", out]) == 0
    assert "0.8744" in capsys.readouterr().out
    assert_picture(tmp_path / "example_trophy.png")
    assert main(["inspect", "positions", "--out", out, "--max-len", "32", "--d-model", "16"]) == 0
    for name in ("positional_encoding", "positional_similarity", "rope_relative"):
        assert_picture(tmp_path / f"{name}.png")
    args = ["inspect", "attention", "--preset", "gpt2-small", "--text", "hello", "--out", out]
    assert main([*args, "--layer", "1", "--set", *SMALL_SET]) == 0
    assert_picture(tmp_path / "self_layer1.png")
    assert main([*args, "--layer", "7", "--set", *SMALL_SET]) == 2
    assert "layer 7 is out of range" in capsys.readouterr().err


def test_attention_maps_from_checkpoints(tmp_path: Path) -> None:
    """A saved char-level decoder, and a BPE encoder-decoder (source + </s>, <s> + target)."""
    import aiayn
    from aiayn.checkpoint import TOKENIZER_FILE
    from aiayn.data.tokenizer import BPETokenizer, CharTokenizer

    char = CharTokenizer.from_text("abc de")
    lm = aiayn.build_model("gpt2-small", **SMALL, vocab_size=char.vocab_size, max_len=16)
    aiayn.save(lm, tmp_path / "lm")
    char.save(tmp_path / "lm" / TOKENIZER_FILE)
    out = attention_maps(tmp_path / "lm", "cab ed", tmp_path / "lm_maps", layer=0, head=1)
    assert_picture(out["self"])
    with pytest.raises(ValueError, match="overrides apply to a preset"):
        attention_maps(tmp_path / "lm", "cab", tmp_path, overrides={"n_layers": 1})

    bpe = BPETokenizer.from_text("ein hund läuft\na dog runs\n" * 20, vocab_size=300)
    mt = aiayn.build_model("paper-base", **SMALL, vocab_size=bpe.vocab_size, max_len=32)
    aiayn.save(mt, tmp_path / "mt")
    bpe.save(tmp_path / "mt" / TOKENIZER_FILE)
    out = attention_maps(tmp_path / "mt", "ein hund", tmp_path / "mt_maps", target_text="a dog")
    assert set(out) == {"encoder", "decoder", "cross"}
    for path in out.values():
        assert_picture(path)


def test_example_nadaraya_watson(tmp_path: Path) -> None:
    path, numbers = worked_examples.example_nadaraya_watson(tmp_path / "nw.png")
    assert path.stat().st_size > 20_000
    assert numbers["max_difference_formula_vs_attention"] < 1e-9  # float64, two sum orders
    assert numbers["query_entropy"] == sorted(numbers["query_entropy"])  # wider = flatter
