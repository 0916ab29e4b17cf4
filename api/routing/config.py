"""How the routing step behaves: circuit breakers, the adapter load deadline, the rollout cache, A/B readouts."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class RoutingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    breaker_failures: int = Field(default=5, ge=1, description="Consecutive failures of an adapter version "
                                  "(load failures, load deadlines, server errors) that open its circuit breaker.")
    breaker_open_s: float = Field(default=30.0, ge=0, description="How long an open breaker refuses its version "
                                  "before letting one probe request through (half-open).")
    adapter_load_deadline_s: float = Field(default=60.0, gt=0, description="Longest wait for an adapter version "
                                           "to load before the request falls back (or fails with 503).")
    rollout_refresh_s: float = Field(default=1.0, ge=0, description="How often a server re-reads the active "
                                     "rollouts and fallback chains from the registry index, seconds.")
    ab_min_samples: int = Field(default=30, ge=2, description="Requests per arm (and feedback scores per arm) "
                                "below which an A/B report says 'not enough data' instead of a p-value.")
