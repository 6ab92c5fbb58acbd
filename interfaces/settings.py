"""Settings from the environment (CONTRACT §1), each overridable by a `serve` flag."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, replace
from pathlib import Path

from application.errors import ConfigurationError


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
    pg_pool_size: int = 10

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        get = env.get
        try:
            port = int(get("SWITCHBOARD_PORT", "8080"))
            rate = float(get("SWITCHBOARD_INGEST_RATE", "50"))
            burst = int(get("SWITCHBOARD_INGEST_BURST", "100"))
            pg_pool_size = int(get("SWITCHBOARD_PG_POOL_SIZE") or "10")
        except ValueError as error:
            raise ConfigurationError(f"bad numeric setting: {error}") from None
        data_dir = get("SWITCHBOARD_DATA_DIR", "./var")
        return cls(
            database_url=get("SWITCHBOARD_DATABASE_URL") or f"sqlite:///{data_dir.rstrip('/')}/switchboard.db",
            host=get("SWITCHBOARD_HOST", "127.0.0.1"),
            port=port,
            base_url=get("SWITCHBOARD_BASE_URL", f"http://127.0.0.1:{port}"),
            data_dir=data_dir,
            secret_key=get("SWITCHBOARD_SECRET_KEY") or None,
            ingest_rate=rate,
            ingest_burst=burst,
            metrics_token=get("SWITCHBOARD_METRICS_TOKEN") or None,
            pg_pool_size=pg_pool_size,
        )

    def with_overrides(self, **values: object) -> Settings:
        return replace(self, **{k: v for k, v in values.items() if v is not None})

    def check(self) -> None:
        """Refuses settings that cannot work, with one clear line."""
        if self.metrics_token is not None and len(self.metrics_token) < 32:
            raise ConfigurationError("SWITCHBOARD_METRICS_TOKEN must be at least 32 characters")
        if not 0 < self.port < 65536:
            raise ConfigurationError(f"bad port {self.port}")
        if not 1 <= self.pg_pool_size <= 1000:
            raise ConfigurationError(f"SWITCHBOARD_PG_POOL_SIZE must be within 1..1000, not {self.pg_pool_size}")

    def resolved_secret_key(self) -> str:
        """The explicit key, else `<data dir>/secret-key`, generated there (0600) on first use."""
        if self.secret_key:
            return self.secret_key
        path = Path(self.data_dir) / "secret-key"
        if path.exists():
            return path.read_text().strip()
        path.parent.mkdir(parents=True, exist_ok=True)
        key = secrets.token_hex(32)
        write_private(path, key + "\n")
        return key


def write_private(path: Path, text: str) -> None:
    """Writes a file readable by its owner only (0600), created that way."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)
