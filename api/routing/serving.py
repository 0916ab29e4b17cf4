"""The routing API's logic (no FastAPI): rollouts started, promoted, aborted and reported, fallback chains set,
feedback recorded. Every change is written to the registry index and seen by the routing step at once here
(and within `rollout_refresh_s` by other servers on the same index)."""

from __future__ import annotations

from adapters.identity import check_name
from adapters.index import RegistryError, VersionNotFound
from adapters.rollouts import FallbackChain, NoActiveRollout, RolloutStore
from api.auth import Caller
from api.errors import OpenAIError, bad_request
from api.routing.breaker import BreakerState
from api.routing.protocol import (
    EndRequest,
    FallbackRequest,
    FallbackView,
    FeedbackRequest,
    FeedbackView,
    RolloutList,
    RolloutReport,
    RolloutRequest,
    RolloutView,
)
from api.routing.report import build_report, rollout_view
from api.routing.traffic import Traffic

BREAKER_NAMES = {BreakerState.CLOSED: "closed", BreakerState.HALF_OPEN: "half_open", BreakerState.OPEN: "open"}


def _name(name: str) -> str:
    try:
        return check_name(name)
    except ValueError as e:
        raise bad_request(str(e), param="name") from e


class RoutingService:
    def __init__(self, store: RolloutStore, traffic: Traffic, min_samples: int):
        self.store = store
        self.traffic = traffic
        self.min_samples = min_samples

    def start(self, name: str, body: RolloutRequest) -> RolloutView:
        try:
            rollout = self.store.start(_name(name), body.candidate, body.percent, body.sticky, body.shadow_percent,
                                       body.guard)
        except VersionNotFound as e:
            raise OpenAIError(404, str(e), param="candidate", code="adapter_not_found") from e
        except RegistryError as e:
            raise OpenAIError(409, str(e), code="rollout_conflict") from e
        self.traffic.invalidate()
        return rollout_view(rollout)

    def promote(self, name: str) -> RolloutView:
        try:
            rollout = self.store.promote(_name(name))
        except NoActiveRollout as e:
            raise OpenAIError(404, str(e), param="name", code="no_active_rollout") from e
        self.traffic.invalidate()
        return rollout_view(rollout)

    def abort(self, name: str, body: EndRequest) -> RolloutView:
        try:
            rollout = self.store.end(_name(name), "aborted", body.reason or "aborted by an operator")
        except NoActiveRollout as e:
            raise OpenAIError(404, str(e), param="name", code="no_active_rollout") from e
        self.traffic.invalidate()
        return rollout_view(rollout)

    def report(self, name: str) -> RolloutReport:
        try:
            rollout = self.store.latest(_name(name))
        except VersionNotFound as e:
            raise OpenAIError(404, str(e), param="name", code="no_rollout") from e
        return build_report(rollout, self.store.outcomes(rollout.id), self.store.shadows(rollout.id),
                            self.store.events(rollout.id), self.min_samples)

    def list(self) -> RolloutList:
        return RolloutList(data=[rollout_view(r) for r in self.store.history()],
                           breakers={label: BREAKER_NAMES[state]
                                     for label, state in sorted(self.traffic.breakers.states().items())})

    def set_fallback(self, name: str, body: FallbackRequest) -> FallbackView:
        self.store.set_fallback(_name(name), FallbackChain(previous=body.previous, base=body.base))
        self.traffic.invalidate()
        return FallbackView(name=name, previous=body.previous, base=body.base)

    def feedback(self, caller: Caller, body: FeedbackRequest) -> FeedbackView:
        if not self.store.feedback(body.request_id, caller.tenant, body.score):
            raise OpenAIError(404, f"No request {body.request_id!r} of yours was routed by a rollout.",
                              param="request_id", code="request_not_found")
        return FeedbackView(request_id=body.request_id, score=body.score)

    def panel(self) -> dict:
        """The dashboard's routing panel: active and recent rollouts with per-arm figures, breakers."""
        rollouts = []
        for rollout in self.store.history(limit=10):
            report = build_report(rollout, self.store.outcomes(rollout.id), self.store.shadows(rollout.id), [],
                                  self.min_samples)
            rollouts.append({
                "id": rollout.id, "name": rollout.name, "policy": report.rollout.policy, "state": rollout.state,
                "percent": rollout.percent, "reason": rollout.reason,
                "arms": [{"arm": a.arm, "model": a.model, "requests": a.requests, "error_rate": a.error_rate,
                          "ttft_p95_s": a.ttft_s.p95} for a in report.arms],
                "shadow": {"completed": report.shadow.completed, "exact_match_rate": report.shadow.exact_match_rate},
            })
        breakers = sorted(self.traffic.breakers.states().items())
        return {"rollouts": rollouts, "breakers": {label: BREAKER_NAMES[state] for label, state in breakers}}
