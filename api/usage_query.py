"""Query parameters of GET /v1/usage to ledger filters, with who-may-see-what applied. Pure."""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone

from api.errors import OpenAIError, bad_request
from api.gate import Caller

_RELATIVE = re.compile(r"^(\d+)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
KNOWN = {"since", "until", "tenant", "model", "adapter", "limit"}


def parse_time(value: str, param: str, now: float | None = None) -> float:
    """Unix seconds from `1733140000`, an ISO-8601 time (UTC if no zone), or `90m`/`24h`/`7d` ago."""
    now = time.time() if now is None else now
    relative = _RELATIVE.match(value)
    if relative:
        return now - int(relative.group(1)) * _UNIT_SECONDS[relative.group(2)]
    try:
        return float(value)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as e:
        raise bad_request(f"{param} must be unix seconds, ISO-8601, or like 24h/7d; got {value!r}",
                          param=param) from e
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()


def usage_filters(params: dict[str, str], caller: Caller, now: float | None = None) -> dict:
    unknown = sorted(set(params) - KNOWN)
    if unknown:
        raise bad_request(f"Unknown query parameters {unknown}; known: {sorted(KNOWN)}", param=unknown[0])
    tenant = params.get("tenant")
    if not caller.is_admin:
        if tenant is not None and tenant != caller.tenant:
            raise OpenAIError(403, "A tenant may only read its own usage.", param="tenant", code="forbidden")
        tenant = caller.tenant
    model = params.get("model") or params.get("adapter")
    return {
        "tenant": tenant,
        "model": model,
        "since": parse_time(params["since"], "since", now) if "since" in params else None,
        "until": parse_time(params["until"], "until", now) if "until" in params else None,
    }
