import pytest

from api.tenancy.virtual_models import MAJORITY, MAX_MEAN_LOGPROB, EscalationRule
from api.graphs.rules import Candidate, choose, escalation, mean_logprob, normalise


@pytest.mark.parametrize("values, expected", [
    ([], None),
    ([-1.0], -1.0),
    ([-1.0, -2.0, -3.0], -2.0),
])
def test_mean_logprob(values, expected):
    assert mean_logprob(values) == expected


@pytest.mark.parametrize("rule, text, mean, expected", [
    ({"mean_logprob_below": -2.0}, "x", -2.5, (True, "mean_logprob")),
    ({"mean_logprob_below": -2.0}, "x", -2.0, (False, None)),  # at the threshold: not below
    ({"mean_logprob_below": -2.0}, "x", -1.5, (False, None)),
    ({"mean_logprob_below": -2.0}, "", None, (False, None)),  # an empty answer has no mean
    ({"output_matches": "(?i)not sure"}, "I am NOT SURE", None, (True, "output_matches")),
    ({"output_matches": "^SELECT"}, "the answer: SELECT 1", -0.1, (False, None)),  # search, anchored by ^
    ({"mean_logprob_below": -2.0, "output_matches": "x"}, "x", -3.0, (True, "mean_logprob")),
    ({"mean_logprob_below": -2.0, "output_matches": "x"}, "x", -1.0, (True, "output_matches")),
    ({"mean_logprob_below": -2.0, "output_matches": "x"}, "y", -1.0, (False, None)),
])
def test_escalation(rule, text, mean, expected):
    decision = escalation(EscalationRule(**rule), text, mean)
    assert (decision.escalate, decision.reason) == expected


@pytest.mark.parametrize("text, expected", [
    ("  Paris. ", "paris"),
    ("PARIS", "paris"),
    ("New\n  York!", "new york"),
    ("«Oui»", "oui"),
    ("", ""),
    ("a.b", "a.b"),
])
def test_normalise(text, expected):
    assert normalise(text) == expected


@pytest.mark.parametrize("aggregate, candidates, expected", [
    (MAJORITY, [("a", None), ("b", None), ("B.", None)], 1),
    (MAJORITY, [("a", None), ("b", None), ("c", None)], 0),  # all differ: the earliest
    (MAJORITY, [("a", None), ("b", None), ("b", None), ("a", None)], 0),  # tie: the earliest of the tied
    (MAJORITY, [("x", -9.0), ("y", -1.0), ("y", -5.0)], 1),  # logprobs do not count in a vote
    (MAX_MEAN_LOGPROB, [("a", -3.0), ("b", -1.0), ("c", -2.0)], 1),
    (MAX_MEAN_LOGPROB, [("a", None), ("b", -7.0)], 1),  # no mean loses
    (MAX_MEAN_LOGPROB, [("a", -1.0), ("b", -1.0)], 0),
    (MAX_MEAN_LOGPROB, [("a", None), ("b", None)], 0),
])
def test_choose(aggregate, candidates, expected):
    assert choose(aggregate, [Candidate(t, m) for t, m in candidates]) == expected


def test_choose_needs_an_answer():
    with pytest.raises(ValueError):
        choose(MAJORITY, [])
