"""End to end: running `serve` for real (CONTRACT §12) — the secret key, the first start, the
recorded base URL and start-up failures — with real `serve` processes and the real CLI."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.e2e._support import SWITCHBOARD_SCRIPT, UNREACHABLE_PG, Cli, Server, clean_env, free_port, run_serve
from tests.fixtures import sign

KEY_1 = "1a" * 32
KEY_2 = "2b" * 32
PASSWORD_LINE = re.compile(r"^created operator admin with password: (\S+)", re.M)


def one_line(result: subprocess.CompletedProcess, says: str) -> str:
    """A refused start: exit 1, one stderr line saying `says`, no traceback, nothing "serving"."""
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0], result.stderr
    assert "serving" not in result.stdout, result.stdout
    return lines[0]


def audit(cli: Cli) -> list[dict]:
    return [json.loads(line) for line in cli.run("audit", "export").ok().stdout.splitlines()]


def signed_ping(hook: dict, server: Server) -> httpx.Response:
    """A correctly signed GitHub ping to the hook, on this server."""
    url = server.base + "/webhooks/w/" + hook["ingest_url"].rsplit("/", 1)[1]
    body = json.dumps({"zen": "Design for failure.", "hook_id": 1}).encode()
    headers = {"content-type": "application/json", "x-github-event": "ping",
               "x-github-delivery": str(uuid.uuid4()), **sign("github", hook["signing_secret"], body)}
    return httpx.post(url, content=body, headers=headers, timeout=30)


def serve_once(data_dir: Path, logs: Path, url: str | None, name: str, **env: str) -> Server:
    server = Server(data_dir, logs, url=url, name=name, **env).start()
    try:
        server.wait_healthy()
    except BaseException:
        server.stop()
        raise
    return server


# -- secret key ------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["abc", "g" * 64, "a" * 63, "a" * 65, "sbk_" + "a" * 60])
def test_a_malformed_secret_key_stops_serve(tmp_path, key):
    one_line(run_serve(tmp_path / "var", timeout=10, SWITCHBOARD_SECRET_KEY=key),
             "SWITCHBOARD_SECRET_KEY must be 64 hex characters")
    assert not (tmp_path / "var" / "admin-password").exists()


def test_a_malformed_key_file_stops_serve(tmp_path):
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "secret-key").write_text("not a key\n")
    one_line(run_serve(tmp_path / "var", timeout=10), "secret-key must be 64 hex characters")


@pytest.mark.postgres
def test_serve_on_postgresql_needs_an_explicit_key(pg_url, tmp_path):
    one_line(run_serve(tmp_path / "var", timeout=10, SWITCHBOARD_DATABASE_URL=pg_url, SWITCHBOARD_SECRET_KEY=""),
             "SWITCHBOARD_SECRET_KEY must be set on PostgreSQL")
    assert not (tmp_path / "var" / "secret-key").exists()
    # and the CLI does not seal a secret under a key of its data dir either
    cli = Cli(pg_url, tmp_path)
    cli.run("operator", "create", "admin", env={"SWITCHBOARD_SECRET_KEY": ""}).ok()
    vended = cli.json("endpoint", "vend", "bot", "--queue", "q", env={"SWITCHBOARD_SECRET_KEY": ""})
    cli.run("webhook", "create", "--endpoint", vended["slug"], "--source", "github", "--queue", "q",
            env={"SWITCHBOARD_SECRET_KEY": ""}).refused("invalid_configuration")


def test_a_moved_key_file_stops_serve_instead_of_failing_every_delivery(tmp_path):
    """SQLite, the key generated in the data dir: moved away, serve refuses to start (it used to
    start and answer 500 to every correctly signed delivery); put back, all is well."""
    data_dir = tmp_path / "var"
    first = serve_once(data_dir, tmp_path, None, "first")
    try:
        cli = Cli(None, data_dir)
        vended = cli.json("endpoint", "vend", "bot", "--queue", "q")
        hook = cli.json("webhook", "create", "--endpoint", vended["slug"], "--source", "github", "--queue", "q")
        assert signed_ping(hook, first).status_code == 202
    finally:
        first.stop()
    shutil.move(data_dir / "secret-key", tmp_path / "secret-key.moved")
    line = one_line(run_serve(data_dir, timeout=20, port=free_port()), "secret-key is missing")
    assert "1 webhook signing secret" in line
    assert not (data_dir / "secret-key").exists()  # no new key generated that could never open them
    shutil.move(tmp_path / "secret-key.moved", data_dir / "secret-key")
    second = serve_once(data_dir, tmp_path, None, "second")
    try:
        assert signed_ping(hook, second).status_code == 202
    finally:
        second.stop()


def test_a_key_rotation_with_secrets_reseal(store_url, tmp_path):
    """A key that cannot open the sealed secrets stops serve; `secrets reseal` with the old key in
    SWITCHBOARD_SECRET_KEY_OLD re-seals them (an event per webhook) and the webhooks keep working."""
    data_dir = tmp_path / "var"
    cli = Cli(store_url, data_dir)
    first = serve_once(data_dir, tmp_path, store_url, "first", SWITCHBOARD_SECRET_KEY=KEY_1)
    try:
        vended = cli.json("endpoint", "vend", "bot", "--queue", "q", env={"SWITCHBOARD_SECRET_KEY": KEY_1})
        hooks = [cli.json("webhook", "create", "--endpoint", vended["slug"], "--source", source, "--queue", "q",
                          env={"SWITCHBOARD_SECRET_KEY": KEY_1}) for source in ("github", "gitea", "generic")]
        assert signed_ping(hooks[0], first).status_code == 202
    finally:
        first.stop()

    line = one_line(run_serve(data_dir, timeout=20, SWITCHBOARD_DATABASE_URL=store_url, SWITCHBOARD_SECRET_KEY=KEY_2),
                    "cannot open the signing secrets of 2 of 2 webhook(s)")
    assert "secrets reseal" in line

    wrong_old = cli.run("secrets", "reseal", env={"SWITCHBOARD_SECRET_KEY": KEY_2,
                                                  "SWITCHBOARD_SECRET_KEY_OLD": "3c" * 32})
    assert "nothing was re-sealed" in wrong_old.refused("invalid_configuration")
    cli.run("secrets", "reseal", env={"SWITCHBOARD_SECRET_KEY": KEY_2}).refused("invalid_configuration")
    assert not [e for e in audit(cli) if e["type"] == "WebhookSecretResealed"]

    env = {"SWITCHBOARD_SECRET_KEY": KEY_2, "SWITCHBOARD_SECRET_KEY_OLD": KEY_1}
    resealed = cli.json("secrets", "reseal", env=env)
    assert resealed["resealed"] == 2 and resealed["already_current"] == 0
    assert set(resealed["webhooks"]) == {hooks[0]["webhook_id"], hooks[1]["webhook_id"]}
    again = cli.run("secrets", "reseal", env=env).ok()  # idempotent
    assert again.stdout.strip() == "re-sealed 0 webhook secret(s) under the current key; 2 already were"
    events = [e for e in audit(cli) if e["type"] == "WebhookSecretResealed"]
    assert len(events) == 2 and {e["actor"] for e in events} == {"operator:cli"}
    assert KEY_1 not in json.dumps(events) and hooks[0]["signing_secret"] not in json.dumps(events)
    cli.run("projections", "rebuild", "--verify", env=env).ok()

    second = serve_once(data_dir, tmp_path, store_url, "second", SWITCHBOARD_SECRET_KEY=KEY_2)
    try:
        assert signed_ping(hooks[0], second).status_code == 202  # the same URL and secret as before
    finally:
        second.stop()
    assert "Traceback" not in second.stderr(), second.output()


# -- first start -----------------------------------------------------------------------------


def test_a_second_store_never_overwrites_admin_password(store_url, tmp_path):
    """Two stores, one data dir: the second start creates its own admin and prints its password,
    but the first store's password file stays as it was."""
    data_dir = tmp_path / "var"
    first = serve_once(data_dir, tmp_path, f"sqlite:///{tmp_path}/first.db", "first")
    first.stop()
    first_password = PASSWORD_LINE.findall(first.stdout())[0]
    password_file = data_dir / "admin-password"
    assert password_file.read_text().strip() == first_password

    second = serve_once(data_dir, tmp_path, store_url, "second", SWITCHBOARD_SECRET_KEY=KEY_1)
    second.stop()
    printed = PASSWORD_LINE.findall(second.stdout())
    assert len(printed) == 1 and printed[0] != first_password, second.output()
    assert f"not written to {password_file}" in second.stdout()
    assert password_file.read_text().strip() == first_password
    first_cli, second_cli = Cli(f"sqlite:///{tmp_path}/first.db", data_dir), Cli(store_url, data_dir)
    assert first_cli.run("operator", "token", "admin").code == 0 and second_cli.run("operator", "token", "admin").code == 0


def test_operator_reset_password(store_url, tmp_path, make_container):
    cli = Cli(store_url, tmp_path)
    cli.run("operator", "create", "admin").ok()
    app = make_container(store_url).app

    text = cli.run("operator", "reset-password", "admin").ok()
    assert text.stdout.startswith("password of operator admin reset\npassword: ")
    generated = text.stdout.split("password: ", 1)[1].strip()
    assert len(generated) >= 16 and app.verify_password("admin", generated)

    quiet = cli.run("operator", "reset-password", "admin", "--password-stdin", stdin="correct horse battery\n").ok()
    assert quiet.stdout.strip() == "password of operator admin reset"
    assert app.verify_password("admin", "correct horse battery") and not app.verify_password("admin", generated)
    as_json = cli.json("operator", "reset-password", "admin", "--password-stdin", stdin="another long one\n")
    assert as_json == {"name": "admin", "password": None}

    cli.run("operator", "reset-password", "ghost").refused("not_found")
    cli.run("operator", "reset-password", "admin", "--password-stdin", stdin="short\n").refused("invalid_argument")
    assert app.verify_password("admin", "another long one")

    resets = [e for e in audit(cli) if e["type"] == "OperatorPasswordReset"]
    assert len(resets) == 3 and {e["actor"] for e in resets} == {"operator:cli"}
    assert {e["data"]["password_hash"] for e in resets} == {"«redacted»"}
    cli.run("projections", "rebuild", "--verify").ok()


# -- base URL --------------------------------------------------------------------------------


def test_the_cli_mints_urls_with_the_base_url_serve_recorded(store_url, tmp_path):
    data_dir = tmp_path / "var"
    data_dir.mkdir()
    cli = Cli(store_url, data_dir)
    cli.run("operator", "create", "admin").ok()
    before = cli.json("endpoint", "vend", "early", "--queue", "q")
    assert before["mcp_url"].startswith("http://127.0.0.1:8080/mcp/")  # nothing recorded yet: the default

    server = serve_once(data_dir, tmp_path, store_url, "first")
    server.stop()
    vended = cli.json("endpoint", "vend", "bot", "--queue", "q")
    assert vended["mcp_url"] == f"{server.base}/mcp/{vended['slug']}"
    hook = cli.json("webhook", "create", "--endpoint", vended["slug"], "--source", "generic", "--queue", "q")
    assert hook["ingest_url"].startswith(f"{server.base}/webhooks/w/")
    # an explicit setting wins: the environment, or the flag
    by_env = cli.json("endpoint", "vend", "env", "--queue", "q", env={"SWITCHBOARD_BASE_URL": "https://sb.example"})
    assert by_env["mcp_url"].startswith("https://sb.example/mcp/")
    by_flag = cli.json("endpoint", "vend", "flag", "--queue", "q", "--base-url", "https://flag.example/")
    assert by_flag["mcp_url"].startswith("https://flag.example/mcp/")

    # an event when it changes, none when a restart keeps it
    again = Server(data_dir, tmp_path, url=store_url, name="again")
    again.port, again.base = server.port, server.base
    again.start()
    try:
        again.wait_healthy()
    finally:
        again.stop()
    proxied = serve_once(data_dir, tmp_path, store_url, "proxied", SWITCHBOARD_BASE_URL="https://sb.example.org")
    proxied.stop()
    recorded = [e for e in audit(cli) if e["type"] == "BaseUrlRecorded"]
    assert [e["data"]["base_url"] for e in recorded] == [server.base, "https://sb.example.org"]
    assert {e["actor"] for e in recorded} == {"system:serve"}
    assert cli.json("endpoint", "vend", "late", "--queue", "q")["mcp_url"].startswith("https://sb.example.org/mcp/")
    cli.run("projections", "rebuild", "--verify").ok()


# -- start-up failures -----------------------------------------------------------------------


def test_a_taken_port_is_one_line_before_anything_says_serving(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        result = run_serve(tmp_path / "var", port=port)
    assert time.monotonic() - started < 5
    assert one_line(result, "") == f"switchboard: cannot listen on 127.0.0.1:{port}: address already in use"
    assert result.stdout == ""  # no password printed for an admin of a server that never ran
    assert not (tmp_path / "var" / "admin-password").exists()


@pytest.mark.parametrize("where", ["make-run", "new-dirs"])
def test_a_taken_port_leaves_nothing_on_disk(tmp_path, where):
    """`make run` (./var under the directory it runs in) or new nested directories for the data
    dir and the SQLite file: a start refused for its port creates none of them."""
    cwd = tmp_path / "cwd"
    env = ({"SWITCHBOARD_DATA_DIR": "var"} if where == "make-run" else
           {"SWITCHBOARD_DATA_DIR": str(tmp_path / "new" / "var"),
            "SWITCHBOARD_DATABASE_URL": f"sqlite:///{tmp_path}/db/dir/switchboard.db"})
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_serve(cwd, port=port, **env)
    assert one_line(result, "") == f"switchboard: cannot listen on 127.0.0.1:{port}: address already in use"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cwd"]
    assert list(cwd.iterdir()) == []


def test_an_unreachable_store_leaves_no_new_data_dir(tmp_path):
    data_dir = tmp_path / "new" / "var"
    result = run_serve(tmp_path / "cwd", timeout=20, SWITCHBOARD_DATA_DIR=str(data_dir),
                       SWITCHBOARD_DATABASE_URL=UNREACHABLE_PG)
    one_line(result, "cannot reach PostgreSQL")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cwd"]


def test_a_data_dir_that_cannot_be_created(tmp_path):
    (tmp_path / "a-file").write_text("")
    data_dir = tmp_path / "a-file" / "var"
    assert one_line(run_serve(tmp_path / "cwd", timeout=10, SWITCHBOARD_DATA_DIR=str(data_dir)), "") == (
        f"switchboard: cannot create data dir {data_dir}: not a directory")


def _read_only(mount: str, target: Path, *command: str, timeout: float = 20) -> subprocess.CompletedProcess:
    """Runs a command in a private mount namespace where `target` is read-only (root only)."""
    script = {"tmpfs": 'mount -t tmpfs -o ro none "$0"', "bind": 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0"'}
    probe = subprocess.run(["unshare", "-m", "sh", "-c", script[mount] + ' && exec "$@"', str(target), "true"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a read-only mount here: {probe.stderr.decode().strip()}")
    return subprocess.run(["unshare", "-m", "sh", "-c", script[mount] + ' && exec "$@"', str(target), *command],
                          capture_output=True, text=True, timeout=timeout, env=clean_env(target),
                          cwd=target.parent)


def test_a_read_only_data_dir_or_file_system(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    serve = (SWITCHBOARD_SCRIPT, "serve", "--port", str(free_port()))
    # a data dir to create on a read-only file system
    result = _read_only("tmpfs", ro, "env", f"SWITCHBOARD_DATA_DIR={ro}/var", *serve)
    assert one_line(result, "") == f"switchboard: cannot create data dir {ro}/var: read-only file system"
    # the data dir itself on a read-only file system
    result = _read_only("tmpfs", ro, "env", f"SWITCHBOARD_DATA_DIR={ro}", *serve)
    assert one_line(result, "") == f"switchboard: cannot write data dir {ro}: read-only file system"
    # an existing store whose database file has become read-only (the data dir elsewhere, writable)
    first = serve_once(ro, tmp_path, None, "first")
    first.stop()
    data_dir = tmp_path / "elsewhere"
    result = _read_only("bind", ro, "env", f"SWITCHBOARD_DATA_DIR={data_dir}",
                        f"SWITCHBOARD_DATABASE_URL=sqlite:///{ro}/switchboard.db", f"SWITCHBOARD_SECRET_KEY={KEY_1}",
                        *serve)
    assert one_line(result, "") == f"switchboard: cannot write database directory {ro}: read-only file system"
