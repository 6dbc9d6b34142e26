"""Errors in OpenAI's shape: ``{"error": {"message", "type", "code"}}`` with the status."""

from __future__ import annotations

from fastapi.responses import JSONResponse


class APIError(Exception):
    """An error a handler raises; the app turns it into :func:`error_response`."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def error_response(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": kind, "code": status}}, status_code=status
    )
