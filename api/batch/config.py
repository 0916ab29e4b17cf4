"""How batches and async jobs run: where their state and files live, their limits."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from adapters.home import data_home
from api.batch.store import default_store_path


class BatchConfig(BaseModel):
    """The CLI's `--batch-*` and `--files-*` flags are generated from these fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_store_path: str | None = Field(default=None, description="SQLite file of batches, lines and async jobs "
                                         "(default: $LORAPLEX_HOME/batches.sqlite, whatever --ledger-url is).")
    files_store_uri: str | None = Field(default=None, description="Where uploaded and result files live: a folder, "
                                        "file:///path or s3://bucket/prefix (default: $LORAPLEX_HOME/files).")
    files_max_bytes: int = Field(default=100 * 2**20, ge=1, description="Largest file POST /v1/files accepts.")
    batch_max_lines: int = Field(default=50_000, ge=1, description="Most request lines in one batch input file.")
    batch_max_running_lines: int = Field(default=32, ge=1, description="Batch lines in flight at once (each still "
                                         "waits for engine capacity live traffic leaves free).")
    batch_retry_s: float = Field(default=1.0, gt=0, description="Wait before a line refused for a passing reason "
                                 "(rate limit, overload) is tried again.")
    async_result_ttl_s: float = Field(default=24 * 3600.0, gt=0, description="How long an async job's result is "
                                      "kept after it finishes.")
    async_webhook_prefixes: str = Field(default="", description="Comma-separated URL prefixes an async job's "
                                        "webhook may start with (default: none, webhooks refused).")

    def store_path(self) -> Path:
        return Path(self.batch_store_path) if self.batch_store_path else default_store_path()

    def files_uri(self) -> str:
        return self.files_store_uri or str(data_home() / "files")

    def webhook_prefixes(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.async_webhook_prefixes.split(",") if p.strip())
