"""A chat model's own prompt format: the Jinja ``chat_template`` of its tokenizer_config.json.

An instruction-tuned checkpoint was trained on conversations laid out one particular way
(ChatML's ``<|im_start|>user ... <|im_end|>``, Llama's ``[INST]``, ...); its folder carries
that layout as a Jinja template.  ``render_chat`` renders it the way transformers'
``apply_chat_template`` does, so the model sees the text it was trained on:

* a sandboxed Jinja environment (templates are code from the internet) with ``trim_blocks``
  and ``lstrip_blocks``, and the ``loopcontrols`` extension (``{% break %}``);
* the variables ``messages``, ``add_generation_prompt``, ``tools`` and ``documents`` (when
  given), and the folder's special tokens by name (``bos_token``, ``eos_token``, ...);
* ``raise_exception(message)``, ``strftime_now(format)``, a ``tojson`` filter that keeps
  non-ASCII characters and takes ``indent``, and the ``{% generation %}`` block (a marker for
  training masks: rendered as its contents).

``chat_ids`` then encodes the rendered text without adding special tokens again: the
template wrote the ones it wants (a BOS, say) itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from aiayn.data.tokenizer import BPETokenizer
from aiayn.errors import CheckpointError, RequestError


class ChatTemplateError(RequestError):
    """The template refused the conversation (its ``raise_exception``) or is not valid Jinja."""


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


@lru_cache(maxsize=16)
def _compile(template: str) -> Any:
    """The compiled template (cached: a server renders the same one for every request)."""
    from jinja2 import nodes
    from jinja2.exceptions import TemplateSyntaxError
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """``{% generation %}...{% endgeneration %}``: rendered as its body."""

        tags = {"generation"}  # noqa: RUF012  (jinja2 declares it an instance attribute)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body).set_lineno(lineno)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except TemplateSyntaxError as err:
        raise ChatTemplateError(f"the chat template is not valid Jinja: {err}") from err


def _check(messages: Sequence[Mapping[str, Any]]) -> None:
    if not messages:
        raise CheckpointError("a chat needs at least one message")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise CheckpointError(f"message {i} should be a mapping with a 'role', not {message!r}")


def render_chat(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    special_tokens: Mapping[str, str] | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    documents: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """The conversation as the model's prompt text (module docstring).

    ``special_tokens`` maps names such as ``"bos_token"`` to the tokens' strings;
    ``add_generation_prompt`` ends the text with the opening of the assistant's turn.
    """
    _check(messages)
    compiled = _compile(template)
    from jinja2.exceptions import TemplateError

    try:
        return str(
            compiled.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                tools=list(tools) if tools is not None else None,
                documents=list(documents) if documents is not None else None,
                **dict(special_tokens or {}),
            )
        )
    except ChatTemplateError:
        raise
    except TemplateError as err:
        raise ChatTemplateError(f"the chat template failed: {err}") from err


def chat_ids(
    tokenizer: BPETokenizer,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
) -> list[int]:
    """The token ids of the rendered conversation, for a tokenizer that has a chat template."""
    if not tokenizer.chat_template:
        raise CheckpointError(
            "this checkpoint's tokenizer has no chat_template (tokenizer_config.json):"
            " it is not a chat model; prompt it with plain text instead"
        )
    text = render_chat(
        tokenizer.chat_template,
        messages,
        add_generation_prompt=add_generation_prompt,
        special_tokens=tokenizer.special_tokens,
    )
    return list(tokenizer.tok.encode(text, add_special_tokens=False).ids)
