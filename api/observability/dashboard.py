"""The JSON behind the operator dashboard (`GET /dashboard/data`) and the path of its static page.

Shape (every number may be null where there is no traffic):
    {"generated_at": ISO, "generated_at_unix": float, "windows": ["5m", "1h"], "budget_window": "1h",
     "tenants": [row], "models": [row], "residency": {"engine": [adapter], "cpu": [...], "disk": [...]},
     "drift": {"threshold", "window", "versions": [{"model", "version", "reference", "current", "pinned",
                                                    "psi": {feature: x}, "drifted": [feature]}]}}
    row = {"name", "status": "met"|"missed"|"no-data" (over the budget window),
           "requests": {window: n}, "errors": {window: n}, "error_rate": {window: ratio},
           "latency": {window: {"ttft"|"tpot"|"e2e": {"p50", "p95", "p99"}}},
           "objectives": {"ttft"|"tpot"|"e2e"|"availability": {
               "threshold_s", "target_percent", "good": {window: n}, "total": {window: n},
               "attainment": {window: ratio}, "met": {window: bool|null}, "burn_rate": {window: x},
               "budget_remaining"}},
           "totals": {"requests", "errors", "prompt_tokens", "completion_tokens", "cost_usd", "price_usd",
                      "cost_per_1k_tokens_usd", "price_per_1k_tokens_usd"}}
Tenant and model names are the bounded metric labels, so at most top_n rows plus `other`.
`api/server/dashboard.py`'s `Dashboard.data` adds
    "routing": {"rollouts": [{"id", "name", "policy", "state", "percent", "reason",
                              "arms": [{"arm", "model", "requests", "error_rate", "ttft_p95_s"}],
                              "shadow": {"completed", "exact_match_rate"}}] (the newest 10),
                "breakers": {adapter version: "closed"|"half_open"|"open"}},
    "batches": [{"id", "tenant", "status", "endpoint", "total", "finished", "failed"}] (the newest 20),
and in scale-out mode "replicas": {replica id: {"residency": {tier: [adapter]}, "ongoing", "running", "waiting",
"requests"}}.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from adapters.tiers import TIERS
from api.observability.labels import OTHER
from api.observability.request_metrics import BUDGET_WINDOW, Metrics
from api.observability.slo import OBJECTIVES, WINDOWS, ObjectiveStatus
from api.observability.usage_totals import GroupSnapshot

STATIC_DIR = Path(__file__).resolve().parents[1] / "static"
DASHBOARD_HTML = STATIC_DIR / "dashboard.html"


def dashboard_snapshot(metrics: Metrics, residency: dict[str, list[str]] | None, now: float,
                       drift: dict[str, Any] | None = None) -> dict[str, Any]:
    """`residency` maps tier ("engine", "cpu", "disk") to the adapters resident there; `now` is unix time;
    `drift` is `DriftMonitor.snapshot()` (None: no drift monitoring)."""
    snap = metrics.snapshot()
    residency = residency or {}
    return {
        "generated_at": datetime.fromtimestamp(now, tz=timezone.utc).isoformat(timespec="seconds"),
        "generated_at_unix": now,
        "windows": list(WINDOWS),
        "budget_window": BUDGET_WINDOW,
        "tenants": [_row(name, group) for name, group in _ordered(snap.tenants)],
        "models": [_row(name, group) for name, group in _ordered(snap.models)],
        "residency": {tier: sorted(residency.get(tier, [])) for tier in TIERS},
        "drift": drift if drift is not None else {"threshold": None, "window": None, "versions": []},
    }


def _ordered(groups: dict[str, GroupSnapshot]) -> list[tuple[str, GroupSnapshot]]:
    return sorted(groups.items(), key=lambda item: (item[0] == OTHER, item[0]))


def _row(name: str, group: GroupSnapshot) -> dict[str, Any]:
    windows = group.windows
    totals = group.totals
    return {
        "name": name,
        "status": _status(group),
        "requests": {w: windows[w].requests if w in windows else 0 for w in WINDOWS},
        "errors": {w: windows[w].errors if w in windows else 0 for w in WINDOWS},
        "error_rate": {w: windows[w].error_rate if w in windows else None for w in WINDOWS},
        "latency": {w: {obj: {"p50": p.p50, "p95": p.p95, "p99": p.p99}
                        for obj, p in windows[w].latency.items()} if w in windows else {}
                    for w in WINDOWS},
        "objectives": _objectives(group),
        "totals": {
            "requests": totals.requests,
            "errors": totals.errors,
            "prompt_tokens": totals.prompt_tokens,
            "completion_tokens": totals.completion_tokens,
            "cost_usd": totals.cost_usd,
            "price_usd": totals.price_usd,
            "cost_per_1k_tokens_usd": totals.cost_per_1k_tokens,
            "price_per_1k_tokens_usd": totals.price_per_1k_tokens,
        },
    }


def _objectives(group: GroupSnapshot) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for objective in OBJECTIVES:
        per_window: dict[str, ObjectiveStatus] = {
            w: s.objectives[objective] for w, s in group.windows.items() if objective in s.objectives
        }
        if not per_window:
            continue
        budget = per_window.get(BUDGET_WINDOW)
        reference = budget or next(iter(per_window.values()))
        out[objective] = {
            "threshold_s": reference.threshold_s,
            "target_percent": reference.target_percent,
            "good": {w: s.good for w, s in per_window.items()},
            "total": {w: s.total for w, s in per_window.items()},
            "attainment": {w: s.attainment if s.total else None for w, s in per_window.items()},
            "met": {w: s.met for w, s in per_window.items()},
            "burn_rate": {w: s.burn_rate for w, s in per_window.items()},
            "budget_remaining": budget.budget_remaining if budget is not None else None,
        }
    return out


def _status(group: GroupSnapshot) -> str:
    summary = group.windows.get(BUDGET_WINDOW)
    verdicts = [s.met for s in summary.objectives.values()] if summary else []
    if any(v is False for v in verdicts):
        return "missed"
    return "met" if any(v is True for v in verdicts) else "no-data"
