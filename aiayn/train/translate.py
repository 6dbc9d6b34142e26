"""Training the encoder-decoder on parallel text: the paper's recipe (§5), on the shared loop.

Token-count batches (§5.1), label-smoothed cross entropy (ε = 0.1, §5.4), Adam with
β1 = 0.9, β2 = 0.98, ε = 1e-9 and the warm-up schedule of Eq. (3) (§5.3), dropout 0.1 --
all set in the TOML config (configs/multi30k_de_en.toml).  A shared byte-level BPE vocabulary
(§5.1) is trained on both sides of the training data and saved with every checkpoint.

Shapes: B sentences, S source length, T target length, V vocabulary.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from aiayn.data.batching import pad, padding_fraction, token_batches
from aiayn.data.bpe import BOS, EOS, PAD
from aiayn.data.parallel import Pair, multi30k, read_parallel
from aiayn.data.tokenizer import BPETokenizer, Tokenizer
from aiayn.evaluate.perplexity import translation_loss
from aiayn.models import EncoderDecoder, TransformerModel, build_model
from aiayn.nn.context import Record
from aiayn.train.config import RunConfig
from aiayn.train.loop import FitResult, train_run

Example = tuple[list[int], list[int]]  # source ids + EOS; BOS + target ids + EOS


def encode_pairs(pairs: list[Pair], tokenizer: BPETokenizer) -> list[Example]:
    return [
        ([*tokenizer.encode(p.source), EOS], [BOS, *tokenizer.encode(p.target), EOS]) for p in pairs
    ]


def load_pairs(run: RunConfig, data_root: Path, split: str) -> list[Pair]:
    d = run.data
    if split == "train" and d.train_source and d.train_target:
        return read_parallel(data_root / d.train_source, data_root / d.train_target)
    if split == "val" and d.valid_source and d.valid_target:
        return read_parallel(data_root / d.valid_source, data_root / d.valid_target)
    return multi30k(data_root / "multi30k", split, d.source_lang, d.target_lang)


def collate(examples: list[Example]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, S) source, (B, T) decoder input (BOS ...), (B, T) decoder target (... EOS)."""
    src = pad([e[0] for e in examples], PAD)
    tgt = pad([e[1] for e in examples], PAD)
    return src, tgt[:, :-1], tgt[:, 1:]


class TranslationTask:
    """Epochs of shuffled token-count batches; the data position is (epoch, batch index)."""

    @property
    def linear_rows(self) -> int:
        # every batch has its own (B, S) and (B, T), of about max_tokens rows each
        return self.max_tokens

    def __init__(
        self,
        train: list[Example],
        valid: list[Example],
        *,
        max_tokens: int,
        label_smoothing: float,
        seed: int,
    ) -> None:
        if not train:
            raise ValueError("no training pairs")
        if not valid:
            raise ValueError("no validation pairs")
        self.train, self.valid = train, valid
        self.lengths = [(len(s), len(t) - 1) for s, t in train]
        self.max_tokens, self.label_smoothing, self.seed = max_tokens, label_smoothing, seed
        self.epoch, self.index = 0, 0
        self.batches = token_batches(self.lengths, max_tokens, seed=seed, epoch=0)
        valid_lengths = [(len(s), len(t) - 1) for s, t in valid]
        self.valid_batches = (
            token_batches(valid_lengths, max_tokens, shuffle=False) if valid else []
        )

    def _next(self) -> list[int]:
        if self.index >= len(self.batches):
            self.epoch, self.index = self.epoch + 1, 0
            self.batches = token_batches(
                self.lengths, self.max_tokens, seed=self.seed, epoch=self.epoch
            )
        self.index += 1
        return self.batches[self.index - 1]

    def next_batches(self, n: int, rank: int, world: int) -> list[Any]:
        every = [self._next() for _ in range(n * world)]
        return [collate([self.train[i] for i in b]) for b in every[rank * n : (rank + 1) * n]]

    def loss(self, model: torch.nn.Module, batch: Any, record: Record) -> tuple[torch.Tensor, int]:
        src, tgt_in, tgt_out = batch
        loss = model(
            src, tgt_in, record=record, targets=tgt_out, label_smoothing=self.label_smoothing
        )
        return loss, int((tgt_out != PAD).sum())

    def evaluate(self, model: TransformerModel) -> float:
        """Validation cross entropy (no smoothing) in nats per target token."""
        assert isinstance(model, EncoderDecoder)
        batches = [collate([self.valid[i] for i in b]) for b in self.valid_batches]
        return translation_loss(model, batches, pad_id=PAD)

    def data_state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index}

    def load_data_state(self, state: dict[str, Any]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self.batches = token_batches(
            self.lengths, self.max_tokens, seed=self.seed, epoch=self.epoch
        )


def train_translation(
    run: RunConfig,
    out_dir: str | Path,
    data_root: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    stop_after: int | None = None,
    progress: bool = True,
) -> FitResult:
    """Train (or resume) an encoder-decoder on parallel text."""
    tc = run.train
    train_pairs, valid_pairs = (
        load_pairs(run, data_root, "train"),
        load_pairs(run, data_root, "val"),
    )

    def build() -> tuple[TransformerModel, Tokenizer]:
        lines = [p.source for p in train_pairs] + [p.target for p in train_pairs]
        tokenizer = BPETokenizer.from_lines(lines, run.data.bpe_vocab_size)
        return build_model(
            run.model.replace(vocab_size=tokenizer.vocab_size, pad_id=PAD)
        ), tokenizer

    def make_task(model: TransformerModel, tokenizer: Tokenizer) -> TranslationTask:
        if not isinstance(tokenizer, BPETokenizer):
            raise ValueError("a translation checkpoint needs a BPE tokenizer")
        train, valid = encode_pairs(train_pairs, tokenizer), encode_pairs(valid_pairs, tokenizer)
        limit = model.config.max_len
        for split, pairs, texts in (
            ("training", train, train_pairs),
            ("validation", valid, valid_pairs),
        ):
            for (s, t), text in zip(pairs, texts, strict=True):
                if max(len(s), len(t)) > limit:
                    side, n = ("source", len(s)) if len(s) > limit else ("target", len(t))
                    raise ValueError(
                        f"the {split} pair at line {text.line} has a {side} sentence of {n}"
                        f" tokens, more than the model's max_len={limit}: raise"
                        " model.max_len, or drop such pairs"
                    )
        longest = max(max(len(s), len(t)) for s, t in train + valid)
        return TranslationTask(
            train,
            valid,
            max_tokens=tc.max_tokens or tc.batch_size * longest,
            label_smoothing=tc.label_smoothing,
            seed=tc.seed,
        )

    result, task = train_run(
        run,
        out_dir,
        resume=resume,
        overwrite=overwrite,
        build=build,
        make_task=make_task,
        model_type=EncoderDecoder,
        stop_after=stop_after,
        progress=progress,
    )
    assert isinstance(task, TranslationTask)
    # §5.1's batching is about not wasting compute on padding: report how much is left.
    return dataclasses.replace(
        result, padding_fraction=padding_fraction(task.lengths, task.batches)
    )
