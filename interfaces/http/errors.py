"""One table from application error codes to HTTP statuses, and the `{"error", "code"}` body."""

from __future__ import annotations

import logging

from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException, ValidationException

from application.errors import CommitOutcomeUnknown, StoreUnavailable
from domain.errors import DomainError

log = logging.getLogger("switchboard.http")

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
    """503 means nothing was stored (CONTRACT §12)."""
    return error_response("store down", "unavailable")


def outcome_unknown_handler(request: Request, error: CommitOutcomeUnknown) -> Response:
    """A commit was sent and the store could not be asked in time whether it landed: not a 503."""
    return error_response(str(error), "internal")


# Litestar's own refusals (no such route, wrong method, unreadable request): same body shape
CODE_BY_STATUS = {
    400: "invalid_argument", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
    409: "conflict", 413: "payload_too_large", 422: "validation_failed", 429: "rate_limited", 500: "internal",
    503: "unavailable",
}


def http_error_handler(request: Request, error: HTTPException) -> Response:
    status = error.status_code
    code = CODE_BY_STATUS.get(status, "internal" if status >= 500 else "invalid_argument")
    return Response({"error": _message(error), "code": code}, status_code=status, media_type=MediaType.JSON,
                    headers=error.headers)


def validation_error_handler(request: Request, error: ValidationException) -> Response:
    """A request that does not fit the declared schema (a missing or unknown field, a wrong type,
    a non-number where a number goes): 422, naming the fields. Malformed JSON stays 400."""
    return Response({"error": _message(error), "code": "validation_failed"}, status_code=422,
                    media_type=MediaType.JSON, headers=error.headers)


def _message(error: HTTPException) -> str:
    """The detail, naming the fields a validation failure found at fault."""
    problems = error.extra if isinstance(error.extra, list) else []
    named = [f"{p.get('key') or p.get('source') or 'body'}: {p.get('message')}" for p in problems
             if isinstance(p, dict) and p.get("message")]
    return f"{error.detail} ({'; '.join(named)})" if named else str(error.detail)


def internal_error_handler(request: Request, error: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response("internal error", "internal")


EXCEPTION_HANDLERS = {
    DomainError: domain_error_handler, StoreUnavailable: unavailable_handler,
    CommitOutcomeUnknown: outcome_unknown_handler,
    HTTPException: http_error_handler, ValidationException: validation_error_handler,
    Exception: internal_error_handler,
}
