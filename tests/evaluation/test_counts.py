"""Counts that make no sense are named, not a ZeroDivisionError or a range() error."""

from __future__ import annotations

import pytest
import torch

import aiayn
from aiayn.data.tokenizer import BPETokenizer
from aiayn.evaluation.perplexity import evaluate_lm
from aiayn.generate.translate import translate


def test_evaluating_no_batches_is_an_error() -> None:
    torch.manual_seed(0)
    m = aiayn.build_model(
        "gpt2-small",
        n_layers=1,
        d_model=32,
        attention={"n_heads": 4},
        ffn={"d_ff": 64},
        vocab_size=16,
        max_len=16,
        dropout=0.0,
    )
    with pytest.raises(ValueError, match="batches=0: evaluate at least 1 batch"):
        evaluate_lm(m, None, batches=0, batch_size=2, block=8)  # type: ignore[arg-type]


def test_translating_in_batches_of_none_is_an_error() -> None:
    lines = ["ein hund läuft", "zwei katzen schlafen"]
    tok = BPETokenizer.from_lines(lines * 4, vocab_size=300)
    torch.manual_seed(0)
    m = aiayn.build_model(
        "paper-base",
        n_layers=1,
        d_model=32,
        attention={"n_heads": 4},
        ffn={"d_ff": 64},
        vocab_size=tok.vocab_size,
        max_len=32,
        dropout=0.0,
    )
    with pytest.raises(ValueError, match="batch_size=0: translate at least 1 line"):
        translate(m, tok, lines, batch_size=0)  # type: ignore[arg-type]
