"""Pure decisions of virtual models: when a cascade escalates, and which ensemble answer wins."""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from dataclasses import dataclass

from api.tenancy.virtual_models import MAJORITY, EscalationRule

_SPACES = re.compile(r"\s+")
_EDGE_PUNCTUATION = string.punctuation + "“”‘’«»…"


def mean_logprob(logprobs: Sequence[float]) -> float | None:
    """Mean of the sampled tokens' logprobs; None for an empty answer."""
    return sum(logprobs) / len(logprobs) if logprobs else None


@dataclass(frozen=True)
class Escalation:
    escalate: bool
    reason: str | None  # "mean_logprob" or "output_matches" when escalating


def escalation(rule: EscalationRule, text: str, mean: float | None) -> Escalation:
    """Whether a cascade stage's answer goes on to the next stage; the logprob condition is judged first."""
    if rule.mean_logprob_below is not None and mean is not None and mean < rule.mean_logprob_below:
        return Escalation(True, "mean_logprob")
    if rule.output_matches is not None and re.search(rule.output_matches, text):
        return Escalation(True, "output_matches")
    return Escalation(False, None)


def normalise(text: str) -> str:
    """What majority voting compares: case folded, runs of whitespace as one space, punctuation at the ends
    dropped."""
    return _SPACES.sub(" ", text.casefold()).strip().strip(_EDGE_PUNCTUATION).strip()


@dataclass(frozen=True)
class Candidate:
    text: str
    mean_logprob: float | None


def choose(aggregate: str, candidates: Sequence[Candidate]) -> int:
    """Index of the winning candidate. majority: the most common normalised text, ties to the earliest
    member; max_mean_logprob: the highest mean (an answer without one loses), ties to the earliest."""
    if not candidates:
        raise ValueError("an ensemble needs at least one answer")
    if aggregate == MAJORITY:
        keys = [normalise(c.text) for c in candidates]
        counts = {k: keys.count(k) for k in keys}
        return max(range(len(keys)), key=lambda i: (counts[keys[i]], -i))
    return max(range(len(candidates)), key=lambda i: (candidates[i].mean_logprob is not None,
                                                       candidates[i].mean_logprob or 0.0, -i))
