"""POST /tokenize and /detokenize, as vLLM's server offers them: a model's tokenizer (the base model's, which
its adapters and virtual models share), for any model the caller may use. Nothing runs on the engine and
nothing is billed."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from api.auth import Caller
from api.errors import bad_request
from api.generation.resolve import visibility_of
from api.input_limits import InputLimits, check_request_size
from api.openai.chat import ChatService
from api.openai.models import ModelCatalog
from api.openai.parameters import refuse_unsupported
from api.openai.protocol import MAX_TOOLS, ChatCompletionRequest, ChatMessage
from api.openai.sampling import token_ids_outside
from api.openai.tools import ToolDefinition
from api.tenancy.config import TenancyConfig


class TokenizeCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    tools: Annotated[list[ToolDefinition], Field(max_length=MAX_TOOLS)] | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    tokens: list[int] = Field(min_length=0)


class DetokenizeResponse(BaseModel):
    prompt: str


def tokenize_request_type(payload: dict[str, Any]) -> type[BaseModel]:
    """vLLM tells the two bodies apart by `messages`."""
    return TokenizeChatRequest if "messages" in payload else TokenizeCompletionRequest


class TokenizeService:
    def __init__(self, chat: ChatService, catalog: ModelCatalog, tenancy: TenancyConfig, input_limits: InputLimits):
        self.chat = chat
        self.catalog = catalog
        self.tenancy = tenancy
        self.input_limits = input_limits

    def _check_model(self, model: str, caller: Caller) -> None:
        self.catalog.model_card(model, visibility_of(self.tenancy, caller))  # the 404 of a model it may not use

    async def tokenize(self, req: TokenizeCompletionRequest | TokenizeChatRequest, caller: Caller) -> TokenizeResponse:
        self._check_model(req.model, caller)
        tokenizer = self.chat.engine.tokenizer()
        if isinstance(req, TokenizeChatRequest):
            check_request_size(self.input_limits, prompts=1, n=1, stop=None, messages=len(req.messages))
            chat = ChatCompletionRequest(model=req.model, messages=req.messages, tools=req.tools, tool_choice="none",
                                         chat_template_kwargs=req.chat_template_kwargs)
            refuse_unsupported(chat)  # a message's fields
            ids = await self.chat.tokenize(lambda: self.chat.render_prompt(chat, req.add_generation_prompt),
                                           sum(len(m.text()) for m in req.messages))
        else:
            ids = await self.chat.tokenize(
                lambda: tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens), len(req.prompt))
        strs = tokenizer.convert_ids_to_tokens(ids) if req.return_token_strs else None
        return TokenizeResponse(count=len(ids), max_model_len=self.chat.engine.max_model_len, tokens=ids,
                                token_strs=strs)

    async def detokenize(self, req: DetokenizeRequest, caller: Caller) -> DetokenizeResponse:
        self._check_model(req.model, caller)
        tokenizer = self.chat.engine.tokenizer()
        outside = token_ids_outside(req.tokens, len(tokenizer))
        if outside:
            raise bad_request(f"Token ids {outside[:5]} are outside the vocabulary [0, {len(tokenizer)}).",
                              param="tokens")
        return DetokenizeResponse(prompt=await self.chat.tokenize(lambda: tokenizer.decode(req.tokens),
                                                                  len(req.tokens)))


