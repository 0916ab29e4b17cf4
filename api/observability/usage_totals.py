"""Running totals of finished requests since start, per tenant and per adapter version, with their SLO windows:
what the dashboard shows beside the windowed percentiles."""

from __future__ import annotations

from dataclasses import dataclass

from api.observability.slo import WindowSummary


@dataclass
class UsageTotals:
    """Running totals since start of one label set or group."""

    requests: int = 0
    errors: int = 0  # 5xx
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    price_usd: float = 0.0

    def add(self, other: UsageTotals) -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cost_usd += other.cost_usd
        self.price_usd += other.price_usd

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def cost_per_1k_tokens(self) -> float | None:
        return self.cost_usd * 1000 / self.tokens if self.tokens else None

    @property
    def price_per_1k_tokens(self) -> float | None:
        return self.price_usd * 1000 / self.tokens if self.tokens else None


@dataclass(frozen=True)
class GroupSnapshot:
    totals: UsageTotals
    windows: dict[str, WindowSummary]  # by window name; empty when nothing arrived within the longest window


@dataclass(frozen=True)
class MetricsSnapshot:
    tenants: dict[str, GroupSnapshot]  # by bounded tenant label
    models: dict[str, GroupSnapshot]  # by bounded "model@version" label
