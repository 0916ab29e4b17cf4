"""What one finished request was: the single record that metrics, SLOs, logs and the usage ledger read."""

from __future__ import annotations

from dataclasses import dataclass

# Client closed the connection before the response finished (nginx's convention).
STATUS_CLIENT_CLOSED = 499
# Tenant and model of requests refused before either was known: user strings never become label values.
UNKNOWN = "unknown"


@dataclass(frozen=True)
class RequestOutcome:
    request_id: str
    tenant: str
    priority: str
    model: str  # base model id or adapter name, never a raw user string
    version: str  # adapter version ("3"), "" for the base model
    status: int  # HTTP status; 499 when the client went away
    prompt_tokens: int
    completion_tokens: int  # tokens actually handed to the client
    queue_seconds: float  # waiting for admission in front of the engine
    ttft_seconds: float | None  # arrival to first output token
    e2e_seconds: float  # arrival to last byte
    inter_token_seconds: tuple[float, ...]  # gaps between successive output chunks after the first
    price_usd: float  # what the tenant is charged
    cost_usd: float  # measured compute cost attributed to this request
    finished_at: float  # unix time
    route: str = ""  # routing policy and arm, and the fallback taken if any ("canary;arm=candidate;rollout=3")
    # How the usage ledger takes it: "row", one row per request (a reused id gets a row of its own); "once",
    # `request_id` is a stable key of the work (a batch line's) and a second row under it, a line run again after
    # a crash, is dropped; "none", no row (a batch line's attempt stopped before it finished: it runs again).
    billing: str = "row"
    attempt_id: str = ""  # the id the request ran under, when `request_id` is the work's key (a batch line's)

    @property
    def model_version(self) -> str:
        return f"{self.model}@{self.version}" if self.version else self.model

    @property
    def tpot_seconds(self) -> float | None:
        """Time per output token after the first."""
        if self.ttft_seconds is None or self.completion_tokens < 2:
            return None
        return (self.e2e_seconds - self.ttft_seconds) / (self.completion_tokens - 1)

    @property
    def succeeded(self) -> bool:
        return self.status < 500
