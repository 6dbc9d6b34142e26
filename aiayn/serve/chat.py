"""``POST /v1/chat/completions``: OpenAI's chat API over the checkpoint's own chat template.

The messages are rendered with the folder's ``chat_template`` as transformers'
``apply_chat_template(..., add_generation_prompt=True)`` renders them
(aiayn/interop/chat_template.py), and the engine continues that text until an end id (the
generation settings' EOS ids or the tokenizer's ``eos_token``), a stop string or the length
limit.  The answer is ``chat.completion`` (the reply as the assistant's message), or, with
``stream``, ``chat.completion.chunk`` events: the role first, then the text as it comes, then
the finish reason, then ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Annotated, Any

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field

from aiayn.data.tokenizer import BPETokenizer
from aiayn.interop.chat_template import ChatTemplateError, chat_ids
from aiayn.serve.completion import Completer, SamplingBody, usage
from aiayn.serve.engine import Event
from aiayn.serve.errors import APIError


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
    # Not served: refused by name, since a client asking for them would read empty fields.
    tools: list[dict[str, Any]] | None = None
    logprobs: bool = False
    response_format: dict[str, Any] | None = None


async def chat_completion(
    body: ChatBody, http: Request, completer: Completer, tokenizer: BPETokenizer, name: str
) -> Any:
    """The handler's work (module docstring)."""
    refused = [key for key, on in (("tools", body.tools), ("logprobs", body.logprobs),
                                   ("response_format", body.response_format)) if on]  # fmt: skip
    if refused:
        raise APIError(400, f"{', '.join(refused)}: not supported by this server")
    messages = [m.as_template_input() for m in body.messages]
    try:  # the template is rendered and its text tokenized off the event loop
        ids = await asyncio.to_thread(chat_ids, tokenizer, messages)
    except ChatTemplateError as err:
        raise APIError(400, f"messages: {err}") from None
    except ValueError as err:  # no chat template: not a chat model
        raise APIError(400, f"{name}: {err}") from None
    room = completer.context - len(ids)
    max_tokens = body.max_completion_tokens or body.max_tokens or min(room, completer.new_limit)
    stops = completer.check(ids, max_tokens, body.top_k, body.stop)
    request, events = completer.submit(ids, max_tokens, body.sampling(), body.seed, stops)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": name}
    if not body.stream:
        await completer.wait(request, events, http)
        message = {"role": "assistant", "content": request.text}
        choice = {"index": 0, "message": message, "finish_reason": request.finish_reason,
                  "logprobs": None}  # fmt: skip
        return {**head, "object": "chat.completion", "choices": [choice],
                "usage": usage(len(ids), request)}  # fmt: skip
    chunk_head = {**head, "object": "chat.completion.chunk"}
    started = False

    def chunks(event: Event) -> list[dict[str, Any]]:
        nonlocal started
        out = []
        if not started:  # the first chunk names the role
            started = True
            delta = {"role": "assistant", "content": ""}
            out.append({**chunk_head, "choices": [{"index": 0, "delta": delta,
                                                   "finish_reason": None}]})  # fmt: skip
        if event.text:
            out.append({**chunk_head, "choices": [{"index": 0, "delta": {"content": event.text},
                                                   "finish_reason": None}]})  # fmt: skip
        if event.kind == "done":
            out.append({**chunk_head, "choices": [{"index": 0, "delta": {},
                                                   "finish_reason": event.finish_reason}]})  # fmt: skip
        return out

    def closing() -> list[dict[str, Any]]:
        if not body.include_usage():
            return []
        return [{**chunk_head, "choices": [], "usage": usage(len(ids), request)}]

    return completer.stream(request, events, chunks, closing)
