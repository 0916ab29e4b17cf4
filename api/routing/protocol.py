"""Wire format of the routing API: starting and ending rollouts, their reports, fallback chains, feedback."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from adapters.identity import MAX_VERSION
from adapters.rollouts import RolloutGuard


class RolloutRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    candidate: int = Field(ge=1, le=MAX_VERSION, description="Version of the same name to roll out.")
    percent: float = Field(ge=0, le=100, description="Share of the name's traffic the candidate serves.")
    sticky: bool = Field(default=False, description="Assign by a hash of the request's `user` (else its tenant), "
                         "so each user keeps one arm: an A/B test. Otherwise each request is assigned on its own.")
    shadow_percent: float = Field(default=0, ge=0, le=100, description="Share of the stable arm's requests also "
                                  "run on the candidate in the background, never returned.")
    guard: RolloutGuard = Field(default_factory=RolloutGuard, description="When the candidate is rolled back "
                                "automatically.")


class EndRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="", max_length=500, description="Why, for the rollout's events.")


class FallbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    previous: bool = Field(description="Serve the version `stable` pointed at before, when the stable one cannot.")
    base: bool = Field(description="Then serve the base model (for tenants allowed to use it).")


class FallbackView(FallbackRequest):
    name: str


class FeedbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(min_length=1, max_length=256, description="The X-Request-Id of a routed request.")
    score: float = Field(ge=-1, le=1, description="The outcome: -1 bad ... 1 good.")


class FeedbackView(BaseModel):
    object: Literal["feedback"] = "feedback"
    request_id: str
    score: float


class RolloutView(BaseModel):
    id: int
    name: str
    stable: str = Field(description="The stable arm, name@version.")
    candidate: str = Field(description="The candidate arm, name@version.")
    percent: float
    sticky: bool
    policy: Literal["canary", "ab"]
    shadow_percent: float
    guard: RolloutGuard
    state: Literal["active", "promoted", "aborted", "rolled_back"]
    reason: str
    started_at: str
    ended_at: str | None


class Quantiles(BaseModel):
    p50: float | None
    p95: float | None


class ArmReport(BaseModel):
    arm: Literal["stable", "candidate"]
    model: str = Field(description="name@version")
    requests: int
    errors: int = Field(description="Requests ending in a server error (5xx).")
    error_rate: float | None
    ttft_s: Quantiles
    tpot_s: Quantiles
    completion_tokens: int
    cost_usd: float
    mean_logprob: float | None = Field(description="Mean output-token logprob over requests that asked for "
                                       "logprobs.")
    feedback_count: int
    feedback_mean: float | None


class Comparison(BaseModel):
    metric: str = Field(description="error_rate (two-proportion z-test), ttft or feedback (Mann-Whitney U).")
    test: str
    stable: float | None = Field(description="The stable arm's value (rate or median).")
    candidate: float | None
    statistic: float | None
    p_value: float | None
    verdict: str = Field(description="'not enough data (n < N per arm)', 'no significant difference' or "
                         "'significant at 5%'.")


class ShadowReport(BaseModel):
    completed: int
    exact_match_rate: float | None
    mean_token_overlap: float | None
    completion_tokens: int
    internal_cost_usd: float


class RolloutReport(BaseModel):
    rollout: RolloutView
    min_samples: int = Field(description="Per arm, below which a comparison says 'not enough data'.")
    arms: list[ArmReport]
    comparisons: list[Comparison]
    shadow: ShadowReport
    events: list[dict]


class RolloutList(BaseModel):
    object: Literal["list"] = "list"
    data: list[RolloutView]
    breakers: dict[str, Literal["closed", "half_open", "open"]]
