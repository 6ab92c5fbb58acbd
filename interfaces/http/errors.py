"""One table from application error codes to HTTP statuses, and the `{"error", "code"}` body."""

from __future__ import annotations

from litestar import MediaType, Request, Response

from application.errors import StoreUnavailable
from domain.errors import DomainError

STATUS_BY_CODE = {
    "invalid_argument": 400,
    "too_many_rules": 400,
    "invalid_rule": 400,
    "invalid_expression": 400,
    "forbidden_function": 400,
    "invalid_params": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "forbidden_source_type": 403,
    "not_found": 404,
    "conflict": 409,
    "ceiling_exceeded": 409,
    "payload_too_large": 413,
    "validation_failed": 422,
    "rate_limited": 429,
    "internal": 500,
    "unavailable": 503,
}


def error_response(message: str, code: str, *, headers: dict[str, str] | None = None) -> Response:
    return Response(
        {"error": message, "code": code}, status_code=STATUS_BY_CODE.get(code, 500),
        media_type=MediaType.JSON, headers=headers,
    )


def domain_error_handler(request: Request, error: DomainError) -> Response:
    return error_response(error.message, error.code)


def unavailable_handler(request: Request, error: StoreUnavailable) -> Response:
    return error_response("store down", "unavailable")


EXCEPTION_HANDLERS = {DomainError: domain_error_handler, StoreUnavailable: unavailable_handler}
