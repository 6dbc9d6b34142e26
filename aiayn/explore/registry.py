"""The explorer's list of models: trained checkpoints and untrained presets, chosen by name.

The browser names a model, never a file: the list is fixed when the server starts (from
``--checkpoint NAME=DIR``, ``--runs DIR`` and ``--preset NAME``), and a request may only pick
one of its names.  A name that looks like a path is refused before any lookup.

Models are loaded on first use and kept in a small least-recently-used cache.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from aiayn.checkpoint import (
    CONFIG_FILE,
    TOKENIZER_FILE,
    is_bundle,
    is_hf_folder,
    load,
    read_model_config,
    read_run,
)
from aiayn.checkpoint.run_dir import CHECKPOINTS
from aiayn.config import ModelConfig
from aiayn.data.tokenizer import CharTokenizer, Tokenizer
from aiayn.device import for_inference
from aiayn.errors import RequestError
from aiayn.inspect.attention_maps import untrained_config
from aiayn.models import TransformerModel, build_model

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,63}$")
# Untrained presets read characters: printable ASCII (space to ~).
PRESET_CHARS = [chr(c) for c in range(32, 127)]
MAX_PRESET_PARAMETERS = 400_000_000


class UnknownModel(LookupError):
    """A name that is not in the list (HTTP 404)."""


class PathNotAllowed(RequestError):
    """A model named by something that looks like a file path (HTTP 400)."""


def looks_like_path(name: str) -> bool:
    return any(c in name for c in "/\\~") or ".." in name or name.startswith(".")


# A first sentence for each input language, so that the page opens on something the selected
# model reads: a German->English model gets German.
EXAMPLES = {
    "de": "Ein Hund läuft über die grüne Wiese.",
    "en": "A dog runs across the green meadow.",
    "fr": "Un chien court sur la prairie verte.",
    "cs": "Pes běží přes zelenou louku.",
}
LM_EXAMPLE = "ROMEO: But soft, what light through yonder window breaks?"


def example_text(config: ModelConfig, run: dict[str, Any]) -> str:
    """A sentence in the language the model reads (from the run's data config)."""
    if config.arch == "encoder-decoder":
        lang = str(run.get("data", {}).get("source_lang", "de"))
        return EXAMPLES.get(lang, EXAMPLES["de"])
    return LM_EXAMPLE


@dataclass(frozen=True)
class Entry:
    name: str
    config: ModelConfig
    directory: Path | None  # a checkpoint folder, or None for an untrained preset
    preset: str | None = None
    example: str = LM_EXAMPLE  # what the page's text box starts with for this model

    def describe(self) -> dict[str, Any]:
        c = self.config
        return {
            "name": self.name,
            "kind": "checkpoint" if self.directory is not None else "untrained preset",
            "arch": c.arch,
            "n_layers": c.n_layers,
            "n_decoder_layers": c.n_decoder_layers or c.n_layers,
            "n_heads": c.attention.n_heads,
            "d_model": c.d_model,
            "max_len": c.max_len,
            "parameters": _parameters(c),
            "image": c.vision.image_size is not None,
            "example": self.example,
        }


def _parameters(c: ModelConfig) -> int:
    """From the config alone; the RNN baselines, which aiayn.inspect.calc does not cover, are
    built on the meta device (no memory) and counted."""
    from aiayn.inspect.calc import parameter_count

    if c.rnn.cell is None and c.vision.image_size is None:
        return parameter_count(c)
    with torch.device("meta"):
        return build_model(c).num_parameters()


@dataclass
class Loaded:
    entry: Entry
    model: TransformerModel
    tokenizer: Tokenizer
    run: dict[str, Any] | None = None  # the checkpoint's run config (an image model's data)


def is_checkpoint(folder: Path) -> bool:
    return is_bundle(folder)


def _checkpoint_name(folder: Path, root: Path) -> str:
    parts = [p for p in folder.relative_to(root).parts if p != "checkpoint"] or [folder.parent.name]
    return ":".join(parts)


class Registry:
    """Names -> models.  Thread-safe; at most ``cache_size`` models stay loaded."""

    def __init__(self, cache_size: int = 2, device: torch.device | None = None) -> None:
        self.device = torch.device("cpu") if device is None else device
        self.entries: dict[str, Entry] = {}
        self._loaded: OrderedDict[str, Loaded] = OrderedDict()
        self._lock = threading.Lock()
        self.cache_size = cache_size

    def _add(self, entry: Entry) -> None:
        if not NAME.match(entry.name):
            raise RequestError(
                f"model name {entry.name!r} is invalid: use letters, digits and _.:+- (1-64 chars)"
            )
        if entry.name in self.entries:
            raise RequestError(f"model name {entry.name!r} is given twice")
        self.entries[entry.name] = entry

    def add_checkpoint(self, directory: str | Path, name: str | None = None) -> str:
        folder = Path(directory)
        if not is_checkpoint(folder):
            raise RequestError(
                f"{folder} is not a checkpoint folder (expected {CONFIG_FILE} and {TOKENIZER_FILE})"
            )
        name = name or _checkpoint_name(folder.resolve(), folder.resolve().parent)
        config = read_model_config(folder)
        run = {} if is_hf_folder(folder) else read_run(folder)
        self._add(Entry(name, config, folder, example=example_text(config, run)))
        return name

    def add_runs(self, root: str | Path) -> list[str]:
        """Every checkpoint folder up to three levels below ``root``, named by its relative path
        (``shakespeare_char``, ``multi30k_de_en:averaged``)."""
        base = Path(root)
        if not base.is_dir():
            raise RequestError(f"runs folder {base} does not exist")
        found = sorted(
            {
                p.parent
                for depth in ("*", "*/*", "*/*/*")
                for p in base.glob(f"{depth}/{CONFIG_FILE}")
            }
        )
        names = []
        for folder in found:
            if CHECKPOINTS in folder.relative_to(base).parts:  # reached through "checkpoint"
                continue
            if is_checkpoint(folder):
                name = _checkpoint_name(folder, base)
                if name not in self.entries:
                    names.append(self.add_checkpoint(folder, name))
        return names

    def add_preset(self, preset: str, **overrides: Any) -> str:
        from aiayn.inspect.calc import parameter_count

        config = untrained_config(preset, len(PRESET_CHARS), overrides)
        if parameter_count(config) > MAX_PRESET_PARAMETERS:
            raise RequestError(
                f"preset {preset!r} has {parameter_count(config):,} parameters, more than the"
                f" explorer builds ({MAX_PRESET_PARAMETERS:,}); train or shrink it"
            )
        name = f"{preset}:untrained"
        self._add(Entry(name, config, None, preset, example=example_text(config, {})))
        return name

    def entry(self, name: object) -> Entry:
        if not isinstance(name, str):
            raise UnknownModel(f"model must be a name from the list, got {name!r}")
        if looks_like_path(name):
            raise PathNotAllowed(
                f"model {name!r} looks like a file path; name one of: {', '.join(self.entries)}"
            )
        if name not in self.entries:
            raise UnknownModel(f"unknown model {name!r}; known: {', '.join(self.entries)}")
        return self.entries[name]

    def get(self, name: object) -> Loaded:
        entry = self.entry(name)
        with self._lock:
            if entry.name in self._loaded:
                self._loaded.move_to_end(entry.name)
                return self._loaded[entry.name]
            loaded = self._load(entry, self.device)
            self._loaded[entry.name] = loaded
            while len(self._loaded) > self.cache_size:
                self._loaded.popitem(last=False)
            return loaded

    @staticmethod
    def _load(entry: Entry, device: torch.device) -> Loaded:
        run: dict[str, Any] | None = None
        if entry.directory is not None:
            bundle = load(entry.directory)
            model, tokenizer, run = bundle.model, bundle.tokenizer, bundle.run
        else:
            torch.manual_seed(0)
            model, tokenizer = build_model(entry.config), CharTokenizer(PRESET_CHARS)
        for_inference(model, device)
        return Loaded(entry, model, tokenizer, run)

    def describe(self) -> list[dict[str, Any]]:
        return [e.describe() for e in self.entries.values()]


def default_registry(
    checkpoints: Sequence[str] = (),
    runs: Sequence[str] = (),
    preset_names: Sequence[str] = (),
    device: torch.device | None = None,
) -> Registry:
    """A registry from the command line: ``NAME=DIR`` or ``DIR`` checkpoints, runs folders and
    presets.  With none of them, the checkpoints under ./runs (if any) and untrained gpt2-small."""
    reg = Registry(device=device)
    for spec in checkpoints:
        name, sep, folder = spec.partition("=")
        if sep and not Path(spec).exists():
            reg.add_checkpoint(folder, name)
        else:
            reg.add_checkpoint(spec)
    for root in runs:
        reg.add_runs(root)
    for preset in preset_names:
        reg.add_preset(preset)
    if not (checkpoints or runs or preset_names):
        if Path("runs").is_dir():
            reg.add_runs("runs")
        reg.add_preset("gpt2-small")
    if not reg.entries:
        raise RequestError("no models to explore: give --checkpoint, --runs or --preset")
    return reg
