"""Settings from the environment (CONTRACT §1), each overridable by a `serve` flag."""

from __future__ import annotations

import math
import os
import re
import secrets
from dataclasses import dataclass, replace
from pathlib import Path

from application.errors import ConfigurationError
from domain.errors import InvalidArgument
from domain.installation import check_base_url
from interfaces.clock import read_offset

SECRET_KEY_FORMAT = re.compile(r"[0-9a-fA-F]{64}")
DEFAULT_BODY_TIMEOUT_SECONDS = 30.0  # a request body not fully received by then is answered 408


@dataclass(frozen=True)
class Settings:
    database_url: str = "sqlite:///./var/switchboard.db"
    host: str = "127.0.0.1"
    port: int = 8080
    base_url: str = "http://127.0.0.1:8080"
    data_dir: str = "./var"
    secret_key: str | None = None
    ingest_rate: float = 50.0
    ingest_burst: int = 100
    metrics_token: str | None = None
    base_url_explicit: bool = False  # set by SWITCHBOARD_BASE_URL or --base-url, not derived
    body_timeout: float = DEFAULT_BODY_TIMEOUT_SECONDS
    pg_pool_size: int = 10
    retention_days: int | None = None  # unset: keep every payload; else serve prunes daily (CONTRACT §14)
    clock_file: str | None = None  # a test hook: wall time plus the seconds in this file (interfaces/clock.py)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        get = env.get
        def number(kind: type, name: str, default: str):  # one line naming the variable, not int()'s words
            value = get(name) or default
            try:
                return kind(value)
            except ValueError:
                raise ConfigurationError(f"{name} must be a number, not {value!r}") from None

        port = number(int, "SWITCHBOARD_PORT", "8080")
        rate = number(float, "SWITCHBOARD_INGEST_RATE", "50")
        burst = number(int, "SWITCHBOARD_INGEST_BURST", "100")
        body_timeout = number(float, "SWITCHBOARD_BODY_TIMEOUT", str(DEFAULT_BODY_TIMEOUT_SECONDS))
        pg_pool_size = number(int, "SWITCHBOARD_PG_POOL_SIZE", "10")
        retention_days = number(int, "SWITCHBOARD_RETENTION_DAYS", "0") if get("SWITCHBOARD_RETENTION_DAYS") else None
        data_dir = get("SWITCHBOARD_DATA_DIR", "./var")
        return cls(
            database_url=get("SWITCHBOARD_DATABASE_URL") or f"sqlite:///{data_dir.rstrip('/')}/switchboard.db",
            host=get("SWITCHBOARD_HOST", "127.0.0.1"),
            port=port,
            base_url=get("SWITCHBOARD_BASE_URL") or f"http://127.0.0.1:{port}",
            data_dir=data_dir,
            secret_key=get("SWITCHBOARD_SECRET_KEY") or None,
            ingest_rate=rate,
            ingest_burst=burst,
            metrics_token=get("SWITCHBOARD_METRICS_TOKEN") or None,
            base_url_explicit=bool(get("SWITCHBOARD_BASE_URL")),
            body_timeout=body_timeout,
            pg_pool_size=pg_pool_size,
            retention_days=retention_days,
            clock_file=get("SWITCHBOARD_CLOCK_FILE") or None,
        )

    def listen_url(self) -> str:
        """`http://host:port` as a client reaches it (a wildcard host is reached on loopback)."""
        host = "127.0.0.1" if self.host in ("", "0.0.0.0", "::") else self.host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def with_overrides(self, **values: object) -> Settings:
        return replace(self, **{k: v for k, v in values.items() if v is not None})

    def check(self) -> None:
        """Refuses settings that cannot work, with one clear line."""
        if self.metrics_token is not None and len(self.metrics_token) < 32:
            raise ConfigurationError("SWITCHBOARD_METRICS_TOKEN must be at least 32 characters")
        if not 0 < self.port < 65536:
            raise ConfigurationError(f"bad port {self.port}")
        try:
            check_base_url(self.base_url)
        except InvalidArgument:
            raise ConfigurationError(f"bad base URL {self.base_url!r}: expected http://… or https://…") from None
        if not (self.ingest_rate >= 0 and math.isfinite(self.ingest_rate)):  # nan and inf too
            raise ConfigurationError(f"SWITCHBOARD_INGEST_RATE must be 0 (off) or a positive number, not {self.ingest_rate}")
        if self.ingest_burst < 0:
            raise ConfigurationError(f"SWITCHBOARD_INGEST_BURST must be 0 or more, not {self.ingest_burst}")
        if not self.body_timeout > 0:
            raise ConfigurationError("SWITCHBOARD_BODY_TIMEOUT must be a positive number of seconds")
        if self.secret_key is not None:
            check_secret_key(self.secret_key, "SWITCHBOARD_SECRET_KEY")
        elif on_postgres(self.database_url):
            raise ConfigurationError(NO_KEY_ON_POSTGRES)
        if not 1 <= self.pg_pool_size <= 1000:
            raise ConfigurationError(f"SWITCHBOARD_PG_POOL_SIZE must be within 1..1000, not {self.pg_pool_size}")
        if self.retention_days is not None and not 1 <= self.retention_days <= 36500:
            raise ConfigurationError(
                f"SWITCHBOARD_RETENTION_DAYS must be a whole number of days within 1..36500 (unset keeps everything),"
                f" not {self.retention_days}")
        if self.clock_file is not None:
            read_offset(self.clock_file)  # a test hook set by mistake or with a typo: one line at start

    def resolved_secret_key(self) -> str:
        """The explicit key, else `<data dir>/secret-key`, generated there (0600) on first use.

        On PostgreSQL there is no generated key: several processes share the store, and a key of
        one data dir's would not open what another process sealed."""
        if self.secret_key:
            return check_secret_key(self.secret_key, "SWITCHBOARD_SECRET_KEY")
        if on_postgres(self.database_url):
            raise ConfigurationError(NO_KEY_ON_POSTGRES)
        path = Path(self.data_dir) / "secret-key"
        if path.exists():
            return check_secret_key(path.read_text().strip(), str(path))
        path.parent.mkdir(parents=True, exist_ok=True)
        key = secrets.token_hex(32)
        write_private(path, key + "\n")
        return key


NO_KEY_ON_POSTGRES = (
    "SWITCHBOARD_SECRET_KEY must be set on PostgreSQL (64 hex characters, the same in every process):"
    " a key generated per data dir would differ between processes"
)


def on_postgres(database_url: str) -> bool:
    return database_url.startswith(("postgresql:", "postgres:"))


def check_secret_key(key: str, where: str) -> str:
    """A secret key is 64 hex characters (256 bits), e.g. `openssl rand -hex 32`."""
    if not SECRET_KEY_FORMAT.fullmatch(key):
        raise ConfigurationError(f"{where} must be 64 hex characters (e.g. openssl rand -hex 32)")
    return key


def write_private(path: Path, text: str) -> None:
    """Writes a file readable by its owner only (0600), created that way."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)


def write_new_private(path: Path, text: str) -> bool:
    """Writes a new file readable by its owner only (0600); False, touching nothing, when it exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return True
