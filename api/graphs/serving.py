"""A request to a virtual model: its cascade stages or ensemble members run as ordinary requests, then one
answer goes back.

Each run is a whole generation request of its own through the same template (tenant limits, fair admission,
adapter loading, its own account): the usage ledger gets one row per run, under the run's adapter and a request
id `<request id>.<path>`, so the tenant's usage and cost count every stage and member. The response is the
answering run's, with `usage` summed over every run, and a `loraplex` extension field naming the virtual model,
what answered and every run. Streaming is refused: a cascade needs the whole first answer to judge it and an
ensemble every answer to aggregate them.

Batch lines and async jobs reach virtual models through `GraphService.dispatching`: each run then carries the
line's lane, with a billing key of its own under the line's (`<line key>.<path>`), so a resumed line bills each
run once.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

from api.auth import Caller
from api.errors import bad_request, model_not_found
from api.pipeline.request import SERVED_MODEL_HEADER, BatchLane, GenerationService, Reply
from api.generation.resolve import visibility_of
from api.tenancy.virtual_models import VirtualModel
from api.graphs.protocol import GraphChatResponse, GraphCompletionResponse, GraphInfo, GraphRun
from api.graphs.rules import Candidate, choose, escalation, mean_logprob
from api.generation.virtual_model_table import VirtualModelTable
from api.openai.protocol import ChatCompletionRequest, ChatCompletionResponse, CompletionResponse, Usage
from api.tenancy.config import TenancyConfig

VIRTUAL_MODEL_HEADER = "x-loraplex-virtual-model"
STAGE_HEADER = "x-loraplex-stage"
MEMBER_HEADER = "x-loraplex-member"

Response = ChatCompletionResponse | CompletionResponse


@dataclass
class Answer:
    """What a run answered (`body`, `headers`: the answering adapter's response) and the record of the run
    (for a virtual model, with a record of each of its stages or members)."""

    body: Response
    headers: dict[str, str]
    run: GraphRun
    position: int = 0  # stage or member index of the answer in its own virtual model


def text_and_logprobs(body: Response) -> tuple[str, list[float]]:
    choice = body.choices[0]
    if isinstance(body, ChatCompletionResponse):
        return choice.message.content or "", [t.logprob for t in (choice.logprobs.content if choice.logprobs else [])]
    return choice.text, list(choice.logprobs.token_logprobs if choice.logprobs else [])


def total_usage(runs: list[GraphRun]) -> Usage:
    cached = sum(r.usage.prompt_tokens_details.cached_tokens for r in runs if r.usage.prompt_tokens_details)
    return Usage.of(sum(r.usage.prompt_tokens for r in runs), sum(r.usage.completion_tokens for r in runs), cached)


class GraphService:
    """Serves the virtual models of `table` over one endpoint's service (chat or completions)."""

    def __init__(self, table: VirtualModelTable, tenancy: TenancyConfig):
        self.table = table
        self.tenancy = tenancy

    def serves(self, model: str) -> bool:
        return self.table.get(model) is not None

    def leaf_runs(self, name: str) -> list[str]:
        """Every leaf run the virtual model `name` may make, a member named twice counted twice."""
        model = self.table.get(name)
        if model is None:
            return [name]
        return [leaf for member in model.members for leaf in self.leaf_runs(member)]

    def bound(self, service: GenerationService, req: Any, caller: Caller) -> _BoundGraph:
        """The virtual model `req.model` over `service`, for this caller; refuses (404, 400) before any run."""
        model = self.table.get(req.model)
        if model is None or not self.table.usable(req.model, visibility_of(self.tenancy, caller)):
            raise model_not_found(req.model)
        _check_request(req, model)
        return _BoundGraph(self, service, model)

    def dispatching(self, service: GenerationService) -> GraphDispatch:
        """`service` for queued work (batch lines, async jobs): virtual models too, each run in the work's lane."""
        return GraphDispatch(self, service)

    async def create(self, service: GenerationService, model: VirtualModel, req: Any, caller: Caller,
                     request_id: str, lane: BatchLane | None = None) -> Reply:
        internal = req.model_copy(update=_with_logprobs(req))
        answer = await self._run_virtual(service, internal, caller, request_id or uuid.uuid4().hex, req.model, model,
                                         lane)
        body = answer.body
        info = GraphInfo(virtual_model=req.model, kind=model.kind, answered_by=body.model, position=answer.position,
                         runs=answer.run.runs)
        update: dict[str, Any] = {"usage": answer.run.usage, "loraplex": info}
        if not _asks_logprobs(req):
            update["choices"] = [c.model_copy(update={"logprobs": None}) for c in body.choices]
        response_cls = GraphChatResponse if isinstance(body, ChatCompletionResponse) else GraphCompletionResponse
        response = response_cls(**{**dict(body), **update})
        headers = {**answer.headers, SERVED_MODEL_HEADER: body.model, VIRTUAL_MODEL_HEADER: req.model,
                   STAGE_HEADER if model.kind == "cascade" else MEMBER_HEADER: str(answer.position)}
        return Reply(response, headers)

    async def _run(self, service: GenerationService, req: Any, caller: Caller, run_id: str, name: str,
                   lane: BatchLane | None) -> Answer:
        """Runs `name` (a virtual model or a leaf) for `req`; `run_id` is unique per run, and so is the lane's
        billing key."""
        model = self.table.get(name)
        if model is None:
            return await self._run_leaf(service, req, caller, run_id, name, lane)
        return await self._run_virtual(service, req, caller, run_id, name, model, lane)

    async def _run_leaf(self, service: GenerationService, req: Any, caller: Caller, run_id: str,
                        name: str, lane: BatchLane | None) -> Answer:
        reply = await service.create(req.model_copy(update={"model": name}), caller, run_id, lane)
        body = reply.body
        text, logprobs = text_and_logprobs(body)
        run = GraphRun(model=body.model, request_id=run_id, text=text, mean_logprob=mean_logprob(logprobs),
                       finish_reason=body.choices[0].finish_reason, usage=body.usage)
        return Answer(body, reply.headers, run)

    async def _run_virtual(self, service: GenerationService, req: Any, caller: Caller, run_id: str, name: str,
                           model: VirtualModel, lane: BatchLane | None) -> Answer:
        """A virtual model's runs, then its answer; its record names it, sums its runs' usage and holds them."""
        if model.cascade is not None:
            chosen, runs = await self._cascade(service, req, caller, run_id, name, model, lane)
        else:
            chosen, runs = await self._ensemble(service, req, caller, run_id, name, model, lane)
        answer = runs[chosen]
        run = GraphRun(model=name, request_id=run_id, text=answer.run.text, mean_logprob=answer.run.mean_logprob,
                       finish_reason=answer.run.finish_reason, usage=total_usage([a.run for a in runs]),
                       answered_by=answer.body.model, runs=[a.run for a in runs])
        return Answer(answer.body, answer.headers, run, chosen)

    async def _cascade(self, service: GenerationService, req: Any, caller: Caller, run_id: str, name: str,
                       model: VirtualModel, lane: BatchLane | None) -> tuple[int, list[Answer]]:
        """Stages in order until one's answer does not escalate (the last one's never does)."""
        answers: list[Answer] = []
        for i, stage in enumerate(model.cascade.stages):
            answer = await self._run(service, req, caller, f"{run_id}.{name}.{i}", stage, _sub_lane(lane, name, i))
            decision = escalation(model.cascade.escalate_when, answer.run.text, answer.run.mean_logprob)
            escalate = decision.escalate and i < len(model.cascade.stages) - 1
            answer.run = answer.run.model_copy(update={"stage": i, "escalated": escalate,
                                                       "reason": decision.reason if escalate else None})
            answers.append(answer)
            if not escalate:
                break
        return len(answers) - 1, answers

    async def _ensemble(self, service: GenerationService, req: Any, caller: Caller, run_id: str, name: str,
                        model: VirtualModel, lane: BatchLane | None) -> tuple[int, list[Answer]]:
        """Every member at once; one answer chosen by the aggregation rule."""
        tasks = [asyncio.ensure_future(self._run(service, req, caller, f"{run_id}.{name}.{i}", member,
                                                 _sub_lane(lane, name, i)))
                 for i, member in enumerate(model.ensemble.members)]
        try:
            answers = list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        winner = choose(model.ensemble.aggregate, [Candidate(a.run.text, a.run.mean_logprob) for a in answers])
        for i, answer in enumerate(answers):
            answer.run = answer.run.model_copy(update={"member": i, "chosen": i == winner})
        return winner, answers


class _BoundGraph:
    """A GraphService over one endpoint, shaped like the endpoint's service for the route."""

    def __init__(self, graphs: GraphService, service: GenerationService, model: VirtualModel):
        self.graphs, self.service, self.model = graphs, service, model

    async def create(self, req: Any, caller: Caller, request_id: str, lane: BatchLane | None = None) -> Reply:
        return await self.graphs.create(self.service, self.model, req, caller, request_id, lane)


class GraphDispatch:
    """An endpoint's service that serves virtual models too, shaped like it for queued work (batch lines, async
    jobs), which reaches the service without the HTTP route's dispatch."""

    def __init__(self, graphs: GraphService, service: GenerationService):
        self.graphs, self.service = graphs, service

    async def check(self, req: Any, caller: Caller) -> int:
        """As `GenerationService.check`; for a virtual model, every run it may make is checked and its tokens
        counted (a cascade's later stages too: they may run)."""
        if not self.graphs.serves(req.model):
            return await self.service.check(req, caller)
        self.graphs.bound(self.service, req, caller)  # refuses (404, 400) as the live route would
        internal = req.model_copy(update=_with_logprobs(req))
        return sum([await self.service.check(internal.model_copy(update={"model": leaf}), caller)
                    for leaf in self.graphs.leaf_runs(req.model)])

    async def create(self, req: Any, caller: Caller, request_id: str, lane: BatchLane | None = None) -> Reply:
        if not self.graphs.serves(req.model):
            return await self.service.create(req, caller, request_id, lane)
        return await self.graphs.bound(self.service, req, caller).create(req, caller, request_id, lane)


def _sub_lane(lane: BatchLane | None, name: str, index: int) -> BatchLane | None:
    """A run's lane: the work's, billed under a key of its own that names the run's place in the graph."""
    if lane is None:
        return None
    return BatchLane(f"{lane.billing_key}.{name}.{index}", lane.preempt)


def _check_request(req: Any, model: VirtualModel) -> None:
    if req.stream:
        raise bad_request(f"Streaming is not available for {model.kind} virtual models: the answer is chosen only "
                          "once whole answers are in. Send stream: false.", param="stream",
                          code="unsupported_parameter")
    if req.n != 1:
        raise bad_request("Virtual models answer one choice; n must be 1.", param="n", code="unsupported_parameter")
    if getattr(req, "echo", False):
        raise bad_request("Virtual models judge answers, not prompts: echo is not available.", param="echo",
                          code="unsupported_parameter")
    prompt = getattr(req, "prompt", None)
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) and len(prompt) != 1:
        raise bad_request("Virtual models answer one prompt at a time.", param="prompt", code="unsupported_parameter")


def _asks_logprobs(req: Any) -> bool:
    if isinstance(req, ChatCompletionRequest):
        return req.logprobs
    return req.logprobs is not None


def _with_logprobs(req: Any) -> dict[str, Any]:
    """Runs always return the sampled tokens' logprobs (the rules and the extension field read them); the
    client's own response keeps them only when it asked."""
    if isinstance(req, ChatCompletionRequest):
        return {"logprobs": True}
    return {"logprobs": req.logprobs if req.logprobs is not None else 0}
