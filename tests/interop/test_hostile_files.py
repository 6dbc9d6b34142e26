"""Property tests of the parsers that read a folder from elsewhere: whatever
``generation_config.json``, ``tokenizer_config.json`` / ``special_tokens_map.json`` and a chat
request's messages hold, each parser gives its result or a ValueError that names what is
wrong -- never another exception (a KeyError, a TypeError, an AttributeError from deep inside),
which the command line would print as a bug, and the server as a 500.

hypothesis draws JSON of every shape, and the keys the parsers look for with values of every
type; the examples are the same on every run (tests/conftest.py's "ci" profile).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiayn.interop.chat_template import render_chat
from aiayn.interop.generation_config import read_generation
from aiayn.interop.tokenizer_config import SPECIAL_NAMES, read_settings
from tests.conftest import CHATML, json_values

JSON = json_values()


def objects_with(keys: tuple[str, ...]) -> st.SearchStrategy[dict[str, Any]]:
    """JSON objects whose keys are drawn mostly from ``keys`` (those a parser reads), their
    values of any JSON type."""
    key = st.sampled_from(keys) | st.text(max_size=8)
    return st.dictionaries(key, JSON, max_size=6)


def folder_with(files: dict[str, Any]) -> tempfile.TemporaryDirectory[str]:
    """A temporary folder holding ``files`` (name -> JSON value, or raw text as str)."""
    tmp = tempfile.TemporaryDirectory()
    for name, content in files.items():
        text = content if isinstance(content, str) else json.dumps(content)
        (Path(tmp.name) / name).write_text(text, encoding="utf-8")
    return tmp


GENERATION_KEYS = ("bos_token_id", "pad_token_id", "eos_token_id", "decoder_start_token_id")


@given(content=objects_with(GENERATION_KEYS) | JSON | st.text(max_size=40))
@settings(suppress_health_check=list(HealthCheck))
def test_any_generation_config_is_read_or_named(content: Any) -> None:
    with folder_with({"generation_config.json": content}) as folder:
        try:
            ids = read_generation(folder)
        except ValueError as err:
            assert "generation_config.json" in str(err)
            return
    assert all(isinstance(i, int) for i in ids.eos)
    for one in (ids.bos, ids.pad, ids.decoder_start):
        assert one is None or isinstance(one, int)


TOKENIZER_KEYS = (
    *SPECIAL_NAMES,
    "do_lower_case",
    "strip_accents",
    "tokenize_chinese_chars",
    "additional_special_tokens",
    "extra_special_tokens",
    "added_tokens_decoder",
    "add_bos_token",
    "add_eos_token",
    "model_max_length",
    "chat_template",
)


@given(config=objects_with(TOKENIZER_KEYS) | JSON, specials=objects_with(SPECIAL_NAMES) | JSON)
@settings(suppress_health_check=list(HealthCheck))
def test_any_tokenizer_config_is_read_or_named(config: Any, specials: Any) -> None:
    files = {"tokenizer_config.json": config, "special_tokens_map.json": specials}
    with folder_with(files) as folder:
        try:
            read_settings(folder)
        except ValueError as err:
            assert ".json" in str(err), err


MESSAGE = st.dictionaries(
    st.sampled_from(("role", "content", "name", "tool_calls")) | st.text(max_size=6),
    JSON,
    max_size=4,
)


@given(messages=st.lists(MESSAGE | JSON, max_size=4))
@settings(suppress_health_check=list(HealthCheck))
def test_any_chat_messages_render_or_are_named(messages: list[Any]) -> None:
    """A chat request's messages reach the template as the client sent them (the server's
    schema checks only that each has a role): rendering them gives text or a ValueError."""
    try:
        text = render_chat(CHATML, messages)
    except ValueError:
        return
    assert isinstance(text, str)
