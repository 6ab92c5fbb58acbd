"""The operator API's body check before Litestar parses a body: JSON nested too deep is a 400, and
a JSON body is decoded against the route's declared type with JSON's own types (the string "3"
is no number there)."""

from __future__ import annotations

import functools
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.datastructures import URL
from litestar.enums import RequestEncodingType
from litestar.exceptions import ValidationException
from litestar.params import BodyKwarg

from interfaces.http.errors import error_response
from interfaces.json_depth import TOO_DEEP, json_too_deep


async def check_body(request: Request) -> Response | None:
    """After the guard, before Litestar parses the body: JSON nested too deep is a 400, never a
    500; then the body is decoded against the route's declared type with JSON's own types, so a
    value of the wrong type ("3" for a number, "true" or 1 for a boolean, "null" for null) is 422
    `validation_failed` (docs/reference.md). Litestar converts every parameter with msgspec's lax
    rules, which query strings need (`?limit=10`) and a JSON body must not get; a body that passes
    here passes those too. Malformed JSON is left to Litestar's 400."""
    if request.method not in ("POST", "PUT", "PATCH"):
        return None
    body = await request.body()
    if json_too_deep(body):
        return error_response(TOO_DEEP, "invalid_argument")
    data = request.route_handler.parsed_fn_signature.parameters.get("data")
    if data is None or not isinstance(data.kwarg_definition, BodyKwarg) or (
            data.kwarg_definition.media_type is not RequestEncodingType.JSON):
        return None
    try:
        _strict_decoder(data.annotation).decode(body or b"null")  # an empty body is null, as Litestar reads it
    except msgspec.ValidationError as error:
        raise _misfit(request, error) from None
    except msgspec.DecodeError:
        pass  # malformed JSON: Litestar's own 400 invalid_argument when it parses the body
    return None


@functools.cache
def _strict_decoder(annotation: Any) -> msgspec.json.Decoder:
    return msgspec.json.Decoder(annotation, strict=True)


def _misfit(request: Request, error: msgspec.ValidationError) -> ValidationException:
    """The 422 Litestar makes of a body that does not fit, naming the field as it does: msgspec's
    "… - at `$.max_in_flight`" is key `max_in_flight`, a misfit of the whole body key `data`."""
    message, _, at = str(error).partition(" - at `$")
    url = URL.from_components(path=request.url.path, query=request.url.query)
    return ValidationException(detail=f"Validation failed for {request.method} {url}", extra=[
        {"message": message, "key": at.rstrip("`").removeprefix(".") or "data", "source": "body"}])
