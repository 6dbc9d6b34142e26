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

import numpy as np
import torch

from aiayn.config.run import RunConfig
from aiayn.data.batching import pad, padding_fraction, plan_batches
from aiayn.data.bpe import BOS, EOS, PAD
from aiayn.data.parallel import Pair, multi30k, read_parallel
from aiayn.data.preprocess import tokenizer_digest
from aiayn.data.shards import (
    TOKENIZER_FILE,
    ParallelSplit,
    Sequences,
    open_parallel,
    padded,
    token_dtype,
)
from aiayn.data.tokenizer import BPETokenizer, Tokenizer, load_tokenizer
from aiayn.errors import UserError
from aiayn.evaluation.perplexity import translation_loss
from aiayn.models import EncoderDecoder, TransformerModel, build_model
from aiayn.nn.context import Record
from aiayn.training.loop import FitResult
from aiayn.training.run import train_run

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


def collate_split(
    split: ParallelSplit, indices: np.ndarray
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``collate`` of the pairs at ``indices``, read from their token sequences."""
    src = padded(split.source.rows(indices), PAD, suffix=EOS)  # (B, S)
    tgt = padded(split.target.rows(indices), PAD, prefix=BOS, suffix=EOS)  # (B, T + 1)
    return src, tgt[:, :-1], tgt[:, 1:]


def pair_lengths(split: ParallelSplit) -> tuple[np.ndarray, np.ndarray]:
    """(N,) source and target lengths as a batch counts them: source + EOS, target + one of
    BOS/EOS (the decoder's input or its target)."""
    src, tgt = split.source.lengths(), split.target.lengths()
    src += 1  # in place: no second copy of millions of lengths (uint16 holds the +1)
    tgt += 1
    return src, tgt


def longest_pair(split: ParallelSplit) -> int:
    """The longest sentence of the split, in tokens with BOS/EOS (the target has both)."""
    s, t = pair_lengths(split)
    return max(int(s.max()), int(t.max()) + 1)


class TranslationTask:
    """Epochs of shuffled token-count batches; the data position is (epoch, batch index).

    The pairs are token sequences (aiayn/data/shards.py), mapped from shards or held in
    memory: planning an epoch reads only their lengths, and a batch reads only its own pairs.
    """

    @property
    def linear_rows(self) -> int:
        # every batch has its own (B, S) and (B, T), of about max_tokens rows each
        return self.max_tokens

    def __init__(
        self,
        train: ParallelSplit,
        valid: ParallelSplit,
        *,
        max_tokens: int,
        label_smoothing: float,
        seed: int,
    ) -> None:
        if not len(train):
            raise UserError("no training pairs")
        if not len(valid):
            raise UserError("no validation pairs")
        self.train, self.valid = train, valid
        self.lengths = pair_lengths(train)
        self.max_tokens, self.label_smoothing, self.seed = max_tokens, label_smoothing, seed
        self.epoch, self.index = 0, 0
        self.batches = plan_batches(self.lengths, max_tokens, seed=seed, epoch=0)
        self.valid_batches = list(plan_batches(pair_lengths(valid), max_tokens, shuffle=False))

    def _next(self) -> np.ndarray:
        if self.index >= len(self.batches):
            self.epoch, self.index = self.epoch + 1, 0
            self.batches = plan_batches(
                self.lengths, self.max_tokens, seed=self.seed, epoch=self.epoch
            )
        self.index += 1
        return self.batches[self.index - 1]

    def next_batches(self, n: int, rank: int, world: int) -> list[Any]:
        """This rank's ``n`` batches: every rank plans all ``n × world`` (lengths only) and
        reads the tokens of its own."""
        every = [self._next() for _ in range(n * world)]
        return [collate_split(self.train, b) for b in every[rank * n : (rank + 1) * n]]

    def loss(self, model: torch.nn.Module, batch: Any, record: Record) -> tuple[torch.Tensor, int]:
        src, tgt_in, tgt_out = batch
        loss = model(
            src, tgt_in, record=record, targets=tgt_out, label_smoothing=self.label_smoothing
        )
        return loss, int((tgt_out != PAD).sum())

    def evaluate(self, model: TransformerModel) -> float:
        """Validation cross entropy (no smoothing) in nats per target token."""
        assert isinstance(model, EncoderDecoder)
        batches = (collate_split(self.valid, b) for b in self.valid_batches)
        return translation_loss(model, batches, pad_id=PAD)

    def data_state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index}

    def load_data_state(self, state: dict[str, Any]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self.batches = plan_batches(self.lengths, self.max_tokens, seed=self.seed, epoch=self.epoch)


class PlainFiles:
    """A run's pairs from plain files (Multi30k or ``[data] train_source`` etc.), read whole:
    the BPE vocabulary is trained on both sides of the training pairs, and every pair
    encoded, at every start.  For small corpora; large ones go through shards."""

    def __init__(self, run: RunConfig, data_root: Path) -> None:
        self.run = run
        self.pairs = {split: load_pairs(run, data_root, split) for split in ("train", "val")}

    def tokenizer(self) -> BPETokenizer:
        train = self.pairs["train"]
        lines = [p.source for p in train] + [p.target for p in train]
        return BPETokenizer.from_lines(lines, self.run.data.bpe_vocab_size)

    def splits(self, tokenizer: BPETokenizer, max_len: int) -> tuple[ParallelSplit, ParallelSplit]:
        """Both splits encoded; a pair over ``max_len`` tokens is an error naming its line."""
        dtype = token_dtype(tokenizer.vocab_size)
        out = []
        for split, name in (("train", "training"), ("val", "validation")):
            pairs = self.pairs[split]
            src = [tokenizer.encode(p.source) for p in pairs]
            tgt = [tokenizer.encode(p.target) for p in pairs]
            for s, t, p in zip(src, tgt, pairs, strict=True):
                if max(len(s) + 1, len(t) + 2) > max_len:
                    side, n = (
                        ("source", len(s) + 1) if len(s) + 1 > max_len else ("target", len(t) + 2)
                    )
                    raise UserError(
                        f"the {name} pair at line {p.line} has a {side} sentence of {n}"
                        f" tokens, more than the model's max_len={max_len}: raise"
                        " model.max_len, or drop such pairs"
                    )
            out.append(
                ParallelSplit(Sequences.from_lists(src, dtype), Sequences.from_lists(tgt, dtype))
            )
        return out[0], out[1]


class TokenShards:
    """A run's pairs from the token shards ``[data] shards`` names (``aiayn preprocess``):
    its tokenizer is the shards' own, its pairs are mapped, nothing is read whole."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.header, self.mapped = open_parallel(folder)
        for split in ("train", "valid"):
            if split not in self.mapped:
                raise UserError(f"{folder} has no {split} split: make it with aiayn preprocess")

    def tokenizer(self) -> BPETokenizer:
        tok = load_tokenizer(self.folder / TOKENIZER_FILE)
        if not isinstance(tok, BPETokenizer):
            raise UserError(f"{self.folder}: a translation run needs a BPE tokenizer")
        return tok

    def splits(self, tokenizer: BPETokenizer, max_len: int) -> tuple[ParallelSplit, ParallelSplit]:
        """The mapped splits, checked against the run: made by ``tokenizer`` (a resumed run's
        own) and no pair over ``max_len`` tokens."""
        if tokenizer_digest(tokenizer) != self.header["tokenizer_sha256"]:
            raise UserError(
                f"the shards in {self.folder} were made with another tokenizer than this run's:"
                " preprocess again with the run's tokenizer, or start a new run"
            )
        for split, info in self.header["splits"].items():
            longest = max(info["source"]["longest"] + 1, info["target"]["longest"] + 2)
            if longest > max_len:
                raise UserError(
                    f"the {split} shards in {self.folder} hold a pair of {longest} tokens (with"
                    f" BOS/EOS), more than the model's max_len={max_len}: raise model.max_len,"
                    f" or preprocess with --max-len {max_len}"
                )
        return self.mapped["train"], self.mapped["valid"]


def corpus(run: RunConfig, data_root: Path) -> PlainFiles | TokenShards:
    """Where a translation run's pairs come from: token shards when ``[data] shards`` is set
    (relative to the data folder, or absolute), else plain files."""
    if run.data.shards is not None:
        return TokenShards(data_root / run.data.shards)
    return PlainFiles(run, data_root)


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
    data = corpus(run, data_root)

    def build() -> tuple[TransformerModel, Tokenizer]:
        tokenizer = data.tokenizer()
        return build_model(
            run.model.replace(vocab_size=tokenizer.vocab_size, pad_id=PAD)
        ), tokenizer

    def make_task(model: TransformerModel, tokenizer: Tokenizer) -> TranslationTask:
        if not isinstance(tokenizer, BPETokenizer):
            raise UserError("a translation checkpoint needs a BPE tokenizer")
        train, valid = data.splits(tokenizer, model.config.max_len)
        return TranslationTask(
            train,
            valid,
            max_tokens=tc.max_tokens or tc.batch_size * max(map(longest_pair, (train, valid))),
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
