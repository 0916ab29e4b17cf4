"""The custom-attributes header and the body shapes of POST /invocations, as tables."""

from __future__ import annotations

import pytest

from api.sagemaker.protocol import InvocationKind, invocation_kind, parse_custom_attributes


@pytest.mark.parametrize(("header", "attributes"), [
    (None, {}),
    ("", {}),
    ("model=poet", {"model": "poet"}),
    ("model=sql-helper@2", {"model": "sql-helper@2"}),
    ("model=support:canary", {"model": "support:canary"}),
    ("trace=abc,model=poet", {"trace": "abc", "model": "poet"}),
    ("trace=abc;model=poet", {"trace": "abc", "model": "poet"}),
    (" trace = abc ;  model = poet ,", {"trace": "abc", "model": "poet"}),
    ("flag,model=poet", {"model": "poet"}),
    ("=orphan,model=poet", {"model": "poet"}),
    ("token=a=b==,model=poet", {"token": "a=b==", "model": "poet"}),
    ("model=", {"model": ""}),
    ("model=poet,model=poet", {"model": "poet"}),
    ("Model=poet", {"Model": "poet"}),
])
def test_custom_attributes(header, attributes):
    assert parse_custom_attributes(header) == attributes


@pytest.mark.parametrize("header", ["model=poet,model=sql-helper", "model=poet;model="])
def test_a_key_given_twice_with_different_values_is_refused(header):
    with pytest.raises(ValueError, match="'model' is given twice"):
        parse_custom_attributes(header)


@pytest.mark.parametrize(("payload", "kind"), [
    ({"messages": []}, InvocationKind.CHAT),
    ({"messages": [{"role": "user", "content": "x"}], "model": "poet"}, InvocationKind.CHAT),
    ({"prompt": "x"}, InvocationKind.COMPLETION),
    ({"prompt": [1, 2], "max_tokens": 3}, InvocationKind.COMPLETION),
])
def test_invocation_kind(payload, kind):
    assert invocation_kind(payload) is kind


@pytest.mark.parametrize(("payload", "message"), [
    ({}, "needs 'messages'"),
    ({"inputs": "x"}, "needs 'messages'"),
    ({"messages": [], "prompt": "x"}, "both"),
])
def test_invocation_kind_refuses(payload, message):
    with pytest.raises(ValueError, match=message):
        invocation_kind(payload)
