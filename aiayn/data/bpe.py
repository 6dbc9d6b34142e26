"""Byte-pair encoding (Sennrich et al., 2016), the paper's shared source/target vocabulary
(§5.1), trained with Hugging Face ``tokenizers``.

A byte-level pre-tokenizer makes every input encodable (no unknown token) and decoding exact.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from aiayn.errors import UserError

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
PAD, BOS, EOS, UNK = range(4)


def train_bpe(lines: Iterable[str], vocab_size: int = 8000, min_frequency: int = 2) -> Tokenizer:
    """A byte-level BPE tokenizer with ``<pad>``=0, ``<s>``=1, ``</s>``=2, ``<unk>``=3."""
    if vocab_size < len(SPECIAL_TOKENS) + 256:
        raise UserError(f"vocab_size={vocab_size} is too small: byte-level BPE needs >= 260")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer)
    return tok
