"""Query parameters of GET /v1/usage to ledger filters, with who-may-see-what applied. Pure."""

from __future__ import annotations

import math
import re
import time
from datetime import datetime, timezone

from api.auth import Caller
from api.errors import OpenAIError, bad_request

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
# Far enough for any real query; beyond it a time is a typo (and overflows SQLite's integers).
_MAX_ABS_SECONDS = 1e12
KNOWN = {"since", "until", "tenant", "model", "adapter", "limit"}


def parse_time(text: str, now: float) -> float:
    """Unix seconds from `1733140000`, an ISO-8601 date or time (UTC if no zone), or an age such as `90m`,
    `1.5h`, `7d` or `2w` before `now`. Raises ValueError naming what is accepted."""
    value = text.strip()
    relative = _RELATIVE.match(value)
    if relative:
        moment = now - float(relative.group(1)) * _UNIT_SECONDS[relative.group(2)]
    elif value.isascii() and value.replace(".", "", 1).isdigit():
        moment = float(value)
    else:
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError as e:
            raise ValueError(f"{text!r} is not unix seconds, ISO 8601, or an age like 24h or 7d") from e
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=timezone.utc)
        moment = parsed.timestamp()
    if not math.isfinite(moment) or abs(moment) > _MAX_ABS_SECONDS:
        raise ValueError(f"{text!r} is too far from now")
    return moment


def _query_time(params: dict[str, str], name: str, now: float) -> float | None:
    if name not in params:
        return None
    try:
        return parse_time(params[name], now)
    except ValueError as e:
        raise bad_request(f"{name}: {e}", param=name) from e


def usage_filters(params: dict[str, str], caller: Caller, now: float | None = None) -> dict:
    now = time.time() if now is None else now
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
        "since": _query_time(params, "since", now),
        "until": _query_time(params, "until", now),
    }


def usage_limit(raw: str) -> int:
    """How many records `?limit=` asks for: an integer in [0, 10000]."""
    if not (raw.isascii() and raw.isdigit()) or not 0 <= int(raw) <= 10000:
        raise OpenAIError(400, "limit must be an integer in [0, 10000].", param="limit", code="invalid_value")
    return int(raw)
