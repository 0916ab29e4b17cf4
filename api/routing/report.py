"""A rollout's readout, pure: per-arm figures from its recorded outcomes, the arms compared with a test each."""

from __future__ import annotations

from adapters.rollouts import CANDIDATE_ARM, STABLE_ARM, ArmOutcome, Rollout, RolloutEvent, ShadowResult
from api.routing.protocol import ArmReport, Comparison, Quantiles, RolloutReport, RolloutView, ShadowReport
from api.routing.stats import TestResult, mann_whitney_u, percentile, two_proportion_z

SIGNIFICANCE = 0.05


def rollout_view(rollout: Rollout) -> RolloutView:
    return RolloutView(id=rollout.id, name=rollout.name, stable=rollout.stable_label, candidate=rollout.candidate_label,
                       percent=rollout.percent, sticky=rollout.sticky, policy="ab" if rollout.sticky else "canary",
                       shadow_percent=rollout.shadow_percent, guard=rollout.guard, state=rollout.state,
                       reason=rollout.reason, started_at=rollout.started_at, ended_at=rollout.ended_at)


def arm_report(arm: str, model: str, rows: list[ArmOutcome]) -> ArmReport:
    errors = sum(1 for r in rows if r.status >= 500)
    ttft = [r.ttft_s for r in rows if r.ttft_s is not None]
    tpot = [r.tpot_s for r in rows if r.tpot_s is not None]
    logprobs = [r.logprob for r in rows if r.logprob is not None]
    feedback = [r.feedback for r in rows if r.feedback is not None]
    return ArmReport(
        arm=arm, model=model, requests=len(rows), errors=errors, error_rate=errors / len(rows) if rows else None,
        ttft_s=Quantiles(p50=percentile(ttft, 50), p95=percentile(ttft, 95)),
        tpot_s=Quantiles(p50=percentile(tpot, 50), p95=percentile(tpot, 95)),
        completion_tokens=sum(r.completion_tokens for r in rows), cost_usd=sum(r.cost_usd for r in rows),
        mean_logprob=sum(logprobs) / len(logprobs) if logprobs else None,
        feedback_count=len(feedback), feedback_mean=sum(feedback) / len(feedback) if feedback else None,
    )


def _compare(metric: str, test: str, stable: list[float], candidate: list[float], min_samples: int,
             value, result: TestResult | None) -> Comparison:
    if min(len(stable), len(candidate)) < min_samples:
        verdict = f"not enough data (n < {min_samples} per arm)"
        return Comparison(metric=metric, test=test, stable=value(stable), candidate=value(candidate), statistic=None,
                          p_value=None, verdict=verdict)
    if result is None:
        verdict = "no difference (identical samples)"
    else:
        verdict = f"significant at {SIGNIFICANCE:.0%}" if result.p_value < SIGNIFICANCE else "no significant difference"
    return Comparison(metric=metric, test=test, stable=value(stable), candidate=value(candidate),
                      statistic=result.statistic if result else None, p_value=result.p_value if result else None,
                      verdict=verdict)


def _rate(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _median(values: list[float]) -> float | None:
    return percentile(values, 50)


def build_report(rollout: Rollout, outcomes: list[ArmOutcome], shadow_rows: list[ShadowResult],
                 events: list[RolloutEvent], min_samples: int) -> RolloutReport:
    by_arm = {STABLE_ARM: [o for o in outcomes if o.arm == STABLE_ARM],
              CANDIDATE_ARM: [o for o in outcomes if o.arm == CANDIDATE_ARM]}
    s, c = by_arm[STABLE_ARM], by_arm[CANDIDATE_ARM]
    errors_s = [float(o.status >= 500) for o in s]
    errors_c = [float(o.status >= 500) for o in c]
    ttft_s = [o.ttft_s for o in s if o.ttft_s is not None]
    ttft_c = [o.ttft_s for o in c if o.ttft_s is not None]
    fb_s = [o.feedback for o in s if o.feedback is not None]
    fb_c = [o.feedback for o in c if o.feedback is not None]
    comparisons = [
        _compare("error_rate", "two-proportion z-test", errors_s, errors_c, min_samples, _rate,
                 two_proportion_z(int(sum(errors_s)), len(errors_s), int(sum(errors_c)), len(errors_c))),
        _compare("ttft", "Mann-Whitney U", ttft_s, ttft_c, min_samples, _median, mann_whitney_u(ttft_s, ttft_c)),
        _compare("feedback", "Mann-Whitney U", fb_s, fb_c, min_samples, _rate, mann_whitney_u(fb_s, fb_c)),
    ]
    completed = [r for r in shadow_rows if r.status < 500]
    shadow = ShadowReport(
        completed=len(completed),
        exact_match_rate=sum(r.exact for r in completed) / len(completed) if completed else None,
        mean_token_overlap=sum(r.overlap for r in completed) / len(completed) if completed else None,
        completion_tokens=sum(r.completion_tokens for r in completed),
        internal_cost_usd=sum(r.cost_usd for r in completed),
    )
    return RolloutReport(
        rollout=rollout_view(rollout), min_samples=min_samples,
        arms=[arm_report(STABLE_ARM, rollout.stable_label, s), arm_report(CANDIDATE_ARM, rollout.candidate_label, c)],
        comparisons=comparisons, shadow=shadow,
        events=[{"kind": e.kind, "detail": e.detail, "at": e.at} for e in events],
    )
