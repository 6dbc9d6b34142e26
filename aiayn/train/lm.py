"""Training a decoder-only language model: the modern recipe.

AdamW with decay on matrices only, linear warm-up then cosine decay, gradient clipping,
optional bf16 autocast and ``torch.compile``; validation loss at intervals; a resumable
checkpoint at intervals and at the end (see aiayn/train/state.py); a CSV log of every logged
value.  A resumed run continues with the same batches, dropout masks and learning rates as
an uninterrupted one.
"""

from __future__ import annotations

import csv
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from aiayn.data.char import BPETokenizer, CharTokenizer, Tokenizer
from aiayn.data.files import read_text
from aiayn.data.lm_data import TokenStream
from aiayn.models import DecoderLM, build_model
from aiayn.nn.moe import RouterStats
from aiayn.train.config import RunConfig
from aiayn.train.optim import build_adamw
from aiayn.train.schedule import cosine_schedule
from aiayn.train.state import TrainState, load_checkpoint, save_checkpoint

CHECKPOINT = "checkpoint"


def lm_loss(
    model: DecoderLM, x: torch.Tensor, y: torch.Tensor, aux: list[RouterStats] | None = None
) -> torch.Tensor:
    """Next-token cross entropy (nats per token); MoE router statistics go to ``aux``."""
    logits = model(x, aux=aux)  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


@torch.no_grad()
def evaluate_lm(
    model: DecoderLM,
    stream: TokenStream,
    *,
    batches: int,
    batch_size: int,
    block: int,
    seed: int = 0,
) -> float:
    """Mean validation loss (nats per token) over fixed random windows."""
    g = torch.Generator().manual_seed(seed)
    was = model.training
    model.eval()
    losses = [
        lm_loss(model, *stream.batch("val", batch_size, block, g)).item() for _ in range(batches)
    ]
    model.train(was)
    return sum(losses) / len(losses)


def _tokenizer(run: RunConfig, text: str) -> Tokenizer:
    if run.data.tokenizer == "char":
        return CharTokenizer.from_text(text)
    return BPETokenizer.from_text(text, run.data.bpe_vocab_size)


def train_lm(
    run: RunConfig,
    out_dir: str | Path,
    data_root: Path,
    *,
    resume: bool = False,
    stop_after: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train (or resume) and return the history and final validation loss."""
    tc = run.train
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if tc.threads:
        torch.set_num_threads(tc.threads)
    ckpt = out / CHECKPOINT
    state: TrainState | None = None
    if resume and ckpt.exists():
        loaded, tokenizer, _, state = load_checkpoint(ckpt)
        if state is None:
            raise ValueError(f"{ckpt} holds a model but no training state to resume")
        assert isinstance(loaded, DecoderLM)
        model = loaded
    else:
        torch.manual_seed(tc.seed)
        tokenizer = _tokenizer(run, read_text(data_root / run.data.text))
        cfg = run.model.replace(
            vocab_size=tokenizer.vocab_size, max_len=max(run.model.max_len, tc.block_size)
        )
        built = build_model(cfg)
        if not isinstance(built, DecoderLM):
            raise ValueError(f"train_lm needs a decoder-only model, got arch={cfg.arch!r}")
        model = built
    stream = TokenStream.from_file(
        data_root / run.data.text, tokenizer, train_fraction=run.data.train_fraction, seed=tc.seed
    )
    optimizer = build_adamw(
        model, lr=tc.lr, weight_decay=tc.weight_decay, betas=(tc.beta1, tc.beta2)
    )
    start, history = 0, []
    if state is not None:
        optimizer.load_state_dict(state.optimizer)
        torch.set_rng_state(state.torch_rng)
        stream.generator.set_state(state.data_rng)
        start, history = state.step, state.history
    model.train()
    step_fn = torch.compile(model) if tc.compile else model
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=tc.dtype == "bfloat16")
    run_dict = run.to_dict() | {"model": model.config.to_dict()}

    def checkpoint(step: int) -> None:
        save_checkpoint(
            ckpt,
            model,
            tokenizer,
            run_dict,
            TrainState(
                step,
                optimizer.state_dict(),
                torch.get_rng_state(),
                stream.generator.get_state(),
                history,
            ),
        )

    log_path = out / "log.csv"
    log = open(log_path, "a", newline="")  # noqa: SIM115
    writer = csv.writer(log)
    if log_path.stat().st_size == 0:
        writer.writerow(["step", "loss", "lr", "val_loss", "tokens_per_s"])
    end = tc.max_steps if stop_after is None else min(tc.max_steps, stop_after)
    bar = tqdm(
        range(start, end),
        initial=start,
        total=tc.max_steps,
        disable=not progress,
        dynamic_ncols=True,
    )
    tokens_per_step = tc.batch_size * tc.block_size * tc.grad_accum
    t0 = time.perf_counter()
    val = float("nan")
    try:
        for step in bar:
            lr = cosine_schedule(
                step, lr=tc.lr, min_lr=tc.min_lr, warmup=tc.warmup_steps, total=tc.max_steps
            )
            for group in optimizer.param_groups:
                group["lr"] = lr
            total = 0.0
            for _ in range(tc.grad_accum):
                x, y = stream.batch("train", tc.batch_size, tc.block_size)
                aux: list[RouterStats] = []
                with autocast:
                    loss = lm_loss(step_fn, x, y, aux) / tc.grad_accum  # type: ignore[arg-type]
                objective = loss
                if aux:  # mixture of experts: add the load-balancing loss (mean over layers)
                    balance = torch.stack([s.aux_loss for s in aux]).mean()
                    objective = loss + tc.moe_aux_weight * balance / tc.grad_accum
                objective.backward()
                total += loss.item()
            if not math.isfinite(total):
                raise FloatingPointError(
                    f"loss became {total} at step {step + 1}; lower the learning rate"
                )
            if tc.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done = step + 1
            speed = tokens_per_step * (done - start) / (time.perf_counter() - t0)
            record: dict[str, float] = {"step": done, "loss": total, "lr": lr}
            if done % tc.eval_interval == 0 or done == tc.max_steps:
                val = evaluate_lm(
                    model,
                    stream,
                    batches=tc.eval_batches,
                    batch_size=tc.batch_size,
                    block=tc.block_size,
                )
                record["val_loss"] = val
            history.append(record)
            writer.writerow(
                [done, f"{total:.5f}", f"{lr:.3e}", f"{record.get('val_loss', '')}", f"{speed:.0f}"]
            )
            bar.set_postfix(
                loss=f"{total:.3f}", val=f"{val:.3f}", lr=f"{lr:.1e}", tok_s=f"{speed:,.0f}"
            )
            if done % tc.checkpoint_interval == 0 or done == end:
                checkpoint(done)
    finally:
        log.close()
        bar.close()
    return {
        "history": history,
        "val_loss": val,
        "checkpoint": str(ckpt),
        "seconds": time.perf_counter() - t0,
    }
