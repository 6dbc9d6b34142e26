"""The explorer's errors: ``{"error": "..."}`` with the status that says what was wrong
(the list is in aiayn/explore/server.py)."""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from aiayn.errors import UserError
from aiayn.explore import analysis
from aiayn.explore.registry import PathNotAllowed, UnknownModel

INTERNAL_ERROR = "internal error: the server's log has the details"


def error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _describe_validation(err: RequestValidationError) -> tuple[int, str]:
    problems = []
    for e in err.errors():
        if e.get("type") == "json_invalid":
            ctx = e.get("ctx", {}).get("error", "")
            return 400, f"malformed JSON: {ctx}".rstrip(": ")
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        if where == "body" and e.get("type") in ("model_attributes_type", "dict_type"):
            return 400, "the body must be a JSON object (send Content-Type: application/json)"
        problems.append(f"{where}: {e.get('msg')}")
    return 422, "; ".join(problems)


def install_error_handlers(app: FastAPI) -> None:
    """Every error as ``{"error": ...}``: 400 malformed JSON (too deeply nested included) or a
    model named by a path, 404 an unknown model, 413 text over the limit, 422 a value out of
    range, 500 anything unexpected."""

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        return error(*_describe_validation(err))

    @app.exception_handler(HTTPException)
    async def httperror(_: Request, err: HTTPException) -> JSONResponse:
        detail = err.detail if isinstance(err.detail, str) else "bad request"
        if err.status_code == 400 and "parsing the body" in detail:
            detail = "malformed JSON: the body could not be parsed (too deeply nested?)"
        return error(err.status_code, detail, err.headers)  # a 405's Allow included

    @app.exception_handler(RecursionError)
    async def too_deep(_: Request, err: RecursionError) -> JSONResponse:
        return error(400, "malformed JSON: nested too deeply")

    @app.exception_handler(Exception)
    async def unexpected(_: Request, err: Exception) -> JSONResponse:
        # The client learns that it failed, not why: exception text can carry paths and
        # internals.  Starlette raises the error on after this answer, so the log has its
        # traceback.
        return error(500, INTERNAL_ERROR)

    @app.exception_handler(PathNotAllowed)
    async def path_like(_: Request, err: PathNotAllowed) -> JSONResponse:
        return error(400, str(err))

    @app.exception_handler(UnknownModel)
    async def unknown(_: Request, err: UnknownModel) -> JSONResponse:
        return error(404, str(err.args[0]))

    @app.exception_handler(analysis.TooLong)
    async def too_long(_: Request, err: analysis.TooLong) -> JSONResponse:
        return error(413, str(err))

    @app.exception_handler(UserError)
    async def bad_value(_: Request, err: UserError) -> JSONResponse:
        return error(422, str(err))
