"""`switchboard operator` (operators, their passwords and API tokens) and `switchboard secrets` (the key
the webhook signing secrets are sealed under)."""

from __future__ import annotations

import os
import sys

from application.errors import ConfigurationError
from interfaces.cli.arguments import AddCommand, Parser
from interfaces.cli.container import CLI, act
from interfaces.cli.output import Output


def _password_from_stdin(args) -> str | None:
    return sys.stdin.readline().rstrip("\r\n") if args.password_stdin else None


def cmd_operator_create(args, out: Output) -> int:
    password = _password_from_stdin(args)
    return act(args, out, lambda c: c.app.create_operator(args.name, password, caller=CLI),
        lambda r: f"operator {r['name']} created" + (f"\npassword: {r['password']}" if r["password"] else ""))


def cmd_operator_reset_password(args, out: Output) -> int:
    password = _password_from_stdin(args)
    return act(args, out, lambda c: c.app.reset_password(args.name, password, caller=CLI),
        lambda r: f"password of operator {r['name']} reset" + (f"\npassword: {r['password']}" if r["password"] else ""))


def cmd_operator_token(args, out: Output) -> int:
    return act(args, out, lambda c: c.app.mint_operator_token(args.name, caller=CLI),
        lambda r: f"token: {r['token']}\n(shown once: store it now)")


def cmd_secrets_reseal(args, out: Output) -> int:
    from interfaces.crypto import AesGcmSecretBox
    from interfaces.settings import check_secret_key

    old = os.environ.get("SWITCHBOARD_SECRET_KEY_OLD")
    if not old:
        raise ConfigurationError("set SWITCHBOARD_SECRET_KEY_OLD to the key the secrets were sealed with")
    old_box = AesGcmSecretBox(check_secret_key(old, "SWITCHBOARD_SECRET_KEY_OLD"))
    return act(args, out, lambda c: c.webhooks.reseal(old_box, caller=CLI),
        lambda r: f"re-sealed {r['resealed']} webhook secret(s) under the current key;"
                  f" {r['already_current']} already were")


# -- parser --------------------------------------------------------------------------------


def add_parsers(groups, command: AddCommand) -> None:
    operator = groups.add_parser("operator", help="operators").add_subparsers(dest="action", required=True, parser_class=Parser)
    p = command(operator, "create", cmd_operator_create, "create an operator (prints a generated password)")
    p.add_argument("name")
    p.add_argument("--password-stdin", action="store_true", help="read the password from the first line of stdin")
    p = command(operator, "token", cmd_operator_token, "mint an operator API token sbo_… (shown once)")
    p.add_argument("name")
    p = command(operator, "reset-password", cmd_operator_reset_password,
                "set a new password (prints a generated one once)")
    p.add_argument("name")
    p.add_argument("--password-stdin", action="store_true", help="read the password from the first line of stdin")

    secrets_group = groups.add_parser("secrets", help="webhook signing secrets at rest").add_subparsers(
        dest="action", required=True, parser_class=Parser)
    command(secrets_group, "reseal", cmd_secrets_reseal,
            "re-seal every signing secret under SWITCHBOARD_SECRET_KEY (SWITCHBOARD_SECRET_KEY_OLD opens them)")
