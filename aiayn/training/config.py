"""Reading a training run's TOML file (aiayn/config/run.py describes its three tables) into a
``RunConfig``: the model from a preset, the file's settings or an ``init_from`` checkpoint,
with ``--set`` overrides, every mistake a ``ConfigError`` naming the file and the key."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from aiayn.config import ModelConfig, dotted_settings
from aiayn.config.run import DataConfig, RunConfig, TrainConfig
from aiayn.errors import ConfigError
from aiayn.models import resolve_config

# What a fine-tuning run may set differently from the checkpoint it starts from.
TUNABLE = ("dropout", "attention.backend")


def _initial_model(init_from: str, settings: dict[str, Any], where: Path) -> ModelConfig:
    """The model of the folder ``init_from`` names (its architecture is read from it): a
    ``[model]`` setting that contradicts it is an error naming each one, except
    ``TUNABLE`` ones, which the run may change."""
    from aiayn.checkpoint.loader import read_model_config

    folder = Path(init_from)
    if not init_from or not folder.is_dir():
        raise ConfigError(f"[model] init_from = {init_from!r} in {where}: no such folder")
    try:
        base = read_model_config(folder)
    except ValueError as err:
        raise ConfigError(f"[model] init_from = {init_from!r} in {where}: {err}") from err
    contradict = [
        f"{key} = {value!r} ({init_from} has {base.value(key)!r})"
        for key, value in settings.items()
        if key not in TUNABLE and value != base.value(key)
    ]
    if contradict:
        raise ConfigError(
            f"[model] in {where} contradicts the model it starts from: {'; '.join(contradict)}."
            f" Leave these out (only {', '.join(TUNABLE)} may change when fine-tuning)"
        )
    return base.replace(**{k: v for k, v in settings.items() if k in TUNABLE})


def _model_settings(
    table: object, overrides: dict[str, Any], where: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """([model]'s preset and init_from, its model settings by their dotted names), the
    ``model.*`` overrides applied over the table.  A setting may be written as a field
    (``d_model``), a sub-config's table (``[model.attention]``), dotted
    (``attention.n_heads``), or by its flat name of older configs (``n_heads``, with a
    ``DeprecatedSetting`` warning naming the new one)."""
    if not isinstance(table, dict):
        raise ConfigError(f"[model] must be a table of settings, got {table!r}")
    special: dict[str, Any] = {}
    settings: dict[str, Any] = {}
    for source in (table, overrides):
        source = dict(source)
        special |= {key: source.pop(key) for key in ("preset", "init_from") if key in source}
        try:
            settings |= dotted_settings(source)
        except ValueError as err:
            raise ConfigError(f"[model] in {where}: {err}") from None
    return special, settings


def _build(cls: type, table: dict[str, Any], where: str, path: Path) -> Any:
    """``cls`` from the ``[where]`` table of ``path``; a mistake is a ValueError naming both."""
    if not isinstance(table, dict):
        raise ConfigError(f"[{where}] in {path} must be a table of settings, got {table!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - names)
    if unknown:
        raise ConfigError(
            f"unknown key(s) {unknown} in [{where}] of {path}; expected some of {sorted(names)}"
        )
    try:
        return cls(**table)
    except ValueError as err:
        raise ConfigError(f"[{where}] in {path}: {err}") from err


def load_run_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a TOML run config; ``overrides`` like ``{"train.max_steps": 10}`` replace values."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist")
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {p} is not UTF-8 text: {err.reason}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"config file {p} is not valid TOML: {err}") from err
    unknown = sorted(set(raw) - {"model", "data", "train"})
    if unknown:
        raise ConfigError(f"unknown table(s) {unknown} in {p}; expected [model], [data], [train]")
    model_overrides: dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        table, _, name = key.partition(".")
        if table not in ("model", "data", "train") or not name:
            raise ConfigError(
                f"override {key!r} must look like model.NAME, data.NAME or train.NAME"
            )
        if table == "model":  # model.attention.n_heads as well as model.n_heads
            model_overrides[name] = value
        else:
            raw.setdefault(table, {})[name] = value
    special, model_table = _model_settings(raw.get("model", {}), model_overrides, p)
    init_from = special.get("init_from")
    if init_from is not None and not isinstance(init_from, str):
        raise ConfigError(f"[model] init_from = {init_from!r} in {p}: expected a folder's path")
    if init_from is not None and "preset" in special:
        raise ConfigError(
            f"[model] in {p} names both preset and init_from: the architecture comes from"
            f" {init_from}; leave preset out"
        )
    if init_from is not None:
        model = _initial_model(init_from, model_table, p)
    else:
        preset = special.get("preset")
        try:
            model = resolve_config(preset if preset is not None else ModelConfig(), **model_table)
        except ValueError as err:
            raise ConfigError(f"[model] in {p}: {err}") from err
    return RunConfig(
        model,
        _build(DataConfig, raw.get("data", {}), "data", p),
        _build(TrainConfig, raw.get("train", {}), "train", p),
        init_from,
    )
