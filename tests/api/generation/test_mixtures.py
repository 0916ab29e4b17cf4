"""Mixtures named per request: their spelling, their bounds, and one build per mixture."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from adapters.identity import ModelRef
from api.errors import OpenAIError
from api.generation.mixtures import MixturePart, Mixtures, canonical, mixture_name, parse_mixture
from api.generation.resolve import ModelResolver
from api.tenancy.config import MixtureLimits, TenantConfig


@pytest.mark.parametrize(("model", "parts"), [
    ("a*0.7+b*0.3", [MixturePart(ModelRef("a"), 0.7), MixturePart(ModelRef("b"), 0.3)]),
    ("a@2*1+b:canary*-0.5", [MixturePart(ModelRef("a", 2), 1.0), MixturePart(ModelRef("b", alias="canary"), -0.5)]),
    ("a*1e-1+b*2+c*3", [MixturePart(ModelRef("a"), 0.1), MixturePart(ModelRef("b"), 2.0),
                        MixturePart(ModelRef("c"), 3.0)]),
])
def test_spelling(model, parts):
    assert parse_mixture(model) == parts


@pytest.mark.parametrize(("model", "problems"), [
    ("a*0.7", ["a mixture needs at least two parts"]),
    ("a+b", ["part 1 ('a') must be REF*WEIGHT", "part 2 ('b') must be REF*WEIGHT"]),
    ("a*x+b*0", ["part 1: weight 'x' must be a finite, non-zero number",
                 "part 2: weight '0' must be a finite, non-zero number"]),
    ("a*nan+b*inf", ["part 1: weight 'nan' must be a finite, non-zero number",
                     "part 2: weight 'inf' must be a finite, non-zero number"]),
    ("a*1+a@2*1", ["a is named more than once"]),
    ("Bad*1+b*1", ["part 1: adapter name 'Bad' must match"]),
])
def test_malformed_spellings_name_every_problem(model, problems):
    with pytest.raises(ValueError) as caught:
        parse_mixture(model)
    message = str(caught.value)
    assert all(p in message for p in problems), message


@pytest.fixture
def two_adapters(registry_with_poet, demo_assets):
    for name in ("sql-helper", "support-bot"):  # ranks 8 and 16
        registry_with_poet.push(demo_assets.adapter_dirs[name], name)
    return registry_with_poet


def parts_of(registry, *weights):
    return [(registry.resolve(ModelRef(name)), w) for name, w in zip(["sql-helper", "support-bot"], weights)]


def test_names_follow_content_and_weights(two_adapters):
    parts = parts_of(two_adapters, 0.7, 0.3)
    assert canonical(parts) == "sql-helper@1*0.7+support-bot@1*0.3"
    assert mixture_name(parts) == mixture_name(parts_of(two_adapters, 0.7, 0.3))
    assert mixture_name(parts) != mixture_name(parts_of(two_adapters, 0.3, 0.7))
    assert mixture_name(parts) != mixture_name(list(reversed(parts)))
    assert mixture_name(parts).startswith("mixture-")


@pytest.mark.parametrize(("limits", "max_rank", "problem"), [
    (MixtureLimits(max_components=2), 64, None),
    (MixtureLimits(max_components=2), 16, "total rank 24 (the sum of the parts' ranks) is over the server's max "
                                         "LoRA rank 16"),
])
def test_bounds(two_adapters, limits, max_rank, problem):
    two_adapters.limits = replace(two_adapters.limits, max_lora_rank=max_rank)
    mixtures = Mixtures(two_adapters, limits)
    if problem is None:
        mixtures.check(parts_of(two_adapters, 1, 1))
    else:
        with pytest.raises(OpenAIError) as caught:
            mixtures.check(parts_of(two_adapters, 1, 1))
        assert (caught.value.status, caught.value.code) == (400, "invalid_mixture") and problem in caught.value.message


def test_more_parts_than_allowed(two_adapters):
    with pytest.raises(OpenAIError) as caught:
        Mixtures(two_adapters, MixtureLimits(max_components=2)).check(parts_of(two_adapters, 1, 1) * 2)
    assert "4 parts, more than the 2 allowed" in caught.value.message


def test_concurrent_requests_build_once_and_builds_are_limited_per_tenant(two_adapters):
    now = [0.0]
    mixtures = Mixtures(two_adapters, MixtureLimits(builds_per_minute=2), clock=lambda: now[0])

    async def main():
        first = await asyncio.gather(*[mixtures.manifest(parts_of(two_adapters, 0.5, 0.5), "t") for _ in range(3)])
        assert len({m.label for m in first}) == 1
        await mixtures.manifest(parts_of(two_adapters, 0.5, 0.5), "t")  # built before: no build, not counted
        await mixtures.manifest(parts_of(two_adapters, 0.25, 0.5), "t")
        with pytest.raises(OpenAIError) as caught:
            await mixtures.manifest(parts_of(two_adapters, 0.125, 0.5), "t")
        assert (caught.value.status, caught.value.code) == (429, "mixture_build_limit")
        await mixtures.manifest(parts_of(two_adapters, 0.125, 0.5), "other")  # another tenant's own count
        now[0] = 60.0
        await mixtures.manifest(parts_of(two_adapters, 0.0625, 0.5), "t")  # the window moved on

    asyncio.run(main())
    built = [s for s in two_adapters.list() if s.name.startswith("mixture-")]
    assert len(built) == 4 and all(len(s.versions) == 1 for s in built)


@pytest.mark.parametrize(("tenant", "model", "status", "code"), [
    (TenantConfig(name="t", adapters=["*"]), "sql-helper*1+support-bot*1", 403, "mixtures_not_allowed"),
    (TenantConfig(name="t", adapters=["*"], mixtures=True), "sql-helper*1+support-bot", 400, "invalid_mixture"),
    (TenantConfig(name="t", adapters=["sql-helper"], mixtures=True), "sql-helper*1+support-bot*1", 404,
     "model_not_found"),
    (TenantConfig(name="t", adapters=["*"], mixtures=True), "poet*1+sql-helper*1", 400, "invalid_mixture"),  # rank 72
])
def test_who_may_mix_what(two_adapters, tenant, model, status, code):
    resolver = ModelResolver("base", two_adapters, Mixtures(two_adapters, MixtureLimits()))

    def may_use(name):
        return name is not None and any(glob in ("*", name) for glob in tenant.adapters)

    with pytest.raises(OpenAIError) as caught:
        asyncio.run(resolver.resolve_request(model, may_use, tenant))
    assert (caught.value.status, caught.value.code) == (status, code)


def test_a_mixture_resolves_by_its_parts_and_its_registry_name_is_not_callable(two_adapters):
    resolver = ModelResolver("base", two_adapters, Mixtures(two_adapters, MixtureLimits()))
    tenant = TenantConfig(name="t", adapters=["*"], mixtures=True)
    resolved = asyncio.run(resolver.resolve_request("sql-helper*0.5+support-bot*0.5", lambda name: True, tenant))
    served = resolved.served
    assert (resolved.kind, resolved.follows_rollouts) == ("mixture", False)
    assert (served.id, served.name, served.version) == ("sql-helper@1*0.5+support-bot@1*0.5",) * 2 + ("",)
    assert served.manifest.rank == 24 and served.manifest.lineage is not None
    with pytest.raises(OpenAIError) as caught:
        resolver.resolve(served.manifest.name)
    assert caught.value.status == 404
