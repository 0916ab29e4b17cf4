from __future__ import annotations

import re

import pytest

from api.tenancy import keys
from api.tenancy.config import KEY_HASH_RE, TenancyConfig, parse_tenancy_config
from api.tenancy.keys import KeyRing, Principal, bearer_token, generate_key, hash_key

ACME_KEYS = ["lpx-acme-one", "lpx-acme-two"]
HOBBY_KEY = "lpx-hobby"
METRICS_KEY = "lpx-metrics-reader"
ADMIN_KEY = "lpx-admin"


@pytest.fixture
def ring() -> KeyRing:
    config = parse_tenancy_config({
        "admin_key_hashes": [hash_key(ADMIN_KEY)],
        "metrics_key_hashes": [hash_key(METRICS_KEY)],
        "tenants": [
            {"name": "acme", "key_hashes": [hash_key(k) for k in ACME_KEYS]},
            {"name": "hobby", "key_hashes": [hash_key(HOBBY_KEY)]},
            {"name": "keyless"},
        ],
    })
    return KeyRing(config)


def test_generated_keys_have_the_documented_form_and_differ():
    generated = {generate_key() for _ in range(200)}
    assert len(generated) == 200
    assert all(re.fullmatch(r"lpx-[A-Za-z0-9_-]{43}", k) for k in generated)


def test_hash_format_and_value():
    assert hash_key("abc") == "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert KEY_HASH_RE.match(hash_key(generate_key()))


@pytest.mark.parametrize(("header", "token"), [
    ("Bearer lpx-abc", "lpx-abc"),
    ("bearer lpx-abc", "lpx-abc"),
    ("  Bearer   lpx-abc  ", "lpx-abc"),
    ("Bearer", None),
    ("Bearer ", None),
    ("Basic dXNlcjpwYXNz", None),
    ("lpx-abc", None),
    ("Bearer a b", None),
    ("", None),
    (None, None),
])
def test_bearer_token(header, token):
    assert bearer_token(header) == token


@pytest.mark.parametrize(("presented", "principal"), [
    (ACME_KEYS[0], Principal("acme", False)),
    (ACME_KEYS[1], Principal("acme", False)),
    (HOBBY_KEY, Principal("hobby", False)),
    (ADMIN_KEY, Principal(None, True, reads_metrics=True)),
    (METRICS_KEY, Principal(None, False, reads_metrics=True)),
    ("lpx-wrong", None),
    (ACME_KEYS[0] + " ", None),
    (hash_key(HOBBY_KEY), None),  # the stored hash is not a key
    ("", None),
    (None, None),
])
def test_authenticate(ring, presented, principal):
    assert ring.authenticate(presented) == principal


def test_a_key_listed_for_a_tenant_and_as_admin_is_both():
    config = parse_tenancy_config({"admin_key_hashes": [hash_key("k")],
                                   "tenants": [{"name": "ops", "key_hashes": [hash_key("k")]}]})
    assert KeyRing(config).authenticate("k") == Principal("ops", True, reads_metrics=True)


@pytest.mark.parametrize("presented", [ADMIN_KEY, ACME_KEYS[0], HOBBY_KEY, "lpx-wrong"])
def test_every_stored_hash_is_compared_whatever_matches(ring, monkeypatch, presented):
    compared = []
    real = keys.hmac.compare_digest

    def counting(a, b):
        compared.append(b)
        return real(a, b)

    monkeypatch.setattr(keys.hmac, "compare_digest", counting)
    ring.authenticate(presented)
    assert ring.size == 5
    assert len(compared) == 5 and len(set(compared)) == 5


def test_open_default_admits_everyone_as_the_default_tenant():
    ring = KeyRing(TenancyConfig.open_default())
    for presented in (None, "", "anything"):
        assert ring.authenticate(presented) == Principal("default", True, reads_metrics=True)
