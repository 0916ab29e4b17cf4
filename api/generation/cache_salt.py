"""Per-tenant prefix-cache salts: tenants never share KV-cache blocks.

vLLM reuses cached KV blocks across requests with the same prompt prefix; the time saved is observable, so
two tenants sharing blocks could learn each other's prompts (the timing side channel of CVE-2025-46570).
vLLM keys blocks on a request's `cache_salt` too: each tenant's salt is an HMAC of its name under a secret
drawn at start, so a tenant still hits its own cache and never another's, and no salt can be guessed.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets


class CacheSalts:
    def __init__(self, secret: bytes | None = None):
        self._secret = secret or secrets.token_bytes(32)

    def salt_of(self, tenant: str) -> str:
        return hmac.new(self._secret, tenant.encode(), hashlib.sha256).hexdigest()
