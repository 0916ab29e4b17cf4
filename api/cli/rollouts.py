"""`loraplex adapters rollout|abort|report|fallback`: rollouts and fallback chains in the registry index.

`promote NAME@V` (api/cli/adapters.py) also ends an active rollout of NAME; `promote NAME` with no version
promotes the rollout's candidate. A running server sees a change within its `--rollout-refresh-s`.
"""

from __future__ import annotations

import argparse

from adapters.registry import Registry
from adapters.rollouts import FallbackChain, NoActiveRollout, RolloutGuard, RolloutStore
from api.routing.config import RoutingConfig
from api.routing.report import build_report, rollout_view


def add_rollout_parsers(actions: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    guard = RolloutGuard.model_fields
    rollout = actions.add_parser(
        "rollout", parents=[common], help="Send a share of NAME's traffic to a candidate version (canary, A/B).",
        description="Start a rollout: PERCENT of the requests for bare NAME are served by the candidate, the rest by "
        "NAME's stable version; NAME@V and NAME:ALIAS still pin. `promote` or `abort` ends it; its guard rolls it "
        "back by itself.")
    rollout.add_argument("name", metavar="NAME")
    rollout.add_argument("--candidate", required=True, metavar="NAME@V", help="The version to roll out.")
    rollout.add_argument("--percent", required=True, type=float, metavar="P", help="Share of traffic, 0..100.")
    rollout.add_argument("--sticky", action="store_true", help="Assign by a hash of the request's `user` (else "
                         "its tenant), stable across requests and restarts: an A/B test.")
    rollout.add_argument("--shadow", type=float, default=0.0, metavar="P", help="Share of the stable arm's "
                         "requests also run on the candidate at the lowest priority, never returned (default: 0).")
    for field in ("max_error_rate", "max_ttft_p95_s", "window_s", "min_requests"):
        info = guard[field]
        rollout.add_argument(f"--{field.replace('_', '-')}", type=int if field == "min_requests" else float,
                             default=info.default,
                             help=info.description + ("" if info.default is None else " (default: %(default)s)"))
    abort = actions.add_parser("abort", parents=[common], help="End NAME's rollout; all traffic back to stable.")
    abort.add_argument("name", metavar="NAME")
    abort.add_argument("--reason", default="aborted by an operator", help="Recorded with the rollout's events.")
    report = actions.add_parser("report", parents=[common], help="Per-arm figures and tests of NAME's latest rollout.")
    report.add_argument("name", metavar="NAME")
    report.add_argument("--min-samples", type=int, default=RoutingConfig.model_fields["ab_min_samples"].default,
                        help="Per arm, below which a comparison says 'not enough data' (default: %(default)s).")
    report.add_argument("--json", action="store_true", help="Print JSON.")
    fallback = actions.add_parser("fallback", parents=[common], help="What serves bare NAME when its version "
                                  "cannot (fails to load, times out, or its circuit breaker is open).")
    fallback.add_argument("name", metavar="NAME")
    fallback.add_argument("--previous", action=argparse.BooleanOptionalAction, default=False,
                          help="The version stable pointed at before (default: no).")
    fallback.add_argument("--base", action=argparse.BooleanOptionalAction, default=False,
                          help="Then the base model (default: no). Neither: a 503.")


def start_rollout(registry: Registry, args: argparse.Namespace, versioned) -> int:
    name, version = versioned(args.candidate)
    if name != args.name:
        raise ValueError(f"the candidate {args.candidate!r} is not a version of {args.name!r}")
    guard = RolloutGuard(max_error_rate=args.max_error_rate, max_ttft_p95_s=args.max_ttft_p95_s,
                         window_s=args.window_s, min_requests=args.min_requests)
    rollout = RolloutStore(registry.index).start(name, version, args.percent, args.sticky, args.shadow, guard)
    print(f"rollout {rollout.id}: {args.percent:g}% of {name} -> {rollout.candidate_label} "
          f"({'sticky A/B' if rollout.sticky else 'canary'}), stable {rollout.stable_label}, shadow {args.shadow:g}%")
    return 0


def promote_candidate(registry: Registry, name: str) -> int:
    try:
        rollout = RolloutStore(registry.index).promote(name)
    except NoActiveRollout as e:
        raise ValueError(f"expected NAME@VERSION, got {name!r} ({name} has no rollout whose candidate to "
                         "promote)") from e
    print(f"{name}:stable -> {rollout.candidate_label} (rollout {rollout.id} promoted)")
    return 0


def abort_rollout(registry: Registry, args: argparse.Namespace) -> int:
    rollout = RolloutStore(registry.index).end(args.name, "aborted", args.reason)
    print(f"rollout {rollout.id} aborted; {args.name} -> {rollout.stable_label}")
    return 0


def show_report(registry: Registry, args: argparse.Namespace) -> int:
    store = RolloutStore(registry.index)
    rollout = store.latest(args.name)
    report = build_report(rollout, store.outcomes(rollout.id), store.shadows(rollout.id), store.events(rollout.id),
                          args.min_samples)
    if args.json:
        print(report.model_dump_json(indent=2))
        return 0
    view = rollout_view(rollout)
    print(f"rollout {view.id} of {view.name}: {view.policy}, {view.percent:g}% -> {view.candidate} "
          f"(stable {view.stable}), {view.state}{': ' + view.reason if view.reason else ''}")
    rows = [("ARM", "MODEL", "REQS", "ERR%", "TTFT50", "TTFT95", "TPOT50", "TPOT95", "TOKENS", "COST$", "LOGPROB",
             "FEEDBACK")]
    for a in report.arms:
        rows.append((a.arm, a.model, str(a.requests), _num(a.error_rate, 100, 1), _num(a.ttft_s.p50), _num(a.ttft_s.p95),
                     _num(a.tpot_s.p50), _num(a.tpot_s.p95), str(a.completion_tokens), f"{a.cost_usd:.6f}",
                     _num(a.mean_logprob), f"{_num(a.feedback_mean)} (n={a.feedback_count})"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)))
    for c in report.comparisons:
        p = "" if c.p_value is None else f", p = {c.p_value:.4g}"
        print(f"{c.metric}: {c.test}: {c.verdict}{p}")
    s = report.shadow
    print(f"shadow: {s.completed} completed, exact match {_num(s.exact_match_rate, 100, 1)}%, token overlap "
          f"{_num(s.mean_token_overlap)}, internal cost ${s.internal_cost_usd:.6f}")
    return 0


def set_fallback(registry: Registry, args: argparse.Namespace) -> int:
    RolloutStore(registry.index).set_fallback(args.name, FallbackChain(previous=args.previous, base=args.base))
    chain = [step for step, on in (("previous stable", args.previous), ("base model", args.base)) if on]
    print(f"{args.name} falls back to: {', then '.join(chain) if chain else 'nothing (503)'}")
    return 0


def _num(value: float | None, scale: float = 1.0, digits: int = 4) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"
