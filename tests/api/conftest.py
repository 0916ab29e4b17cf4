"""A fake engine for fast unit tests of the HTTP layer only; engine behaviour is tested on the real one."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest

from adapters.base_model import base_model_spec
from adapters.registry import Registry, RegistryConfig
from api.app import create_app
from api.batch.config import BatchConfig
from api.config import LoraplexConfig, ServingOptions
from api.server.build import build_server
from engine.config import EngineConfig
from engine.types import ChoiceDelta, EngineError, EngineLoad, PositionLogprobs, TokenLogprob


class FakeEngine:
    """Emits `tokens_per_request` one-token deltas per choice (tokens 100, 101, ..., or `reply_ids` when set); can fail after `fail_after` steps, or wait after
    the first step until `hold` (a threading.Event, so another thread can release it) is set."""

    model_id = "fake-base"
    max_model_len = 64

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.alive = True
        self.fail_after: int | None = None
        self.fail_with: BaseException | None = None  # raised at `fail_after`; default an EngineError
        self.tokens_per_request = 4
        self.reply_ids: list[int] | None = None
        self.last_finish_reason = "length"  # the finish reason of each choice's last delta
        self.step_delay = 0.0
        self.hold: threading.Event | None = None
        self.aborted: list[str] = []
        self.requests: list[tuple] = []
        self.salts: list[str | None] = []

    def start(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def tokenizer(self):
        return self._tokenizer

    async def generate(self, request_id, prompt_token_ids, params, adapter, cache_salt=None):
        self.requests.append((request_id, list(prompt_token_ids), params, adapter))
        self.salts.append(cache_salt)
        tokens = self.reply_ids or [100 + step for step in range(self.tokens_per_request)]
        count = min(len(tokens), params.max_tokens)
        for step in range(count):
            if self.fail_after is not None and step >= self.fail_after:
                raise self.fail_with or EngineError("injected failure")
            await asyncio.sleep(self.step_delay)
            while step == 1 and self.hold is not None and not self.hold.is_set():
                await asyncio.sleep(0.01)
            token = tokens[step]
            prompt_logprobs = self._prompt_logprobs(prompt_token_ids, params) if step == 0 else None
            yield [ChoiceDelta(index=i, text=self._tokenizer.decode([token]), token_ids=(token,),
                               finish_reason=self.last_finish_reason if step == count - 1 else None,
                               prompt_logprobs=prompt_logprobs) for i in range(params.n)]

    def _prompt_logprobs(self, prompt_token_ids, params):
        """Position i's log-probability is -i (the first has none), each alone in its top list."""
        if params.prompt_logprobs is None:
            return None
        entries = [TokenLogprob(t, self._tokenizer.decode([t]), -float(i)) for i, t in enumerate(prompt_token_ids)]
        return (None, *(PositionLogprobs(chosen=e, top=(e,)) for e in entries[1:]))

    async def abort(self, request_id):
        self.aborted.append(request_id)

    def is_alive(self):
        return self.alive

    def load(self):
        return EngineLoad()

    def num_unfinished_requests(self):
        return 0


@pytest.fixture(scope="session")
def small_tokenizer():
    from adapters.demo.tiny_llama import TinyLlamaSpec, train_tokenizer

    return train_tokenizer(TinyLlamaSpec())


@pytest.fixture
def fake_engine(small_tokenizer):
    return FakeEngine(small_tokenizer)


@pytest.fixture
def make_fake_server(fake_engine, demo_assets, tmp_path):
    """The real server parts around the fake engine: an empty registry, the open tenant, a fresh ledger;
    `options` (a dict) sets ServingOptions fields, other keyword arguments are `LoraplexConfig` sections."""

    def make(options: dict | None = None, tracing=None, **sections):
        base = base_model_spec(demo_assets.model_dir)
        registry_config = RegistryConfig(store_uri=str(tmp_path / "blobs"), index_url=str(tmp_path / "index.sqlite"))
        registry = Registry.from_config(registry_config, base, max_lora_rank=64)
        sections.setdefault("batch", BatchConfig(batch_store_path=str(tmp_path / "batches.sqlite"),
                                                 files_store_uri=str(tmp_path / "files")))
        config = LoraplexConfig(engine=EngineConfig(model=str(demo_assets.model_dir)), registry=registry_config,
                                serving=ServingOptions(ledger_url=str(tmp_path / "usage.sqlite"), **(options or {})),
                                **sections)
        return build_server(fake_engine, registry, config, tiers=None, tracing=tracing)

    return make


@pytest.fixture
def fake_server(make_fake_server):
    return make_fake_server()


@pytest.fixture
def fake_app(fake_server):
    return create_app(fake_server)


@pytest.fixture
async def fake_client(fake_app):
    transport = httpx.ASGITransport(app=fake_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://fake") as client:
        yield client
