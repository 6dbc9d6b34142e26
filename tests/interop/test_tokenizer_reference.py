"""aiayn's tokenizers against code that does not share their implementation.

aiayn's BPE tokenizer and its ``tokenizer.json`` path run HF ``tokenizers``, and so does HF's
fast tokenizer: comparing the two compares a library with itself.  Here the references are
independent: a pure-Python byte-level BPE written below (GPT-2's algorithm), transformers'
pure-Python BERT tokenizer, the ``sentencepiece`` library on the ``tokenizer.model`` itself,
and hand-tokenised strings; on texts with accents, CJK, emoji, digits and leading spaces.
"""

from __future__ import annotations

import json
import math
import os
from itertools import pairwise
from pathlib import Path

import pytest
import regex
import sentencepiece as spm
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import transformers

from aiayn.data.tokenizer import BPETokenizer, load_tokenizer
from aiayn.interop.hf_tokenizer import load_hf_tokenizer

TEXTS = [
    "Ein Hund läuft über die Wiese.",
    "Crème brûlée à Noël, garçon!",
    "HELLO Wörld, ÉCOLE",
    "e\u0301 (combining) vs é",
    "東京は日本の首都です。",
    "中文 text 混合",
    "I ❤️ 🐕 and 🍕!",
    "In 2024 we paid 1,234.56 € for 3 items.",
    "  two leading spaces",
    " one leading space",
    "trailing space ",
    "tabs\tand\nnew lines",
    "",
]
CORPUS = [t for t in TEXTS if t] * 20


# ----- byte-level BPE (GPT-2, Qwen2; aiayn's own) -------------------------------------------


def byte_symbols() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte: the printable Latin-1 bytes stand for
    themselves, the other 68 for chr(256), chr(257), ... in byte order."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in keep}
    for n, b in enumerate(b for b in range(256) if b not in table):
        table[b] = chr(256 + n)
    return table


BYTES = byte_symbols()
GPT2_SPLIT = regex.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)


def reference_bpe(vocab: dict[str, int], merges: list[tuple[str, str]], text: str) -> list[int]:
    """GPT-2's encoder: split by its pattern, each chunk's UTF-8 bytes as symbols, then the
    lowest-ranked adjacent pair merged until none is in ``merges``."""
    rank = {pair: i for i, pair in enumerate(merges)}
    ids: list[int] = []
    for chunk in GPT2_SPLIT.findall(text):
        symbols = [BYTES[b] for b in chunk.encode()]
        while len(symbols) > 1:
            best, i = min((rank.get(p, math.inf), i) for i, p in enumerate(pairwise(symbols)))
            if best == math.inf:
                break
            symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
        ids += [vocab[s] for s in symbols]
    return ids


def reference_bytes_decode(vocab: dict[str, int], ids: list[int]) -> str:
    """ids -> symbols -> bytes -> UTF-8."""
    symbol = {i: s for s, i in vocab.items()}
    byte = {c: b for b, c in BYTES.items()}
    return bytes(byte[c] for i in ids for c in symbol[i]).decode()


def vocab_and_merges(tok: Tokenizer) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The BPE model's vocabulary and ranked merges, read from its JSON."""
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return model["vocab"], merges  # type: ignore[return-value]


def bpe_by_path(path: str, tmp_path: Path) -> BPETokenizer:
    """aiayn's byte-level BPE trained on CORPUS, as ``path`` reaches it: saved and loaded as
    an aiayn tokenizer, or as a GPT-2 folder's ``tokenizer.json`` read by load_hf_tokenizer."""
    trained = BPETokenizer.from_lines(CORPUS, vocab_size=400)
    if path == "aiayn":
        trained.save(tmp_path / "tok.json")
        loaded = load_tokenizer(tmp_path / "tok.json")
        assert isinstance(loaded, BPETokenizer)
        return loaded
    trained.tok.save(str(tmp_path / "tokenizer.json"))
    loaded = load_hf_tokenizer(tmp_path)
    assert isinstance(loaded, BPETokenizer)
    return loaded


@pytest.mark.parametrize("path", ["aiayn", "hf-folder"])
def test_byte_level_bpe_equals_a_python_gpt2_bpe(path: str, tmp_path: Path) -> None:
    ours = bpe_by_path(path, tmp_path)
    vocab, merges = vocab_and_merges(ours.tok)
    assert len(merges) > 100  # a real merge table, not bytes alone
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == reference_bpe(vocab, merges, text), text
        assert ours.decode(ids) == reference_bytes_decode(vocab, ids) == text


def hand_bpe(tmp_path: Path) -> BPETokenizer:
    """A GPT-2-style tokenizer.json over the 256 byte symbols and four merges."""
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ã", "©")]
    vocab = {s: i for i, s in enumerate(BYTES.values())}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(tmp_path / "tokenizer.json"))
    loaded = load_hf_tokenizer(tmp_path)
    assert isinstance(loaded, BPETokenizer)
    return loaded


@pytest.mark.parametrize(
    ("text", "pieces"),
    [
        (" the", ["Ġthe"]),
        ("  the", ["Ġ", "Ġthe"]),  # the first space alone: GPT-2's \s+(?!\S)
        ("the thé", ["t", "he", "Ġt", "h", "Ã©"]),  # é is bytes C3 A9
        ("2024 x", ["2", "0", "2", "4", "Ġ", "x"]),
        (" 🐕", ["Ġ", "ð", "Ł", "Ĳ", "ķ"]),  # F0 9F 90 95
        ("東", ["æ", "Ŀ", "±"]),  # E6 9D B1
    ],
)
def test_byte_level_bpe_hand_tokenised(text: str, pieces: list[str], tmp_path: Path) -> None:
    ours = hand_bpe(tmp_path)
    ids = ours.encode(text)
    assert [ours.tok.id_to_token(i) for i in ids] == pieces
    assert ours.decode(ids) == text


# ----- WordPiece (BERT) ---------------------------------------------------------------------

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def bert_pipeline(tok: Tokenizer) -> Tokenizer:
    """BERT's uncased normaliser and pre-tokeniser, [CLS] ... [SEP], WordPiece decoder."""
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    return tok


def with_cls_sep(tok: Tokenizer) -> Tokenizer:
    """``tok`` with BERT's post-processor: [CLS] text [SEP]."""
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return tok


def python_bert(vocab: dict[str, int], folder: Path) -> object:
    """transformers' pure-Python BERT tokenizer (BasicTokenizer + WordpieceTokenizer), uncased,
    over ``vocab`` written as vocab.txt.  transformers 5 keeps it as BertTokenizerLegacy; in 4
    BertTokenizer is that class."""
    try:
        from transformers.models.bert.tokenization_bert_legacy import (
            BertTokenizerLegacy as Slow,
        )
    except ImportError:  # transformers 4
        Slow = transformers.BertTokenizer
    backends = [c.__module__ for c in Slow.__mro__]
    assert not any(m.endswith(("_fast", "_tokenizers")) for m in backends), backends  # Python's
    words = sorted(vocab, key=vocab.__getitem__)
    assert [vocab[w] for w in words] == list(range(len(words)))
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")
    return Slow(str(folder / "vocab.txt"), do_lower_case=True)


def test_wordpiece_equals_pythons_bert_tokenizer(tmp_path: Path) -> None:
    tok = bert_pipeline(Tokenizer(models.WordPiece(unk_token="[UNK]")))
    tok.train_from_iterator(
        CORPUS,
        trainers.WordPieceTrainer(vocab_size=200, special_tokens=SPECIAL, show_progress=False),
    )
    with_cls_sep(tok).save(str(tmp_path / "tokenizer.json"))
    ours = load_hf_tokenizer(tmp_path)
    theirs = python_bert(tok.get_vocab(), tmp_path)
    unknown = tok.token_to_id("[UNK]")
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == theirs.encode(text), text  # type: ignore[attr-defined]
        assert unknown not in ids, text  # the vocabulary covers TEXTS: real pieces compared
    for text in ["Ünknown wörds: Zebra 🦓", "Zebra"]:  # Z and 🦓 are in no text: [UNK]
        ids = ours.encode(text)
        assert ids == theirs.encode(text) and unknown in ids, text  # type: ignore[attr-defined]


def test_wordpiece_hand_tokenised(tmp_path: Path) -> None:
    words = [
        *SPECIAL,
        "ein",
        "hund",
        "lauft",
        "uber",
        "die",
        "wiese",
        ".",
        "cafe",
        "run",
        "##s",
        "1",
        "##2",
        "##3",
        "!",
        "東",
        "京",
        "は",
    ]
    tok = bert_pipeline(
        Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    )
    with_cls_sep(tok).save(str(tmp_path / "tokenizer.json"))
    ours = load_hf_tokenizer(tmp_path)
    cases = {
        "  Ein HUND läuft über die Wiese.": [
            "[CLS]",
            "ein",
            "hund",
            "lauft",
            "uber",
            "die",
            "wiese",
            ".",
            "[SEP]",
        ],
        "Café 123 東京は!": ["[CLS]", "cafe", "1", "##2", "##3", "東", "京", "は", "!", "[SEP]"],
        "runs 🐕 e\u0301": ["[CLS]", "run", "##s", "[UNK]", "[UNK]", "[SEP]"],
    }
    for text, pieces in cases.items():
        assert [words[i] for i in ours.encode(text)] == pieces, text


# ----- SentencePiece (Llama, Mistral: a folder with only tokenizer.model) ------------------


LLAMA_LIKE = {
    "normalization_rule_name": "identity",
    "remove_extra_whitespaces": False,
    "byte_fallback": True,
    "vocab_size": 400,
}
NFKC_UNK = {"normalization_rule_name": "nmt_nfkc", "byte_fallback": False, "vocab_size": 300}


@pytest.mark.parametrize("options", [LLAMA_LIKE, NFKC_UNK], ids=["llama-like", "nfkc-unk"])
def test_a_sentencepiece_model_alone_encodes_as_sentencepiece(
    options: dict, tmp_path: Path
) -> None:
    """The ids of HF's converted tokenizer equal ``SentencePieceProcessor.encode`` on the same
    .model (BOS first, as ``add_bos_token`` asks): the dummy prefix before a leading space,
    the model's normaliser (NFKC, extra spaces) or none, digits split one by one, characters
    the vocabulary lacks as bytes or as <unk> (never dropped); ids -> text too."""
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS),
        model_prefix=str(tmp_path / "tokenizer"),
        model_type="bpe",
        bos_id=1,
        eos_id=2,
        unk_id=0,
        pad_id=-1,
        character_coverage=1.0,
        split_digits=True,
        minloglevel=2,
        **options,
    )
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "LlamaTokenizer", "add_bos_token": True})
    )
    ours = load_hf_tokenizer(tmp_path)
    theirs = spm.SentencePieceProcessor(model_file=str(tmp_path / "tokenizer.model"))
    unseen = "Zebra 🦓 ＡＢＣ１２"  # Z and 🦓 are in no CORPUS text
    assert (0 in theirs.encode(unseen)) != options["byte_fallback"]  # <unk> only without bytes
    for text in [*TEXTS, unseen, "   ", "Hund  und   Katze 5 7"]:
        ids = ours.encode(text)
        assert ids == theirs.encode(text, add_bos=True), (text, theirs.encode(text, out_type=str))
        if 0 not in ids:  # (<unk> is written " ⁇ " by SentencePiece, "<unk>" by HF)
            assert ours.decode(ids[1:]) == theirs.decode(ids[1:]), text
