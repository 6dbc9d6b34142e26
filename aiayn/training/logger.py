"""What a run reports as it goes: log.csv (one row per step, exactly once, whatever the
number of resumes) and a progress bar with the loss, validation loss, learning rate, tokens/s
and time left."""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path

from tqdm import tqdm

from aiayn.atomic import fsync_path

COLUMNS = ["step", "loss", "lr", "val_loss", "tokens_per_s", "val_ppl"]


def _row_step(line: str) -> int | None:
    head = line.split(",", 1)[0]
    return int(head) if head.isdigit() else None


def truncate_log(path: Path, last_step: int) -> None:
    """Keep the header and the complete rows of steps <= ``last_step`` (those the resumed
    checkpoint covers); later rows will be written again, and a row cut short by a kill is
    dropped.  Replaced atomically."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines(keepends=True)
    kept = [
        line
        for line in lines
        if line.endswith("\n") and ((s := _row_step(line)) is None or s <= last_step)
    ]  # the header has no step
    if kept == lines:
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(kept))
    os.replace(tmp, path)


class RunLogger:
    """The CSV log and the progress bar of one invocation of the loop (rank 0 writes)."""

    def __init__(
        self, path: Path, *, start: int, end: int, total: int, enabled: bool, progress: bool
    ) -> None:
        self.enabled = enabled
        self._file: io.TextIOWrapper | None = None
        if enabled:
            truncate_log(path, start)
            fresh = not path.exists() or path.stat().st_size == 0
            self._file = open(path, "a", newline="")  # noqa: SIM115 (closed in close())
            self._csv = csv.writer(self._file)
            if fresh:
                self._csv.writerow(COLUMNS)
        self.bar = tqdm(
            total=total,
            initial=start,
            disable=not (progress and enabled),
            dynamic_ncols=True,
            desc="training",
            unit="step",
        )
        self.val = math.nan

    def row(
        self, step: int, loss: float, lr: float, val: float | None, tokens_per_s: float
    ) -> None:
        if val is not None:
            self.val = val
        ppl = None if val is None else math.exp(min(val, 50.0))
        if self._file is not None:
            self._csv.writerow(
                [
                    step,
                    f"{loss:.5f}",
                    f"{lr:.3e}",
                    "" if val is None else f"{val}",
                    f"{tokens_per_s:.0f}",
                    "" if ppl is None else f"{ppl}",
                ]
            )
            self._file.flush()
        self.bar.update(1)
        self.bar.set_postfix(
            loss=f"{loss:.3f}",
            val="-" if math.isnan(self.val) else f"{self.val:.3f}",  # NaN: not evaluated yet
            lr=f"{lr:.1e}",
            tok_s=f"{tokens_per_s:,.0f}",
            refresh=False,
        )

    def note(self, text: str) -> None:
        if self.enabled:
            self.bar.write(text)

    def close(self) -> None:
        self.bar.close()
        if self._file is not None:
            self._file.flush()
            fsync_path(Path(self._file.name))
            self._file.close()
            self._file = None
