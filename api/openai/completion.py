"""POST /v1/completions: one or more prompts (text or token ids), deltas to completion chunks."""

from __future__ import annotations

from collections.abc import AsyncIterator

from api.errors import bad_request
from api.generation.accounting import RequestAccount
from api.generation.budget import OutputLimit, output_budget
from api.generation.fanout import EngineCall
from api.generation.resolve import ServedModel
from api.generation.sse import sse
from api.input_limits import check_request_size
from api.openai.chunks import CompletionTextChunks
from api.openai.echo import EchoPosition, pieces
from api.openai.parameters import refuse_unsupported
from api.openai.protocol import CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse
from api.openai.sampling import build_sampling_params, token_ids_outside
from api.openai.structured import checked_constraint, json_safe
from api.openai.usage import usage_of
from api.pipeline.request import GenerationService
from engine.types import ChoiceDelta


def completion_logprobs(positions: tuple[EchoPosition, ...] | None, start_offset: int) -> CompletionLogprobs:
    tokens, token_logprobs, top, offsets = [], [], [], []
    offset = start_offset
    for p in positions or ():
        token = p if isinstance(p, str) else p.chosen.token
        tokens.append(token)
        token_logprobs.append(None if isinstance(p, str) else p.chosen.logprob)
        top.append(None if isinstance(p, str) else {t.token: t.logprob for t in p.top})
        offsets.append(offset)
        offset += len(token)
    return CompletionLogprobs(tokens=tokens, token_logprobs=token_logprobs, top_logprobs=top, text_offset=offsets)


class CompletionService(GenerationService[CompletionRequest]):
    response_prefix = "cmpl"

    def prompts(self, req: CompletionRequest) -> list[list[int]]:
        tokenizer = self.engine.tokenizer()
        p = req.prompt
        if isinstance(p, str):
            return [tokenizer.encode(p, add_special_tokens=False)]
        if all(isinstance(x, int) for x in p):
            batch = [list(p)]
        elif all(isinstance(x, str) for x in p):
            return [tokenizer.encode(x, add_special_tokens=False) for x in p]
        else:
            batch = [list(x) for x in p]
        vocab = len(tokenizer)
        for i, ids in enumerate(batch):
            bad = token_ids_outside(ids, vocab)
            if bad:
                raise bad_request(f"Token ids {bad[:5]} are outside the vocabulary [0, {vocab}).",
                                  param="prompt" if len(batch) == 1 else f"prompt[{i}]")
        return batch

    async def prepare(self, req: CompletionRequest, response_id: str, tenant_cap: int | None) -> list[EngineCall]:
        p = req.prompt
        count = 1 if isinstance(p, str) or all(isinstance(x, int) for x in p) else len(p)
        check_request_size(self.pipeline.input_limits, prompts=count, n=req.n, stop=req.stop)
        refuse_unsupported(req)
        if req.max_tokens == 0 and not req.echo:
            raise bad_request("max_tokens 0 is allowed only with echo (the prompt's log-probabilities alone).",
                              param="max_tokens")
        structured = await checked_constraint(req)
        chars = len(p) if isinstance(p, str) else sum(len(x) for x in p if isinstance(x, str))
        prompts = await self.tokenize(lambda: self.prompts(req), chars)
        # max_tokens 0 (with echo): the engine generates at least one token, which nobody sees or pays for.
        prompt_only = req.max_tokens == 0
        limit = OutputLimit(1, "max_tokens") if prompt_only else req.output_limit()
        calls = []
        for i, ids in enumerate(prompts):
            param = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
            max_tokens = output_budget(len(ids), limit, tenant_cap, self.engine.max_model_len, param)
            params = build_sampling_params(req, max_tokens, req.logprobs, len(self.engine.tokenizer()), structured)
            if req.echo and req.logprobs is not None:
                params.prompt_logprobs = req.logprobs
            request_id = response_id if len(prompts) == 1 else f"{response_id}-{i}"
            calls.append(EngineCall(request_id=request_id, prompt_token_ids=ids, params=params,
                                    choice_offset=i * req.n, discard_output=prompt_only))
        return calls

    async def stream_events(self, req: CompletionRequest, served: ServedModel, response_id: str, created: int,
                            calls: list[EngineCall], deltas: AsyncIterator[ChoiceDelta],
                            account: RequestAccount) -> AsyncIterator[str]:
        deltas = json_safe(req, deltas)
        model = served.id
        text_chunks = CompletionTextChunks(response_id, created, model)
        if not req.echo and req.logprobs is None:  # plain text: a chunk per delta, nothing else to add
            async for d in deltas:
                yield text_chunks.line(d.index, d.text, d.finish_reason, d.token_ids if req.return_token_ids else None)
        else:
            async for line in self._echo_or_logprob_lines(req, response_id, created, model, calls, deltas,
                                                          text_chunks):
                yield line
        if req.stream_options is not None and req.stream_options.include_usage:
            yield sse(CompletionResponse(id=response_id, created=created, model=model, choices=[],
                                         usage=usage_of(account)))

    async def _echo_or_logprob_lines(self, req: CompletionRequest, response_id: str, created: int, model: str,
                                     calls: list[EngineCall], deltas: AsyncIterator[ChoiceDelta],
                                     text_chunks: CompletionTextChunks) -> AsyncIterator[str]:
        offsets: dict[int, int] = {}
        async for piece in pieces(req, calls, deltas, self.engine.tokenizer()):
            d = piece.delta
            token_ids = d.token_ids if req.return_token_ids else None
            offset = offsets.get(d.index, 0)
            offsets[d.index] = offset + len(piece.text)
            if piece.positions is None:  # echo without logprobs
                yield text_chunks.line(d.index, piece.text, d.finish_reason, token_ids)
                continue
            logprobs = completion_logprobs(piece.positions, offset)
            choice = CompletionChoice(index=d.index, text=piece.text, logprobs=logprobs, finish_reason=d.finish_reason,
                                      token_ids=None if token_ids is None else list(token_ids))
            yield sse(CompletionResponse(id=response_id, created=created, model=model, choices=[choice]))

    async def collect(self, req: CompletionRequest, served: ServedModel, response_id: str, created: int,
                      calls: list[EngineCall], deltas: AsyncIterator[ChoiceDelta],
                      account: RequestAccount) -> CompletionResponse:
        deltas = json_safe(req, deltas)
        count = len(calls) * req.n
        texts, positions = [""] * count, [[] for _ in range(count)]
        reasons: list[str | None] = [None] * count
        token_ids: list[list[int]] = [[] for _ in range(count)]
        async for piece in pieces(req, calls, deltas, self.engine.tokenizer()):
            i = piece.delta.index
            texts[i] += piece.text
            positions[i].extend(piece.positions or ())
            token_ids[i].extend(piece.delta.token_ids)
            reasons[i] = piece.delta.finish_reason or reasons[i]
        choices = [
            CompletionChoice(
                index=i,
                text=texts[i],
                logprobs=completion_logprobs(tuple(positions[i]), 0) if req.logprobs is not None else None,
                finish_reason=reasons[i],
                token_ids=token_ids[i] if req.return_token_ids else None,
            )
            for i in range(count)
        ]
        return CompletionResponse(
            id=response_id, created=created, model=served.id, choices=choices,
            usage=usage_of(account),
            prompt_token_ids=[c.prompt_token_ids for c in calls] if req.return_token_ids else None,
        )
