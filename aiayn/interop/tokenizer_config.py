"""A Hugging Face folder's tokenizer settings beyond ``tokenizer.json``, applied as
transformers applies them when it loads the folder.

``tokenizer.json`` is the tokenizer as it was saved; ``tokenizer_config.json`` (and, in older
folders, ``special_tokens_map.json``) can change it on load.  transformers honours:

* ``do_lower_case`` (with ``strip_accents``, ``tokenize_chinese_chars``) -- a BERT-style
  tokenizer's normaliser is rebuilt from them, so a cased flag in the config wins over an
  uncased ``tokenizer.json``;
* the special tokens (``bos_token``, ``eos_token``, ``unk_token``, ``sep_token``,
  ``pad_token``, ``cls_token``, ``mask_token``, ``additional_special_tokens`` /
  ``extra_special_tokens``) -- each is added as a special, never-split token if the
  vocabulary lacks it; ``special_tokens_map.json`` overrides the config's names where the
  config has no ``added_tokens_decoder`` (the legacy layout);
* ``add_bos_token`` / ``add_eos_token`` -- only where the folder has no ``tokenizer.json``
  (a SentencePiece ``tokenizer.model``, converted by transformers itself): with a
  ``tokenizer.json``, transformers 5 drops both flags and keeps the post-processor saved there,
  which already adds whatever BOS / EOS the model was trained with;
* ``model_max_length`` -- the longest input the model was trained on (kept, not applied:
  encoding never truncates by itself);
* ``chat_template`` -- kept for ``aiayn.interop.chat_template``.

``read_settings`` reads them; ``apply_settings`` changes a ``tokenizers.Tokenizer``
in place.  What changes lives in the tokenizer itself (its normaliser and added tokens), so an
aiayn checkpoint written from the folder keeps it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiayn.errors import CheckpointError
from aiayn.interop.json_files import read_json_object

SPECIAL_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
EXTRA_NAMES = ("additional_special_tokens", "extra_special_tokens")
# transformers' "effectively unlimited" model_max_length when a folder names none
UNLIMITED = int(1e30)


@dataclass(frozen=True)
class TokenizerSettings:
    """What ``tokenizer_config.json`` / ``special_tokens_map.json`` say (module docstring);
    None where the folder is silent."""

    special: dict[str, str] = field(default_factory=dict)  # e.g. {"bos_token": "<s>"}
    extra_special: tuple[str, ...] = ()
    lowercase: bool | None = None
    strip_accents: bool | None = None
    chinese_chars: bool | None = None
    model_max_length: int | None = None
    chat_template: str | None = None


def _content(value: Any, where: str) -> str | None:
    """A token given as a string or as an AddedToken dict ({"content": ...})."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    raise CheckpointError(f"{where} should be a token string or {{'content': ...}}, not {value!r}")


def _chat_template(config: dict[str, Any], folder: Path) -> str | None:
    """The default chat template: a string, a list of named ones, or chat_template.jinja."""
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {str(t.get("name")): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    jinja = folder / "chat_template.jinja"
    if template is None and jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    if template is not None and not isinstance(template, str):
        raise CheckpointError(f"{folder / 'tokenizer_config.json'}: chat_template is not a string")
    return template


def _named_tokens(config: dict[str, Any], config_path: Path, map_path: Path) -> dict[str, Any]:
    """Each special-token setting with the file it comes from: ``{name: (value, path)}``."""
    names = {k: (config[k], config_path) for k in (*SPECIAL_NAMES, *EXTRA_NAMES) if k in config}
    if map_path.is_file() and "added_tokens_decoder" not in config:
        # the legacy layout: the map wins, as in transformers
        names.update({k: (v, map_path) for k, v in read_json_object(map_path).items()})
    return names


def _extra_tokens(name: str, value: Any, path: Path) -> list[str]:
    """The tokens of a list (or a dict of) extra special tokens."""
    tokens = list(value.values()) if isinstance(value, dict) else value or []
    if not isinstance(tokens, list):
        raise CheckpointError(f"{path}: {name} should be a list of tokens, not {value!r}")
    return [t for t in (_content(v, f"{path}: {name}") for v in tokens) if t is not None]


def read_settings(directory: str | os.PathLike[str]) -> TokenizerSettings:
    """The folder's settings; all None / empty when it has neither file.  A value of the wrong
    kind is a ValueError naming the file and the setting."""
    folder = Path(directory)
    config_path, map_path = folder / "tokenizer_config.json", folder / "special_tokens_map.json"
    config = read_json_object(config_path) if config_path.is_file() else {}
    names = _named_tokens(config, config_path, map_path)
    special = {}
    for name in SPECIAL_NAMES:
        value, path = names.get(name, (None, config_path))
        token = _content(value, f"{path}: {name}")
        if token is not None:
            special[name] = token
    extra: list[str] = []
    for name in EXTRA_NAMES:
        if name in names:
            extra += _extra_tokens(name, *names[name])
    length = config.get("model_max_length")
    flags = {k: config.get(k) for k in ("do_lower_case", "strip_accents", "tokenize_chinese_chars")}
    for key, value in flags.items():
        if value is not None and not isinstance(value, bool):
            raise CheckpointError(f"{config_path}: {key} should be true or false, not {value!r}")
    return TokenizerSettings(
        special=special,
        extra_special=tuple(dict.fromkeys(extra)),
        lowercase=flags["do_lower_case"],
        strip_accents=flags["strip_accents"],
        chinese_chars=flags["tokenize_chinese_chars"],
        model_max_length=int(length)
        if isinstance(length, int | float) and length < UNLIMITED
        else None,
        chat_template=_chat_template(config, folder),
    )


def _bert_normalizer(tok: Any, s: TokenizerSettings) -> None:
    """Rebuild a BERT normaliser from the config's flags (a lone BertNormalizer only)."""
    from tokenizers import normalizers

    current = json.loads(tok.to_str()).get("normalizer") or {}
    if current.get("type") != "BertNormalizer" or s.lowercase is None:
        return
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=bool(current.get("clean_text", True)),
        handle_chinese_chars=s.chinese_chars if s.chinese_chars is not None else True,
        strip_accents=s.strip_accents,
        lowercase=s.lowercase,
    )


def apply_settings(tok: Any, s: TokenizerSettings) -> None:
    """Change the ``tokenizers.Tokenizer`` ``tok`` as transformers does on load (module doc)."""
    from tokenizers import AddedToken

    _bert_normalizer(tok, s)
    # Registered as special (never split; skipped when decoding), whether or not the
    # vocabulary has the string already: one in it keeps its id, a new one is appended.
    added = {t.content for t in tok.get_added_tokens_decoder().values()}
    missing = [t for t in [*s.special.values(), *s.extra_special] if t not in added]
    if missing:
        tok.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t in dict.fromkeys(missing)]
        )
