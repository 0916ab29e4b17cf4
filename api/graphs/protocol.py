"""The `loraplex` extension field of a virtual model's response: what answered, and every run on the way."""

from __future__ import annotations

from pydantic import BaseModel, Field

from api.openai.protocol import ChatCompletionResponse, CompletionResponse, Usage


class GraphRun(BaseModel):
    """One stage or member run: an ordinary request with its own usage-ledger row (`request_id`), or a nested
    virtual model, whose own runs are in `runs` (their ledger rows' ids start with its `request_id`)."""

    model: str = Field(description="The adapter version (or base model) that ran, or the nested virtual model.")
    request_id: str
    text: str
    mean_logprob: float | None = Field(description="Mean logprob of the answer's tokens; null when empty.")
    finish_reason: str | None
    usage: Usage
    stage: int | None = Field(default=None, description="Cascade: the stage's index.")
    escalated: bool | None = Field(default=None, description="Cascade: whether this answer was handed on.")
    reason: str | None = Field(default=None, description="Cascade: the condition that escalated "
                               "(mean_logprob or output_matches).")
    member: int | None = Field(default=None, description="Ensemble: the member's index.")
    chosen: bool | None = Field(default=None, description="Ensemble: whether this answer was chosen.")
    answered_by: str | None = Field(default=None, description="Nested virtual model: the adapter version whose "
                                    "answer it gave.")
    runs: list[GraphRun] | None = Field(default=None, description="Nested virtual model: its stages or members.")


class GraphInfo(BaseModel):
    virtual_model: str
    kind: str = Field(description="cascade or ensemble")
    answered_by: str = Field(description="The adapter version whose answer is returned.")
    position: int = Field(description="Index of the stage (cascade) or member (ensemble) that answered.")
    runs: list[GraphRun] = Field(description="One per stage run (cascade) or member (ensemble), in order; "
                                 "`usage` of the response is their sum.")


class GraphChatResponse(ChatCompletionResponse):
    loraplex: GraphInfo


class GraphCompletionResponse(CompletionResponse):
    loraplex: GraphInfo
