from __future__ import annotations

from prometheus_client import REGISTRY
from vllm.v1.metrics.loggers import AggregateStatLoggerBase, PrometheusStatLogger
from vllm.v1.metrics.stats import IterationStats

from engine.async_engine import _UnexposedPrometheus, _Waiting


def test_a_request_waits_from_submission_to_its_first_output():
    by_adapter: dict[str, int] = {}
    first, second, base = _Waiting(by_adapter, "poet#1"), _Waiting(by_adapter, "poet#1"), _Waiting(by_adapter, None)
    assert by_adapter == {"poet#1": 2}  # base-model requests are not per-adapter queueing
    first.over()
    first.over()  # every later output, and the end of the stream, call it again
    base.over()
    assert by_adapter == {"poet#1": 1}
    second.over()  # e.g. aborted before any output
    assert by_adapter == {}


def test_vllms_prometheus_logger_is_replaced_by_one_that_records_nothing():
    # vLLM's StatLoggerManager adds its own Prometheus logger unless a given factory is an aggregate logger whose
    # instance is a PrometheusStatLogger: the stand-in must pass that check, and register and record nothing.
    assert issubclass(_UnexposedPrometheus, AggregateStatLoggerBase)
    names_before = set(REGISTRY._names_to_collectors)
    stand_in = _UnexposedPrometheus(None, [0])
    assert isinstance(stand_in, PrometheusStatLogger)
    stats = IterationStats()
    stats.num_generation_tokens = 3
    stand_in.record(None, stats, engine_idx=0)
    stand_in.log_engine_initialized()
    assert set(REGISTRY._names_to_collectors) == names_before
