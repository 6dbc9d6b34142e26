"""A sweep: variants of one base run config, each trained on the same data for the same work.

The file (``aiayn experiment SWEEP.toml``)::

    [sweep]
    title = "Table 3 at 3+3 x 256"
    base = "../configs/table3_base.toml"   # a run config, relative to this file
    steps = 600                            # every variant trains this many steps ...
    max_tokens = 2048                      # ... of token-count batches of this size
                                           # (translation; a language model's batches are
                                           # its base config's batch_size x block_size)
    val_limit = 0                          # validation sentences scored by BLEU (0 = all)
    test = true                            # also score the test set (the final table)
    beam = 4                               # beam size of the BLEU scoring (0 = greedy)
    set = { "train.eval_interval" = 100 }  # settings every variant shares

    [[variant]]
    name = "base"                          # a folder name: letters, digits, - _ .
    row = "base"                           # the table's row group: base, A, B, ...
    note = "the reference row"
    set = {}                               # this variant's overrides of the base

Every variant gets the same steps of the same batches -- the batches depend only on the data,
the tokenizer, ``max_tokens`` and the seed, which no variant may change -- so every variant
sees exactly the same training tokens.  A bad file is an error naming the variant and the key.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiayn.config.run import RunConfig
from aiayn.errors import ConfigError
from aiayn.training.config import load_run_config

# Settings that would give a variant other training data or another amount of it.
FIXED = (
    "train.max_steps",
    "train.max_tokens",
    "train.batch_size",
    "train.block_size",
    "train.grad_accum",
    "train.seed",
    "train.max_minutes",
)
FIXED_PREFIXES = ("data.",)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_SWEEP_KEYS = {
    "title",
    "base",
    "steps",
    "max_tokens",
    "val_limit",
    "test",
    "beam",
    "set",
    "plot",
}
_VARIANT_KEYS = {"name", "row", "note", "set"}


@dataclass(frozen=True)
class Variant:
    name: str
    row: str
    note: str = ""
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Sweep:
    title: str
    base: Path
    steps: int
    max_tokens: int | None  # translation's token-count batches; None for a language model
    variants: tuple[Variant, ...]
    val_limit: int = 0
    test: bool = True
    beam: int = 4
    shared: dict[str, Any] = field(default_factory=dict)
    source: Path | None = None
    plot: str = "bars"  # "bars" (every variant's score) or "scaling" (loss against size)

    def overrides(self, variant: Variant) -> dict[str, Any]:
        """Everything a variant's run changes in the base config."""
        fixed: dict[str, Any] = {"train.max_steps": self.steps}
        if self.max_tokens is not None:
            fixed["train.max_tokens"] = self.max_tokens
        return {**self.shared, **variant.overrides, **fixed}

    def run_config(self, variant: Variant) -> RunConfig:
        return load_run_config(self.base, self.overrides(variant))

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise ConfigError(
            f"no variant {name!r} in the sweep; it has {', '.join(v.name for v in self.variants)}"
        )


def _positive(where: str, key: str, value: object, *, zero: bool = False) -> int:
    low = 0 if zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        expected = "a non-negative integer" if zero else "a positive integer"
        raise ConfigError(f"{where}: {key} = {value!r} is invalid: expected {expected}")
    return value


def _boolean(where: str, key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: {key} = {value!r} is invalid: expected true or false")
    return value


def _overrides(where: str, table: object) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ConfigError(f'{where}: set must be a table of "section.name" = value')
    for key in table:
        section, _, name = str(key).partition(".")
        if section not in ("model", "data", "train") or not name:
            raise ConfigError(
                f"{where}: setting {key!r} must look like model.NAME, data.NAME or train.NAME"
            )
        if key in FIXED or key.startswith(FIXED_PREFIXES):
            raise ConfigError(
                f"{where}: {key!r} may not vary: every variant trains on the same data for the"
                " same steps ([sweep] steps and max_tokens set the work)"
            )
    return dict(table)


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file; every variant's run config is built once, so that a bad
    setting is named before anything trains."""
    p = Path(path)
    head, tables = _read_tables(p)
    base = (p.parent / str(head["base"])).resolve()
    if not base.is_file():
        raise ConfigError(f"{p}: base config {base} does not exist")
    variants = _variants(p, tables)
    sweep = Sweep(
        title=str(head.get("title", p.stem)),
        base=base,
        steps=_positive(str(p), "steps", head.get("steps")),
        max_tokens=None
        if head.get("max_tokens") is None
        else _positive(str(p), "max_tokens", head.get("max_tokens")),
        variants=variants,
        val_limit=_positive(str(p), "val_limit", head.get("val_limit", 0), zero=True),
        test=_boolean(str(p), "test", head.get("test", True)),
        beam=_positive(str(p), "beam", head.get("beam", 4), zero=True),
        shared=_overrides(f"{p} [sweep]", head.get("set", {})),
        source=p.resolve(),
        plot=str(head.get("plot", "bars")),
    )
    if sweep.plot not in ("bars", "scaling"):
        raise ConfigError(f"{p}: plot = {sweep.plot!r} is invalid: expected 'bars' or 'scaling'")
    _check_runs(p, sweep)
    return sweep


def _read_tables(p: Path) -> tuple[dict[str, Any], list[Any]]:
    """The ``[sweep]`` table (its keys checked, ``base`` present) and the ``[[variant]]``
    tables of the file ``p``."""
    if not p.is_file():
        raise ConfigError(f"sweep file {p} does not exist")
    try:
        raw = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"sweep file {p} is not valid TOML: {err}") from err
    unknown = sorted(set(raw) - {"sweep", "variant"})
    if unknown:
        raise ConfigError(f"{p}: unknown table(s) {unknown}; expected [sweep] and [[variant]]")
    head = raw.get("sweep")
    if not isinstance(head, dict):
        raise ConfigError(f"{p}: the [sweep] table is missing")
    extra = sorted(set(head) - _SWEEP_KEYS)
    if extra:
        raise ConfigError(f"{p}: unknown [sweep] key(s) {extra}; expected {sorted(_SWEEP_KEYS)}")
    if "base" not in head:
        raise ConfigError(f"{p}: [sweep] needs base = the run config the variants change")
    return head, raw.get("variant", [])


def _variants(p: Path, tables: list[Any]) -> tuple[Variant, ...]:
    """The ``[[variant]]`` tables as variants: known keys, folder-safe names used once."""
    variants: list[Variant] = []
    seen: set[str] = set()
    for i, table in enumerate(tables, 1):
        where = f"{p}, variant {i}"
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: expected a [[variant]] table")
        extra = sorted(set(table) - _VARIANT_KEYS)
        if extra:
            raise ConfigError(f"{where}: unknown key(s) {extra}; expected {sorted(_VARIANT_KEYS)}")
        name = str(table.get("name", ""))
        if not _NAME.match(name):
            raise ConfigError(
                f"{where}: name = {name!r} is invalid: expected letters, digits, '-', '_', '.'"
            )
        if name.lower() in seen:  # one folder per name, on case-insensitive file systems too
            raise ConfigError(f"{where}: the name {name!r} is used twice")
        seen.add(name.lower())
        variants.append(
            Variant(
                name,
                str(table.get("row", name)),
                str(table.get("note", "")),
                _overrides(f"{where} ({name})", table.get("set", {})),
            )
        )
    if not variants:
        raise ConfigError(f"{p}: no [[variant]] tables: nothing to run")
    return tuple(variants)


def _check_runs(p: Path, sweep: Sweep) -> None:
    """Build every variant's run config once: a bad setting, a time budget or a model kind a
    sweep cannot train is named now, before anything trains."""
    for v in sweep.variants:
        try:
            sweep.run_config(v)
        except (ValueError, TypeError) as err:
            raise ConfigError(f"{p}, variant {v.name!r}: {err}") from err
        if sweep.run_config(v).train.max_minutes is not None:
            raise ConfigError(
                f"{p}: the base config sets train.max_minutes: a sweep's variants train for"
                " fixed steps, never a time budget"
            )
        arch = sweep.run_config(v).model.arch
        if arch not in ("encoder-decoder", "decoder"):
            raise ConfigError(
                f"{p}, variant {v.name!r}: a sweep trains translation or language"
                f" models, not arch={arch!r}"
            )
        if arch == "encoder-decoder" and sweep.max_tokens is None:
            raise ConfigError(f"{p}: [sweep] needs max_tokens for translation variants")
