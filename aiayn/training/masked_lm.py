"""Masked-language-model training for an encoder (BERT's objective, Devlin et al., 2019, §3.1),
continued from a published checkpoint on text of your choice.

Each batch is random windows of the tokenized text (the checkpoint's own tokenizer).  In each
window 15 % of the ordinary tokens are chosen -- never [CLS], [SEP], [PAD] or another special
token -- and of those 80 % become [MASK], 10 % a random token and 10 % stay; the loss is the
cross-entropy of the original tokens at the chosen positions only.  The choices come from the
task's own random generator, which the checkpoint saves, so a resumed run masks exactly as an
uninterrupted one.  Validation masks its windows with a generator seeded afresh each time: the
same positions at every evaluation, so the losses compare.

A run starts from a checkpoint (``[model] init_from``): the objective needs the tokenizer's
[MASK] token and the masked-LM head, which a published BERT folder has.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from aiayn.config.run import RunConfig
from aiayn.data.lm_data import TokenStream
from aiayn.data.tokenizer import BPETokenizer, Tokenizer
from aiayn.errors import UserError
from aiayn.generate.encoder import mask_id
from aiayn.models import EncoderLM, TransformerModel
from aiayn.nn.context import Record
from aiayn.training.lm import initial_model, lm_corpus
from aiayn.training.loop import FitResult
from aiayn.training.run import train_run

MASK_RATE, AS_MASK, AS_RANDOM = 0.15, 0.8, 0.1
IGNORE = -100  # the label of a position that is not predicted


def mask_tokens(
    ids: torch.Tensor,
    *,
    mask: int,
    vocab_size: int,
    special: torch.Tensor,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's corruption of (B, T) ``ids``: (inputs, labels), labels ``IGNORE`` where nothing
    is predicted.  ``special`` (S,) holds the ids never chosen."""
    chosen = torch.rand(ids.shape, generator=generator) < MASK_RATE  # (B, T)
    chosen &= ~torch.isin(ids, special)
    labels = ids.masked_fill(~chosen, IGNORE)
    roll = torch.rand(ids.shape, generator=generator)  # which corruption each chosen one gets
    as_mask = chosen & (roll < AS_MASK)
    as_random = chosen & (roll >= AS_MASK) & (roll < AS_MASK + AS_RANDOM)
    randoms = torch.randint(vocab_size, ids.shape, generator=generator)
    inputs = ids.masked_fill(as_mask, mask)
    inputs = torch.where(as_random, randoms, inputs)
    return inputs, labels


class MaskedLMTask:
    """Random windows of one token stream, corrupted as BERT's pre-training corrupts them."""

    def __init__(
        self,
        stream: TokenStream,
        tokenizer: BPETokenizer,
        *,
        vocab_size: int,
        batch_size: int,
        block: int,
        eval_batches: int,
        seed: int,
    ) -> None:
        self.stream, self.batch_size, self.block = stream, batch_size, block
        self.eval_batches, self.seed, self.vocab_size = eval_batches, seed, vocab_size
        self.mask = mask_id(tokenizer)
        named = [tokenizer.tok.token_to_id(t) for t in tokenizer.special_tokens.values()]
        added = list(tokenizer.tok.get_added_tokens_decoder())
        self.special = torch.tensor(sorted({*added, *(i for i in named if i is not None)}))

    @property
    def linear_rows(self) -> int:
        return self.batch_size * self.block

    def _corrupt(self, ids: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        return mask_tokens(
            ids,
            mask=self.mask,
            vocab_size=self.vocab_size,
            special=self.special,
            generator=generator,
        )

    def next_batches(self, n: int, rank: int, world: int) -> list[Any]:
        every = []
        for _ in range(n * world):
            x, _ = self.stream.batch("train", self.batch_size, self.block)  # (B, T)
            every.append(self._corrupt(x, self.stream.generator))
        return every[rank * n : (rank + 1) * n]

    def loss(self, model: torch.nn.Module, batch: Any, record: Record) -> tuple[torch.Tensor, int]:
        inputs, labels = (t.to(next(model.parameters()).device) for t in batch)
        return model(inputs, targets=labels, record=record), int((labels != IGNORE).sum())

    @torch.no_grad()
    def evaluate(self, model: TransformerModel) -> float:
        assert isinstance(model, EncoderLM)
        generator = torch.Generator().manual_seed(self.seed + 1)  # the same masks every time
        total, count = 0.0, 0
        was_training = model.training
        model.eval()
        try:
            for _ in range(self.eval_batches):
                x, _ = self.stream.batch("val", self.batch_size, self.block, generator=generator)
                inputs, labels = self._corrupt(x, generator)
                n = int((labels != IGNORE).sum())
                if n:
                    total += float(self.loss(model, (inputs, labels), Record())[0]) * n
                    count += n
        finally:
            model.train(was_training)
        return total / max(count, 1)

    def data_state(self) -> dict[str, Any]:
        return {"rng": self.stream.generator.get_state()}

    def load_data_state(self, state: dict[str, Any]) -> None:
        self.stream.generator.set_state(state["rng"])


def train_masked_lm(
    run: RunConfig,
    out_dir: str | Path,
    data_root: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    stop_after: int | None = None,
    progress: bool = True,
) -> FitResult:
    """Continue an encoder's masked-LM training on ``[data] text`` (module docstring)."""
    if run.init_from is None:
        raise UserError(
            "an encoder's masked-LM run starts from a checkpoint: set [model] init_from to a"
            " BERT-family folder (its tokenizer has the [MASK] token, its model the MLM head)"
        )
    tc = run.train
    corpus = lm_corpus(run, data_root)

    def build() -> tuple[TransformerModel, Tokenizer]:
        model, tokenizer = initial_model(run, tc.block_size)
        if not isinstance(model, EncoderLM) or model.head is None:
            raise UserError(f"{run.init_from} has no masked-LM head: it cannot be trained so")
        if not isinstance(tokenizer, BPETokenizer):
            raise UserError(f"{run.init_from}'s tokenizer has no [MASK] token")
        return model, tokenizer

    def make_task(model: TransformerModel, tokenizer: Tokenizer) -> MaskedLMTask:
        assert isinstance(tokenizer, BPETokenizer)
        stream = corpus.stream(tokenizer)
        return MaskedLMTask(
            stream,
            tokenizer,
            vocab_size=model.config.vocab_size,
            batch_size=tc.batch_size,
            block=tc.block_size,
            eval_batches=tc.eval_batches,
            seed=tc.seed,
        )

    result, _ = train_run(
        run,
        out_dir,
        resume=resume,
        overwrite=overwrite,
        build=build,
        make_task=make_task,
        model_type=EncoderLM,
        stop_after=stop_after,
        progress=progress,
    )
    return result
