from __future__ import annotations

from api.generation.cache_salt import CacheSalts


def test_salts_differ_by_tenant_and_by_secret():
    salts = CacheSalts(b"k" * 32)
    assert salts.salt_of("acme") == salts.salt_of("acme")
    assert salts.salt_of("acme") != salts.salt_of("globex")
    assert CacheSalts(b"j" * 32).salt_of("acme") != salts.salt_of("acme")  # not guessable from the name alone
    assert CacheSalts().salt_of("acme") != CacheSalts().salt_of("acme")  # a new secret at each start
