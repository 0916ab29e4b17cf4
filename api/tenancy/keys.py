"""API keys: generation, the stored hash, and constant-time lookup of a presented key."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from api.tenancy.config import OPEN_TENANT, TenancyConfig

KEY_PREFIX = "lpx-"
_KEY_BYTES = 32  # 43 urlsafe base64 characters, 256 bits


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(_KEY_BYTES)


def hash_key(key: str) -> str:
    """The form stored in the tenants file: `sha256:<64 hex>`."""
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def bearer_token(header_value: str | None) -> str | None:
    """The key of an `Authorization: Bearer <key>` header, else None."""
    if not header_value:
        return None
    scheme, _, token = header_value.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return None
    return token


@dataclass(frozen=True)
class Principal:
    """Who a request is: a tenant, an admin, a metrics reader, or several when one key is listed in several
    places."""

    tenant: str | None
    is_admin: bool
    reads_metrics: bool = False


class KeyRing:
    """Maps presented keys to principals.

    Every stored hash is compared, with `hmac.compare_digest` and without stopping at a match, so the time
    taken does not tell which stored key (or how much of one) matched.
    """

    def __init__(self, config: TenancyConfig):
        self._auth_required = config.auth_required
        self._open = Principal(tenant=OPEN_TENANT, is_admin=True, reads_metrics=True)
        entries: list[tuple[bytes, str | None, bool, bool]] = []  # (digest, tenant, admin, metrics)
        entries.extend((_digest(h), None, True, True) for h in config.admin_key_hashes)
        entries.extend((_digest(h), None, False, True) for h in config.metrics_key_hashes)
        for tenant in config.tenants:
            entries.extend((_digest(h), tenant.name, False, False) for h in tenant.key_hashes)
        self._entries = entries

    @property
    def size(self) -> int:
        return len(self._entries)

    def authenticate(self, presented: str | None) -> Principal | None:
        """None when the key is missing or unknown. Without a tenants file everyone is the open tenant."""
        if not self._auth_required:
            return self._open
        if not presented:
            return None
        digest = hashlib.sha256(presented.encode()).digest()
        tenant: str | None = None
        is_admin = reads_metrics = matched = False
        for stored, owner, admin, metrics in self._entries:
            hit = hmac.compare_digest(digest, stored)
            matched |= hit
            is_admin |= hit and admin
            reads_metrics |= hit and metrics
            if hit and owner is not None:
                tenant = owner
        return Principal(tenant=tenant, is_admin=is_admin, reads_metrics=reads_metrics) if matched else None


def _digest(key_hash: str) -> bytes:
    return bytes.fromhex(key_hash.removeprefix("sha256:"))
