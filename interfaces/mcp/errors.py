"""One table from application errors to MCP tool errors: `isError: true`, text `<code>: <message>`.

The code is the error's own stable `.code` (CONTRACT §7 lists which ones a tool may answer);
anything else is `internal`, logged with its traceback and never described to the caller.
"""

from __future__ import annotations

import logging

import msgspec

from application.errors import CommitOutcomeUnknown, StoreUnavailable
from domain.errors import DomainError
from domain.rule_set import RULE_ERROR_CODES

log = logging.getLogger("switchboard.mcp")

TOOL_ERROR_CODES = frozenset({
    "forbidden", "not_found", "conflict", "invalid_argument", "ceiling_exceeded", "forbidden_source_type",
    "internal", "unavailable", *RULE_ERROR_CODES,
})
INTERNAL_MESSAGE = "unexpected server error"


def tool_error(error: BaseException, *, verb: str) -> tuple[str, str]:
    """(code, message) of the tool error that answers this exception."""
    if isinstance(error, DomainError) and error.code in TOOL_ERROR_CODES:
        return error.code, error.message
    if isinstance(error, msgspec.ValidationError):
        return "invalid_argument", str(error)
    if isinstance(error, StoreUnavailable):  # nothing was written (CONTRACT §12)
        log.debug("mcp %s: store unavailable: %s", verb, error)
        return "unavailable", "store down"
    if isinstance(error, CommitOutcomeUnknown):
        return "internal", str(error)
    log.error("mcp %s failed", verb, exc_info=error)
    return "internal", INTERNAL_MESSAGE
