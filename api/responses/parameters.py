"""Every Responses API request parameter and what loraplex does with it (the table of `api/openai/parameters.py`,
for `/v1/responses`). Pure."""

from __future__ import annotations

from api.openai.parameters import ParameterTable

HONOURED: dict[str, str] = {
    "model": "the base model or an adapter (`name`, `name@version`, `name@alias`); virtual models are refused",
    "input": "a string (one user message) or items: messages (`input_text` parts; `output_text` parts of "
             "assistant messages sent back), `function_call` and `function_call_output`",
    "instructions": "a system message before the input; not carried to a next turn",
    "tools": "function tools, as chat's `tools`",
    "tool_choice": "as chat's: `none`, `required`, a named function; `auto` with `--tool-call-parser`",
    "parallel_tool_calls": "`false` allows one call at most under `required`",
    "text": "`format`: `text`, `json_object` or `json_schema` (as chat's `response_format`)",
    "max_output_tokens": "output cap, bounded by the tenant's cap",
    "temperature": "sampling temperature; 0 is greedy",
    "top_p": "nucleus sampling",
    "user": "end-user id: keeps a user on one rollout arm",
    "metadata": "up to 16 string tags, returned with the response and stored with it",
    "store": "`true` (the default) keeps the response in the server's database for `GET /v1/responses/{id}` "
             "and `previous_response_id`, readable by its tenant only",
    "previous_response_id": "continue a stored response of this tenant: its input and output come first",
    "stream": "server-sent events, typed as the SDK parses them",
}

NO_OPS: dict[str, str] = {
    "service_tier": "one tier serves every request; priority comes from the tenant's class",
    "prompt_cache_key": "a routing hint for OpenAI's caches; the prefix cache here is automatic, per tenant",
    "safety_identifier": "an abuse-monitoring id for OpenAI; usage is recorded per tenant and `user`",
}

REFUSED: dict[str, str] = {
    "truncation": "the input is never cut; one longer than the context is a 400",
    "include": "no extra output data (reasoning, logprobs, sources) is available",
    "reasoning": "no model served here reasons in a separate channel",
    "background": "use the async jobs API (`/v1/jobs`) for work that outlives the request",
    "conversation": "conversations are not kept; chain turns with `previous_response_id`",
    "max_tool_calls": "built-in tools are not available, and function calls are the client's to run",
    "prompt": "stored prompt templates are not available",
    "top_logprobs": "log-probabilities are available on chat and completions",
    "stream_options": "the stream has no options",
    "prompt_cache_retention": "the prefix cache keeps blocks while memory allows; no retention is promised",
    "prompt_cache_options": "the prefix cache is automatic; it has no options",
    "context_management": "the context is never compacted",
    "moderation": "moderation is not available",
    "access_programs": "not available",
    "image": "images are not available",
    "background_options": "use the async jobs API (`/v1/jobs`)",
}

ASKS_NOTHING = {"truncation": "disabled", "include": [], "background": False}

RESPONSES = ParameterTable(HONOURED, NO_OPS, REFUSED, ASKS_NOTHING)


if __name__ == "__main__":
    from api.openai.parameters import markdown_table

    print(markdown_table(RESPONSES), end="")
