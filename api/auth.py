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
    reads_metrics: bool = False


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
            return Caller(tenant=OPEN_TENANT, is_admin=True, reads_metrics=True)
        found = self.keys.authenticate(bearer_token(authorization))
        if found is None:
            raise unauthorized()
        return Caller(tenant=found.tenant or "", is_admin=found.is_admin, reads_metrics=found.reads_metrics)

    def caller(self, authorization: str | None) -> Caller:
        """A tenant (the admin key alone does not generate: it belongs to no tenant)."""
        caller = self.principal(authorization)
        if not caller.tenant:
            raise OpenAIError(403, "This key belongs to no tenant and cannot generate; use a tenant's key.",
                              code="not_a_tenant")
        return caller

    def admin(self, authorization: str | None) -> Caller:
        caller = self.principal(authorization)
        if not caller.is_admin:
            raise OpenAIError(403, "This call needs the admin key.", code="admin_only")
        return caller

    def metrics_reader(self, authorization: str | None) -> Caller:
        """/metrics shows every tenant's traffic, prices and adapter names: the admin or a metrics key only."""
        caller = self.principal(authorization)
        if not caller.reads_metrics:
            raise OpenAIError(403, "/metrics needs the admin key or a metrics key.", code="metrics_only")
        return caller
