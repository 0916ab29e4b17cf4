"""What a request costs the tenant (price list) and what it cost us (measured engine time)."""

from __future__ import annotations

from dataclasses import dataclass

from api.tenancy.config import FREE, PricingConfig, TenancyConfig, TokenPrices

PER = 1_000_000
DEFAULT_BATCH_DISCOUNT = 0.5


@dataclass(frozen=True)
class Rates:
    prompt_per_million: float
    completion_per_million: float


class PriceTable:
    """Rates by precedence: tenant's model price, tenant's default, server's model price, server's default."""

    def __init__(self, config: TenancyConfig):
        self._config = config

    def rates(self, tenant: str, model_name: str) -> Rates:
        """`model_name` is the base model id or the adapter name. Unknown tenants pay server prices."""
        override = self._tenant_pricing(tenant)
        server = self._config.pricing
        layers = [override.models.get(model_name), override.default] if override else []
        layers += [server.models.get(model_name), server.default]
        return _rates(next((p for p in layers if p is not None), FREE))

    def price(self, tenant: str, model: str, prompt_tokens: int, completion_tokens: int) -> float:
        r = self.rates(tenant, model)
        return (prompt_tokens * r.prompt_per_million + completion_tokens * r.completion_per_million) / PER

    def batch_discount(self, tenant: str) -> float:
        """Fraction off batch lines' prices: the tenant's, else the server's, else OpenAI's 0.5."""
        override = self._tenant_pricing(tenant)
        for pricing in (override, self._config.pricing):
            if pricing is not None and pricing.batch_discount is not None:
                return pricing.batch_discount
        return DEFAULT_BATCH_DISCOUNT

    def _tenant_pricing(self, tenant: str) -> PricingConfig | None:
        try:
            return self._config.tenant(tenant).pricing
        except KeyError:
            return None


def _rates(prices: TokenPrices) -> Rates:
    return Rates(prompt_per_million=prices.prompt, completion_per_million=prices.completion)


class ComputeMeter:
    """Turns measured engine time into a cost per token.

    Fed once per engine step. The time since the previous step is billed only if the engine was busy in
    it, and at most `max_step_s`, so idle gaps between bursts cost nothing. The cost per token of each
    step with tokens is smoothed exponentially (`smoothing` = weight of the newest step).
    """

    def __init__(self, cost_per_hour: float, max_step_s: float = 1.0, smoothing: float = 0.1):
        if cost_per_hour < 0 or max_step_s <= 0 or not 0 < smoothing <= 1:
            raise ValueError(f"need cost_per_hour >= 0, max_step_s > 0, 0 < smoothing <= 1; got "
                             f"{cost_per_hour}, {max_step_s}, {smoothing}")
        self.cost_per_second = cost_per_hour / 3600
        self.max_step_s = max_step_s
        self.smoothing = smoothing
        self.usd_per_token = 0.0
        self.total_cost_usd = 0.0
        self.busy_seconds = 0.0
        self._last_step: float | None = None
        self._measured = False

    def on_step(self, now: float, tokens_in_step: int, busy: bool) -> None:
        previous, self._last_step = self._last_step, now
        if previous is None or not busy:
            return
        seconds = min(max(0.0, now - previous), self.max_step_s)
        cost = seconds * self.cost_per_second
        self.busy_seconds += seconds
        self.total_cost_usd += cost
        if tokens_in_step <= 0:
            return
        step_rate = cost / tokens_in_step
        if self._measured:
            self.usd_per_token += self.smoothing * (step_rate - self.usd_per_token)
        else:
            self.usd_per_token, self._measured = step_rate, True

    def charge(self, tokens: int) -> float:
        """Compute cost attributed to `tokens` at the current rate."""
        return tokens * self.usd_per_token
