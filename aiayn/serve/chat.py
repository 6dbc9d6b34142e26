"""``POST /v1/chat/completions``: OpenAI's chat API over the checkpoint's own chat template.

The messages are rendered with the folder's ``chat_template`` as transformers'
``apply_chat_template(..., add_generation_prompt=True)`` renders them
(aiayn/interop/chat_template.py), and the engine continues that text until an end id (the
generation settings' EOS ids or the tokenizer's ``eos_token``), a stop string or the length
limit.  The answer is ``chat.completion`` (the reply as the assistant's message), or, with
``stream``, ``chat.completion.chunk`` events: the role first, then the text as it comes, then
the finish reason, then ``[DONE]``.  ``n`` choices are drawn (``seed``, ``seed + 1``, ...);
``logprobs`` with ``top_logprobs`` gives each reply token's log-probability and the top ones,
the model's own before any sampling setting (aiayn/serve/logprobs.py); ``presence_penalty``,
``frequency_penalty`` and ``logit_bias`` shape what is sampled.  ``tools`` and a
``response_format`` other than text are refused by name.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Annotated, Any

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field

from aiayn.data.tokenizer import BPETokenizer
from aiayn.errors import UserError
from aiayn.interop.chat_template import ChatTemplateError, chat_ids
from aiayn.serve.completion import Choice, Completer, SamplingBody, Shared, seeds, usage
from aiayn.serve.engine import Event
from aiayn.serve.engine import Request as EngineRequest
from aiayn.serve.errors import APIError
from aiayn.serve.limits import MAX_LOGPROBS
from aiayn.serve.logprobs import chat_logprobs


class ChatMessage(BaseModel):
    """One message; ``content`` as a string or OpenAI's list of text parts."""

    model_config = ConfigDict(
        extra="allow", strict=True
    )  # name, tool_calls, ... reach the template
    role: str
    content: str | list[dict[str, Any]] | None = None

    def as_template_input(self) -> dict[str, Any]:
        message = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):  # [{"type": "text", "text": ...}, ...]
            kinds = {part.get("type") for part in self.content}
            if kinds - {"text"}:
                raise APIError(400, f"messages: only text parts are served, not {kinds - {'text'}}")
            message["content"] = "".join(str(part.get("text", "")) for part in self.content)
        return message


class ChatBody(SamplingBody):
    """OpenAI's chat request: the fields served, those refused by name, any other ignored."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    # Not served: refused by name, since a client asking for them would read empty fields.
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None

    def refused(self) -> list[str]:
        text = self.response_format is None or self.response_format.get("type") == "text"
        return [k for k, on in (("tools", self.tools), ("response_format", not text)) if on]


async def chat_completion(
    body: ChatBody, http: Request, completer: Completer, tokenizer: BPETokenizer, name: str
) -> Any:
    """The handler's work (module docstring)."""
    refused = body.refused()
    if refused:
        raise APIError(400, f"{', '.join(refused)}: not supported by this server")
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs: only with logprobs: true")
    ids = await _prompt(body, tokenizer, name)
    room = completer.context - len(ids)
    max_tokens = body.max_completion_tokens or body.max_tokens or min(room, completer.new_limit)
    stops = completer.check(ids, max_tokens, body.top_k, body.stop)
    completer.check_choices(body.n, "n")
    top = (body.top_logprobs or 0) if body.logprobs else None
    choices = [Choice(ids, max_tokens, seed, top) for seed in seeds(body.seed, body.n)]
    shared = Shared(body.sampling(), stops, body.penalties(completer.vocab))
    requests, events = completer.submit(choices, shared)
    reply = Reply(body, tokenizer, name, len(ids))
    if not body.stream:
        await completer.wait(requests, events, http)
        return reply.whole(requests)
    return completer.stream(requests, events, reply.chunks(), reply.closing(requests))


async def _prompt(body: ChatBody, tokenizer: BPETokenizer, name: str) -> list[int]:
    """The messages rendered with the checkpoint's template and tokenized, off the event
    loop."""
    messages = [m.as_template_input() for m in body.messages]
    try:
        return await asyncio.to_thread(chat_ids, tokenizer, messages)
    except ChatTemplateError as err:
        raise APIError(400, f"messages: {err}") from None
    except UserError as err:  # no chat template: not a chat model
        raise APIError(400, f"{name}: {err}") from None


class Reply:
    """The response's JSON: ``chat.completion``, or ``chat.completion.chunk`` events."""

    def __init__(self, body: ChatBody, tokenizer: BPETokenizer, name: str, prompt: int) -> None:
        self.body, self.decode, self.prompt_tokens = body, tokenizer.decode, prompt
        self.head = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "created": int(time.time()),
            "model": name,
        }

    def whole(self, requests: list[EngineRequest]) -> dict[str, Any]:
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": r.text},
                "finish_reason": r.finish_reason,
                "logprobs": self._logprobs(r.tokens, r.token_logprobs, r.top_logprobs),
            }
            for i, r in enumerate(requests)
        ]
        usage_ = usage(self.prompt_tokens, requests)
        return {**self.head, "object": "chat.completion", "choices": choices, "usage": usage_}

    def _logprobs(
        self, tokens: list[int], values: list[float], tops: list[dict[int, float]]
    ) -> dict[str, Any] | None:
        if not self.body.logprobs:
            return None
        return chat_logprobs(tokens, values, tops, self.decode)

    def _chunk(self, index: int, delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "finish_reason": None, **extra}
        return {**self.head, "object": "chat.completion.chunk", "choices": [choice]}

    def chunks(self) -> Any:
        """Per choice: the role first, then the text as it comes (with its log-probabilities),
        then the finish reason."""
        started: set[int] = set()

        def chunks(index: int, event: Event) -> list[dict[str, Any]]:
            out = []
            if index not in started:  # a choice's first chunk names the role
                started.add(index)
                out.append(self._chunk(index, {"role": "assistant", "content": ""}))
            if event.kind == "token":
                lp = None
                if event.token is not None and event.logprob is not None:
                    lp = self._logprobs([event.token], [event.logprob], [event.top or {}])
                out.append(self._chunk(index, {"content": event.text}, logprobs=lp))
            if event.kind == "done":
                out.append(self._chunk(index, {}, finish_reason=event.finish_reason))
            return out

        return chunks

    def closing(self, requests: list[EngineRequest]) -> Any:
        def closing() -> list[dict[str, Any]]:
            if not self.body.include_usage():
                return []
            usage_ = usage(self.prompt_tokens, requests)
            return [
                {**self.head, "object": "chat.completion.chunk", "choices": [], "usage": usage_}
            ]

        return closing
