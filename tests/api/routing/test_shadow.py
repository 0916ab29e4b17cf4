"""The shadow copy's engine calls (fake engine, stub tiers and queue): the same engine call as a live request's."""

from __future__ import annotations

from types import SimpleNamespace

from vllm import SamplingParams

from api.generation.fanout import EngineCall
from api.routing.shadow import ShadowRunner


class StubTiers:
    async def acquire(self, manifest):
        return SimpleNamespace(adapter=None)

    def release(self, acquired) -> None:
        pass


class StubQueue:
    def __init__(self):
        self.released = []

    def add_wait_listener(self, listener) -> None:
        pass

    def release(self, ticket) -> None:
        self.released.append(ticket)


async def test_a_shadow_copy_runs_under_its_own_id_with_its_primary_s_cache_salt(fake_engine):
    queue = StubQueue()
    runner = ShadowRunner(fake_engine, queue, StubTiers(), store=None, metrics=None, usd_per_token=lambda: 0.0,
                          load_deadline_s=5)
    params = SamplingParams(max_tokens=3, n=2)
    calls = [EngineCall("req-1", [1, 2], params), EngineCall("req-1-1", [3], params, choice_offset=2)]
    route = SimpleNamespace(shadow=SimpleNamespace(manifest=None))
    output, prompt_tokens = await runner._generate(route, calls, "salt-of-acme", ticket="t")
    assert [r[0] for r in fake_engine.requests] == ["shadow-req-1", "shadow-req-1-1"]
    assert fake_engine.salts == ["salt-of-acme", "salt-of-acme"]  # its prefix-cache blocks stay with its tenant
    assert [r[2] is not params for r in fake_engine.requests] == [True, True]  # the primary's params untouched
    assert sorted(output) == [0, 1, 2, 3] and all(len(tokens) == 3 for tokens in output.values())
    assert prompt_tokens == 3 and queue.released == ["t"]
