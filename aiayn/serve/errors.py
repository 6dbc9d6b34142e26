"""Errors in OpenAI's shape: ``{"error": {"message", "type", "code"}}`` with the status.

A client hears what it did wrong, never an exception's text: an unexpected error is a 500
that says only that the server's log has the details (paths and internals stay there)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from aiayn.errors import UserError
from aiayn.serve.engine import EngineStopped, QueueFull

INTERNAL_ERROR = "internal error: the server's log has the details"

# Every status the server answers with besides 200, as its OpenAPI schema documents them.
STATUSES = {
    400: "A value the server cannot take, named in the message.",
    401: "A missing or wrong API key (with --api-key).",
    404: "An unknown model or path.",
    413: "A request body over --max-body bytes, refused before it is read.",
    429: "The queue is full: try again later.",
    499: "The client closed the request before its answer.",
    500: "An internal error; the server's log has its details.",
    503: "The engine is not running.",
}


class ErrorDetail(BaseModel):
    message: str
    type: str
    code: int


class ErrorBody(BaseModel):
    """OpenAI's error shape."""

    error: ErrorDetail


def documented_errors() -> dict[int | str, dict[str, Any]]:
    """The error responses every route may give, for its OpenAPI schema."""
    return {status: {"model": ErrorBody, "description": text} for status, text in STATUSES.items()}


class APIError(Exception):
    """An error a handler raises; the app turns it into ``error_response``."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def error_response(
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape, with the status that says what went wrong: a handler's
    ``APIError``, a 400 for a body that fails validation or a
    ``UserError`` (a ``RequestError`` above all), a 429 for a full queue, a 503
    for an engine that has stopped."""

    @app.exception_handler(APIError)
    async def api_error(_: Request, err: APIError) -> JSONResponse:
        return error_response(err.status, err.message, err.kind)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        problems = [
            f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e.get('msg')}"
            for e in err.errors()
        ]
        return error_response(400, "; ".join(problems))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, err: HTTPException) -> JSONResponse:
        # the exception's headers too: a 405's Allow names the methods the path takes
        return error_response(err.status_code, str(err.detail), headers=err.headers)

    @app.exception_handler(UserError)
    async def user_error(_: Request, err: UserError) -> JSONResponse:
        # a request the model cannot take (RequestError), or any other mistake a caller can
        # make, named in one line; a plain ValueError is a bug and stays a 500
        return error_response(400, str(err))

    @app.exception_handler(QueueFull)
    async def busy(_: Request, err: QueueFull) -> JSONResponse:
        return error_response(429, f"the server is busy: {err}", "rate_limit_error")

    @app.exception_handler(Exception)
    async def unexpected(_: Request, err: Exception) -> JSONResponse:
        # Starlette raises the error on after this answer: the server logs its traceback.
        return error_response(500, INTERNAL_ERROR, "server_error")

    @app.exception_handler(EngineStopped)
    async def stopped(_: Request, err: EngineStopped) -> JSONResponse:
        return error_response(503, str(err), "server_error")
