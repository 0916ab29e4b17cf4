"""Thin routes of the routing API: rollouts and fallback chains (admin key), feedback (a tenant's key)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from api.body import parse_body
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
from api.routing.serving import RoutingService

routing_router = APIRouter(tags=["routing"])


def routing_service(request: Request) -> RoutingService:
    """The routing service, for the admin key only (checked before the body is validated)."""
    server = request.app.state.server
    server.auth.admin(request.headers.get("authorization"))
    return server.routing


Admin = Depends(routing_service)


@routing_router.get("/v1/rollouts", response_model=RolloutList)
async def list_rollouts(service: RoutingService = Admin) -> RolloutList:
    return service.list()


@routing_router.post("/v1/adapters/{name}/rollout", response_model=RolloutView, status_code=201)
async def start_rollout(name: str, body: RolloutRequest, service: RoutingService = Admin) -> RolloutView:
    return service.start(name, body)


@routing_router.get("/v1/adapters/{name}/rollout", response_model=RolloutReport)
async def rollout_report(name: str, service: RoutingService = Admin) -> RolloutReport:
    return service.report(name)


@routing_router.post("/v1/adapters/{name}/rollout/promote", response_model=RolloutView)
async def promote_rollout(name: str, service: RoutingService = Admin) -> RolloutView:
    return service.promote(name)


@routing_router.post("/v1/adapters/{name}/rollout/abort", response_model=RolloutView)
async def abort_rollout(name: str, body: EndRequest | None = None, service: RoutingService = Admin) -> RolloutView:
    return service.abort(name, body or EndRequest())


@routing_router.put("/v1/adapters/{name}/fallback", response_model=FallbackView)
async def set_fallback(name: str, body: FallbackRequest, service: RoutingService = Admin) -> FallbackView:
    return service.set_fallback(name, body)


@routing_router.post("/v1/feedback", response_model=FeedbackView)
async def feedback(request: Request) -> FeedbackView:
    """A score for a request a rollout routed, from the tenant that sent it."""
    server = request.app.state.server
    caller = server.auth.caller(request.headers.get("authorization"))
    body = await parse_body(request, FeedbackRequest, server.config.input_limits.max_json_depth)
    return server.routing.feedback(caller, body)
