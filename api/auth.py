"""From an `Authorization` header to a caller: a tenant, the admin, or a 401."""

from __future__ import annotations

from dataclasses import dataclass

from api.errors import OpenAIError, unauthorized
from api.tenancy.config import OPEN_TENANT, TenancyConfig
from api.tenancy.keys import KeyRing, bearer_token


@dataclass(frozen=True)
class Caller:
    """Who is asking, from the API key: a tenant (empty for the admin key alone), and whether it is the admin."""

    tenant: str
    is_admin: bool = False


class Authenticator:
    def __init__(self, tenancy: TenancyConfig):
        self.tenancy = tenancy
        self.keys = KeyRing(tenancy)

    @property
    def open(self) -> bool:
        """Without a tenants file everyone is the default tenant, with admin rights (loopback demo)."""
        return not self.tenancy.auth_required

    def principal(self, authorization: str | None) -> Caller:
        if self.open:
            return Caller(tenant=OPEN_TENANT, is_admin=True)
        found = self.keys.authenticate(bearer_token(authorization))
        if found is None:
            raise unauthorized()
        return Caller(tenant=found.tenant or "", is_admin=found.is_admin)

    def caller(self, authorization: str | None) -> Caller:
        """A tenant (the admin key alone does not generate: it belongs to no tenant)."""
        caller = self.principal(authorization)
        if not caller.tenant:
            raise OpenAIError(403, "The admin key cannot generate; use a tenant's key.", code="not_a_tenant")
        return caller

    def admin(self, authorization: str | None) -> Caller:
        caller = self.principal(authorization)
        if not caller.is_admin:
            raise OpenAIError(403, "This call needs the admin key.", code="admin_only")
        return caller
