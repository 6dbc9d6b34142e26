"""Training a decoder-only language model: the modern recipe, on the shared loop.

AdamW with decay on matrices only, linear warm-up then cosine decay, gradient clipping,
optional bf16 autocast and ``torch.compile`` (see aiayn/training/loop.py for the loop itself,
its checkpoints and its multi-process behaviour).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from aiayn.config.run import RunConfig
from aiayn.data.files import read_text
from aiayn.data.lm_data import TokenStream
from aiayn.data.preprocess import tokenizer_digest
from aiayn.data.shards import TOKENIZER_FILE, open_text
from aiayn.data.tokenizer import BPETokenizer, CharTokenizer, Tokenizer, load_tokenizer
from aiayn.errors import UserError
from aiayn.evaluation.perplexity import evaluate_lm, lm_loss
from aiayn.models import DecoderLM, TransformerModel, build_model
from aiayn.nn.context import Record
from aiayn.training.loop import FitResult
from aiayn.training.run import train_run


class LMTask:
    """Random contiguous windows of one token stream (nanoGPT's sampling)."""

    def __init__(
        self, stream: TokenStream, *, batch_size: int, block: int, eval_batches: int
    ) -> None:
        self.stream, self.batch_size, self.block, self.eval_batches = (
            stream,
            batch_size,
            block,
            eval_batches,
        )

    @property
    def linear_rows(self) -> int:
        return self.batch_size * self.block  # every batch is (batch_size, block)

    def next_batches(self, n: int, rank: int, world: int) -> list[Any]:
        every = [self.stream.batch("train", self.batch_size, self.block) for _ in range(n * world)]
        return every[rank * n : (rank + 1) * n]

    def loss(self, model: torch.nn.Module, batch: Any, record: Record) -> tuple[torch.Tensor, int]:
        x, y = batch
        return lm_loss(model, x, y, record), y.numel()

    def evaluate(self, model: TransformerModel) -> float:
        assert isinstance(model, DecoderLM)
        return evaluate_lm(
            model,
            self.stream,
            batches=self.eval_batches,
            batch_size=self.batch_size,
            block=self.block,
        )

    def data_state(self) -> dict[str, Any]:
        return {"rng": self.stream.generator.get_state()}

    def load_data_state(self, state: dict[str, Any]) -> None:
        self.stream.generator.set_state(state["rng"])


def _tokenizer(run: RunConfig, text: str) -> Tokenizer:
    if run.data.tokenizer == "char":
        return CharTokenizer.from_text(text)
    return BPETokenizer.from_text(text, run.data.bpe_vocab_size)


def token_stream(run: RunConfig, text: str, tokenizer: Tokenizer) -> TokenStream:
    """The run's text as one token stream split into training and validation, with room for
    at least one block in each (else an error naming the split)."""
    stream = TokenStream.from_text(
        text, tokenizer, train_fraction=run.data.train_fraction, seed=run.train.seed
    )
    stream.require(run.train.block_size)
    return stream


class PlainText:
    """A run's text from a plain file (``[data] text``), read and tokenized at every start."""

    def __init__(self, run: RunConfig, data_root: Path) -> None:
        self.run, self.text = run, read_text(data_root / run.data.text)

    def tokenizer(self) -> Tokenizer:
        return _tokenizer(self.run, self.text)

    def stream(self, tokenizer: Tokenizer) -> TokenStream:
        return token_stream(self.run, self.text, tokenizer)


class TextShards:
    """A run's text from the token shards ``[data] shards`` names (``aiayn preprocess``):
    the stream is mapped, the tokenizer the shards' own."""

    def __init__(self, run: RunConfig, folder: Path) -> None:
        self.run, self.folder = run, folder
        self.header, self.mapped = open_text(folder)

    def tokenizer(self) -> Tokenizer:
        return load_tokenizer(self.folder / TOKENIZER_FILE)

    def stream(self, tokenizer: Tokenizer) -> TokenStream:
        if tokenizer_digest(tokenizer) != self.header["tokenizer_sha256"]:
            raise UserError(
                f"the shards in {self.folder} were made with another tokenizer than this run's:"
                " preprocess the text again with the run's tokenizer (--tokenizer)"
            )
        stream = TokenStream(
            self.mapped.array,
            train_fraction=self.run.data.train_fraction,
            seed=self.run.train.seed,
            mapped=self.mapped,
        )
        stream.require(self.run.train.block_size)
        return stream


def lm_corpus(run: RunConfig, data_root: Path) -> PlainText | TextShards:
    """Where a language model's text comes from: token shards when ``[data] shards`` is set,
    else the plain file ``[data] text``."""
    if run.data.shards is not None:
        return TextShards(run, data_root / run.data.shards)
    return PlainText(run, data_root)


def initial_model(run: RunConfig, block_size: int) -> tuple[TransformerModel, Tokenizer]:
    """The model and tokenizer a fine-tuning run starts from (``run.init_from``, an HF folder
    or an aiayn checkpoint; nanoGPT's ``init_from``): its weights in fp32 in a model built from
    ``run.model`` (the folder's architecture, with the run's dropout), and its own tokenizer."""
    from aiayn.checkpoint import load

    assert run.init_from is not None
    if block_size > run.model.max_len:
        raise UserError(
            f"train.block_size={block_size}: {run.init_from} has positions for at most"
            f" {run.model.max_len} tokens"
        )
    bundle = load(run.init_from)
    if bundle.model.config.quantization is not None:
        raise UserError(
            f"[model] init_from={run.init_from} holds int8 weights, which do not train: start"
            " from the fp32 checkpoint it was quantized from"
        )
    model = build_model(run.model)
    model.load_state_dict(bundle.model.state_dict())  # cast to the new model's fp32
    return model, bundle.tokenizer


def train_lm(
    run: RunConfig,
    out_dir: str | Path,
    data_root: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    stop_after: int | None = None,
    progress: bool = True,
) -> FitResult:
    """Train (or resume) a decoder-only language model on a text file."""
    tc = run.train
    corpus = lm_corpus(run, data_root)

    def build() -> tuple[TransformerModel, Tokenizer]:
        if run.init_from is not None:
            return initial_model(run, tc.block_size)
        tokenizer = corpus.tokenizer()
        cfg = run.model.replace(
            vocab_size=tokenizer.vocab_size, max_len=max(run.model.max_len, tc.block_size)
        )
        return build_model(cfg), tokenizer

    def make_task(model: TransformerModel, tokenizer: Tokenizer) -> LMTask:
        stream = corpus.stream(tokenizer)
        return LMTask(
            stream, batch_size=tc.batch_size, block=tc.block_size, eval_batches=tc.eval_batches
        )

    result, _ = train_run(
        run,
        out_dir,
        resume=resume,
        overwrite=overwrite,
        build=build,
        make_task=make_task,
        model_type=DecoderLM,
        stop_after=stop_after,
        progress=progress,
    )
    return result
