"""The JSON behind the dashboard charts (`GET /dashboard/history?resolution=10s|1m&group=...`).

Shape (every list parallel to "t", oldest first; null where there is nothing to show):
    {"resolution": "10s"|"1m", "interval_s": 10|60, "group": str, "groups": [str],
     "generated_at_unix": float, "started_at_unix": float, "retention": str,
     "t": [bucket start, unix s],                               # 360 (10s) or 1440 (1m) entries
     "requests_per_s": {"2xx"|"4xx"|"5xx"|"499": [x]},         # 0, not null, for a quiet bucket
     "output_tokens_per_s": [x],
     "ttft_s": {"p50"|"p95"|"p99": [s]}, "tpot_s": {"p50"|"p95"|"p99": [s]},   # served requests only
     "objective_s": {"ttft"|"tpot": [s]},                      # the threshold the percentile is judged against
     "budget_remaining": {"ttft"|"tpot"|"e2e"|"availability": [ratio]},   # over the SLO budget window (1h)
     "queued": [n], "running": [n],                            # admission; null for model groups
     "residency": {"engine"|"cpu"|"disk": [n]},                 # server-wide whatever the group
     "events": [{"t": unix s, "kind": "load"|"evict", "adapter": "name@version", "tier": str}]}
"groups" are those with a request in the window ("all", "tenant:<label>", "model:<label>"), for the group picker.
Rates in a bucket divide by the seconds it covered (the current one is partial); buckets before the process started
are null throughout. Latency percentiles are estimated from histogram buckets (at most ~19% high, never low).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.tiers import TIERS
from api.observability.history import ALL, RESOLUTIONS, History, model_group, tenant_group
from api.observability.history_buckets import PERCENTILES, STATUS_CLASSES, Aggregate, SloPoint, Summary
from api.observability.slo import OBJECTIVES

RETENTION = "in this process's memory only: a restart starts the history empty"
PERCENTILE_NAMES = tuple(f"p{p:g}" for p in PERCENTILES)  # "p50", "p95", "p99"
CHARTED_OBJECTIVES = ("ttft", "tpot")


def history_json(history: History, resolution: str, group: str | None, now: float) -> dict[str, Any]:
    """`resolution` "10s" or "1m" (ValueError otherwise); `group` None means "all". An unknown group is not an
    error (it may have aged out of the window): it reads as no traffic."""
    if resolution not in RESOLUTIONS:
        raise ValueError(f"unknown resolution {resolution!r}; expected one of {sorted(RESOLUTIONS)}")
    view = history.view(RESOLUTIONS[resolution], group or ALL, now)
    width = view.resolution.seconds
    live = [start + width > view.started_at for start in view.starts]
    covered = [max(1.0, min(start + width, now) - max(start, view.started_at)) for start in view.starts]
    aggs, gauges = view.aggregates, view.gauges

    def per_bucket(value) -> list:
        return [value(a, s) if ok else None for a, s, ok in zip(aggs, covered, live)]

    def gauge(value) -> list:
        return [value(g) if g is not None else None for g in gauges]

    return {
        "resolution": view.resolution.name,
        "interval_s": width,
        "group": view.group,
        "groups": view.groups,
        "generated_at_unix": now,
        "started_at_unix": view.started_at,
        "retention": RETENTION,
        "t": view.starts,
        "requests_per_s": {name: per_bucket(lambda a, s, i=i: _rate(a.requests[i] if a else 0, s))
                           for i, name in enumerate(STATUS_CLASSES)},
        "output_tokens_per_s": per_bucket(lambda a, s: _rate(a.output_tokens if a else 0, s)),
        "ttft_s": _percentiles(aggs, "ttft"),
        "tpot_s": _percentiles(aggs, "tpot"),
        "objective_s": {o: gauge(lambda g, o=o: g.get(view.group, f"{o}_threshold_s")) for o in CHARTED_OBJECTIVES},
        "budget_remaining": {o: gauge(lambda g, o=o: g.get(view.group, f"{o}_budget_remaining")) for o in OBJECTIVES},
        "queued": gauge(lambda g: _count(g.get(view.group, "queued"))),
        "running": gauge(lambda g: _count(g.get(view.group, "running"))),
        "residency": {tier: gauge(lambda g, i=i: g.residency[i]) for i, tier in enumerate(TIERS)},
        "events": [{"t": e.at, "kind": e.kind, "adapter": e.adapter, "tier": e.tier} for e in view.events],
    }


def slo_points(dashboard: Mapping[str, Any]) -> dict[str, dict[str, SloPoint]]:
    """Per group, per objective, threshold and budget left, from a `dashboard_snapshot` (the input of `sample`).

    "all" has no SLO of its own: it takes, per objective, the strictest threshold and the smallest budget left
    over the tenants, so its line shows the worst tenant.
    """
    out: dict[str, dict[str, SloPoint]] = {}
    for key, to_group in (("tenants", tenant_group), ("models", model_group)):
        for row in dashboard.get(key, ()):
            out[to_group(row["name"])] = {name: SloPoint(o.get("threshold_s"), o.get("budget_remaining"))
                                          for name, o in row["objectives"].items()}
    tenants = [out[tenant_group(row["name"])] for row in dashboard.get("tenants", ())]
    out[ALL] = {name: SloPoint(_least([t[name].threshold_s for t in tenants if name in t]),
                               _least([t[name].budget_remaining for t in tenants if name in t]))
                for name in OBJECTIVES if any(name in t for t in tenants)}
    return out


def _least(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _rate(count: int, seconds: float) -> float:
    return _short(count / seconds)


def _short(value: float) -> float:
    """7 significant digits: far below what a chart shows, and it keeps the JSON small."""
    return float(f"{value:.7g}")


def _percentiles(aggs: list[Aggregate | Summary | None], latency: str) -> dict[str, list[float | None]]:
    out: dict[str, list[float | None]] = {name: [] for name in PERCENTILE_NAMES}
    for agg in aggs:
        values = agg.percentiles(latency) if agg is not None else (None,) * len(PERCENTILES)
        for name, value in zip(PERCENTILE_NAMES, values):
            out[name].append(_short(value) if value is not None else None)
    return out


def _count(value: float | None) -> int | None:
    return None if value is None else int(value)

