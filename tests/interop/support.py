"""What the Hugging Face interop tests share: weights moved off HF's initial values (so that a
swapped or dropped norm, bias or embedding changes the output), state dicts compared name by
name (not paired by position), and a small BERT config and WordPiece tokenizer."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TypeVar

import torch
import transformers

M = TypeVar("M", bound=torch.nn.Module)
VOCAB = 97  # the small BERT's vocabulary


def perturb(model: M, names: Iterable[str]) -> M:
    """``model`` with every bias and every parameter whose name holds one of ``names`` (norms,
    embeddings) moved by 0.1 N(0, 1), in place.  HF initialises norms to (1, 0) and biases to
    0: left so, two swapped norms or a dropped bias convert to the same output."""
    parts = tuple(names)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or any(part in name for part in parts):
                p.add_(0.1 * torch.randn_like(p))
    return model


def perturbed_seq2seq(model: M) -> M:
    """An HF seq2seq model (Marian, BART) with its norms and biases moved as :func:`perturb`
    moves them, and its final logits' bias (a buffer, 0 at first) drawn from N(0, 1)."""
    perturb(model, ("norm",))
    with torch.no_grad():
        model.final_logits_bias.normal_()  # type: ignore[operator]
    return model


def assert_same_state(
    got: Mapping[str, torch.Tensor], want: Mapping[str, torch.Tensor], what: str = "state"
) -> None:
    """The same names, and under each name an equal tensor (dtype and shape included)."""
    missing, extra = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
    assert not missing and not extra, f"{what}: missing {missing}, unexpected {extra}"
    differ = [_difference(n, got[n], want[n]) for n in want]
    differ = [d for d in differ if d]
    assert not differ, f"{what}: {len(differ)} of {len(want)} tensors differ: {differ[:6]}"


def _difference(name: str, got: torch.Tensor, want: torch.Tensor) -> str:
    """'' when equal; else the name and how the two differ (torch.equal ignores dtype)."""
    if got.dtype != want.dtype:
        return f"{name}: dtype {got.dtype} != {want.dtype}"
    if got.shape != want.shape:
        return f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    return "" if torch.equal(got, want) else f"{name}: values"


def bert_config(**overrides: object) -> object:
    kwargs: dict = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=96,
        max_position_embeddings=40,
        type_vocab_size=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=0,
    )
    kwargs.update(overrides)
    return transformers.BertConfig(**kwargs)


def wordpiece(folder: Path) -> None:
    """A small WordPiece tokenizer (BERT's kind) trained here, saved as tokenizer.json with
    BERT's normaliser, pre-tokeniser and [CLS] ... [SEP] post-processor."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    text = [
        "Ein Hund läuft über die Wiese.",
        "A dog runs across the meadow.",
        "Le chien court dans le pré.",
        "Zwei Männer spielen Fußball im Park.",
    ] * 20
    tok.train_from_iterator(
        text, trainers.WordPieceTrainer(vocab_size=VOCAB, special_tokens=special)
    )
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    tok.save(str(folder / "tokenizer.json"))
