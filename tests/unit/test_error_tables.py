"""Each interface maps application errors in one table; these pin the tables down."""

from __future__ import annotations

import pytest

from application.errors import RetryLimitExceeded
from domain.errors import CeilingExceeded, Conflict, Forbidden, ForbiddenSourceType, InvalidArgument, NotFound
from domain.signatures import SignatureRefused
from domain.rule_set import RuleError
from interfaces.cli.main import EXIT_REFUSED, main
from interfaces.http.errors import STATUS_BY_CODE, domain_error_handler


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (InvalidArgument("x"), 400),
        (NotFound("x"), 404),
        (Conflict("x"), 409),
        (Forbidden("x"), 403),
        (CeilingExceeded("x"), 409),
        (ForbiddenSourceType("x"), 403),
        (RetryLimitExceeded("x"), 409),
        (SignatureRefused("bad digest"), 401),
        (RuleError("too_many_rules", "x"), 400),
        (RuleError("invalid_rule", "x"), 400),
        (RuleError("invalid_expression", "x"), 400),
        (RuleError("forbidden_function", "x"), 400),
        (RuleError("invalid_params", "x"), 400),
        (RuleError("forbidden", "x"), 403),
    ],
)
def test_each_application_error_has_its_http_status_and_json_body(error, status):
    response = domain_error_handler(None, error)  # type: ignore[arg-type]
    assert response.status_code == status
    assert response.content == {"error": error.message, "code": error.code}


def test_every_code_in_the_table_is_a_client_or_server_error_status():
    assert all(400 <= status < 600 for status in STATUS_BY_CODE.values())


def test_the_signature_refusal_never_tells_why():
    error = SignatureRefused("missing sha256= prefix")
    assert domain_error_handler(None, error).content == {  # type: ignore[arg-type]
        "error": "signature verification failed", "code": "unauthorized",
    }


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["todo", "show", "td_nope"], EXIT_REFUSED),
        (["todo", "list", "--limit", "0"], EXIT_REFUSED),
        (["endpoint", "vend", "x", "--queue", "quarantine"], EXIT_REFUSED),
    ],
)
def test_refusals_exit_1_with_the_code_on_stderr(argv, code, tmp_path, capsys):
    assert main([*argv, "--database-url", f"sqlite:///{tmp_path}/s.db"]) == code
    assert capsys.readouterr().err.startswith("error: ")


@pytest.mark.parametrize("argv", [["todo"], ["nonsense"], ["todo", "push", "only-one-arg"]])
def test_usage_errors_exit_2(argv):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
