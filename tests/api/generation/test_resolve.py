"""A request's `model` to what serves it, with the caller's visibility applied."""

from __future__ import annotations

import pytest

from adapters.identity import parse_model_ref
from api.errors import OpenAIError
from api.generation.resolve import ModelResolver, ServedModel


@pytest.fixture
def resolver(registry_with_poet):
    return ModelResolver("base", registry_with_poet)


def test_base_model(resolver):
    resolved = resolver.resolve("base")
    served = resolved.served
    assert (served.id, served.name, served.version, served.identity) == ("base", "base", "", None)
    assert (resolved.kind, resolved.follows_rollouts) == ("base", False)


@pytest.mark.parametrize(("model", "kind", "follows_rollouts"), [
    ("poet", "name", True), ("poet@1", "version", False), ("poet:stable", "alias", False)])
def test_adapter_references_name_the_version_that_serves(resolver, registry_with_poet, model, kind,
                                                         follows_rollouts):
    resolved = resolver.resolve(model)
    assert (resolved.kind, resolved.follows_rollouts, str(resolved.ref)) == (kind, follows_rollouts, model)
    served = resolved.served
    manifest = registry_with_poet.resolve(parse_model_ref("poet@1"))
    assert served == ServedModel("base", manifest)
    assert (served.id, served.name, served.version) == ("poet@1", "poet", "1")
    assert served.identity == manifest.identity


@pytest.mark.parametrize(("model", "may_use"), [
    ("nope", lambda name: True),  # no such adapter
    ("poet@2", lambda name: True),  # no such version
    ("poet:canary", lambda name: True),  # no such alias
    ("Bad Name", lambda name: True),  # not a reference at all
    ("poet", lambda name: name != "poet"),  # exists, but not for this caller
    ("base", lambda name: name is not None),  # the base model, hidden from this caller
])
def test_missing_and_hidden_are_the_same_404(resolver, model, may_use):
    with pytest.raises(OpenAIError) as info:
        resolver.resolve(model, may_use)
    assert (info.value.status, info.value.code, info.value.param) == (404, "model_not_found", "model")
